"""Every viewgate process allocates Arrow's memory from jemalloc (viewgate/__init__.py)."""

import os
import subprocess
import sys

import pyarrow as pa
import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or "jemalloc" not in pa.supported_memory_backends(),
    reason="Arrow's jemalloc is chosen on Linux, where its wheels carry it")

BACKEND = ("import viewgate, pyarrow as pa; "
           "print(pa.default_memory_pool().backend_name)")


def _backend(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run([sys.executable, "-c", BACKEND], env={**clean, **env},
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def test_importing_viewgate_first_gives_arrow_jemalloc():
    assert _backend() == "jemalloc"


def test_a_users_choice_of_allocator_wins():
    assert _backend(ARROW_DEFAULT_MEMORY_POOL="system") == "system"
