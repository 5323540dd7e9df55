"""Crash points for the exactly-once tests: SIGKILL the engine at a named step of a commit.

`VIEWGATE_FAILPOINT=after_redis:CustomerStats` kills the process the first time the
CustomerStats commit gets past its Redis apply. Steps: after_redis, after_changefeed,
after_delta. Unset (always, outside those tests) it costs one dict lookup per step.
"""

from __future__ import annotations

import os
import signal

FAILPOINT_ENV = "VIEWGATE_FAILPOINT"


def failpoint(step: str, view: str) -> None:
    if os.environ.get(FAILPOINT_ENV) != f"{step}:{view}":
        return
    # The whole process group, so Spark's JVM dies in the same instant as the driver
    # script (as when a machine dies), when the engine leads its group.
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
