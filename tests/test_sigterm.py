"""SIGTERM during streams (RELIABILITY 5.2 case 24), on `memproxy serve` in its own process:
it stops accepting connections, lets the running streams finish with [DONE], commits their
turns, and exits 0."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time

import httpx
import pytest

from tests.fake_upstream import SSEReply, stream_events
from tests.test_crash import start_server

pytestmark = pytest.mark.faults
STREAMS = 6


async def stream(url: str, n: int) -> bytes:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": f"question {n}"}]}
    async with httpx.AsyncClient(base_url=url, timeout=30) as client, client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"x-memory-user": "alice"}) as response:
        return b"".join([piece async for piece in response.aiter_raw()])


def test_sigterm_lets_running_streams_finish_saves_their_turns_and_exits_0(fake, tmp_path):
    db = tmp_path / "term.db"
    for _ in range(STREAMS):
        fake.queue(SSEReply(stream_events("a full answer", pieces=20), delay=0.05))  # about 1 s each
    process, url = start_server(db, fake.url)
    try:
        async def run() -> tuple[list[bytes], bool]:
            streams = [asyncio.create_task(stream(url, n)) for n in range(STREAMS)]
            await asyncio.sleep(0.3)  # every stream under way
            os.kill(process.pid, signal.SIGTERM)
            await asyncio.sleep(0.2)
            try:
                async with httpx.AsyncClient(timeout=1) as client:
                    await client.get(url + "/healthz")
                accepted = True
            except httpx.ConnectError:
                accepted = False
            return list(await asyncio.gather(*streams)), accepted

        bodies, accepted_after_sigterm = asyncio.run(run())
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert not accepted_after_sigterm
    assert all(body.endswith(b"data: [DONE]\n\n") for body in bodies)
    with sqlite3.connect(db) as conn:
        saved = conn.execute("SELECT role, content FROM messages ORDER BY role, content").fetchall()
        statuses = conn.execute("SELECT status, count(*) FROM turns GROUP BY status").fetchall()
    assert saved == [("assistant", "a full answer")] * STREAMS + [("user", f"question {n}") for n in range(STREAMS)]
    assert statuses == [("complete", STREAMS)]


def test_sigterm_with_nothing_running_exits_at_once(fake, tmp_path):
    process, _ = start_server(tmp_path / "idle.db", fake.url)
    started = time.monotonic()
    os.kill(process.pid, signal.SIGTERM)
    try:
        assert process.wait(10) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert time.monotonic() - started < 5
