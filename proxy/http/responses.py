"""Relaying a provider response to the client: chunk by chunk, never buffered whole."""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, Self

from proxy.errors import ShuttingDown
from proxy.http.asgi import ResponseAborted, Send, Sent, send_error
from proxy.http.upstream import StreamCut, response_headers
from proxy.wires.base import ErrorShape, Wire
from proxy.wires.sse import SSEDecoder

log = logging.getLogger("memproxy.stream")

_SSE_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


class Answerable(Protocol):
    """What the relay tells the memory side about the answer (proxy.memory.chat_memory.Recall)."""

    @property
    def active(self) -> bool: ...

    def headers(self) -> list[tuple[bytes, bytes]]: ...

    def answered(self, message: Any) -> asyncio.Future[None] | None: ...

    def failed(self, status: str) -> None: ...

    def bad_events(self, count: int) -> None: ...


# The most of a compressed answer memproxy inflates to read it; past this the answer is
# left unread (a compression bomb must not fill memory), and the client still gets it whole.
MAX_DECODED_BYTES = 32 * 1024 * 1024


_EVENT_ENDS = (b"\n\n", b"\r\r", b"\r\n\r\n")
PING = b": ping\n\n"


class Heartbeat:
    """The body of an event stream, with a `: ping` comment while the provider is silent.

    After a 200, comments every `every_s` keep the idle timers of load
    balancers in front of the client from closing a stream whose model is still thinking;
    the SDK skips them. One goes out only between events (never inside a half-sent one),
    and never after the stream ended; sends are serialised with the relay's own.

    A timer, not a task, watches the silence: most streams end before their first ping is
    due, and a task with its sleep, cancelled at the end, cost every stream ~15 us.
    """

    def __init__(self, send: Send, every_s: float) -> None:
        self._send = send
        self._every_s = every_s
        self._tail = b"\n\n"  # the stream starts between events
        self._recent: tuple[bytes, bytes] = (b"", b"")  # the last two chunks sent (not copies)
        # Kept: asyncio.get_running_loop() asks the kernel for the process id on every call
        # (Python 3.11), and a stream's every chunk reads the clock.
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._ping: asyncio.Task[None] | None = None  # the last ping sent, or being sent
        self._sending = False  # a chunk of the provider's is being sent
        self._closed = False

    async def __aenter__(self) -> Self:
        if self._every_s > 0:
            self._timer = self._loop.call_at(self._last + self._every_s, self._due)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._ping is not None:
            self._ping.cancel()
            await asyncio.gather(self._ping, return_exceptions=True)

    @property
    def tail(self) -> bytes:
        """The last bytes sent: whether the stream stands between events."""
        return self._tail

    @property
    def recent(self) -> bytes:
        """The last two chunks sent: enough to hold the last event's start in a stream cut now."""
        return b"".join(self._recent)

    async def body(self, chunk: bytes) -> None:
        """Send one chunk of the provider's stream."""
        if self._ping is not None and not self._ping.done():
            await asyncio.wait((self._ping,))  # after the ping going out (its failure is its own)
        self._sending = True
        try:
            await self._send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            self._sending = False
        self._tail = (self._tail + chunk[-4:])[-4:]
        self._recent = (self._recent[1], chunk)
        self._last = self._loop.time()

    def _due(self) -> None:
        now = self._loop.time()
        if self._sending:  # a chunk is going out to a slow client: the provider is not the one silent
            self._timer = self._loop.call_at(now + self._every_s, self._due)
        elif now < self._last + self._every_s:  # the provider spoke meanwhile
            self._timer = self._loop.call_at(self._last + self._every_s, self._due)
        else:
            self._timer = None
            self._ping = self._loop.create_task(self._pinged(), name="memproxy-heartbeat")

    async def _pinged(self) -> None:
        if self._tail.endswith(_EVENT_ENDS):
            await self._send({"type": "http.response.body", "body": PING, "more_body": True})
        self._last = self._loop.time()
        if not self._closed:  # a ping that failed watches no more, as the relay's next send fails too
            self._timer = self._loop.call_at(self._last + self._every_s, self._due)


class _Inflate:
    """The copy memproxy reads of a body the provider compressed although asked not to.

    `accept-encoding: identity` is sent with every request whose answer is saved, but a
    provider (or a proxy in front of it) may compress anyway. The client gets the bytes
    as they came; only memproxy's own reading is inflated. gzip and deflate only: any
    other encoding leaves the answer unreadable, as before.
    """

    def __init__(self, encoding: str) -> None:
        wbits = 16 + zlib.MAX_WBITS if encoding in ("gzip", "x-gzip") else zlib.MAX_WBITS
        self._inflater = zlib.decompressobj(wbits)
        self._left = MAX_DECODED_BYTES
        self.failed = False

    def __call__(self, chunk: bytes) -> bytes:
        if self.failed or not chunk:
            return b""
        try:
            out = self._inflater.decompress(chunk, self._left)
        except zlib.error:
            self.failed = True
            return b""
        self._left -= len(out)
        if self._left <= 0 or self._inflater.unconsumed_tail:
            self.failed = True  # over the bound: stop reading rather than hold it all
        return out


class _Unreadable:
    """An encoding memproxy cannot read (br, zstd): the answer is not saved."""

    failed = True

    def __call__(self, chunk: bytes) -> bytes:
        return b""


def _encoding(response: Any) -> str:
    return response.response.headers.get("content-encoding", "").strip().lower()


def _compressed(response: Any) -> bool:
    """True when the provider encoded its body: memproxy can add no plain bytes to it."""
    return _encoding(response) not in ("", "identity")


def _reader(response: Any) -> _Inflate | _Unreadable | None:
    """What turns the provider's body bytes into the bytes memproxy reads (None: as they are)."""
    if not _compressed(response):
        return None
    encoding = _encoding(response)
    if encoding in ("gzip", "x-gzip", "deflate"):
        return _Inflate(encoding)
    return _Unreadable()


def readable_body(response: Any, body: bytes) -> bytes:
    """A whole body as memproxy reads it: inflated when the provider compressed it (b"" if unreadable)."""
    read = _reader(response)
    if read is None:
        return body
    inflated = read(body)
    return b"" if read.failed else inflated


def is_readable_sse(response: Any) -> bool:
    """An event stream memproxy can read as it comes: plain, or compressed in gzip or deflate."""
    return _is_sse(response) and not isinstance(_reader(response), _Unreadable)


def stream_inflater(response: Any) -> _Inflate | None:
    """What inflates a readable stream's body bytes as they come (None: they are plain)."""
    read = _reader(response)
    return read if isinstance(read, _Inflate) else None


def is_plain_sse(response: Any) -> bool:
    """An event stream memproxy can read as it comes (not compressed)."""
    return _is_sse(response) and not _compressed(response)


def _is_sse(response: Any) -> bool:
    return response.content_type.split(";", 1)[0].strip().lower() == "text/event-stream"


def _start(response: Any, extra: list[tuple[bytes, bytes]], sse: bool) -> dict[str, Any]:
    headers = response_headers(response.response.headers)
    if sse:
        # Bytes may be appended (an error event), so a provider length would lie.
        headers = [(k, v) for k, v in headers if k not in (b"content-length", b"cache-control")] + _SSE_HEADERS
    return {"type": "http.response.start", "status": response.status, "headers": headers + extra}


async def relay_plain(send: Send, response: Any, extra_headers: list[tuple[bytes, bytes]], shape: ErrorShape,
                      heartbeat_s: float = 0.0) -> None:
    """Forward any response unchanged; a cut event stream ends with the wire's error event."""
    sse = _is_sse(response)
    await send(_start(response, extra_headers, sse))
    if not sse:
        try:
            async for chunk in response.chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except StreamCut as body_cut:
            log.info("upstream body cut: %s", body_cut.code)
            raise ResponseAborted(body_cut.code) from body_cut  # a cut JSON body: the connection closes
    else:
        cut, tail, recent = await _forward_events(send, response, heartbeat_s)
        if cut is not None:
            await _append_cut_event(send, response, tail, shape.stream_error(cut.message, cut.code, after=recent),
                                    cut.code)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _forward_events(send: Send, response: Any, heartbeat_s: float,
                          each: Callable[[bytes], Awaitable[None]] | None = None
                          ) -> tuple[StreamCut | None, bytes, bytes]:
    """An event stream to the client chunk by chunk, with pings while it is silent (`each` sees
    every chunk first); how it ended (None: whole), its last bytes and its last two chunks. A
    compressed stream gets no pings: plain bytes inside gzip would break it."""
    async with Heartbeat(send, 0.0 if _compressed(response) else heartbeat_s) as stream:
        try:
            async for chunk in response.chunks():
                if each is not None:
                    await each(chunk)
                await stream.body(chunk)
        except StreamCut as cut:
            log.info("upstream stream cut: %s", cut.code)
            return cut, stream.tail, stream.recent
    return None, stream.tail, stream.recent


async def relay_chat(send: Send, response: Any, recall: Answerable, wire: Wire, heartbeat_s: float = 0.0) -> None:
    """Forward a chat answer on any wire and hand it to memory before the last event."""
    sse = _is_sse(response) and response.status == 200
    await send(_start(response, recall.headers(), sse))
    if sse:
        await _relay_stream(send, response, recall, wire, heartbeat_s)
    else:
        await _relay_json(send, response, recall, wire)


async def _relay_stream(send: Send, response: Any, recall: Answerable, wire: Wire, heartbeat_s: float) -> None:
    decoder = SSEDecoder()
    # Only an answer that will be saved is rebuilt; otherwise just watch how the stream ends.
    answer = wire.answer_reader(keep_answer=recall.active)
    read = _reader(response)
    committed = False

    def take(events: list[Any]) -> asyncio.Future[None] | None:
        """Read the events; the answer's commit to wait for, the first time it is done."""
        nonlocal committed
        for event in events:
            answer.feed(event)
        if answer.done and not committed:
            committed = True
            if recall.active and answer.error is None and not answer.too_large:
                return recall.answered(answer.message())
        return None

    async def read_events(chunk: bytes) -> None:
        waiter = take(decoder.feed(chunk if read is None else read(chunk)))
        if waiter is not None:  # the answer is in the store before the wire's end event reaches the client
            await _commit(waiter)

    cut, tail, recent = await _forward_events(send, response, heartbeat_s, read_events)
    if cut is None and not answer.done:
        # A provider that ends with its end event but not the blank line after it did finish.
        await _commit(take(decoder.feed(b"\n\n")))
    if answer.malformed:
        recall.bad_events(answer.malformed)  # a bad data line is counted, never fatal
    if cut is not None and answer.done:
        log.info("upstream stream cut after its end event: ended as whole")  # the answer came complete
    elif cut is not None:
        await _end_cut(send, response, recall, wire.stream_error(cut.message, cut.code, after=recent), cut.code,
                       tail)
        return
    if read is not None and read.failed:  # the stream came whole; memproxy could not read it
        recall.failed("unparseable")
    elif answer.error is not None:
        recall.failed("upstream_failed")
    elif not answer.done:
        await _end_cut(send, response, recall,
                       wire.stream_error("upstream stream ended before completion", "stream_truncated",
                                         after=recent),
                       "stream_truncated", tail)
        return
    elif answer.too_large:
        recall.failed("too_large")  # an answer past the bound is not saved cut short
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _end_cut(send: Send, response: Any, recall: Answerable, event: bytes, code: str, tail: bytes) -> None:
    recall.failed("truncated")
    await _append_cut_event(send, response, tail, event, code)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _append_cut_event(send: Send, response: Any, tail: bytes, event: bytes, code: str) -> None:
    """The error event that tells the SDK a stream was cut; a compressed stream cannot take
    one (plain bytes inside gzip), so its connection is closed instead: the SDK raises either way."""
    if _compressed(response):
        raise ResponseAborted(code)
    await send({"type": "http.response.body", "body": _after_event(tail) + event, "more_body": True})


async def end_interrupted(sent: Sent) -> None:
    """End a response the server must stop (its grace period is over): a 503 the SDK retries if
    nothing went out yet, an error event for a stream; a JSON body half sent is cut off."""
    message = "memproxy is shutting down and could not finish this response"
    if not sent.started:
        await send_error(sent, ShuttingDown(message), sent.error_headers, sent.shape)
    elif sent.open_stream and not sent.ended:
        event = sent.shape.stream_error(message, ShuttingDown.code, ShuttingDown.type, after=sent.recent)
        await sent({"type": "http.response.body", "more_body": True, "body": _after_event(sent.tail) + event})
        await sent({"type": "http.response.body", "body": b"", "more_body": False})
    elif not sent.ended:
        raise ResponseAborted(ShuttingDown.code)


def _after_event(tail: bytes) -> bytes:
    """What goes before the error event that ends a cut stream; cut mid-line, it would join
    that line and the client would never read it, so a blank line ends the broken event first."""
    return b"" if tail.endswith(_EVENT_ENDS) else b"\n\n"


async def _relay_json(send: Send, response: Any, recall: Answerable, wire: Wire) -> None:
    copy: list[bytes] = []
    # Only an answer that will be saved holds anything back: the body's end, so the commit
    # happens before the body is whole. Every chunk before goes out as it comes (a JSON-array
    # stream's responses one by one).
    holds = recall.active and response.status == 200
    held = b""
    end = _BodyEnd(response)
    read = _reader(response)
    try:
        async for chunk in response.chunks():
            if recall.active:
                copy.append(chunk if read is None else read(chunk))
            if not holds:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                continue
            pending = held + chunk
            at = end.held_from(pending)
            held = pending[at:]
            if at:
                await send({"type": "http.response.body", "body": pending[:at], "more_body": True})
    except StreamCut as cut:
        log.info("upstream body cut: %s", cut.code)
        recall.failed("truncated")
        raise ResponseAborted(cut.code) from cut  # the connection closes: the client sees a short body
    if recall.active:
        if response.status == 200:
            message = None if read is not None and read.failed else wire.parse_answer(b"".join(copy))
            if message is None:
                recall.failed("unparseable")
            else:
                await _commit(recall.answered(message))
        else:
            recall.failed("upstream_failed")
    await send({"type": "http.response.body", "body": held, "more_body": False})


class _BodyEnd:
    """Where a JSON body's end begins in the bytes not yet sent, held for the commit.

    An array's (a Gemini stream of responses): its closing `]` and any whitespace after it, so
    each response goes out as it comes. An object's: the whole of bytes ending in `}` (no client
    reads an object before its end, and most answers come in one chunk: one send, not two).
    A bracket that turns out to be nested is sent with what follows: it delayed nothing a client
    could read, as what it closes was not whole yet. A compressed body's bytes say nothing of
    brackets: its last byte is held.
    """

    _CLOSING = {b"[": b"]", b"{": b"}"}

    def __init__(self, response: Any) -> None:
        self._closing: bytes | None = b"" if _compressed(response) else None  # None: no byte seen; b"": no bracket

    def held_from(self, pending: bytes) -> int:
        """The index in `pending` (the bytes not yet sent) from which they wait for the commit."""
        kept = pending.rstrip()
        if not kept:
            return 0  # blank so far: it waits for what follows
        if self._closing is None:
            self._closing = self._CLOSING.get(kept.lstrip()[:1], b"")
        if not self._closing:
            return len(pending) - 1
        if not kept.endswith(self._closing):
            return len(pending)
        return len(kept) - 1 if self._closing == b"]" else 0


async def _commit(waiter: asyncio.Future[None] | None) -> None:
    """Wait for the answer's commit: memory bounds the wait (memory.commit_timeout_ms once its store
    fails or stalls; proxy/memory/writer.py) and ends it without raising."""
    if waiter is None:
        return
    try:
        await asyncio.shield(waiter)
    except Exception:  # the write path logs its own failures; the response goes out regardless
        log.debug("commit failed", exc_info=True)
