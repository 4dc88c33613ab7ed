"""Request heads past `server.max_header_bytes` against `memproxy serve` in its own process.

uvicorn's parser took a request line and headers of any size: a 1 MiB header was read whole,
passed to the application and forwarded to the provider. Each test sends a head over a raw
socket and asserts the exact answer, and that nothing reached the provider.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.fake_upstream import FakeUpstream
from tests.test_crash import start_server

MAX_HEADER_BYTES = 32 * 1024  # the default
BODY = b"Request line and headers too large: at most 32768 bytes (server.max_header_bytes)."
TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
             b"content-length: " + str(len(BODY)).encode() + b"\r\nconnection: close\r\n\r\n" + BODY)
CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


@pytest.fixture(scope="module")
def port(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    db = tmp_path_factory.mktemp("heads") / "memproxy.db"
    process, url = start_server(db, upstream.url)
    yield int(urlsplit(url).port or 0)
    process.terminate()
    process.wait(15)


def head(*headers: bytes, body: bytes = CHAT) -> bytes:
    lines = [b"POST /v1/chat/completions HTTP/1.1", b"Host: 127.0.0.1", b"Content-Type: application/json",
             b"Content-Length: " + str(len(body)).encode(), *headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def exchange(port: int, *pieces: bytes) -> bytes:
    """Send the pieces (the server may close before all are sent) and read until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            for piece in pieces:
                sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
        return received


def test_a_1_mib_header_gets_431_and_reaches_no_provider(port: int, fake: FakeUpstream) -> None:
    assert exchange(port, head(b"X-Big: " + b"a" * (1 << 20))) == TOO_LARGE
    assert fake.received == []


@pytest.mark.parametrize("pieces", [
    [head(*(b"X-Part-%d: %s" % (n, b"b" * 1000) for n in range(40)))],  # many lines adding up past the cap
    [b"GET /v1/models?" + b"q" * 40_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"],  # a long request line
    # One header line that never ends, in pieces: refused once the cap's worth came, not held.
    [b"POST /v1/chat/completions HTTP/1.1\r\nX-Big: ", *[b"c" * 4096] * 12],
], ids=["many-lines", "request-line", "endless-line"])
def test_a_head_past_the_cap_however_sent_gets_431(port: int, fake: FakeUpstream, pieces: list[bytes]) -> None:
    assert exchange(port, *pieces) == TOO_LARGE
    assert fake.received == []


def test_a_head_under_the_cap_and_a_large_body_go_through(port: int, fake: FakeUpstream) -> None:
    header = b"X-Trace: " + b"t" * 30_000
    body = CHAT.replace(b'"hi"', b'"' + b"long question " * 10_000 + b'"')  # 140 KB, in the head's packets
    answer = exchange(port, head(header, b"X-Memory-User: alice", b"Connection: close", body=body))
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    [request] = fake.chat_requests()
    assert request.header("x-trace") == "t" * 30_000


def test_pipelined_heads_are_each_held_to_the_cap(port: int) -> None:
    """Two heads of 20 KB in one packet: 40 KB together, each under the cap, both answered."""
    one = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"p" * 20_000 + b"\r\n"
    answer = exchange(port, one + b"\r\n" + one + b"Connection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 2
