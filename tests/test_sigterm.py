"""SIGTERM during streams, on `memproxy serve` in its own process:
it stops accepting connections, lets the running streams finish with [DONE], commits their
turns, and exits 0."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
from typing import Any

import httpx
import pytest

from proxy.http.asgi import Sent
from tests.fake_upstream import (
    JsonReply,
    Reply,
    SlowHeaders,
    SSEReply,
    _head,
    completion,
    stream_events,
)
from tests.fake_responses import output
from tests.fake_responses import stream as responses_stream
from tests.test_crash import start_server
from tests.proxy_db import sqlite_file

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
            # Every stream under way at the provider, however long a busy machine took to get there.
            while len(fake.chat_requests()) < STREAMS:
                await asyncio.sleep(0.01)
            os.kill(process.pid, signal.SIGTERM)
            refused_while_streaming = await _refuses_connections(url, until=asyncio.gather(*streams))
            return list(await asyncio.gather(*streams)), refused_while_streaming

        bodies, refused_while_streaming = asyncio.run(run())
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)  # reaped: an unreaped child warns in a later test
    assert refused_while_streaming  # no new connection once SIGTERM came, though streams still ran
    assert all(body.endswith(b"data: [DONE]\n\n") for body in bodies)
    with sqlite_file(db) as conn:
        saved = conn.execute("SELECT role, content FROM messages ORDER BY role, content").fetchall()
        statuses = conn.execute("SELECT status, count(*) FROM turns GROUP BY status").fetchall()
    assert saved == [("assistant", "a full answer")] * STREAMS + [("user", f"question {n}") for n in range(STREAMS)]
    assert statuses == [("complete", STREAMS)]


async def _refuses_connections(url: str, until: asyncio.Future[Any]) -> bool:
    """True once a new connection is refused (or reset unserved) while `until` still runs (the streams)."""
    while not until.done():
        try:
            async with httpx.AsyncClient(timeout=1) as client:  # a new connection each time
                await client.get(url + "/healthz")
        except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
            return not until.done()
        await asyncio.sleep(0.02)
    return False


def test_sigterm_with_nothing_running_exits_at_once(fake, tmp_path):
    process, _ = start_server(tmp_path / "idle.db", fake.url)
    started = time.monotonic()
    os.kill(process.pid, signal.SIGTERM)
    try:
        assert process.wait(10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)  # reaped: an unreaped child warns in a later test
    assert time.monotonic() - started < 5


def test_at_the_end_of_the_grace_period_a_stream_gets_an_error_event_and_a_waiting_request_a_503(fake, tmp_path):
    # What still runs at the deadline is ended properly and its turn is interrupted.
    db, log = tmp_path / "grace.db", tmp_path / "grace.log"
    fake.queue(SSEReply(stream_events("slow " * 40, pieces=40), delay=0.15))  # about 6 s
    fake.queue(SlowHeaders(6.0, JsonReply(completion("too late"))))
    process, url = start_server(db, fake.url, log, server_grace_period_s="1.5", server_log_level="info")
    try:
        async def run() -> tuple[bytes, httpx.Response, float]:
            streamed = asyncio.create_task(stream(url, 0))
            await asyncio.sleep(0.3)
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                waiting = asyncio.create_task(client.post("/v1/chat/completions", headers={"x-memory-user": "alice"},
                    json={"model": "m", "messages": [{"role": "user", "content": "question 1"}]}))
                await asyncio.sleep(0.3)
                os.kill(process.pid, signal.SIGTERM)
                stopped = time.monotonic()
                body, answer = await streamed, await waiting
            return body, answer, time.monotonic() - stopped

        body, answer, took = asyncio.run(run())
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)  # reaped: an unreaped child warns in a later test
    assert 1.4 < took < 4  # the grace period (1.5 s), not the 6 s the provider would have taken
    assert b"[DONE]" not in body
    assert body.endswith(b'data: {"error":{"message":"memproxy is shutting down and could not finish this response",'
                         b'"type":"server_error","param":null,"code":"server_shutting_down"}}\n\n')
    assert (answer.status_code, answer.headers["x-memory-proxy-error"]) == (503, "server_shutting_down")
    assert answer.json()["error"]["code"] == "server_shutting_down"
    with sqlite_file(db) as conn:  # as the process left them, before any restart's recovery
        turns = conn.execute("SELECT t.status, m.content FROM turns t JOIN messages m ON m.turn_key = t.turn_key"
                             " ORDER BY m.content").fetchall()
    assert turns == [("interrupted", "question 0"), ("interrupted", "question 1")]
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert [line["msg"] for line in lines if line["level"] == "error"] == []


# In process: the test fixture's server stops with a 2 s grace period (tests/conftest.py).

def _stop_later(proxy: Any, after_s: float) -> threading.Thread:
    def stop() -> None:
        time.sleep(after_s)
        proxy.stop()

    stopper = threading.Thread(target=stop)
    stopper.start()
    return stopper


def test_the_503_at_the_deadline_says_the_memory_status_and_turn(proxy, fake):
    fake.queue(SlowHeaders(8.0, JsonReply(completion("too late"))))
    stopper = _stop_later(proxy, 0.5)
    with proxy.http(timeout=20) as http:
        answer = http.post("/v1/chat/completions", headers={"x-memory-user": "alice"},
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    stopper.join(15)
    assert (answer.status_code, answer.headers["x-memory-proxy-error"]) == (503, "server_shutting_down")
    assert answer.headers["x-memory-status"] == "ok"  # every chat response says it
    assert answer.headers["x-memory-turn"]


class _EventStream500(Reply):
    """A 500 sent as an event stream with a Content-Length, whose body stops half way."""

    async def write(self, request: Any, writer: asyncio.StreamWriter) -> bool:
        body = b'data: {"error": {"message": "boom", "type": "server_error"}}\n\n'
        writer.write(_head(500, [("content-type", "text/event-stream"), ("content-length", str(len(body)))])
                     + body[:10])
        await writer.drain()
        await asyncio.sleep(30)
        return False


def test_a_sized_event_stream_at_the_deadline_is_closed_without_an_error_traceback(proxy, fake, caplog):
    # Its Content-Length leaves no room for an event: appending one made uvicorn raise.
    caplog.set_level(logging.INFO)
    fake.queue(_EventStream500())
    stopper = _stop_later(proxy, 0.5)
    with proxy.http(timeout=20) as http, http.stream(
            "POST", "/v1/chat/completions", headers={"x-memory-user": "alice"},
            json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as response:
        assert response.status_code == 500
        with pytest.raises(httpx.RemoteProtocolError):  # cut short, as the provider left it
            response.read()
    stopper.join(15)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_send_cancelled_while_it_waits_for_the_socket_counts_as_not_sent() -> None:
    # uvicorn waits for the socket to drain before it writes: a send cancelled there (the grace
    # period over, a slow reader) wrote nothing, and the error event must not be joined to it.
    async def body() -> tuple[bytes, bool]:
        written: list[bytes] = []
        drained = asyncio.Event()

        async def send(message: dict[str, Any]) -> None:  # as uvicorn's: wait for room, then write
            await drained.wait()
            written.append(message.get("body", b""))

        sent = Sent(send)
        drained.set()
        await sent({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await sent({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        drained.clear()
        half = asyncio.create_task(sent({"type": "http.response.body", "body": b"data: {half", "more_body": True}))
        await asyncio.sleep(0)
        half.cancel()
        await asyncio.gather(half, return_exceptions=True)
        return sent.tail, sent.open_stream

    assert asyncio.run(body()) == (b"{}\n\n", True)  # the tail of what was written, not of the cancelled send


def test_a_responses_stream_at_the_deadline_ends_with_the_next_sequence_number(proxy, fake):
    fake.queue(SSEReply(responses_stream(output("slow " * 30), pieces=30), delay=0.2))  # about 8 s
    stopper = _stop_later(proxy, 1.0)
    with proxy.http(timeout=20) as http, http.stream(
            "POST", "/v1/responses", json={"model": "m", "stream": True, "input": "hi"}) as response:
        body = response.read()
    stopper.join(15)
    events = [json.loads(chunk.split(b"data: ", 1)[1]) for chunk in body.split(b"\n\n") if b"data: " in chunk]
    assert events[-1]["type"] == "error" and events[-1]["code"] == "server_shutting_down"
    assert len(events) > 2 and [e["sequence_number"] for e in events] == list(range(len(events)))
