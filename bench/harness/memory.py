"""What a benchmark does to memproxy's memory around its figures: seed a user's memories, then wait
until memproxy serves them as it would in steady use (breaker closed, postings built, extraction
queue drained), so that a figure measures memory that works and not a cold start."""

from __future__ import annotations

import asyncio
import json
import time

from .loadgen import Target, chat_payload, fixed_count, get_payload, one, request_payload
from .measure import Figures, fetch_json

# The user whose memory a benchmark seeds and measures.
MEMORY_USER = "bench-user"

_SEEDS = (
    "I prefer {w} for project {i}.",
    "My favourite library for service {i} is {w}.",
    "I really like {w} when I build pipeline {i}.",
    "I never use {w} on cluster {i}.",
    "I work with {w} on the billing system {i}.",
)
_WORDS = ("postgres", "redis", "kafka", "rust", "golang", "terraform", "vim", "emacs", "pytest", "celery",
          "django", "fastapi", "react", "svelte", "kubernetes", "nomad", "sqlite", "duckdb", "polars", "numpy")


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
        held = [float(line.rsplit(" ", 1)[1]) for line in await metric_lines(metrics, "memproxy_search_memory_users{")]
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
        depth = next((line.rsplit(" ", 1)[1] for line in
                      await metric_lines(metrics, 'memproxy_queue_depth{queue="extraction"}')), "0")
        if float(depth) == 0:
            return time.perf_counter() - started
        await asyncio.sleep(0.5)
    return -1.0


async def metric_lines(target: Target, prefix: str) -> list[str]:
    """The lines of memproxy's /metrics that start with `prefix`."""
    reply = await one(target, get_payload(target, "/metrics"))
    return [line for line in b"".join(reply.body or []).decode().splitlines() if line.startswith(prefix)]
