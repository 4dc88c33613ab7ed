"""Upstream and client faults, proxy side."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sqlite3
import ssl
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import free_port
from tests.fake_upstream import (
    DONE, JsonReply, RawReply, RefusingPort, SlowHeaders, SSEReply, chunk, raw_sockets_allowed, stream_events,
)
from tests.proxy_db import eventually, settled_turns

pytestmark = pytest.mark.faults
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_upstream_down_is_502_with_openai_error(make_proxy):
    proxy = make_proxy(upstream__base_url=f"http://127.0.0.1:{free_port()}/v1")
    for stream in (False, True):  # upstream down: streaming and not, the same answer
        with pytest.raises(openai.InternalServerError) as caught:
            answer = proxy.client().chat.completions.create(**CHAT, stream=stream)
            list(answer)  # a stream that did open would be read (and must not have)
        assert caught.value.status_code == 502
        assert caught.value.code == "upstream_unavailable"
        assert caught.value.response.headers["x-memory-proxy-error"] == "upstream_unavailable"
        assert caught.value.response.headers["x-memory-status"] == "off: no user"
    with proxy.http() as http:
        assert http.get("/v1/models").status_code == 502


@pytest.mark.skipif(not raw_sockets_allowed(), reason="counting refused connects needs a raw socket (CAP_NET_RAW)")
def test_sdk_retries_on_502_without_amplification(make_proxy):
    # Upstream down: with max_retries=2 the upstream sees at most 3 refused attempts
    # (the SDK's three, memproxy adding none), counted as SYNs to a port where nothing listens.
    port = RefusingPort(free_port())
    proxy = make_proxy(upstream__base_url=f"http://127.0.0.1:{port.port}/v1")
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=2)
    with port.watching(), pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(**CHAT)
    assert (caught.value.status_code, caught.value.code) == (502, "upstream_unavailable")
    assert (port.syns, port.resets, port.accepted) == (3, 3, 0)  # one refused connect per SDK attempt


def test_headers_never_come_is_504(make_proxy, fake):
    proxy = make_proxy(upstream__first_byte_timeout_s=0.5)
    fake.queue(SlowHeaders(3.0))
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as caught:
        proxy.client().chat.completions.create(**CHAT)
    assert caught.value.status_code == 504
    assert caught.value.code == "upstream_timeout"
    assert time.monotonic() - started < 0.5 + 1.0  # within the budget plus a second
    assert fake.wait_closed(5)  # the upstream connection was closed, not left hanging


def test_stall_mid_stream_ends_with_error_event(make_proxy, fake):
    proxy = make_proxy(upstream__idle_timeout_s=0.5)
    fake.queue(SSEReply(stream_events(pieces=4), stall_after=3))
    with pytest.raises(openai.APIError) as caught:
        for _ in proxy.client().chat.completions.create(**CHAT, stream=True):
            pass
    assert "upstream stopped sending" in str(caught.value)
    fake.queue(SSEReply(stream_events(pieces=4), stall_after=3))
    with proxy.http() as http:
        body = http.post("/v1/chat/completions", json={**CHAT, "stream": True}).content
    assert body.endswith(b'"code":"upstream_idle_timeout"}}\n\n')
    assert b"[DONE]" not in body


def test_a_stream_past_max_stream_is_cut_with_an_error_event(make_proxy, fake):
    # A hard cap on a stream's length (30 minutes by default), whatever the
    # pace: this one never falls silent for the idle timeout, yet it is cut at the cap.
    proxy = make_proxy(upstream__max_stream_s=0.6, upstream__idle_timeout_s=5)
    fake.queue(SSEReply(stream_events(pieces=20), delay=0.1))
    with proxy.http() as http:
        body = http.post("/v1/chat/completions", json={**CHAT, "stream": True}).content
    assert body.endswith(b'"code":"upstream_max_stream"}}\n\n')
    assert b"[DONE]" not in body and body.count(b"data: {\"id\"") < 20  # cut before its end


@pytest.mark.parametrize("how", ["cut_after", "reset_after"])
def test_cut_or_reset_stream_never_gets_done(proxy, fake, how):
    events = stream_events(pieces=5)
    fake.queue(SSEReply(events, **{how: 3}))
    with proxy.http() as http:
        body = http.post("/v1/chat/completions", json={**CHAT, "stream": True}).content
    assert body.startswith(b"".join(events[:3]))
    assert body[len(b"".join(events[:3])):] == (
        b'data: {"error":{"message":"upstream stream ended before completion","type":"upstream_error",'
        b'"param":null,"code":"stream_truncated"}}\n\n')
    fake.queue(SSEReply(events, **{how: 3}))
    with pytest.raises(openai.APIError, match="ended before completion"):
        for _ in proxy.client().chat.completions.create(**CHAT, stream=True):
            pass


def test_clean_end_without_done_counts_as_cut(proxy, fake):
    fake.queue(SSEReply(stream_events(done=False)))
    with proxy.http() as http:
        body = http.post("/v1/chat/completions", json={**CHAT, "stream": True}).content
    assert body.endswith(b'"code":"stream_truncated"}}\n\n')


def test_upstream_error_event_mid_stream_forwarded(proxy, fake):
    error = b'data: {"error": {"message": "overloaded mid-stream", "type": "server_error", "code": null}}\n\n'
    events = stream_events()[:2] + [error]
    fake.queue(SSEReply(events))
    with proxy.http() as http:
        body = http.post("/v1/chat/completions", json={**CHAT, "stream": True}).content
    assert body == b"".join(events)
    fake.queue(SSEReply(events))
    with pytest.raises(openai.APIError, match="overloaded mid-stream"):
        for _ in proxy.client().chat.completions.create(**CHAT, stream=True):
            pass


# A provider's 500 as it comes: end-to-end headers (a repeated one, odd spacing, a name in
# mixed case), and hop-by-hop ones that concern only the connection memproxy has with it.
ERROR_500 = b'{"error": {"message": "boom",  "type": "server_error", "param": null, "code": null}}\n'
END_TO_END = [("x-request-id", "req-500"), ("openai-processing-ms", "12"), ("set-cookie", "a=1; Path=/"),
              ("set-cookie", "b=2; Path=/"), ("X-Mixed-Case", "Value  With   Spaces"), ("retry-after-ms", "10"),
              ("x-should-retry", "true"), ("cache-control", "no-store")]
HOP_BY_HOP = [("connection", "keep-alive"), ("keep-alive", "timeout=5, max=100"), ("proxy-authenticate", "Basic")]


def _end_to_end(headers: httpx.Headers) -> list[tuple[str, str]]:
    """The client's response headers minus memproxy's own X-Memory-* ones, names in lower case."""
    return [(k.decode().lower(), v.decode()) for k, v in headers.raw if not k.lower().startswith(b"x-memory-")]


@pytest.mark.parametrize("headers", [{}, {"x-memory-user": "alice"}], ids=["memory off", "memory on"])
def test_upstream_500_passes_through_and_sdk_retries(proxy, fake, headers):
    # Upstream 500: status, body and headers byte-identical (the hop-by-hop ones
    # excepted, RFC 9110 7.6.1), no proxy retry; the SDK's own two retries make 3 calls.
    mixed = [END_TO_END[0], HOP_BY_HOP[0], *END_TO_END[1:5], HOP_BY_HOP[1], *END_TO_END[5:], HOP_BY_HOP[2]]
    fake.queue(JsonReply(ERROR_500, status=500, headers=mixed))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 500
    assert response.content == ERROR_500
    provider = [("content-type", "application/json"), *END_TO_END, ("content-length", str(len(ERROR_500)))]
    assert _end_to_end(response.headers) == [(k.lower(), v) for k, v in provider]  # in order, repeats kept
    assert len(fake.chat_requests()) == 1  # no retry by the proxy
    for _ in range(3):
        fake.queue(JsonReply(ERROR_500, status=500, headers=mixed))
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=2, default_headers=headers)
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(**CHAT)
    assert caught.value.status_code == 500
    assert caught.value.body == json.loads(ERROR_500)["error"]
    assert len(fake.chat_requests()) == 1 + 3


def test_a_header_the_providers_connection_header_names_is_not_forwarded(proxy, fake):
    fake.queue(JsonReply(ERROR_500, status=500, headers=[("connection", "keep-alive, x-hop-note"),
                                                         ("x-hop-note", "for memproxy's connection only"),
                                                         ("x-request-id", "req-500")]))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json=CHAT)
    assert response.headers["x-request-id"] == "req-500"
    assert "x-hop-note" not in response.headers


def test_upstream_429_headers_and_body_unchanged(proxy, fake):
    error = {"error": {"message": "Rate limit reached", "type": "requests", "param": None,
                       "code": "rate_limit_exceeded"}}
    headers = [("retry-after", "2"), ("retry-after-ms", "1500"), ("x-ratelimit-remaining-requests", "0"),
               ("x-ratelimit-reset-requests", "1s"), ("x-should-retry", "false")]
    fake.queue(JsonReply(error, status=429, headers=headers))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 429
    assert response.content == json.dumps(error).encode()
    for name, value in headers:
        assert response.headers[name] == value
    fake.queue(JsonReply(error, status=429, headers=headers))
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=2)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(**CHAT)
    assert len(fake.received) == 2  # x-should-retry: false was obeyed by the SDK


def test_after_a_429_the_sdk_waits_what_retry_after_ms_says_and_the_proxy_adds_nothing(proxy, fake):
    # Upstream 429: retry-after-ms (1.5 s) wins over retry-after (2 s).
    error = {"error": {"message": "Rate limit reached", "type": "requests", "param": None,
                       "code": "rate_limit_exceeded"}}
    fake.queue(JsonReply(error, status=429, headers=[("retry-after", "2"), ("retry-after-ms", "1500")]))
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=1)
    started = time.monotonic()
    answer = client.chat.completions.create(**CHAT)
    elapsed = time.monotonic() - started
    assert answer.choices[0].message.content == "Hello from upstream"
    assert len(fake.chat_requests()) == 2
    assert 1.5 <= elapsed < 1.9, elapsed


def test_sse_split_everywhere_is_forwarded_byte_identical(proxy, fake):
    # CRLF, CR, comments, event: lines, a BOM, a malformed line, multi-byte text split.
    raw = ("\ufeff: comment\r\n" + "event: message\r\ndata: " +
           json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                       "choices": [{"index": 0, "delta": {"content": "é🙂"}, "finish_reason": None}]},
                      ensure_ascii=False) + "\r\r" + "data: {not json}\n\n").encode()
    raw += chunk({}, finish="stop") + DONE
    pieces = [raw[i:i + 1] for i in range(len(raw))]
    fake.queue(SSEReply(pieces))
    with proxy.http() as http:
        body = http.post("/v1/chat/completions", json={**CHAT, "stream": True}).content
    assert body == raw


@pytest.mark.parametrize("headers", [{}, {"x-memory-user": "alice"}], ids=["memory off", "memory on"])
def test_each_event_reaches_the_client_before_the_upstream_writes_the_next(proxy, fake, headers):
    # A slow but live stream: no chunk is held back. The mock writes an event every 150 ms
    # and notes when; the client notes when each event is whole. An event that waited for
    # the next one (a buffer, a coalescing read) arrives after the mock wrote that next one.
    events = stream_events(pieces=5)
    reply = SSEReply(events, delay=0.15)
    fake.queue(reply)
    arrived, buffer = [], b""
    with proxy.http() as http, http.stream("POST", "/v1/chat/completions", headers=headers,
                                           json={**CHAT, "stream": True}) as response:
        for piece in response.iter_raw():
            now = time.monotonic()
            buffer += piece
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if not event.startswith(b":"):  # a `: ping` comment is not the provider's
                    arrived.append((now, event + b"\n\n"))
    assert [event for _, event in arrived] == events
    written = reply.written
    late = [(i, round(at - written[i], 3)) for i, (at, _) in enumerate(arrived[:-1]) if at >= written[i + 1]]
    assert late == [], late  # (event, seconds after the mock wrote it) for each one held back
    assert all(at >= written[i] for i, (at, _) in enumerate(arrived))  # the clocks agree


def test_client_disconnect_cancels_upstream(proxy, fake, caplog):
    for _ in range(20):
        fake.queue(SSEReply(stream_events(pieces=100), delay=0.05))
    closes = []
    for _ in range(20):
        with proxy.http() as http, http.stream("POST", "/v1/chat/completions",
                                               json={**CHAT, "stream": True}) as response:
            next(response.iter_raw())
            closed_at = time.monotonic()
        assert fake.wait_closed(5)
        closes.append(fake.connections[-1].closed - closed_at)
    assert max(closes) < 1.0, closes  # a client that leaves: the upstream is closed within 1 s
    # A client leaving is ordinary: nothing at ERROR or above, no traceback.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_client_disconnect_while_waiting_for_headers(proxy, fake):
    fake.queue(SlowHeaders(10))
    with pytest.raises(httpx.ReadTimeout):
        with proxy.http(timeout=0.5) as http:
            http.post("/v1/chat/completions", json=CHAT)
    assert fake.wait_closed(5)


def test_many_clients_disconnect_mid_stream_under_load(proxy, fake):
    for _ in range(64):
        fake.queue(SSEReply(stream_events(pieces=40), delay=0.02))

    async def one(i: int, client: httpx.AsyncClient) -> None:
        async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
            async for _ in response.aiter_raw():
                if i % 2 == 0:
                    break

    async def run() -> None:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30,
                                     limits=httpx.Limits(max_connections=64)) as client:
            await asyncio.gather(*(one(i, client) for i in range(64)))

    asyncio.run(run())
    assert fake.wait_idle(10)  # no upstream response left running for a client that left
    assert sum(c.closed is not None for c in fake.connections) >= 32
    assert proxy.client().chat.completions.create(**CHAT).choices[0].message.content == "Hello from upstream"


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _proxy_tasks(proxy) -> int:
    """How many asyncio tasks the proxy's event loop has (this probe's own included)."""
    async def count() -> int:
        return len(asyncio.all_tasks())

    return asyncio.run_coroutine_threadsafe(count(), proxy.server.servers[0].get_loop()).result(5)


def _leave_mid_stream(proxy, clients: int, first: int) -> None:
    """`clients` streamed chat requests at once, each client gone after the first chunk."""
    async def one(client: httpx.AsyncClient, i: int) -> None:
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": f"leaving {i}"}]}
        async with client.stream("POST", "/v1/chat/completions", json=body, headers={"x-memory-user": "alice"}
                                 ) as response:
            assert response.status_code == 200
            await anext(response.aiter_raw())

    async def run() -> None:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30,
                                     limits=httpx.Limits(max_connections=clients)) as client:
            await asyncio.gather(*(one(client, first + i) for i in range(clients)))

    asyncio.run(run())


def test_a_hundred_clients_leaving_mid_stream_leave_nothing_behind(proxy, fake, caplog):
    # After 100 disconnects mid-stream, the upstream connections are
    # closed and the process's file descriptors and the proxy's asyncio tasks are back at
    # their level before (a little slack for the store's and the pool's own bookkeeping).
    for _ in range(110):
        fake.queue(SSEReply(stream_events(pieces=50), delay=0.05))
    _leave_mid_stream(proxy, 10, first=0)  # warm up: the store, the writer, the pools exist
    assert fake.wait_closed(10)
    time.sleep(0.5)
    fds, tasks = _open_fds(), _proxy_tasks(proxy)
    fake.reset()
    for _ in range(100):
        fake.queue(SSEReply(stream_events(pieces=50), delay=0.05))
    for batch in range(4):
        _leave_mid_stream(proxy, 25, first=100 + 25 * batch)
    assert len(fake.chat_requests()) == 100
    assert fake.wait_closed(10), [c for c in fake.connections if c.closed is None]  # none left open upstream
    assert eventually(lambda: _open_fds() <= fds + 3 and _proxy_tasks(proxy) <= tasks + 2, timeout=10), (
        f"fds {fds} -> {_open_fds()}, tasks {tasks} -> {_proxy_tasks(proxy)}")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_malformed_json_200_forwarded(proxy, fake):
    fake.queue(JsonReply(b'{"choices": [', status=200))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert response.content == b'{"choices": ['


@pytest.mark.parametrize("reply", [b"", b"garbage, not HTTP\r\n\r\n"], ids=["closed", "garbage"])
def test_upstream_closing_or_garbling_before_headers_is_a_502_protocol_error(proxy, fake, reply):
    # Reset or garbage before headers is 502 upstream_protocol_error, marked as memproxy's.
    fake.queue(RawReply(reply))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_protocol_error"
    assert response.headers["x-memory-proxy-error"] == "upstream_protocol_error"


def test_sigterm_like_shutdown_lets_stream_finish(make_proxy, fake):
    proxy = make_proxy()
    fake.queue(SSEReply(stream_events(pieces=10), delay=0.1))
    with proxy.http() as http:
        with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
            pieces = response.iter_raw()
            first = next(pieces)
            proxy.server.should_exit = True  # what uvicorn's SIGTERM handler sets
            rest = b"".join(pieces)
    assert (first + rest).endswith(DONE)


def test_client_disconnect_on_streamed_post_passthrough(proxy, fake):
    fake.queue(SSEReply([b"event: response.created\ndata: {}\n\n"] * 50, delay=0.1))
    with proxy.http() as http:
        with http.stream("POST", "/v1/responses", json={"model": "m", "stream": True, "input": "hi"}) as response:
            next(response.iter_raw())
            closed_at = time.monotonic()
    assert fake.wait_closed(5)
    assert fake.connections[-1].closed - closed_at < 2.0


def test_a_503_with_an_http_date_retry_after_passes_through_unchanged(proxy, fake):
    # A 503 with an HTTP-date Retry-After: the client's own retry logic reads the provider's header.
    when = "Wed, 21 Oct 2026 07:28:00 GMT"
    error = {"error": {"message": "overloaded", "type": "server_error", "param": None, "code": None}}
    fake.queue(JsonReply(error, status=503, headers=[("retry-after", when), ("x-request-id", "req-503")]))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 503
    assert response.headers["retry-after"] == when
    assert response.headers["x-request-id"] == "req-503"
    assert response.content == json.dumps(error).encode()
    assert len(fake.chat_requests()) == 1  # no retry by the proxy


def test_an_unresolvable_upstream_is_a_502_that_names_no_host(make_proxy, caplog):
    # DNS failure: the client gets a generic message; the details go to the log.
    proxy = make_proxy(upstream__base_url="http://upstream-host-that-does-not-exist.invalid/v1")
    with proxy.http(timeout=30) as http:
        response = http.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_unavailable"
    assert "upstream-host-that-does-not-exist" not in response.text
    assert any(r.getMessage().startswith("upstream unreachable: ") for r in caplog.records)


def test_a_request_body_that_stops_arriving_gets_408_and_never_reaches_the_upstream(make_proxy, fake):
    # A slow request body: a trickled or abandoned body past the body-read deadline.
    proxy = make_proxy(server__body_timeout_s=0.5)
    body = json.dumps(CHAT).encode()
    for path in (b"/v1/chat/completions", b"/v1/embeddings"):  # read whole, and streamed to the upstream
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            sock.sendall(b"POST " + path + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n" % len(body) + body[:10])
            started = time.monotonic()
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                piece = sock.recv(65536)
                if not piece:
                    break
                reply += piece
        assert time.monotonic() - started < 3
        head, _, payload = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), head
        assert json.loads(payload)["error"]["code"] == "request_timeout"
    assert fake.chat_requests() == []


TLS = Path(__file__).parent / "data" / "tls"  # a self-signed certificate no client trusts


def test_a_tls_failure_is_a_502_that_names_no_host_or_certificate(make_proxy, caplog):
    # TLS failure: the provider's certificate does not verify.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(TLS / "cert.pem", TLS / "key.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    handshakes: list[str] = []

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            try:
                with context.wrap_socket(conn, server_side=True):
                    handshakes.append("completed")
            except (ssl.SSLError, OSError) as exc:
                handshakes.append(type(exc).__name__)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    proxy = make_proxy(upstream__base_url=f"https://127.0.0.1:{port}/v1")
    with proxy.http(timeout=30) as http:
        started = time.monotonic()
        response = http.post("/v1/chat/completions", json=CHAT)
    server.join(5)
    assert time.monotonic() - started < 5  # refused at the handshake, not after a timeout
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unavailable"
    for detail in ("127.0.0.1", "ssl", "certificate", "memproxy-test-untrusted"):
        assert detail not in response.text.lower()
    assert any(r.getMessage().startswith("upstream unreachable: ") for r in caplog.records)
    assert handshakes != ["completed"]


def test_a_stream_cut_after_done_ends_whole_and_its_turn_stays_complete(make_proxy, fake):
    # The provider closed after `data: [DONE]` without the chunked body's last chunk: the
    # answer came whole, so no error event may follow [DONE].
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    events = stream_events("hello there")
    fake.queue(SSEReply(events + [b"data: x\n\n"], cut_after=len(events)))
    with proxy.http() as http, http.stream("POST", "/v1/chat/completions", headers={"x-memory-user": "alice"},
                                           json={**CHAT, "stream": True}) as response:
        body = response.read()
        found = http.get("/metrics").text
    assert body.endswith(b"data: [DONE]\n\n")
    assert settled_turns(proxy, 1) == [("complete",)]
    assert 'memproxy_answers_total{ending="complete"} 1.0' in found
    assert 'ending="truncated"' not in found


def test_a_client_leaving_while_its_answer_commits_counts_the_step_once(make_proxy, fake, tmp_path):
    # The whole answer came, so the step ended `complete`; the client that leaves while the
    # answer's commit holds back [DONE] must not count it again as `client_aborted`, and the
    # answer still lands once the store can write.
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    fake.queue(SSEReply(stream_events("the whole answer", pieces=2), delay=0.05))
    with proxy.http() as http:
        assert http.get("/healthz").status_code == 200  # the store exists
        blocker = sqlite3.connect(tmp_path / "memproxy.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # the writer's commit waits behind this
        try:
            with http.stream("POST", "/v1/chat/completions", headers={"x-memory-user": "alice"},
                             json={**CHAT, "stream": True}) as response:
                seen = b""
                for piece in response.iter_raw():
                    seen += piece
                    if b'"finish_reason": "stop"' in seen:
                        # [DONE] reaches memproxy 50 ms later and waits there for the commit:
                        # once the step has ended `complete`, the client leaves.
                        assert eventually(lambda: 'ending="complete"' in http.get("/metrics").text, timeout=5)
                        break
            assert b"[DONE]" not in seen
            # memproxy has seen the client leave (a second count would have come with it).
            assert eventually(lambda: 'outcome="client_gone"' in http.get("/metrics").text, timeout=5)
        finally:
            blocker.execute("COMMIT")
            blocker.close()
        assert settled_turns(proxy, 1, timeout=15) == [("complete",)]
        found = http.get("/metrics").text
    assert 'memproxy_answers_total{ending="complete"} 1.0' in found
    assert 'ending="client_aborted"' not in found


def test_a_client_leaving_mid_upload_is_client_gone_not_an_upstream_failure(proxy, fake, caplog):
    caplog.set_level(logging.INFO)
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.sendall(b"POST /v1/files HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\n"
                     b"content-length: 100000\r\n\r\n" + b"x" * 1000)
        assert eventually(lambda: len(fake.connections) > 0, timeout=5)
    assert eventually(lambda: any(getattr(r, "outcome", None) for r in caplog.records
                                  if r.name == "memproxy.request"), timeout=5)
    outcomes = [r.outcome for r in caplog.records if r.name == "memproxy.request"]
    assert outcomes == ["client_gone"]
    assert not [r for r in caplog.records if r.name == "memproxy.upstream"]
