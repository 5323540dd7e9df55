"""Logging setup: JSON lines carry the view, batch id and request id."""

from __future__ import annotations

import json
import logging

from schema.logs import REQUEST_ID, configure_logging
from schema.settings import Settings


def test_json_lines_carry_view_batch_and_request_ids(capsys):
    configure_logging(Settings(log_format="json", log_level="debug"))
    try:
        log = logging.getLogger("viewgate.engine.commit")
        log.debug("Order batch 7 committed", extra={"view": "Order", "batch_id": 7})
        token = REQUEST_ID.set("req-42")
        try:
            logging.getLogger("viewgate.gateway").warning("slow read")
        finally:
            REQUEST_ID.reset(token)
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    finally:
        configure_logging(Settings())
    assert lines[0]["message"] == "Order batch 7 committed"
    assert (lines[0]["view"], lines[0]["batch_id"], lines[0]["level"]) == ("Order", 7, "DEBUG")
    assert lines[0]["logger"] == "viewgate.engine.commit" and lines[0]["time"]
    assert lines[1]["request_id"] == "req-42" and "view" not in lines[1]


def test_text_is_the_default_and_configuring_twice_keeps_one_handler(capsys):
    configure_logging(Settings())
    configure_logging(Settings())
    logging.getLogger("viewgate.engine").info("view Order now runs generation 1")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].endswith("INFO viewgate.engine view Order now runs generation 1")
    assert len(logging.getLogger("viewgate").handlers) == 1
