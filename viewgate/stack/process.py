"""Starting, watching and stopping the processes we own, by pid, with deadlines."""

from __future__ import annotations

import asyncio
import ctypes
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from viewgate.stack.errors import StackError

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM when the process that started it dies, so a
    # killed test run or `viewgate up` never leaves a broker behind.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


# free_port chooses below the kernel's ephemeral range: a port chosen now and bound later
# by a service must not be taken meanwhile by an outgoing connection, which gets its local
# port from that range (a clean-clone run lost a Redis Cluster node to one).
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_BELOW_EPHEMERAL = 12_000  # how many ports under the range to choose from
_handed_out: set[int] = set()  # never the same port twice in one process


def free_port() -> int:
    """A port on 127.0.0.1 that nothing has bound, below the ephemeral range when there is
    room there (else one the kernel picks)."""
    low = _ephemeral_low()
    start = max(1024, low - _BELOW_EPHEMERAL)
    if low - start >= 1000:
        for _ in range(100):
            port = random.randrange(start, low)
            if port not in _handed_out and not port_in_use(port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
        return False


def require_free_port(port: int, service: str, setting: str) -> None:
    if port_in_use(port):
        raise StackError(
            f"{service}: port {port} is already in use. Stop whatever listens there "
            f"or choose another port with {setting}=<port>."
        )


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.2,
    alive: Callable[[], bool] = lambda: True,
    log: Path | None = None,
) -> None:
    """Poll `condition` until it holds; fail with the log's tail at the deadline
    or as soon as the process we wait for has died."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return
        hint = f"\nLast lines of {log}:\n{tail(log)}" if log else ""
        if not alive():
            raise StackError(f"{what}: the process exited before it became ready.{hint}")
        if time.monotonic() > deadline:
            raise StackError(f"{what}: not ready after {timeout_s:.0f}s.{hint}")
        time.sleep(interval_s)


async def eventually(attempt: Callable[[], Awaitable[T | None]], *, timeout_s: float,
                     what: str, interval_s: float = 0.1) -> T:
    """wait_until for coroutines: the first result of `attempt` that is not None; fail at
    the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = await attempt()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise StackError(f"{what}: not after {timeout_s:.0f}s")
        await asyncio.sleep(interval_s)


@dataclass
class ManagedProcess:
    """A child process with its log file, stopped by pid (never by name)."""

    name: str
    args: Sequence[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    die_with_parent: bool = True
    popen: subprocess.Popen | None = field(default=None, init=False)

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        try:
            self.popen = subprocess.Popen(
                list(self.args),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})},
                cwd=self.cwd,
                start_new_session=True,  # Ctrl-C reaches us, and we stop it in order
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        except FileNotFoundError as exc:
            raise StackError(f"{self.name}: cannot run {self.args[0]!r}: {exc}") from exc
        finally:
            log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was not started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.popen is None:
            return
        stop_pid(self.popen.pid, timeout_s, waiter=self.popen.wait)


def stop_pid(
    pid: int, timeout_s: float = 15.0, waiter: Callable[..., object] | None = None
) -> None:
    """SIGTERM, wait up to the deadline, then SIGKILL."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if waiter is not None:
        try:
            waiter(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            pass
    else:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if waiter is not None:
        waiter(timeout=timeout_s)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return True
    return state != "Z"
