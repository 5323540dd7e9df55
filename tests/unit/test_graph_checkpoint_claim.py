"""The graph query refuses a checkpoint made for other views with the error `viewgate engine`
reports (engine.errors, importable without loading the engine)."""

import json
from pathlib import Path

import pytest

from engine.errors import GraphChanged
from engine.graph import VIEWS_FILE, claim_checkpoint, graph_checkpoint, graph_views
from schema.demo import CATALOG
from schema.settings import Settings

GENERATIONS = {v.name: 0 for v in graph_views(CATALOG)}


def _checkpoint_of(settings: Settings, names: list[str]) -> Path:
    """The graph's checkpoint, recorded as made for `names`."""
    recorded = Path(graph_checkpoint(settings, 0)) / VIEWS_FILE
    recorded.parent.mkdir(parents=True)
    recorded.write_text(json.dumps(names))
    return recorded


def test_a_checkpoint_of_other_views_is_refused_naming_the_added_ones(tmp_path):
    settings = Settings(data_dir=tmp_path)
    _checkpoint_of(settings, ["Customer"])

    with pytest.raises(GraphChanged, match="the catalog adds .*CustomerStats") as refused:
        claim_checkpoint(settings, CATALOG, GENERATIONS)
    assert "viewgate rebuild" in str(refused.value)


def test_the_checkpoint_of_the_same_views_is_claimed(tmp_path):
    settings = Settings(data_dir=tmp_path)
    recorded = _checkpoint_of(settings, sorted(GENERATIONS))

    claim_checkpoint(settings, CATALOG, GENERATIONS)  # no error
    assert json.loads(recorded.read_text()) == sorted(GENERATIONS)
