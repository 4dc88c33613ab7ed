"""A provider that compresses its answer although memproxy asked for `identity` (RELIABILITY 5.2
case 15, with memory on): the client gets the bytes as they came, and the answer is still
saved when it is gzip or deflate; an encoding memproxy cannot read is passed on unread."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from tests.fake_upstream import JsonReply, completion, stream_events
from tests.proxy_db import rows, settled_turns

USER = {"x-memory-user": "alice"}


def deflate(data: bytes) -> bytes:
    packer = zlib.compressobj()
    return packer.compress(data) + packer.flush()


ENCODINGS = {"gzip": gzip.compress, "deflate": deflate}


@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_a_compressed_json_answer_reaches_the_client_and_is_saved(make_proxy, fake, encoding):
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    body = ENCODINGS[encoding](json.dumps(completion(f"a {encoding} answer")).encode())
    fake.queue(JsonReply(body, headers=[("content-encoding", encoding)]))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", headers=USER,
                             json={"model": "m", "messages": [{"role": "user", "content": "squeeze it"}]})
    assert fake.chat_requests()[-1].header("accept-encoding") == "identity"
    assert response.headers["content-encoding"] == encoding
    assert response.json()["choices"][0]["message"]["content"] == f"a {encoding} answer"
    assert settled_turns(proxy, 1) == [("complete",)]
    assert rows(proxy, "SELECT role, content FROM messages ORDER BY seq") == [
        ("user", "squeeze it"), ("assistant", f"a {encoding} answer")]


def test_a_gzip_stream_reaches_the_client_whole_and_is_saved(make_proxy, fake):
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    stream = b"".join(stream_events("a zipped stream", pieces=4))
    fake.queue(JsonReply(gzip.compress(stream), content_type="text/event-stream",
                         headers=[("content-encoding", "gzip")]))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", headers=USER,
                             json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "zip"}]})
    assert response.content == stream  # no error event appended: the stream was whole
    assert settled_turns(proxy, 1) == [("complete",)]
    assert ("assistant", "a zipped stream") in rows(proxy, "SELECT role, content FROM messages")


@pytest.mark.parametrize("stream", [False, True])
def test_an_encoding_memproxy_cannot_read_passes_unread(make_proxy, fake, stream):
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    body = b"\x00opaque bytes in an encoding memproxy does not know\xff"
    fake.queue(JsonReply(body, content_type="text/event-stream" if stream else "application/json",
                         headers=[("content-encoding", "x-unknown")]))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", headers=USER,
                             json={"model": "m", "stream": stream, "messages": [{"role": "user", "content": "q"}]})
    assert response.content == body
    assert settled_turns(proxy, 1) == [("unparseable",)]
    assert rows(proxy, "SELECT role FROM messages") == [("user",)]


def test_a_compression_bomb_is_not_inflated_past_the_bound(make_proxy, fake):
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    bomb = gzip.compress(b'{"choices": [{"message": {"content": "' + b"a" * (40 * 1024 * 1024) + b'"}}]}')
    assert len(bomb) < 200_000
    fake.queue(JsonReply(bomb, headers=[("content-encoding", "gzip")]))
    with proxy.http(timeout=30) as http:
        response = http.post("/v1/chat/completions", headers=USER,
                             json={"model": "m", "messages": [{"role": "user", "content": "boom"}]})
    assert response.status_code == 200 and len(response.content) > 40 * 1024 * 1024
    assert settled_turns(proxy, 1) == [("unparseable",)]
