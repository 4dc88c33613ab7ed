"""What a turn records when the upstream fails or the client leaves (refused,
cut, 500, malformed, reset, error event, gone during recall; memory on): the user's message once, no answer (so nothing
of the failed step reaches extraction), and the turn's status saying what happened."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import httpx
import openai
import pytest

from proxy.memory.retrieval.base import Query, Retrieved
from proxy.http.responses import PING
from proxy.models import Scope
from tests.conftest import free_port
from tests.fake_upstream import (
    DONE,
    JsonReply,
    RawReply,
    SSEReply,
    chunk,
    completion,
    stream_events,
)
from tests.proxy_db import eventually, rows

USER = {"x-memory-user": "alice"}
ERROR_EVENT = b'data: {"error": {"message": "overloaded mid-stream", "type": "server_error", "code": null}}\n\n'


def ask(proxy: Any, text: str, *, stream: bool = False, timeout: float = 10) -> httpx.Response:
    with proxy.http(timeout=timeout) as http:
        return http.post("/v1/chat/completions", headers=USER,
                         json={"model": "m", "stream": stream, "messages": [{"role": "user", "content": text}]})


def only_the_question_saved(proxy: Any, text: str, status: str) -> None:
    assert eventually(lambda: rows(proxy, "SELECT status FROM turns") == [(status,)]), rows(proxy, "SELECT * FROM turns")
    assert rows(proxy, "SELECT role, content FROM messages") == [("user", text)]  # nothing of the failed step


FAULTS = {
    # case 5: the stream stalls past upstream.idle_timeout_s
    "stall": (SSEReply(stream_events(pieces=4), stall_after=2), True, "truncated"),
    # case 12: the connection is reset mid-stream
    "reset": (SSEReply(stream_events(pieces=4), reset_after=2), True, "truncated"),
    # case 13: the provider sends an error event mid-stream
    "error event": (SSEReply(stream_events()[:2] + [ERROR_EVENT]), True, "upstream_failed"),
    # case 6: a 500 with a JSON body (no retry here: the raw client does not retry)
    "500": (JsonReply({"error": {"message": "boom", "type": "server_error"}}, status=500), False, "upstream_failed"),
    # case 9: a 200 whose JSON body cannot be parsed
    "malformed 200": (JsonReply(b'{"choices": [', status=200), False, "unparseable"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_failed_step_saves_the_question_once_no_answer_and_says_why(make_proxy, fake, fault):
    reply, stream, status = FAULTS[fault]
    proxy = make_proxy(memory__commit_timeout_ms=5000, upstream__idle_timeout_s=0.5)
    fake.queue(reply)
    response = ask(proxy, f"question before a {fault}", stream=stream)
    assert response.headers["x-memory-status"] == "ok"
    only_the_question_saved(proxy, f"question before a {fault}", status)


def test_an_unreachable_upstream_saves_the_question_and_marks_the_turn_failed(make_proxy):
    # case 1: connection refused
    proxy = make_proxy(upstream__base_url=f"http://127.0.0.1:{free_port()}/v1", memory__commit_timeout_ms=5000)
    response = ask(proxy, "anyone there?", stream=False)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unavailable"
    assert response.headers["x-memory-proxy-error"] == "upstream_unavailable"  # memproxy's own, not the provider's
    only_the_question_saved(proxy, "anyone there?", "upstream_failed")


class SlowRecall:
    """The app's own retriever, answering only after `seconds` (a store under heavy load)."""

    def __init__(self, inner: Any, seconds: float) -> None:
        self.inner = inner
        self.seconds = seconds
        self.started = 0

    async def retrieve(self, scope: Scope, query: Query) -> Retrieved:
        self.started += 1
        await asyncio.sleep(self.seconds)
        return await self.inner.retrieve(scope, query)

    def forget(self, user: str) -> None:
        self.inner.forget(user)


def test_a_client_leaving_during_recall_never_reaches_the_upstream(make_proxy, fake, caplog):
    # case 17: the client goes away while memory is still being recalled
    caplog.set_level(logging.INFO)
    proxy = make_proxy(memory__retrieval_timeout_ms=5000, memory__commit_timeout_ms=5000)
    memory = proxy.app.state.parts.memory
    slow = SlowRecall(memory.retriever, 1.5)
    memory.retriever = slow
    with pytest.raises(httpx.ReadTimeout):
        ask(proxy, "leaving early", timeout=0.4)
    assert eventually(lambda: slow.started == 1)
    time.sleep(2.0)  # past the moment the recall would have finished
    assert fake.chat_requests() == []
    assert fake.connections == [] or all(c.closed is not None for c in fake.connections)
    assert rows(proxy, "SELECT count(*) FROM turns WHERE status = 'complete'") == [(0,)]
    assert rows(proxy, "SELECT role FROM messages WHERE role = 'assistant'") == []
    # A client leaving is ordinary (case 16): logged as such, nothing at ERROR, no traceback.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert [getattr(r, "outcome", None) for r in caplog.records if r.getMessage() == "request"] == ["client_gone"]
    # The proxy still serves the next request in full.
    memory.retriever = slow.inner
    assert ask(proxy, "still there?", stream=False).status_code == 200


def test_raw_reply_closing_before_headers_is_a_failed_turn(make_proxy, fake):
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    fake.queue(RawReply(b""))
    assert ask(proxy, "closed on me", stream=False).status_code == 502
    only_the_question_saved(proxy, "closed on me", "upstream_failed")


def test_a_tool_loop_and_its_retry_while_memory_is_degraded_are_one_turn(make_proxy, fake):
    # One turn, one copy, even while the store cannot be asked (here: no time for the turn lookup at all): the
    # steps and an SDK retry repeat the turn's history, so they are the same turn, and the
    # user's message and the answer are each saved once. (A long window: no test straddles it.)
    proxy = make_proxy(memory__retrieval_timeout_ms=0, memory__commit_timeout_ms=5000, memory__retry_window_s=3600,
                       extraction__from_roles=[])
    client = proxy.client(**{"X-Memory-User": "alice"})
    question = [{"role": "user", "content": "please look up order 8812"}]
    fake.queue(JsonReply(completion(None, tool_calls=[{"id": "call_a", "name": "lookup", "arguments": "{}"}])))
    first = client.chat.completions.with_raw_response.create(model="m", messages=question)
    step = question + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "shipped"}]
    second = client.chat.completions.with_raw_response.create(model="m", messages=step)
    retried = client.chat.completions.with_raw_response.create(model="m", messages=step)
    assert {r.headers["x-memory-status"] for r in (first, second, retried)} == {"degraded: retrieval timeout"}
    assert first.headers["x-memory-turn"] == second.headers["x-memory-turn"] == retried.headers["x-memory-turn"]
    assert eventually(lambda: rows(proxy, "SELECT status FROM turns") == [("complete",)])
    assert rows(proxy, "SELECT role, content FROM messages ORDER BY seq") == [
        ("user", "please look up order 8812"), ("assistant", "Hello from upstream")]
    assert rows(proxy, "SELECT count(DISTINCT conversation_id) FROM messages") == [(1,)]
    # A new question is a new turn.
    later = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "and order 8813?"}])
    assert later.headers["x-memory-turn"] != first.headers["x-memory-turn"]


def test_a_tool_loop_whose_next_step_finds_memory_degraded_stays_one_turn(make_proxy, fake):
    # Step one is identified by the store; step two cannot ask it (the circuit opened in
    # between). The step is still the same turn, in the conversation the turn began in.
    proxy = make_proxy(memory__commit_timeout_ms=5000, extraction__from_roles=[])
    client = proxy.client(**{"X-Memory-User": "alice"})
    earlier = [{"role": "user", "content": "hello"}]
    client.chat.completions.create(model="m", messages=earlier)  # the conversation the loop continues
    question = [*earlier, {"role": "assistant", "content": "Hello from upstream"},
                {"role": "user", "content": "please look up order 8812"}]
    fake.queue(JsonReply(completion(None, tool_calls=[{"id": "call_a", "name": "lookup", "arguments": "{}"}])))
    first = client.chat.completions.with_raw_response.create(model="m", messages=question)
    assert first.headers["x-memory-status"] == "ok"
    breaker = proxy.app.state.parts.memory.breaker
    while not breaker.is_open:
        breaker.failed()
    step = [*question, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "shipped"}]
    second = client.chat.completions.with_raw_response.create(model="m", messages=step)
    assert second.headers["x-memory-status"] == "degraded: circuit open"
    assert second.headers["x-memory-turn"] == first.headers["x-memory-turn"]
    assert eventually(lambda: rows(proxy, "SELECT count(*) FROM turns WHERE status = 'pending'") == [(0,)])
    assert rows(proxy, "SELECT count(DISTINCT conversation_id), count(*) FROM messages") == [(1, 4)]
    assert rows(proxy, "SELECT count(*) FROM conversations") == [(1,)]
    assert rows(proxy, "SELECT content FROM messages WHERE role = 'user' ORDER BY seq") == [
        ("hello",), ("please look up order 8812",)]


def test_a_stream_cut_mid_line_still_ends_with_an_error_the_sdk_reads(make_proxy, fake):
    # A stream cut mid-line: the error event must not join the half line the upstream left.
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    events = stream_events(pieces=3, done=False)[:3] + [b"da"]
    fake.queue(SSEReply(events, cut_after=len(events)))
    with pytest.raises(openai.APIError) as caught:
        stream = proxy.client(**USER).chat.completions.create(
            model="m", stream=True, messages=[{"role": "user", "content": "cut me"}])
        for _ in stream:
            pass
    assert "ended before completion" in str(caught.value)
    only_the_question_saved(proxy, "cut me", "truncated")


def test_done_without_its_blank_line_is_a_complete_answer(make_proxy, fake):
    # The provider sent `data: [DONE]` and closed without the blank line after it: the client
    # got the whole answer, so it is saved, and nothing is appended to what the provider sent.
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    events = stream_events()[:-1] + [b"data: [DONE]\n"]
    fake.queue(SSEReply(events))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", headers=USER,
                             json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert response.content == b"".join(events)
    assert eventually(lambda: rows(proxy, "SELECT status FROM turns") == [("complete",)])
    assert rows(proxy, "SELECT role, content FROM messages ORDER BY seq") == [
        ("user", "hi"), ("assistant", "Hello from upstream")]


def test_an_answer_past_the_bound_is_not_saved_cut_short(make_proxy, fake):
    # Past DEFAULT_MAX_CHARS accumulation stops and the turn is too_large.
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    piece = "lorem ipsum " * 10_000  # 120,000 characters
    events = [chunk({"role": "assistant", "content": ""})] + [chunk({"content": piece})] * 9 + [
        chunk({}, finish="stop"), DONE]
    fake.queue(SSEReply(events))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", headers=USER,
                             json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "long"}]})
    assert response.content == b"".join(events)  # the client gets it all
    only_the_question_saved(proxy, "long", "too_large")


def test_other_choices_never_crowd_out_choice_0(make_proxy, fake):
    # With n > 1 choice 0 is the answer; long other choices do not count against its bound.
    proxy = make_proxy(memory__commit_timeout_ms=5000)

    def choice(index: int, text: str) -> bytes:
        body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": index, "delta": {"content": text}, "finish_reason": None}]}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    big = "x" * 600_000
    events = [choice(1, big), choice(2, big), choice(0, "The short answer."), DONE]
    fake.queue(SSEReply(events))
    with proxy.http() as http:
        http.post("/v1/chat/completions", headers=USER,
                  json={"model": "m", "stream": True, "n": 3, "messages": [{"role": "user", "content": "three"}]})
    assert eventually(lambda: rows(proxy, "SELECT status FROM turns") == [("complete",)])
    assert rows(proxy, "SELECT role, content FROM messages ORDER BY seq") == [
        ("user", "three"), ("assistant", "The short answer.")]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models"])
def test_a_json_body_cut_after_its_headers_closes_the_connection_quietly(make_proxy, fake, caplog, path):
    # A status already sent cannot change, so the connection closes (a short body); the
    # turn says truncated, and nothing is logged at ERROR: it is an expected event (case 12).
    caplog.set_level(logging.INFO)
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    fake.queue(RawReply(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n"
                        b'{"choices": [1, 2'))
    with proxy.http() as http, pytest.raises(httpx.RemoteProtocolError):
        if path == "/v1/models":
            http.get(path)
        else:
            http.post(path, headers=USER, json={"model": "m", "messages": [{"role": "user", "content": "cut"}]})
    if path != "/v1/models":
        only_the_question_saved(proxy, "cut", "truncated")
    assert eventually(lambda: any(getattr(r, "outcome", None) == "upstream_cut" for r in caplog.records))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("headers", [{}, USER], ids=["memory off", "memory on"])
def test_a_stream_reset_mid_way_is_logged_as_an_expected_event(make_proxy, fake, caplog, headers):
    # A connection reset (RST) mid-stream ends with the truncation
    # event, and it is an expected event: nothing at ERROR, no traceback, in any logger.
    caplog.set_level(logging.DEBUG)
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    events = stream_events(pieces=4)
    fake.queue(SSEReply(events, reset_after=3))
    with proxy.http() as http:
        body = http.post("/v1/chat/completions", headers=headers,
                         json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "reset"}]}).content
    assert body.startswith(b"".join(events[:3])) and body.endswith(b'"code":"stream_truncated"}}\n\n')
    if headers:
        only_the_question_saved(proxy, "reset", "truncated")  # the turn's write has run, too
    assert eventually(lambda: [getattr(r, "outcome", None) for r in caplog.records if r.getMessage() == "request"])
    assert any(r.getMessage() == "upstream stream cut: stream_truncated" for r in caplog.records)  # seen, at INFO
    assert [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert [(r.name, r.getMessage()) for r in caplog.records if r.exc_info] == []


def test_a_silent_stream_gets_pings_between_events_and_the_answer_is_untouched(make_proxy, fake):
    # While the model is silent, `: ping` comments keep the
    # connection's idle timers from firing; never inside an event, and the SDK skips them.
    proxy = make_proxy(memory__commit_timeout_ms=5000, server__heartbeat_s=0.1)
    events = stream_events(pieces=2)
    half = events[1][:10]  # a pause in the middle of an event must not get a ping
    fake.queue(SSEReply([events[0], half, events[1][10:], *events[2:]], delay=0.3))  # 0.3 s before each chunk
    with proxy.http() as http:
        raw = http.post("/v1/chat/completions", headers=USER,
                        json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "think"}]}).content
    assert raw.replace(PING, b"") == b"".join(events)  # the provider's bytes, in order
    assert raw.count(PING) >= 2
    assert half + PING not in raw  # none inside the half-sent event
    assert eventually(lambda: rows(proxy, "SELECT status FROM turns") == [("complete",)])
    assert rows(proxy, "SELECT content FROM messages WHERE role = 'assistant'") == [("Hello from upstream",)]
    fake.queue(SSEReply(stream_events(pieces=2), delay=0.15))
    text = "".join(c.choices[0].delta.content or "" for c in proxy.client(**USER).chat.completions.create(
        model="m", stream=True, messages=[{"role": "user", "content": "again"}]) if c.choices)
    assert text == "Hello from upstream"  # the SDK reads through the pings
