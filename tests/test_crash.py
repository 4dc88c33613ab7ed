"""kill -9 while turns stream: the database stays sound and no completed turn is lost.

A few rounds here; bench/faults.py runs 50.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.fake_upstream import SSEReply, stream_events

pytestmark = pytest.mark.faults
ROUNDS = 3
STREAMS = 20


def start_server(db: Path, upstream: str, log: Path | None = None, **env_settings: str
                 ) -> tuple[subprocess.Popen, str]:
    """`memproxy serve` in its own process; `env_settings` are MEMPROXY_* variables (server_grace_period_s=...)."""
    port = free_port()
    env = {**os.environ, "MEMPROXY_STORE_URL": f"sqlite:///{db}", "MEMPROXY_UPSTREAM_BASE_URL": upstream,
           "MEMPROXY_SERVER_PORT": str(port), "MEMPROXY_SERVER_LOG_LEVEL": "warning",
           **{f"MEMPROXY_{key.upper()}": value for key, value in env_settings.items()}}
    if log is None:
        process = subprocess.Popen([sys.executable, "-m", "proxy", "serve"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        with log.open("ab") as output:  # the child keeps its own copy
            process = subprocess.Popen([sys.executable, "-m", "proxy", "serve"], env=env, stdout=output,
                                       stderr=output)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
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
            task = asyncio.create_task(stream_turns(url, round_no, completed))
            await asyncio.sleep(rng.uniform(0.1, 0.35))
            os.kill(process.pid, signal.SIGKILL)
            await task

        asyncio.run(run_and_kill())
        process.wait(10)
        with sqlite3.connect(db) as check:
            assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    process, url = start_server(db, fake.url)  # recovery runs at start-up
    try:
        with sqlite3.connect(db) as check:
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
