"""Setup and abuse steps around the figures: seeding memories, and the disconnect storm."""

from __future__ import annotations

import asyncio
import json
import random
import time

from loadgen import Disconnect, Reply, Target, chat_payload, connect, fixed_count, get_payload, one, request_payload
from scenarios import Figures, Subject, fetch_json

_SEEDS = (
    "I prefer {w} for project {i}.",
    "My favourite library for service {i} is {w}.",
    "I really like {w} when I build pipeline {i}.",
    "I never use {w} on cluster {i}.",
    "I work with {w} on the billing system {i}.",
)
_WORDS = ("postgres", "redis", "kafka", "rust", "golang", "terraform", "vim", "emacs", "pytest", "celery",
          "django", "fastapi", "react", "svelte", "kubernetes", "nomad", "sqlite", "duckdb", "polars", "numpy")
# Long streams, so every storm client leaves mid-stream.
_STORM_STREAM = {"x-mock-events": "400", "x-mock-delay-ms": "5"}


def seed_text(i: int) -> str:
    """The i-th seeded fact."""
    return _SEEDS[i % len(_SEEDS)].format(w=f"{_WORDS[i % len(_WORDS)]}{i // len(_WORDS)}", i=i)


async def seed_memories(target: Target, user: str, count: int) -> Figures:
    """Store `count` memories for `user`: by the Memory API when it answers, else chat turns (slow)."""
    path = f"/memory/v1/users/{user}/memories"
    headers = {"content-type": "application/json", "x-memory-user": user}

    def api(i: int) -> bytes:
        body = json.dumps({"content": seed_text(i), "type": "fact"}).encode()
        return request_payload(target, "POST", path, body, headers)

    def turn(i: int) -> bytes:
        body = json.dumps({"model": "bench-model", "messages": [{"role": "user", "content": seed_text(i)}]}).encode()
        return request_payload(target, "POST", "/v1/chat/completions", body,
                               {**headers, "x-memory-conversation": f"bench-seed-{i}"})

    probe = await one(target, api(0))
    via = "api" if probe.status in (200, 201) else "chat"
    run = await fixed_count(target, api if via == "api" else turn, 8, count)
    return {"items": float(count), "via_api": float(via == "api"), "seconds": run.elapsed, "errors": float(run.errors)}


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


async def memory_recovered(target: Target, user: str, timeout: float = 40.0) -> float:
    """Seconds until memproxy's circuit breaker is closed again (/readyz), -1 if not within `timeout`.

    Seeding can trip the breaker (retrieval timeouts); the figures after it should be of memory
    that works. A memory-on request each second is what lets a half-open breaker close.
    """
    started = time.perf_counter()
    probe = Target(target.name, target.port, {"x-memory-user": user, "x-memory-persist": "false"})
    while time.perf_counter() - started < timeout:
        if (await fetch_json(target, "/readyz")).get("circuit") != "open":
            return time.perf_counter() - started
        await one(probe, chat_payload(probe, stream=False)(0))
        await asyncio.sleep(1.0)
    return -1.0


async def searched_in_memory(target: Target, user: str, timeout: float = 120.0) -> float:
    """Seconds until memproxy answers `user`'s searches from memory (`memproxy_search_memory_users`
    of both indexes at 1 or more), -1 if not within `timeout`; 0 at once for a store that keeps
    no postings (PostgreSQL).

    The first recall asks for the user's postings, built in the background (paced, for seconds
    at 10,000 memories) while FTS5 answers: a level measured meanwhile measures a cold start.
    A memory-on request every half second asks again for any dropped meanwhile.
    """
    started = time.perf_counter()
    metrics = Target(target.name, target.port, {})
    probe = Target(target.name, target.port, {"x-memory-user": user, "x-memory-persist": "false"})
    while time.perf_counter() - started < timeout:
        reply = await one(metrics, get_payload(metrics, "/metrics"))
        text = b"".join(reply.body or []).decode()
        held = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("memproxy_search_memory_users{")]
        if all(users >= 1 for users in held):
            return time.perf_counter() - started
        await one(probe, chat_payload(probe, stream=False)(0))
        await asyncio.sleep(0.5)
    return -1.0


async def extraction_drained(target: Target, timeout: float = 120.0) -> float:
    """Seconds until memproxy's extraction queue is empty (`memproxy_queue_depth`), -1 if not within `timeout`.

    Seeded memories are queued for extraction: a level measured while the worker still drains
    thousands of them measures that backlog, not the level's own load.
    """
    started = time.perf_counter()
    metrics = Target(target.name, target.port, {})
    while time.perf_counter() - started < timeout:
        reply = await one(metrics, get_payload(metrics, "/metrics"))
        text = b"".join(reply.body or []).decode()
        depth = next((line.rsplit(" ", 1)[1] for line in text.splitlines()
                      if line.startswith('memproxy_queue_depth{queue="extraction"}')), "0")
        if float(depth) == 0:
            return time.perf_counter() - started
        await asyncio.sleep(0.5)
    return -1.0
