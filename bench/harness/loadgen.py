"""The benchmark's load client: raw asyncio protocol + httptools, keep-alive connections.

A framework client would spend more CPU per request than the proxies under test; this one
writes pre-built request bytes and parses responses with the same C parser uvicorn uses.
It timestamps every read, so a stream's time to first event, time to end and how many
events each read carried (coalescing) come from the same clock.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httptools

MakeRequest = Callable[[int], bytes]


@dataclass
class Reply:
    """One request as the client saw it; times are perf_counter seconds."""

    status: int = 0
    sent: float = 0.0
    first: float | None = None  # first body bytes (first SSE event for a stream)
    ended: float = 0.0
    events: int = 0  # SSE events ("\n\n"-terminated) in the body
    event_reads: int = 0  # reads that completed at least one event
    body_size: int = 0
    body: list[bytes] | None = None  # kept only when asked for
    memory_status: bytes = b""  # X-Memory-Status, from memproxy
    memory_injected: int = -1  # X-Memory-Injected, from memproxy (-1: absent)

    @property
    def latency(self) -> float:
        return self.ended - self.sent


@dataclass
class Target:
    """Where to send requests and which extra headers to add."""

    name: str
    port: int
    headers: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    wire: str = "chat"  # "chat": POST /v1/chat/completions; "messages": Anthropic's POST /v1/messages;
    # "responses": OpenAI's POST /v1/responses; "gemini": POST /v1beta/models/bench-model:generateContent


class Disconnect(Exception):
    """The server closed the connection before the response ended."""


class ClientConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.reply = Reply()
        self.waiter: asyncio.Future[Reply] | None = None
        self.abort_after: int | None = None
        self._now = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(Disconnect(str(exc or "closed")))

    def data_received(self, data: bytes) -> None:
        self._now = time.perf_counter()
        before = self.reply.events
        self.parser.feed_data(data)
        if self.reply.events > before:
            self.reply.event_reads += 1
        if self.abort_after is not None and self.reply.events >= self.abort_after and self.transport:
            self._abort()

    def on_status(self, status: bytes) -> None:
        self.reply.status = self.parser.get_status_code()

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"x-memory-status":
            self.reply.memory_status = value
        elif lowered == b"x-memory-injected":
            self.reply.memory_injected = int(value)

    def on_body(self, body: bytes) -> None:
        reply = self.reply
        if reply.first is None:
            reply.first = self._now
        reply.body_size += len(body)
        if reply.body is not None:
            reply.body.append(body)
        reply.events += body.count(b"\n\n")

    def on_message_complete(self) -> None:
        self.reply.ended = self._now
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(self.reply)

    def _abort(self) -> None:
        """Leave mid-stream: half of the clients with a FIN, half with a RST."""
        assert self.transport is not None
        self.reply.ended = self._now
        waiter = self.waiter
        if random.random() < 0.5:
            self.transport.close()
        else:
            self.transport.abort()
        if waiter is not None and not waiter.done():
            waiter.set_result(self.reply)

    async def request(self, payload: bytes, abort_after: int | None = None, keep_body: bool = False) -> Reply:
        """Send one request and wait for its whole response (or `abort_after` events)."""
        if self.transport is None:
            raise Disconnect("not connected")
        self.reply = Reply(sent=time.perf_counter(), body=[] if keep_body else None)
        self.abort_after = abort_after
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return await self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def connect(target: Target) -> ClientConnection:
    """A new connection to the target."""
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(ClientConnection, target.host, target.port)
    return protocol


QUESTIONS = (
    "request %d: which tools do I prefer for my projects?",
    "request %d: remind me what database we picked for the billing service",
    "request %d: can you summarise the deployment plan for cluster seven?",
    "request %d: what editor setup did I say I like?",
    "request %d: draft a short reply to the vendor about the invoice delay",
    "request %d: which library should I use for parsing dates in rust?",
    "request %d: what did we decide about retries in the payment pipeline?",
    "request %d: explain the difference between a mutex and a semaphore",
)


def _posts(target: Target, path: bytes, auth: dict[str, str], bodies: list[bytes],
           extra: dict[str, str] | None) -> MakeRequest:
    """A factory of POST request bytes to `path`: request n sends body n (mod their number), its `%d` made n."""
    headers = {"host": f"{target.host}:{target.port}", "content-type": "application/json", **auth, **target.headers,
               **(extra or {})}
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()

    def make(n: int) -> bytes:
        body = bodies[n % len(bodies)].replace(b"%d", str(n).encode())
        return b"POST %s HTTP/1.1\r\n%scontent-length: %d\r\n\r\n%s" % (path, head, len(body), body)

    return make


def chat_payload(target: Target, *, stream: bool, extra: dict[str, str] | None = None,
                 questions: tuple[str, ...] = QUESTIONS) -> MakeRequest:
    """A factory of chat-completion request bytes; request n asks question n (mod their number)."""
    flag = b"true" if stream else b"false"
    bodies = [b'{"model":"bench-model","stream":%s,"messages":[{"role":"user","content":"%s"}]}' % (
        flag, q.encode()) for q in questions]
    return _posts(target, b"/v1/chat/completions", {"authorization": "Bearer sk-bench"}, bodies, extra)


def messages_payload(target: Target, *, stream: bool, extra: dict[str, str] | None = None,
                     questions: tuple[str, ...] = QUESTIONS) -> MakeRequest:
    """The same requests as chat_payload's on Anthropic's Messages wire."""
    flag = b"true" if stream else b"false"
    bodies = [b'{"model":"bench-model","max_tokens":256,"stream":%s,"messages":[{"role":"user","content":"%s"}]}'
              % (flag, q.encode()) for q in questions]
    return _posts(target, b"/v1/messages", {"x-api-key": "sk-ant-bench", "anthropic-version": "2023-06-01"},
                  bodies, extra)


def responses_payload(target: Target, *, stream: bool, extra: dict[str, str] | None = None,
                      questions: tuple[str, ...] = QUESTIONS) -> MakeRequest:
    """The same requests as chat_payload's on OpenAI's Responses wire, the question as one user item."""
    flag = b"true" if stream else b"false"
    bodies = [b'{"model":"bench-model","stream":%s,"store":false,"input":[{"role":"user","content":"%s"}]}'
              % (flag, q.encode()) for q in questions]
    return _posts(target, b"/v1/responses", {"authorization": "Bearer sk-bench"}, bodies, extra)


def gemini_payload(target: Target, *, stream: bool, extra: dict[str, str] | None = None,
                   questions: tuple[str, ...] = QUESTIONS) -> MakeRequest:
    """The same requests as chat_payload's on Gemini's generateContent wire (a stream: `alt=sse`)."""
    path = (b"/v1beta/models/bench-model:streamGenerateContent?alt=sse" if stream
            else b"/v1beta/models/bench-model:generateContent")
    bodies = [b'{"contents":[{"role":"user","parts":[{"text":"%s"}]}]}' % q.encode() for q in questions]
    return _posts(target, path, {"x-goog-api-key": "bench-gemini-key"}, bodies, extra)


def wire_payload(target: Target, *, stream: bool, extra: dict[str, str] | None = None) -> MakeRequest:
    """The request factory of the target's wire."""
    factory = {"messages": messages_payload, "responses": responses_payload,
               "gemini": gemini_payload}.get(target.wire, chat_payload)
    return factory(target, stream=stream, extra=extra)


def numbered(make: MakeRequest, first: int) -> MakeRequest:
    """`make`'s requests numbered from `first`: loads given ranges of their own never repeat a request
    (memproxy takes a repeated history for a retry of the same turn)."""
    def make_numbered(n: int) -> bytes:
        return make(first + n)
    return make_numbered


def request_payload(target: Target, method: str, path: str, body: bytes = b"",
                    headers: dict[str, str] | None = None) -> bytes:
    """Any request, framed with a content-length."""
    lines = {"host": f"{target.host}:{target.port}", **(headers or {})}
    if body or method not in ("GET", "HEAD"):
        lines["content-length"] = str(len(body))
    head = "".join(f"{k}: {v}\r\n" for k, v in lines.items())
    return f"{method} {path} HTTP/1.1\r\n{head}\r\n".encode() + body


def get_payload(target: Target, path: str) -> bytes:
    """A GET request."""
    return request_payload(target, "GET", path)


@dataclass
class Run:
    """Replies gathered over one or more slices of a closed loop."""

    replies: list[Reply] = field(default_factory=list)
    errors: int = 0
    elapsed: float = 0.0

    @property
    def rate(self) -> float:
        return len(self.replies) / self.elapsed if self.elapsed > 0 else 0.0

    def add(self, other: Run) -> None:
        self.replies += other.replies
        self.errors += other.errors
        self.elapsed += other.elapsed


class ClosedLoop:
    """`concurrency` keep-alive connections, each sending its next request as soon as one ends.

    It runs in slices, so that several loads can take turns within a second; connections
    stay open between slices, and `total` adds the slices up.
    """

    def __init__(self, target: Target, make: MakeRequest, concurrency: int, warm: MakeRequest | None = None) -> None:
        self.target = target
        self.make = make
        self.warm = warm or make
        self.conns: list[ClientConnection] = []
        self.concurrency = concurrency
        self.total = Run()
        self._numbers = itertools.count()

    async def open(self) -> None:
        """Connect, and warm every connection with one request (not counted)."""
        self.conns = [await connect(self.target) for _ in range(self.concurrency)]
        await asyncio.gather(*(c.request(self.warm(-1)) for c in self.conns))

    async def reopen_closed(self) -> None:
        """Reconnect what the server closed while this load sat idle (uvicorn's 5 s keep-alive)."""
        for n, conn in enumerate(self.conns):
            if conn.transport is None:
                self.conns[n] = await connect(self.target)

    async def run(self, duration: float, min_requests: int = 1) -> Run:
        """One slice: no request starts after `duration`, and it lasts until the last one ends."""
        run = Run()
        started = time.perf_counter()
        deadline = started + duration

        async def worker(i: int) -> None:
            while time.perf_counter() < deadline or len(run.replies) < min_requests:
                try:
                    reply = await self.conns[i].request(self.make(next(self._numbers)))
                except Disconnect:
                    run.errors += 1
                    self.conns[i] = await connect(self.target)
                    continue
                run.errors += reply.status != 200
                run.replies.append(reply)

        await asyncio.gather(*(worker(i) for i in range(len(self.conns))))
        run.elapsed = max((r.ended for r in run.replies), default=started) - started
        self.total.add(run)
        return run

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


async def closed_loop(target: Target, make: MakeRequest, concurrency: int, duration: float) -> Run:
    """One closed-loop run of `duration` seconds on fresh connections."""
    load = ClosedLoop(target, make, concurrency)
    await load.open()
    try:
        return await load.run(duration)
    finally:
        load.close()


async def one(target: Target, payload: bytes, abort_after: int | None = None) -> Reply:
    """One request on a new connection, closed afterwards; the reply keeps its body."""
    conn = await connect(target)
    try:
        return await conn.request(payload, abort_after, keep_body=True)
    finally:
        conn.close()


async def fixed_count(target: Target, make: MakeRequest, concurrency: int, count: int) -> Run:
    """Send requests 0..count-1 over `concurrency` connections; for setup work, not for figures."""
    numbers = iter(range(count))
    replies: list[Reply] = []
    errors = 0
    started = time.perf_counter()

    async def worker() -> None:
        nonlocal errors
        conn = await connect(target)
        for n in numbers:
            try:
                reply = await conn.request(make(n))
            except Disconnect:
                errors += 1
                conn = await connect(target)
                continue
            errors += reply.status >= 300
            replies.append(reply)
        conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Run(replies, errors, time.perf_counter() - started)


R = TypeVar("R")


def run_client(coro: Coroutine[Any, Any, R]) -> R:
    """Run the load client to completion on uvloop when it is installed, else on asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
