"""Crash points for the exactly-once tests: SIGKILL the engine at a named step of a commit.

`VIEWGATE_FAILPOINT=after_redis:CustomerStats` kills the process the first time the
CustomerStats commit gets past its Redis apply. Steps: after_redis, after_changefeed,
after_delta. `sigterm_<step>:<view>` instead sends SIGTERM to the process group once, as
systemd or Kubernetes would in the middle of that commit, and lets it go on. Unset
(always, outside those tests) it costs one dict lookup per step.
"""

from __future__ import annotations

import os
import signal

FAILPOINT_ENV = "VIEWGATE_FAILPOINT"


_terminated = False


def failpoint(step: str, view: str) -> None:
    global _terminated
    wanted = os.environ.get(FAILPOINT_ENV)
    if wanted == f"sigterm_{step}:{view}" and not _terminated:
        _terminated = True
        os.killpg(os.getpgrp(), signal.SIGTERM)
        return
    if wanted != f"{step}:{view}":
        return
    # The whole process group, so Spark's JVM dies in the same instant as the driver
    # script (as when a machine dies), when the engine leads its group.
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
