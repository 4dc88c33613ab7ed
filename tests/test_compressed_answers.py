"""A provider that compresses its answer although memproxy asked for `identity` (gzip,
with memory on): the client gets the bytes as they came, and the answer is still
saved when it is gzip or deflate; an encoding memproxy cannot read is passed on unread."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from typing import Any

import httpx
import openai
import pytest

from tests.fake_upstream import JsonReply, Reply, _head, completion, stream_events
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


class GzipStream(Reply):
    """An event stream the provider gzips although asked not to: silent at first, optionally cut."""

    def __init__(self, think_s: float = 0.0, cut: bool = False) -> None:
        self.think_s, self.cut = think_s, cut

    async def write(self, request: Any, writer: asyncio.StreamWriter) -> bool:
        writer.write(_head(200, [("content-type", "text/event-stream"), ("transfer-encoding", "chunked"),
                                 ("content-encoding", "gzip")]))
        await writer.drain()
        await asyncio.sleep(self.think_s)
        packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
        events = stream_events("hello there", done=not self.cut)
        for event in events[:3] if self.cut else events:
            piece = packer.compress(event) + packer.flush(zlib.Z_SYNC_FLUSH)
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        if self.cut:
            writer.close()  # no end of the gzip member, no last chunk
            return False
        piece = packer.flush()
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(piece), piece))
        await writer.drain()
        return True


@pytest.mark.parametrize("memory", [{}, USER])
def test_a_gzip_stream_gets_no_ping_while_the_provider_is_silent(make_proxy, fake, memory):
    # Pings are plain text: inside gzip they broke the whole answer (the SDK raised).
    proxy = make_proxy(server__heartbeat_s=0.1, memory__commit_timeout_ms=5000)
    fake.queue(GzipStream(think_s=0.5))
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0,
                           default_headers={"accept-encoding": "gzip", **memory})
    stream = client.chat.completions.create(model="m", stream=True, messages=[{"role": "user", "content": "hi"}])
    assert "".join(event.choices[0].delta.content or "" for event in stream if event.choices) == "hello there"


@pytest.mark.parametrize("memory", [{}, USER])
def test_a_cut_gzip_stream_closes_the_connection_rather_than_append_a_plain_event(proxy, fake, memory):
    fake.queue(GzipStream(cut=True))
    with proxy.http() as http, http.stream(
            "POST", "/v1/chat/completions", headers={"accept-encoding": "gzip", **memory},
            json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as response:
        raw = b""
        with pytest.raises(httpx.RemoteProtocolError):  # the body ends unfinished: the SDK raises
            for piece in response.iter_raw():
                raw += piece
    assert b"stream_truncated" not in raw and b'data: {"error"' not in raw
    inflated = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw)  # nothing but gzip was sent
    assert inflated.count(b"data: ") == 3 and inflated.endswith(b"\n\n")  # the three events that came
