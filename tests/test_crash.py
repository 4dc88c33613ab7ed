"""kill -9 while turns stream: the database stays sound and no completed turn is lost.

A few rounds here; bench/faults.py runs 50, and 10 under load on either store.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.conftest import PG_HASH_KEY, free_port
from tests.fake_upstream import SSEReply, stream_events
from tests.proxy_db import sqlite_file

pytestmark = pytest.mark.faults
ROUNDS = 3
STREAMS = 20


def start_server(db: Path | str, upstream: str, log: Path | None = None, *, start_within: float = 15.0,
                 **env_settings: str) -> tuple[subprocess.Popen, str]:
    """`memproxy serve` in its own process on the SQLite file `db` (or the store.url `db` names);
    `env_settings` are MEMPROXY_* variables (server_grace_period_s=...)."""
    port = free_port()
    url = db if isinstance(db, str) else f"sqlite:///{db}"
    env = {**os.environ, "MEMPROXY_STORE_URL": url, "MEMPROXY_UPSTREAM_BASE_URL": upstream,
           "MEMPROXY_SERVER_PORT": str(port), "MEMPROXY_SERVER_LOG_LEVEL": "warning",
           **{f"MEMPROXY_{key.upper()}": value for key, value in env_settings.items()}}
    if env["MEMPROXY_STORE_URL"].startswith("postgresql"):
        env.setdefault("MEMPROXY_STORE_HASH_KEY", PG_HASH_KEY)
    if log is None:
        process = subprocess.Popen([sys.executable, "-m", "proxy", "serve"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        with log.open("ab") as output:  # the child keeps its own copy
            process = subprocess.Popen([sys.executable, "-m", "proxy", "serve"], env=env, stdout=output,
                                       stderr=output)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_within
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=0.5).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.05)
    process.kill()
    process.wait(10)  # reaped: an unreaped child warns in a later test
    raise RuntimeError("proxy did not start")


async def stream_turns(url: str, round_no: int, completed: list[str]) -> None:
    async def one(i: int, client: httpx.AsyncClient) -> None:
        text = f"round {round_no} turn {i}"
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": text}]}
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body,
                                     headers={"x-memory-user": f"u{i % 5}"}) as response:
                data = b"".join([piece async for piece in response.aiter_raw()])
        except httpx.HTTPError:
            return
        if data.endswith(b"data: [DONE]\n\n"):
            completed.append(text)

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await asyncio.gather(*(one(i, client) for i in range(STREAMS)))


def test_kill_9_rounds_keep_every_completed_turn(fake, tmp_path):
    db = tmp_path / "crash.db"
    completed: list[str] = []
    rng = random.Random(7)
    for round_no in range(ROUNDS):
        for _ in range(STREAMS):
            fake.queue(SSEReply(stream_events("an answer", pieces=8), delay=rng.uniform(0.005, 0.03)))
        process, url = start_server(db, fake.url)

        async def run_and_kill() -> None:
            before = len(completed)
            task = asyncio.create_task(stream_turns(url, round_no, completed))
            # Killed while the burst is under way: once its first stream completed (a fixed delay saw
            # none complete on a busy host, or all of them on a quiet one), a random moment after.
            deadline = time.monotonic() + 10
            while len(completed) == before and not task.done() and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            await asyncio.sleep(rng.uniform(0.0, 0.05))
            os.kill(process.pid, signal.SIGKILL)
            await task

        asyncio.run(run_and_kill())
        process.wait(10)
        with sqlite_file(db) as check:
            assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    process, url = start_server(db, fake.url)  # recovery runs at start-up
    try:
        with sqlite_file(db) as check:
            # Each completed turn: its full answer saved, and the turn complete.
            answered = {row[0] for row in check.execute(
                "SELECT u.content FROM messages u JOIN messages a ON a.user_id = u.user_id AND a.turn_key = u.turn_key"
                " JOIN turns t ON t.user_id = u.user_id AND t.turn_key = u.turn_key"
                " WHERE u.role = 'user' AND a.role = 'assistant' AND a.content = 'an answer' AND t.status = 'complete'")}
            statuses = dict(check.execute("SELECT status, count(*) FROM turns GROUP BY status").fetchall())
    finally:
        process.terminate()
        process.wait(10)
    assert completed, "no stream completed before the kill: the test proved nothing"
    assert set(completed) <= answered  # turns lost = 0
    # A turn the kill cut short is interrupted at the next start, never left pending.
    assert "pending" not in statuses
    assert statuses.get("complete", 0) >= len(completed)


# Each wire's path, request body for a text, and the event its stream ends with when complete.
WIRES: dict[str, tuple[str, Any, bytes]] = {
    "chat": ("/v1/chat/completions",
             lambda text: {"model": "m", "stream": True, "messages": [{"role": "user", "content": text}]},
             b"data: [DONE]"),
    "responses": ("/v1/responses", lambda text: {"model": "m", "stream": True, "input": text},
                  b"event: response.completed"),
    "messages": ("/v1/messages", lambda text: {"model": "m", "max_tokens": 64, "stream": True,
                                               "messages": [{"role": "user", "content": text}]},
                 b"event: message_stop"),
}
CLIENTS = 6
ANSWERED = ("SELECT u.content FROM messages u JOIN messages a ON a.user_id = u.user_id AND a.turn_key = u.turn_key"
            " WHERE u.role = 'user' AND a.role = 'assistant'")


@contextmanager
def writes_held(url: str, pg_url: str | None) -> Iterator[None]:
    """Another session holds the store's write lock (readers go on): every commit waits for it,
    as commits queue behind each other under load."""
    held, release = threading.Event(), threading.Event()

    def hold_sqlite() -> None:
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        held.set()
        release.wait(30)
        conn.execute("ROLLBACK")
        conn.close()

    async def hold_postgres(dsn: str) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            async with conn.transaction():
                await conn.execute("LOCK TABLE turns IN EXCLUSIVE MODE")  # blocks writes, not reads
                held.set()
                await asyncio.to_thread(release.wait, 30)
        finally:
            await conn.close()

    thread = threading.Thread(target=hold_sqlite if pg_url is None else lambda: asyncio.run(hold_postgres(pg_url)))
    thread.start()
    try:
        assert held.wait(10)
        yield
    finally:
        release.set()
        thread.join(10)


async def stream_back_to_back(url: str, round_no: int, stop: asyncio.Event, completed: list[str]) -> None:
    """CLIENTS clients on the three wires, each streaming turns one after another until `stop`."""
    async def client_loop(i: int, client: httpx.AsyncClient) -> None:
        path, body, end = WIRES[list(WIRES)[i % len(WIRES)]]
        n = 0
        while not stop.is_set():
            text = f"round {round_no} client {i} turn {n}"
            n += 1
            try:
                async with client.stream("POST", path, json=body(text), headers={"x-memory-user": f"u{i % 3}"}) as r:
                    data = b"".join([piece async for piece in r.aiter_raw()])
            except httpx.HTTPError:
                continue
            if r.status_code == 200 and data.rstrip().rsplit(b"\n\n", 1)[-1].startswith(end):  # the end event came last
                completed.append(text)

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await asyncio.gather(*(client_loop(i, client) for i in range(CLIENTS)))


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_kill_9_while_commits_lag_keeps_every_completed_stream(store, fake, tmp_path, request):
    # Clients stream back to back on the three wires; then the store's commits fall behind (another
    # session holds its write lock, as under load each commit queues behind others) and memproxy is
    # killed. A response whose end event the client got had its turn committed first, however long
    # that took: every completed stream's question and answer are in the store.
    pg_url = request.getfixturevalue("pg_url") if store == "postgres" else None
    url = pg_url or f"sqlite:///{tmp_path / 'lag.db'}"
    completed: list[str] = []
    for round_no in range(2):
        process, base = start_server(url, fake.url, memory_commit_timeout_ms="100",
                                     upstream_anthropic_base_url=fake.url)

        async def load_then_kill() -> None:
            stop = asyncio.Event()
            clients = asyncio.create_task(stream_back_to_back(base, round_no, stop, completed))
            await asyncio.sleep(0.6)
            with writes_held(url, pg_url):
                await asyncio.sleep(0.6)  # past memory.commit_timeout_ms: the answers wait for their commits
                os.kill(process.pid, signal.SIGKILL)
                stop.set()
                await clients

        asyncio.run(load_then_kill())
        process.wait(10)
    process, _ = start_server(url, fake.url)  # recovery runs at start-up
    try:
        if pg_url is None:
            with sqlite_file(url.removeprefix("sqlite:///")) as check:
                stored = {row[0] for row in check.execute(ANSWERED)}
        else:
            stored = asyncio.run(_answered_pg(pg_url))
    finally:
        process.terminate()
        process.wait(10)
    assert len(completed) >= CLIENTS, "too few streams completed: the test proved nothing"
    assert sorted(set(completed) - stored) == []  # turns lost = 0


async def _answered_pg(url: str) -> set[str]:
    conn = await asyncpg.connect(url)
    try:
        return {row[0] for row in await conn.fetch(ANSWERED)}
    finally:
        await conn.close()
