"""Every viewgate process allocates Arrow's memory from jemalloc and fixes glibc's mmap
threshold (viewgate/__init__.py); the engine gives glibc's free memory back (engine.malloc)."""

import os
import platform
import subprocess
import sys
from types import SimpleNamespace

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


# A 20 MiB block freed raises glibc's dynamic threshold to 20 MiB; a 2 MiB block is then
# mapped on its own (counted in mallinfo2's hblkhd) only with the threshold fixed.
MAPPED = """
import ctypes
{imports}
from engine.malloc import mallinfo
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free(ctypes.c_void_p(libc.malloc(20 << 20)))
before = mallinfo().hblkhd
block = libc.malloc(2 << 20)
print(mallinfo().hblkhd - before >= 2 << 20)
"""


def _mapped_apart(imports: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    done = subprocess.run([sys.executable, "-c", MAPPED.format(imports=imports)], env=clean,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_importing_viewgate_fixes_mallocs_mmap_threshold():
    assert _mapped_apart("") == "False"  # glibc's own: the freed 20 MiB raised it
    assert _mapped_apart("import viewgate") == "True"


# 150 MiB of small blocks freed, one kept after them: glibc cannot give back what lies
# below a block in use, until malloc_trim.
TRIMMED = """
import ctypes
from engine.malloc import trim_free_memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
def anonymous_kb():
    return next(int(line.split()[1]) for line in open("/proc/self/status")
                if line.startswith("RssAnon:"))
blocks = [libc.malloc(1000) for _ in range(150_000)]
for block in blocks:
    ctypes.memset(block, 1, 1000)
kept = libc.malloc(1000)
for block in blocks:
    libc.free(ctypes.c_void_p(block))
before = anonymous_kb()
small = trim_free_memory(above_bytes=1 << 40)  # not that much free: nothing done
done = trim_free_memory()
print(small, done, before - anonymous_kb())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_free_memory_above_the_bar_goes_back_to_the_system():
    done = subprocess.run([sys.executable, "-c", TRIMMED], capture_output=True, text=True,
                          timeout=60, check=True)
    small, trimmed, given_back_kb = done.stdout.split()
    assert (small, trimmed) == ("False", "True")
    assert int(given_back_kb) > 100 * 1024


def test_the_engine_looks_at_free_memory_at_most_every_interval(monkeypatch):
    from engine import malloc

    looked: list[int] = []
    monkeypatch.setattr(malloc, "trim_free_memory", lambda above: looked.append(above))
    clock = iter([100.0, 110.0, 130.5])
    monkeypatch.setattr(malloc, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    trim = malloc.FreeMemoryTrim(every_s=30, above_bytes=7)
    assert [trim(), trim(), trim()] == [True, False, True]  # at 100 s, not 110, at 130.5
    assert looked == [7, 7]
