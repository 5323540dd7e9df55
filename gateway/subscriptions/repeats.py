"""Which change events the fan-out has delivered already.

The change feed is at least once: when the engine replays a batch after a crash, it sends
that batch's events again. Each view's feed is one partition, written one batch after
another in version order, so a repeat is always an event of the newest version seen or of
an older one. Remembering the keys of each view's newest version is therefore enough to
drop every repeat, and exactly: a memory of recent keys instead (a bounded map of every
key's version) holds hundreds of thousands of entries under steady traffic, and still lets
through a repeat whose key it has forgotten.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Newest:
    generation: int
    version: int
    keys: set[str] = field(default_factory=set)  # delivered at this version


class RepeatFilter:
    def __init__(self) -> None:
        self._newest: dict[str, _Newest] = {}  # view -> its newest version seen

    def repeat(self, view: str, generation: int, version: int, key: str) -> bool:
        """True if this event was seen before (or is older than one seen); else notes it."""
        newest = self._newest.get(view)
        if newest is None or (generation, version) > (newest.generation, newest.version):
            # A new version (or a rebuild's new generation): the older keys are done with.
            self._newest[view] = _Newest(generation, version, {key})
            return False
        if (generation, version) < (newest.generation, newest.version) or key in newest.keys:
            return True
        newest.keys.add(key)
        return False
