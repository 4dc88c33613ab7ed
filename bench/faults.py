"""kill -9 rounds: memproxy killed at a random moment while turns stream.

Each round starts memproxy on one store, streams turns through it, kills it with SIGKILL,
and (SQLite) checks the file with `PRAGMA integrity_check`. After the last round memproxy
starts once more (its start-up recovery runs), and every turn whose stream the client saw
end (`data: [DONE]`, `message_stop`, `response.completed`) must be in the store with its
answer: turns lost = 0.

Two shapes of round:
- a burst (the default): `--streams` turns at once on Chat Completions, killed 50-600 ms in;
- under load (`--clients N`): N clients stream turns back to back on the three wires (Chat
  Completions, Responses, Messages) over 12 users, killed after 2-4 s. The turns the
  server answers right before each kill are the ones a lagging writer would lose.

`--store postgres` runs a throwaway PostgreSQL (tests/pg_server.py; its binaries must be
installed). It runs with fsync off, as a test server: only memproxy is killed, never the
database, so what is measured is whether memproxy committed before the last event.

    python bench/faults.py [--rounds 50] [--streams 50] [--json]
    python bench/faults.py --clients 36 --rounds 10 --store postgres
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from harness.figures import percentile
from harness.report import json_option, print_json
from harness.targets import Server, Targets, throwaway_postgres

DONE = b"data: [DONE]\n\n"
# Each wire's path, request body for a text, and the bytes its stream ends with when complete.
WIRES: dict[str, tuple[str, Callable[[str], dict[str, Any]], bytes]] = {
    "chat": ("/v1/chat/completions",
             lambda text: {"model": "m", "stream": True, "messages": [{"role": "user", "content": text}]},
             DONE),
    "responses": ("/v1/responses", lambda text: {"model": "m", "stream": True, "input": text},
                  b"event: response.completed"),
    "messages": ("/v1/messages",
                 lambda text: {"model": "m", "max_tokens": 64, "stream": True,
                               "messages": [{"role": "user", "content": text}]},
                 b"event: message_stop"),
}
LOAD_USERS = 12
ANSWERED = ("SELECT u.content FROM messages u JOIN messages a ON a.user_id = u.user_id AND a.turn_key = u.turn_key"
            " WHERE u.role = 'user' AND a.role = 'assistant'")


def ended(wire: str, data: bytes) -> bool:
    """Whether a stream of the wire ended complete: its end event came last."""
    return data.rstrip().rsplit(b"\n\n", 1)[-1].startswith(WIRES[wire][2])


async def stream_one(client: httpx.AsyncClient, wire: str, text: str, user: str) -> float | None:
    """One streamed turn; its duration in seconds when the client saw it end complete, else None."""
    path, body, _ = WIRES[wire]
    began = time.perf_counter()
    try:
        async with client.stream("POST", path, json=body(text), headers={"x-memory-user": user}) as response:
            data = b"".join([piece async for piece in response.aiter_raw()])
    except httpx.HTTPError:
        return None
    return time.perf_counter() - began if response.status_code == 200 and ended(wire, data) else None


async def stream_turns(url: str, round_no: int, streams: int) -> list[str]:
    """Start `streams` streamed turns at once; the texts of those that ended with [DONE]."""
    completed: list[str] = []

    async def one(i: int, client: httpx.AsyncClient) -> None:
        text = f"round {round_no} turn {i}"
        if await stream_one(client, "chat", text, f"user{i % 10}") is not None:
            completed.append(text)

    async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=streams)) as client:
        await asyncio.gather(*(one(i, client) for i in range(streams)))
    return completed


async def kill_during(server: Server, round_no: int, streams: int, rng: random.Random) -> list[str]:
    """Stream turns and SIGKILL the server part way through."""
    task = asyncio.create_task(stream_turns(f"http://127.0.0.1:{server.port}", round_no, streams))
    await asyncio.sleep(rng.uniform(0.05, 0.6))
    server.process.kill()
    return await task


async def kill_under_load(server: Server, round_no: int, clients: int, rng: random.Random
                          ) -> tuple[list[str], int, list[float]]:
    """`clients` clients stream back to back on the three wires; SIGKILL after 2-4 s.
    The texts of the turns that ended complete, how many streams were started, and how long
    each completed one took."""
    completed: list[str] = []
    durations: list[float] = []
    started = 0
    stop = asyncio.Event()
    wires = list(WIRES)

    async def client_loop(i: int, client: httpx.AsyncClient) -> None:
        nonlocal started
        n = 0
        while not stop.is_set():
            text = f"round {round_no} client {i} turn {n}"
            started += 1
            took = await stream_one(client, wires[i % len(wires)], text, f"user{i % LOAD_USERS}")
            if took is not None:
                completed.append(text)
                durations.append(took)
            n += 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=30, limits=limits) as client:
        loops = [asyncio.create_task(client_loop(i, client)) for i in range(clients)]
        await asyncio.sleep(rng.uniform(2.0, 4.0))
        server.process.kill()
        stop.set()
        await asyncio.gather(*loops)
    return completed, started, durations


def unsaved_answers(log: Path) -> int:
    """Answers the server sent before their commit, as its last such log line counts them (a lower
    bound: the lines are at most one every 10 s, and the process is killed)."""
    counts = [int(found) for found in re.findall(r"(\d+) in all \(memproxy_answers_unsaved_total\)",
                                                 log.read_text(errors="replace"))]
    return max(counts, default=0)


def answered_turns(db: Path) -> set[str]:
    """User texts of turns stored with an answer."""
    with sqlite3.connect(db) as check:
        return {row[0] for row in check.execute(ANSWERED)}


async def answered_turns_pg(url: str) -> set[str]:
    conn = await asyncpg.connect(url)
    try:
        return {row[0] for row in await conn.fetch(ANSWERED)}
    finally:
        await conn.close()


def integrity(db: Path) -> str:
    with sqlite3.connect(db) as check:
        return str(check.execute("PRAGMA integrity_check").fetchone()[0])


@contextmanager
def store_url(store: str, work: Path) -> Iterator[str]:
    """The store.url of a fresh store of the kind."""
    if store == "sqlite":
        yield f"sqlite:///{work / 'memproxy.db'}"
        return
    with throwaway_postgres() as postgres:
        yield postgres.url()


def run(rounds: int, streams: int, seed: int, store: str = "sqlite", clients: int = 0) -> dict[str, object]:
    """All rounds; integrity and turns lost (docs/performance.md)."""
    rng = random.Random(seed)
    completed: list[str] = []
    durations: list[float] = []
    ok_rounds = started_streams = unsaved = 0
    began = time.monotonic()
    with Targets("memproxy-faults-") as targets:
        work = targets.workdir
        upstream = targets.mock(events=20, delay_ms=10).url("/v1")
        with store_url(store, work) as url:
            for round_no in range(rounds):
                server = targets.memproxy(upstream, name=f"memproxy-{round_no + 1}", store_url=url)
                if clients:
                    done, tried, took = asyncio.run(kill_under_load(server, round_no, clients, rng))
                    started_streams += tried
                    durations += took
                else:
                    done = asyncio.run(kill_during(server, round_no, streams, rng))
                completed += done
                server.process.wait(10)
                unsaved += unsaved_answers(server.log)
                ok_rounds += store != "sqlite" or integrity(work / "memproxy.db") == "ok"
                print(f"round {round_no + 1}/{rounds}: {len(completed)} completed so far", file=sys.stderr)
            targets.memproxy(upstream, "warning", name="memproxy-last", store_url=url).stop()  # recovery at start-up
            stored = answered_turns(work / "memproxy.db") if store == "sqlite" else asyncio.run(answered_turns_pg(url))
        lost = sorted(set(completed) - stored)
    return {"store": store, "rounds": rounds, "clients": clients, "streams_per_round": streams,
            "streams_started": started_streams, "integrity_ok": ok_rounds, "completed_turns": len(completed),
            "turns_lost": len(lost), "lost": lost[:10], "answers_unsaved_at_least": unsaved,
            "stream_ms_p50": _ms(durations, 50), "stream_ms_p95": _ms(durations, 95),
            "seconds": round(time.monotonic() - began, 1)}


def _ms(seconds: list[float], q: float) -> float | None:
    """The q-th percentile of `seconds` in ms, None when there are none."""
    return round(1000 * percentile(seconds, q), 1) if seconds else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--streams", type=int, default=50, help="a burst round's streams")
    parser.add_argument("--clients", type=int, default=0,
                        help="rounds under load: this many clients streaming back to back, killed after 2-4 s")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--seed", type=int, default=7)
    json_option(parser, help="print one JSON object")
    args = parser.parse_args()
    result = run(args.rounds, args.streams, args.seed, args.store, args.clients)
    if args.json:
        print_json(result)
    else:
        print(f"store: {result['store']}; integrity_check ok: {result['integrity_ok']}/{result['rounds']}")
        print(f"turns completed (client saw the end event): {result['completed_turns']}, turns lost:"
              f" {result['turns_lost']}; answers sent before their commit: at least {result['answers_unsaved_at_least']}")
        if args.clients:
            print(f"completed streams, ms: p50 {result['stream_ms_p50']}, p95 {result['stream_ms_p95']}")
    raise SystemExit(0 if result["turns_lost"] == 0 and result["integrity_ok"] == result["rounds"] else 1)


if __name__ == "__main__":
    main()
