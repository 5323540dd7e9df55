"""An HTTP/1.1 load generator for the gateway group: keep-alive connections on raw asyncio
sockets (uvloop when installed), requests built once as bytes, responses framed by their
Content-Length. Far cheaper per request than an HTTP client library, so one generator
process can saturate a Python server on another core and still say how busy it was.

Two ways to load a server, each run in a process of its own (viewgate.bench.workers.Worker):
- `closed_loop`: every connection sends its next request as soon as the last answer is
  in; the completions per second inside the measured window are the server's saturation
  throughput.
- `open_loop`: requests are due at fixed times (`schedule`), whether or not earlier ones
  were answered, and latency counts from the time a request was due, so a server that
  falls behind shows the queueing (no coordinated omission). A request waits in the
  generator when every connection is busy; that wait is part of its latency.

Both check every answer (status 200, marker bytes present or absent) and report the
generator's own CPU time and that of the processes named in `watch_pids` (the server,
Redis) over the measured window, from /proc.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from viewgate.bench.group import BenchError

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# --- Pure helpers ---------------------------------------------------------------------------


def post_request(host: str, port: int, path: str, body: bytes) -> bytes:
    """The bytes of a keep-alive HTTP/1.1 POST of a JSON body."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


def parse_response(buffer: bytes | bytearray) -> tuple[int, bytes, int] | None:
    """(status, body, bytes used) of the first complete response in `buffer`, or None
    when it is not all there yet. Only Content-Length framing (what Starlette sends)."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    parts = head[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x response: {head[0]!r}")
    length = None
    for line in head[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
        elif name.strip().lower() == "transfer-encoding":
            raise ValueError("chunked responses are not supported by this load generator")
    if length is None:
        raise ValueError("a response without Content-Length")
    start = end + 4
    if len(buffer) < start + length:
        return None
    return int(parts[1]), bytes(buffer[start : start + length]), start + length


def schedule(rate: float, duration_s: float) -> list[float]:
    """Seconds after the start at which each request of an open-loop run is due: evenly
    spaced at `rate` per second for `duration_s`."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError("an open-loop run needs a positive rate and duration")
    return [i / rate for i in range(int(round(rate * duration_s)))]


def answer_ok(status: int, body: bytes, must: bytes, must_not: Sequence[bytes]) -> bool:
    return status == 200 and must in body and not any(m in body for m in must_not)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


def proc_kb(path: str, field: str) -> int | None:
    """A `<field>: <n> kB` line of a /proc file (status, smaps_rollup); None if the file or
    the line is missing (a process gone, another kernel)."""
    try:
        with open(path) as proc:
            lines = proc.read().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in lines if line.startswith(f"{field}:")),
                None)


def rss_kb(pid: int) -> int:
    """A live process's resident memory; a process gone is the bench's error, not a zero."""
    kb = proc_kb(f"/proc/{pid}/status", "VmRSS")
    if kb is None:
        raise BenchError(f"no VmRSS for process {pid}")
    return kb


def cpu_seconds_fine(pid: int) -> float:
    """CPU seconds a process's live threads have used so far, in nanoseconds' resolution
    (/proc/<pid>/task/*/schedstat): for short spans, where utime and stime's 10 ms ticks
    can round a busy moment to nothing. Threads that ended are not counted."""
    total_ns = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total_ns += int(stat.read().split()[0])
        except FileNotFoundError:  # the thread ended while we read
            continue
    return total_ns / 1e9


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- The client -----------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.waiter is None or self.waiter.done():
            return
        try:
            parsed = parse_response(self.buffer)
        except ValueError as exc:
            self.waiter.set_exception(exc)
            return
        if parsed is not None:
            status, body, used = parsed
            del self.buffer[:used]
            self.waiter.set_result((status, body))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"the server closed the connection: {exc}"))

    async def request(self, data: bytes) -> tuple[int, bytes]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.waiter


async def _connect(host: str, port: int, count: int) -> list[_Connection]:
    loop = asyncio.get_running_loop()
    out = []
    for _ in range(count):
        _, protocol = await loop.create_connection(_Connection, host, port)
        out.append(protocol)
    return out


def _close(connections: Sequence[_Connection]) -> None:
    for connection in connections:
        if connection.transport is not None:
            connection.transport.close()


@dataclass
class _Window:
    """CPU seconds of this process and of the watched ones at the window's edges."""

    pids: Sequence[int]
    start: float = 0.0
    end: float = 0.0
    own: tuple[float, float] = (0.0, 0.0)
    watched: tuple[list[float], list[float]] = ([], [])

    def open(self) -> None:
        self.start, self.own = time.perf_counter(), (_own_cpu_seconds(), 0.0)
        self.watched = ([cpu_seconds(p) for p in self.pids], [])

    def close(self) -> None:
        self.end, self.own = time.perf_counter(), (self.own[0], _own_cpu_seconds())
        self.watched = (self.watched[0], [cpu_seconds(p) for p in self.pids])

    def report(self) -> dict[str, Any]:
        seconds = self.end - self.start
        return {
            "seconds": seconds,
            "generator_cpu": (self.own[1] - self.own[0]) / seconds,
            "watched_cpu": [(b - a) / seconds for a, b in zip(*self.watched, strict=True)],
        }


def _run(coroutine: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


# --- Workers (module-level, so a spawned interpreter can import them) ----------------------


def closed_loop(
    host: str,
    port: int,
    requests: Sequence[bytes],
    connections: int,
    warmup_s: float,
    duration_s: float,
    must: bytes,
    must_not: Sequence[bytes],
    watch_pids: Sequence[int],
) -> dict[str, Any]:
    """Saturation: `connections` connections each sending the next request (cycling
    through `requests`, each connection from its own offset) as soon as the last answer
    arrived. Counts the answers completed within [warmup_s, warmup_s + duration_s]."""

    async def main() -> dict[str, Any]:
        conns = await _connect(host, port, connections)
        window = _Window(watch_pids)
        counted = bad = 0
        stop = False
        errors: list[str] = []

        async def drive(index: int, conn: _Connection) -> None:
            nonlocal counted, bad
            i = index * len(requests) // connections
            while not stop:
                status, body = await conn.request(requests[i % len(requests)])
                i += 1
                if window.start and not window.end:
                    counted += 1
                    if not answer_ok(status, body, must, must_not):
                        bad += 1
                        if len(errors) < 3:
                            errors.append(f"{status} {body[:300]!r}")

        tasks = [asyncio.create_task(drive(i, c)) for i, c in enumerate(conns)]
        try:
            await asyncio.sleep(warmup_s)
            window.open()
            await asyncio.sleep(duration_s)
            window.close()
            stop = True
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
        finally:
            for task in tasks:
                task.cancel()
            _close(conns)
        report = window.report()
        return {**report, "answers": counted, "rps": counted / report["seconds"],
                "bad": bad, "errors": errors}

    return _run(main())


def open_loop(
    host: str,
    port: int,
    requests: Sequence[bytes],
    rate: float,
    warmup_s: float,
    duration_s: float,
    connections: int,
    must: bytes,
    must_not: Sequence[bytes],
    watch_pids: Sequence[int],
) -> dict[str, Any]:
    """Fixed offered load: request i is due at start + i / rate for warmup_s + duration_s;
    it goes out on the first free connection. Returns the latency (ms, from when each
    request was due, or was sent if that was earlier, until its answer was in) of the
    requests due after the warm-up, and how late the generator itself sent them
    (`send_lag_ms`, negative when early)."""

    async def main() -> dict[str, Any]:
        conns = await _connect(host, port, connections)
        due_at = schedule(rate, warmup_s + duration_s)
        queue: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()
        latency: list[float | None] = [None] * len(due_at)
        lag: list[float] = [0.0] * len(due_at)
        window = _Window(watch_pids)
        bad = 0
        bad_statuses: dict[int, int] = {}  # wrong answers by HTTP status
        errors: list[str] = []
        start = time.perf_counter() + 0.05
        counted_from = start + warmup_s

        async def send(conn: _Connection) -> None:
            nonlocal bad
            while (item := await queue.get()) is not None:
                i, due = item
                sent = time.perf_counter()
                lag[i] = (sent - due) * 1000
                status, body = await conn.request(requests[i % len(requests)])
                # From when it was due; from when it went out if that was earlier (the
                # loop's millisecond timers can wake a little early).
                latency[i] = (time.perf_counter() - min(due, sent)) * 1000
                if not answer_ok(status, body, must, must_not):
                    bad += 1
                    bad_statuses[status] = bad_statuses.get(status, 0) + 1
                    if len(errors) < 3:
                        errors.append(f"{status} {body[:300]!r}")

        senders = [asyncio.create_task(send(c)) for c in conns]
        try:
            for i, offset in enumerate(due_at):
                due = start + offset
                wait = due - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not window.start and due >= counted_from:
                    window.open()
                queue.put_nowait((i, due))
            for _ in senders:
                queue.put_nowait(None)
            await asyncio.wait_for(asyncio.gather(*senders), timeout=60)
            window.close()
        finally:
            for task in senders:
                task.cancel()
            _close(conns)
        first = next(i for i, offset in enumerate(due_at) if start + offset >= counted_from)
        measured = [v for v in latency[first:] if v is not None]
        return {**window.report(), "latency_ms": measured, "send_lag_ms": lag[first:],
                "due": len(due_at) - first, "answered": len(measured), "bad": bad,
                "bad_statuses": bad_statuses,
                "errors": errors}

    return _run(main())
