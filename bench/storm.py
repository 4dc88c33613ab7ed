"""The disconnect storm: streaming clients leaving mid-stream under load, then leak checks (overhead.py)."""

from __future__ import annotations

import asyncio
import random
import time

from harness.loadgen import Disconnect, Reply, Target, chat_payload, connect, fixed_count, one
from harness.measure import Figures, Subject, fetch_json

# Long streams, so every storm client leaves mid-stream.
_STORM_STREAM = {"x-mock-events": "400", "x-mock-delay-ms": "5"}


async def _storm_client(target: Target, n: int, memory_user: str) -> bool:
    """Start a stream, leave after a few events (FIN or RST); True when it got a 200 stream first."""
    extra = {**_STORM_STREAM, **({"x-memory-user": memory_user} if n % 2 else {})}
    payload = chat_payload(target, stream=True, extra=extra)(n)
    try:
        conn = await connect(target)
    except OSError:
        return False
    try:
        reply = await conn.request(payload, abort_after=random.randint(1, 30))
    except Disconnect:
        return False
    finally:
        conn.close()
    return reply.status == 200 and reply.events >= 1


async def _background(target: Target, stop: asyncio.Event, concurrency: int) -> tuple[int, int]:
    """Non-streamed requests until `stop` is set: (answered, errors)."""
    make = chat_payload(target, stream=False)
    counts = [0, 0]

    async def worker() -> None:
        conn = await connect(target)
        while not stop.is_set():
            try:
                reply: Reply = await conn.request(make(counts[0]))
            except Disconnect:
                counts[1] += 1
                conn = await connect(target)
                continue
            counts[0 if reply.status == 200 else 1] += 1
        conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return counts[0], counts[1]


async def _upstream_drained(mock: Target, timeout: float) -> float | None:
    """Seconds until the mock has no stream in progress, None if some are still open at `timeout`."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if (await fetch_json(mock, "/_stats"))["streams_active"] == 0:
            return time.perf_counter() - started
        await asyncio.sleep(0.02)
    return None


async def _still_answers(target: Target, memory_user: str) -> bool:
    """A full stream and a plain completion, both complete, after the storm."""
    stream = await one(target, chat_payload(target, stream=True, extra={"x-mock-events": "50", "x-mock-delay-ms": "0",
                                                                        "x-memory-user": memory_user})(0))
    plain = await one(target, chat_payload(target, stream=False)(0))
    return stream.status == 200 and stream.events == 51 and plain.status == 200


async def disconnect_storm(subject: Subject, clients: int, memory_user: str) -> Figures:
    """`clients` streams cut mid-way (half FIN, half RST) under background load; then leak checks."""
    target, server = subject.target, subject.server
    mock = Target("mock", subject.mock.port)
    await fixed_count(target, chat_payload(target, stream=False), 8, 200)  # pools at their steady size
    await asyncio.sleep(0.5)
    stats0 = await fetch_json(mock, "/_stats")
    before = {"rss_mb": server.rss_mb(), "fds": float(server.open_fds())}
    stop = asyncio.Event()
    load = asyncio.create_task(_background(target, stop, 8))
    gate = asyncio.Semaphore(min(clients, 200))

    async def client(n: int) -> bool:
        async with gate:
            return await _storm_client(target, n, memory_user)

    started = time.perf_counter()
    outcomes = await asyncio.gather(*(client(n) for n in range(clients)))
    storm_s = time.perf_counter() - started
    stop.set()
    answered, load_errors = await load
    drained = await _upstream_drained(mock, 10.0)
    await asyncio.sleep(1.0)  # let closed sockets and finished tasks go
    stats1 = await fetch_json(mock, "/_stats")
    answers = await _still_answers(target, memory_user)
    return {
        "clients": float(clients), "storm_errors": float(outcomes.count(False)), "storm_seconds": storm_s,
        "load_requests": float(answered), "load_errors": float(load_errors),
        "upstream_drain_ms": drained * 1000 if drained is not None else -1.0,
        "upstream_streams_cut": float(stats1["streams_cut"] - stats0["streams_cut"]),
        "upstream_conns_before": float(stats0["connections_open"]),
        "upstream_conns_after": float(stats1["connections_open"]),
        "fds_before": before["fds"], "fds_after": float(server.open_fds()),
        "rss_mb_before": before["rss_mb"], "rss_mb_after": server.rss_mb(), "still_answers": float(answers),
    }
