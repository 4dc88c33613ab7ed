"""Slow request heads and a flood of connections against `memproxy serve` in its own process.

Clients that send a request line and then a header byte now and then (slowloris) used to
hold their sockets for ever, until the process ran out of open files and its own
application's chats failed. Each test here holds such sockets on loopback, in bounded
loops, and asserts when and how the server closes them while a normal chat goes through.
"""

from __future__ import annotations

import json
import resource
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest

from proxy.http.connections import max_client_connections
from proxy.settings import load_settings
from tests.fake_upstream import FakeUpstream, JsonReply, SlowHeaders, completion
from tests.test_crash import start_server

HEADER_TIMEOUT_S = 1.0
CAP = 50
SLOW_CLIENTS = 60
PARTIAL_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl"
TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
             b"content-length: 34\r\nconnection: close\r\n\r\nRequest head not received in time.")
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
           b"content-length: 26\r\nconnection: close\r\n\r\nToo many open connections.")


class SlowClient:
    """One socket that sent part of a request head and adds a byte of it now and then."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(PARTIAL_HEAD)
        self.opened = time.monotonic()
        self.received = b""
        self.closed_at: float | None = None

    def trickle(self) -> None:
        try:
            self.sock.send(b"i")
        except OSError:  # closed by the server: noticed by `read`
            pass

    def read(self) -> None:
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        self.received += data
        if not data:
            self.closed_at = time.monotonic()
            self.sock.close()


def watch(clients: list[SlowClient], until: float, trickle_every_s: float = 0.25) -> None:
    """Read what the server sends and trickle a byte to each open client until all are closed
    or `until` (a time.monotonic()) passes."""
    next_trickle = time.monotonic()
    while time.monotonic() < until:
        open_clients = [c for c in clients if c.closed_at is None]
        if not open_clients:
            return
        if time.monotonic() >= next_trickle:
            for client in open_clients:
                client.trickle()
            next_trickle += trickle_every_s
        readable, _, _ = select.select([c.sock for c in open_clients], [], [], 0.05)
        for client in open_clients:
            if client.sock in readable:
                client.read()


def chat(url: str) -> str | None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-client-key", max_retries=0, timeout=10)
    answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    return answer.choices[0].message.content


def read_response(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length (its head and body may come in two reads)."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _content_length(data):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


def _content_length(data: bytes) -> int:
    head = data.partition(b"\r\n\r\n")[0].lower()
    return next(int(line[15:]) for line in head.split(b"\r\n") if line.startswith(b"content-length:"))


def cap_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "server.max_connections" in line]


@pytest.fixture
def serve(fake: FakeUpstream, tmp_path: Path):  # type: ignore[no-untyped-def]
    started = []

    def start(**settings: str) -> tuple[str, Path]:
        log = tmp_path / "serve.log"
        process, url = start_server(tmp_path / "memproxy.db", fake.url, log, **settings)
        started.append(process)
        return url, log

    yield start
    for process in started:
        process.terminate()
        process.wait(15)


@pytest.fixture(scope="module")
def bounded(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One server for the tests that only open a connection each and leave nothing behind: both
    bounds at 1 s (a connection that sends its whole head meets only the body's)."""
    directory = tmp_path_factory.mktemp("bounded")
    process, url = start_server(directory / "memproxy.db", upstream.url, directory / "serve.log",
                                server_header_timeout_s=str(HEADER_TIMEOUT_S), server_body_timeout_s="1")
    yield url
    process.terminate()
    process.wait(15)


def test_slow_heads_are_closed_and_a_chat_goes_through_while_they_are_held(serve) -> None:  # type: ignore[no-untyped-def]
    url, log = serve(server_header_timeout_s=str(HEADER_TIMEOUT_S), server_max_connections=str(CAP))
    port = urlsplit(url).port
    assert port is not None
    clients = [SlowClient(port) for _ in range(SLOW_CLIENTS)]
    started = time.monotonic()
    assert chat(url) == "Hello from upstream"
    chatted = time.monotonic()
    watch(clients, until=started + HEADER_TIMEOUT_S + 5)

    # The chat did not wait for the slow heads' deadline: 39 of them were still held then.
    assert chatted - started < HEADER_TIMEOUT_S
    assert sum(1 for c in clients if c.closed_at is None or c.closed_at > chatted) >= CAP - 11
    assert all(c.closed_at is not None for c in clients)
    # The 10 connections past the cap, then the chat's, each closed the oldest slow one to make room...
    made_room = clients[:SLOW_CLIENTS - CAP + 1]
    assert [c.received for c in made_room] == [b""] * len(made_room)
    assert all(c.closed_at is not None and c.closed_at <= chatted + 0.2 for c in made_room)
    # ...and every other one got 408 once its head had taken the bound, trickling or not.
    timed_out = clients[len(made_room):]
    assert [c.received for c in timed_out] == [TIMED_OUT] * len(timed_out)
    for client in timed_out:
        assert client.closed_at is not None
        assert HEADER_TIMEOUT_S - 0.05 <= client.closed_at - client.opened <= HEADER_TIMEOUT_S + 1.5

    assert chat(url) == "Hello from upstream"
    lines = cap_lines(log)
    assert len(lines) == 1  # one line per interval, not one per connection
    assert ("server.max_connections (50) reached; since the last such line, connections closed to make room "
            "(still sending a request head, or a body too slowly): 1, new connections refused with 503 (all open "
            "ones busy): 0") in lines[0]


def test_a_connection_that_sends_nothing_is_closed_silently(bounded: str) -> None:
    url = bounded
    port = urlsplit(url).port
    assert port is not None
    silent = socket.create_connection(("127.0.0.1", port), timeout=5)
    opened = time.monotonic()
    silent.settimeout(HEADER_TIMEOUT_S + 3)
    assert silent.recv(1024) == b""
    assert HEADER_TIMEOUT_S - 0.05 <= time.monotonic() - opened <= HEADER_TIMEOUT_S + 1.5
    silent.close()


def test_an_idle_keep_alive_connection_gets_the_same_bound(bounded: str) -> None:
    # uvicorn's own keep-alive timer stops at the first byte of the next request: a client
    # could send one byte after each response and then hold the socket.
    url = bounded
    port = urlsplit(url).port
    assert port is not None
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert read_response(sock).startswith(b"HTTP/1.1 200 ")
    answered = time.monotonic()
    sock.sendall(b"G")
    sock.settimeout(HEADER_TIMEOUT_S + 3)
    assert sock.recv(65536) == TIMED_OUT
    assert sock.recv(65536) == b""
    assert HEADER_TIMEOUT_S - 0.05 <= time.monotonic() - answered <= HEADER_TIMEOUT_S + 1.5
    sock.close()


def test_past_the_cap_with_every_connection_busy_a_new_one_gets_503(serve, fake: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    url, log = serve(server_header_timeout_s=str(HEADER_TIMEOUT_S), server_max_connections="2")
    port = urlsplit(url).port
    assert port is not None
    fake.queue(SlowHeaders(2.0, JsonReply(completion())), SlowHeaders(2.0, JsonReply(completion())))
    answers: list[str | None] = []
    busy = [threading.Thread(target=lambda: answers.append(chat(url))) for _ in range(2)]
    for thread in busy:
        thread.start()
    deadline = time.monotonic() + 5
    while len(fake.chat_requests()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(fake.chat_requests()) == 2  # both connections have a request running
    refused = socket.create_connection(("127.0.0.1", port), timeout=5)
    refused.settimeout(3)
    assert refused.recv(65536) == REFUSED
    assert refused.recv(65536) == b""
    refused.close()
    for thread in busy:
        thread.join(10)
    assert answers == ["Hello from upstream", "Hello from upstream"]
    assert chat(url) == "Hello from upstream"
    assert "new connections refused with 503 (all open ones busy): 1" in cap_lines(log)[0]


SLOW_BODY_HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n{")


def test_trickled_bodies_make_room_for_a_chat_and_end_with_408(serve) -> None:  # type: ignore[no-untyped-def]
    """A whole head, then a byte of the body now and then: never a long pause, so only the pace
    ends it (1 KiB a second after the first body_timeout_s), and at the cap, once a body has had
    a second, the one that has trickled longest is closed to let a chat in."""
    url, log = serve(server_header_timeout_s=str(HEADER_TIMEOUT_S), server_max_connections="5",
                     server_body_timeout_s="2")
    port = urlsplit(url).port
    assert port is not None
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(5)]
    opened = time.monotonic()
    for sock in socks:
        sock.sendall(SLOW_BODY_HEAD)
    time.sleep(1.2)
    assert chat(url) == "Hello from upstream"  # the oldest trickler made room
    answers: dict[int, bytes] = {}
    closed_at: dict[int, float] = {}
    while len(closed_at) < len(socks) and time.monotonic() < opened + 6:
        for n, sock in enumerate(socks):
            if n in closed_at:
                continue
            try:
                sock.send(b" ")
                sock.settimeout(0.05)
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            answers[n] = answers.get(n, b"") + data
            if not data or data.endswith(b"}"):
                closed_at[n] = time.monotonic()
        time.sleep(0.2)
    assert answers[0] == b""  # closed for room
    for n in range(1, 5):
        assert answers[n].startswith(b"HTTP/1.1 408 "), answers[n]
        assert b"the request body did not arrive in time" in answers[n]
        assert 2.0 <= closed_at[n] - opened <= 4.0
    assert "(still sending a request head, or a body too slowly): 1" in cap_lines(log)[0]


def test_a_steady_upload_is_never_closed_for_room(serve) -> None:  # type: ignore[no-untyped-def]
    """At the cap, connections that send nothing are closed to let new ones in, never a chat whose
    400 KB body arrives at a steady 200 KB/s."""
    url, log = serve(server_header_timeout_s="5", server_max_connections="3")
    port = urlsplit(url).port
    assert port is not None
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 400_000}]}).encode()
    upload = socket.create_connection(("127.0.0.1", port), timeout=10)
    upload.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer sk-client\r\n"
                   b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    idle = []
    for start in range(0, len(body), 20_000):
        upload.sendall(body[start:start + 20_000])
        time.sleep(0.1)
        if len(idle) < 4:  # two fill the cap, two more each close the oldest idle one
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    answer = read_response(upload)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["choices"][0]["message"]["content"] == "Hello from upstream"
    upload.close()
    for sock in idle:
        sock.close()
    assert "(still sending a request head, or a body too slowly): 1" in cap_lines(log)[0]  # one line in 10 s


def test_the_memory_api_ends_a_body_that_stops_arriving(bounded: str) -> None:
    url = bounded
    port = urlsplit(url).port
    assert port is not None
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"POST /memory/v1/users/bob/memories HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 40\r\n\r\n{")
    sent = time.monotonic()
    answer = read_response(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"the request body did not arrive in time: no part of it for 1 s" in answer
    assert 0.9 <= time.monotonic() - sent <= 2.5
    sock.close()


def test_the_default_cap_leaves_room_for_the_provider_connections_and_the_store() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert max_client_connections(load_settings(environ={})) == (soft - 64) // 2
    assert max_client_connections(load_settings(environ={}, overrides={"server.max_connections": 7})) == 7
