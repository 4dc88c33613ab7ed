"""Client connections of `memproxy serve`: a deadline on every request head, and a cap on
how many connections are open at once.

uvicorn keeps a connection that has not finished sending its request line and headers open
for ever (its keep-alive timer only runs between requests, and `limit_concurrency` answers
503 to new requests without closing idle sockets). 1,100 clients sending a header byte every
5 s held 1,001 sockets, the process reached its open-file limit and a normal chat failed.
So each connection here must finish its head within `server.header_timeout_s`, and past
`server.max_connections` the connection that has waited longest for a head is closed to make
room, or else one whose body trickles in slower than body_deadline.py's pace (a steady upload
is never closed for room); only when neither is open is a new one refused.

uvicorn's parser also takes a request line and headers of any size (a 1 MiB header was read,
passed to the application and forwarded to the provider). A head past
`server.max_header_bytes` gets 431 and the connection is closed before the request runs: as
soon as its lines add up past the cap, or as soon as that many bytes came with the head still
unfinished (a single endless line the parser holds until it ends).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from proxy.http.body_deadline import MIN_BYTES_PER_S
from proxy.settings import Settings

log = logging.getLogger("memproxy.connections")

# Descriptors kept for the store, log files, embedding and extraction calls.
RESERVED_FILES = 64
CAP_LOG_INTERVAL_S = 10.0  # under a flood, one line this often, with counts, not one a connection
BODY_GRACE_S = 1.0  # a body is not judged slow before it has had this long
SLOW_BODIES_TRIED = 8  # bodies looked at for a slow one per connection let in: bounded work under a flood


def max_client_connections(settings: Settings) -> int:
    """server.max_connections, or half the open files left after the reserve: each client
    connection may hold one connection to the provider."""
    if settings.server.max_connections is not None:
        return settings.server.max_connections
    try:
        import resource
    except ImportError:  # not on Windows; 512 is its C runtime's default limit of open files
        return (512 - RESERVED_FILES) // 2
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65_536
    cap = max(1, (soft - RESERVED_FILES) // 2)
    log.info("client connections capped at %d (server.max_connections unset; open-file limit %d)", cap, soft)
    return cap


class ConnectionGuard:
    """One server's open connections, and the ones still waiting for a request head, oldest first."""

    def __init__(self, max_connections: int, header_timeout_s: float, max_header_bytes: int) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.max_header_bytes = max_header_bytes
        self._open: set[GuardedHttpProtocol] = set()
        self._waiting: OrderedDict[GuardedHttpProtocol, None] = OrderedDict()  # for a head, oldest first
        self._sending: OrderedDict[GuardedHttpProtocol, None] = OrderedDict()  # a body, oldest first
        self._closed_for_room = 0
        self._refused = 0
        self._next_log_at = 0.0

    def admit(self, connection: GuardedHttpProtocol) -> bool:
        """Count a new connection in; at the cap, close the one waiting longest for its head, or
        one whose body trickles in, to make room, or answer False when there is neither."""
        if len(self._open) >= self.max_connections:
            victim = self._victim()
            if victim is None:
                self._refused += 1
                self._log_cap()
                return False
            self._open.discard(victim)  # its slot is the new one's now, though closing takes a moment
            victim.close_for_room()
            self._closed_for_room += 1
            self._log_cap()
        self._open.add(connection)
        return True

    def _victim(self) -> GuardedHttpProtocol | None:
        if self._waiting:
            return self._waiting.popitem(last=False)[0]
        for _ in range(min(SLOW_BODIES_TRIED, len(self._sending))):
            connection, _ = self._sending.popitem(last=False)
            if connection.body_is_slow():
                return connection
            self._sending[connection] = None  # steady: looked at again after the others
        return None

    def waiting(self, connection: GuardedHttpProtocol) -> None:
        self._waiting[connection] = None

    def not_waiting(self, connection: GuardedHttpProtocol) -> None:
        self._waiting.pop(connection, None)

    def sending(self, connection: GuardedHttpProtocol) -> None:
        self._sending[connection] = None

    def sent(self, connection: GuardedHttpProtocol) -> None:
        self._sending.pop(connection, None)

    def release(self, connection: GuardedHttpProtocol) -> None:
        self._waiting.pop(connection, None)
        self._sending.pop(connection, None)
        self._open.discard(connection)

    def _log_cap(self) -> None:
        now = time.monotonic()
        if now < self._next_log_at:
            return
        log.warning("server.max_connections (%d) reached; since the last such line, connections closed to make "
                    "room (still sending a request head, or a body too slowly): %d, new connections refused with "
                    "503 (all open ones busy): %d", self.max_connections, self._closed_for_room, self._refused)
        self._closed_for_room = self._refused = 0
        self._next_log_at = now + CAP_LOG_INTERVAL_S


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a deadline on each request head and a cap on connections."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard = guard
        self._head_deadline: asyncio.TimerHandle | None = None
        self._head_started = False
        self._body_since = 0.0
        self._body_bytes = 0
        self._in_head = True  # the bytes coming in are a request head's
        self._head_bytes = 0  # its request line and header lines as parsed
        self._head_received = 0  # bytes received while it was unfinished
        self._head_refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self._guard.admit(self):
            self._answer_and_close(503, "Too many open connections.")
            return
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_deadline()
        self._guard.release(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._head_refused:
            return  # answered 431; the connection is closing
        if self._head_deadline is not None:
            self._head_started = True
        if self._in_head:
            self._head_received += len(data)
        super().data_received(data)
        if self._in_head and self._head_received > self._guard.max_header_bytes:
            self._refuse_head()  # all of it head, and still no end to it

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + len(b": \r\n"))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._head_refused:
            return  # the rest of a refused head's packet: no request runs
        self._in_head = False
        self._head_bytes = self._head_received = 0
        self._stop_head_deadline()
        super().on_headers_complete()
        self._body_since = self.loop.time()
        self._body_bytes = 0
        self._guard.sending(self)  # until its body has come whole (at once, when there is none)

    def on_body(self, body: bytes) -> None:
        if self._head_refused:
            return
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._head_refused:
            return
        self._in_head = True  # a pipelined request's head may follow
        self._guard.sent(self)
        super().on_message_complete()

    def body_is_slow(self) -> bool:
        """Whether the body now arriving trickles in slower than a body may (body_deadline.py)."""
        elapsed = self.loop.time() - self._body_since
        return self._body_bytes < (elapsed - BODY_GRACE_S) * MIN_BYTES_PER_S

    def on_response_complete(self) -> None:
        next_is_queued = bool(self.pipeline)  # a queued request's head has arrived already
        super().on_response_complete()
        if next_is_queued or self.transport.is_closing():
            return
        if self._head_refused:
            self._answer_too_large()  # the requests before it are answered
        else:
            self._await_head()

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self._guard.max_header_bytes and not self._head_refused:
            self._refuse_head()

    def _refuse_head(self) -> None:
        """431, once; the parser's callbacks for the rest of what came are then ignored. Behind
        requests still being answered (pipelined), after their answers: answers keep the
        requests' order, and one written now would land inside a response being written."""
        self._head_refused = True
        self._stop_head_deadline()
        if self.pipeline or (self.cycle is not None and not self.cycle.response_complete):
            self.flow.pause_reading()
            return
        self._answer_too_large()

    def _answer_too_large(self) -> None:
        self._answer_and_close(431, f"Request line and headers too large: at most {self._guard.max_header_bytes} "
                                    "bytes (server.max_header_bytes).")

    def close_for_room(self) -> None:
        """Closed by the guard to let a newer connection in."""
        self._stop_head_deadline()
        self.transport.close()

    def _await_head(self) -> None:
        self._stop_head_deadline()
        self._head_started = False
        self._head_deadline = self.loop.call_later(self._guard.header_timeout_s, self._head_timed_out)
        self._guard.waiting(self)

    def _stop_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
        self._guard.not_waiting(self)

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        self._guard.not_waiting(self)
        if self.transport.is_closing():
            return
        if self._head_started:
            self._answer_and_close(408, "Request head not received in time.")
        else:
            self.transport.close()

    def _answer_and_close(self, status: int, message: str) -> None:
        body = message.encode("ascii")
        self.transport.write(b"".join([
            STATUS_LINE[status],
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]))
        self.transport.close()
