"""ASGI plumbing for the proxy path: bounded body reads, error answers, disconnect watch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from typing import Any, Awaitable, Callable

from proxy.http.body_deadline import BodyDeadline
from proxy.errors import BodyTooLarge, ClientGone, ProxyError
from proxy.wires.base import ErrorShape
from proxy.wires.openai_chat import OpenAIChat

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ResponseAborted(Exception):
    """The provider's body broke after its headers went out: the client's response is cut off
    (the connection closes: a sent status cannot change), an expected event rather than a failure of memproxy's."""


class StatusKept:
    """`send`, keeping the response's status (0 until it starts) for the request's metric and log line."""

    def __init__(self, send: Callable[[Any], Awaitable[None]]) -> None:
        self._send = send
        self.status = 0

    async def __call__(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self._send(message)

    @property
    def outcome(self) -> str:
        """The metric's outcome label: `status_200`, or `status_0` for a response never started."""
        return f"status_{self.status}"


class Sent:
    """`send`, remembering how much of the response has gone out, so that one the server must
    stop mid-way (its grace period over) can still be ended properly.

    What it remembers is what was written: a send cancelled while it waited for the socket
    to drain wrote nothing (uvicorn writes after the wait).
    """

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.open_stream = False  # an event stream memproxy may still append an event to
        self.ended = False
        self.tail = b"\n\n"  # the last bytes of the body: whether an event stream stands between events
        self._recent: tuple[bytes, bytes] = (b"", b"")  # the last two body chunks (not copies)
        self.error_headers: list[tuple[bytes, bytes]] = []  # what memproxy's own error answer carries
        self.shape: ErrorShape = OpenAIChat()  # the wire whose shape memproxy's own errors take
        self.memory_status: str | None = None  # the X-Memory-Status sent, for the request's log line

    async def __call__(self, message: Message) -> None:
        await self._send(message)
        if message["type"] == "http.response.start":
            self.started = True
            self.open_stream = appendable_stream(message.get("headers", []))
            self.memory_status = _memory_status(message.get("headers", []))
        elif message["type"] == "http.response.body":
            body = message.get("body", b"")
            self.tail = (self.tail + body[-4:])[-4:]  # never a copy of a whole chunk
            if body and not body.startswith(b":"):  # a ping (a comment) holds no event
                self._recent = (self._recent[1], body)
            self.ended = not message.get("more_body", False)

    @property
    def recent(self) -> bytes:
        """The last two body chunks sent: enough to hold the last event's start."""
        return b"".join(self._recent)


def _memory_status(headers: list[tuple[bytes, bytes]]) -> str | None:
    return next((value.decode("latin-1") for name, value in headers if name.lower() == b"x-memory-status"), None)


def appendable_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    """True for an event stream memproxy can add an event (or a ping) to: not one with a
    Content-Length, nor one compressed (plain bytes inside gzip would break it)."""
    found = {name.lower(): value.split(b";")[0].strip().lower() for name, value in headers}
    return (found.get(b"content-type") == b"text/event-stream" and b"content-length" not in found
            and found.get(b"content-encoding", b"identity") in (b"", b"identity"))


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The request's Content-Length, or None when absent or unreadable."""
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def read_body(receive: Receive, limit: int, idle_s: float) -> bytes:
    """The whole request body, refusing (413) as soon as it passes `limit`."""
    return b"".join([chunk async for chunk in body_stream(receive, limit, on_end=_nothing, idle_s=idle_s)])


def _nothing() -> None:
    return None


async def body_stream(receive: Receive, limit: int, on_end: Callable[[], None], idle_s: float
                      ) -> AsyncIterator[bytes]:
    """The request body as it arrives (pass-through paths never hold it whole).

    A client that sends nothing more for `idle_s`, or trickles it (body_deadline.py), gets
    408: such a body would otherwise hold its connection (and a chat request's turn) forever.
    """
    size = 0
    deadline = BodyDeadline(idle_s)
    while True:
        try:
            async with asyncio.timeout(deadline.wait_s()):
                message = await receive()
        except TimeoutError:
            raise deadline.expired() from None
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        deadline.received(len(chunk))
        if size > limit:
            raise BodyTooLarge(f"request body is larger than the limit of {limit} bytes")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            on_end()
            return


async def send_error(send: Send, error: ProxyError, headers: list[tuple[bytes, bytes]] | None = None,
                     shape: ErrorShape | None = None) -> None:
    """Answer with memproxy's own error in the wire's shape (OpenAI's by default), marked as
    memproxy's, not the provider's."""
    body = error.body() if shape is None else shape.error_body(error)
    all_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"x-memory-proxy-error", error.code.encode())]
    all_headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": all_headers + (headers or [])})
    await send({"type": "http.response.body", "body": body})


class DisconnectWatch:
    """Cancels the request's task when the client goes away, so the upstream call stops.

    It watches only once the request body has been read (`armed`, or `arm()` called when
    a streamed body ends): from then on the only message `receive` can bring is
    http.disconnect.
    """

    def __init__(self, receive: Receive, *, armed: bool = True) -> None:
        self._receive = receive
        self._armed = armed
        self._task: asyncio.Task[None] | None = None
        self._owner: asyncio.Task[Any] | None = None
        self.gone = False

    async def __aenter__(self) -> DisconnectWatch:
        self._owner = asyncio.current_task()
        if self._armed:
            self.arm()
        return self

    def arm(self) -> None:
        """Start watching (the request body has been read)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        if self._owner is not None:
            self._owner.cancel()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self._task is not None:
            self._task.cancel()
        if exc_type is asyncio.CancelledError and self.gone and self._owner is not None:
            self._owner.uncancel()
            return True  # the client left: nothing more to send, not an error
        return False
