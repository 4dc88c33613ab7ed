"""/mcp: tools mode's memory tools over the Model Context Protocol (docs/mcp.md).

This module is the endpoint's edge: the Host and Origin guard against DNS rebinding, 405 for
anything but a POST, identity resolved for each request (headers from trusted clients, a
memproxy key, a signed token: identity/scope.py, as on every other path), the body read within
server.max_body_bytes and server.body_timeout_s before the SDK sees it, one log line and
the request metrics. The server itself (tools_server.py, on the official SDK) is
stateless, so any worker or replica serves any request; it is loaded on the first /mcp
request, in a task of its own that holds the SDK's task group until the app stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.types import Send
from starlette.types import Scope as AsgiScope

from proxy.errors import ClientGone, ProxyError
from proxy.memory.pipeline import MemoryService
from proxy.metrics import Metrics
from proxy.http.asgi import Receive, StatusKept, read_body
from proxy.identity.rebinding import RebindingGuard
from proxy.identity.scope import RequestScope, ScopeResolver
from proxy.settings import Settings

if TYPE_CHECKING:
    from proxy.mcp.tools_server import ToolsServer

log = logging.getLogger("memproxy.mcp")

INVALID_REQUEST = -32600  # JSON-RPC's code for a request the server will not take
class McpEndpoint:
    """The ASGI app mounted at /mcp."""

    def __init__(self, settings: Settings, scopes: ScopeResolver, memory: MemoryService, metrics: Metrics) -> None:
        self._scopes = scopes
        self._memory = memory
        self._metrics = metrics
        self._guard = RebindingGuard(settings.server)
        self._max_body_bytes = settings.server.max_body_bytes
        self._body_timeout_s = settings.server.body_timeout_s
        self._server: asyncio.Future[ToolsServer] | None = None  # set by the first request
        self._host: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The app's lifetime: at its end the server's task (if a request started it) leaves the SDK."""
        try:
            yield
        finally:
            self._stop.set()
            if self._host is not None:
                await asyncio.gather(self._host, return_exceptions=True)

    async def _tools_server(self) -> ToolsServer:
        if self._server is None:
            self._server = asyncio.get_running_loop().create_future()
            self._host = asyncio.get_running_loop().create_task(self._hosted(self._server), name="memproxy-mcp")
        return await asyncio.shield(self._server)

    async def _hosted(self, ready: asyncio.Future[ToolsServer]) -> None:
        """Load the SDK (in a thread: the event loop goes on serving), then hold its task group."""
        try:
            module = await asyncio.to_thread(importlib.import_module, "proxy.mcp.tools_server")
            server = module.ToolsServer(self._memory, self._metrics, self._max_body_bytes)
            async with server.running():
                ready.set_result(server)
                await self._stop.wait()
        except Exception as exc:  # every request then gets the error: /mcp is down, the rest is not
            log.exception("the MCP server did not start")
            if not ready.done():
                ready.set_exception(exc)

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        sent = StatusKept(send)
        try:
            await self._serve(scope, receive, sent)
        finally:
            seconds = time.perf_counter() - started
            outcome = sent.outcome
            self._metrics.request_done("mcp", outcome, seconds)
            log.info("mcp request", extra={"method": scope.get("method"), "outcome": outcome,
                                           "ms": round(seconds * 1000, 2)})

    async def _serve(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            # No stream for server-initiated messages (memproxy sends none) and no session to end:
            # a GET held open would only hold a connection. The protocol's answer for that is 405.
            await _answer(send, 405, "memproxy: /mcp takes POST (stateless, no event stream)", [(b"allow", b"POST")])
            return
        refused = self._guard.refusal(scope["headers"])
        if refused is not None:
            self._metrics.mcp_calls.labels("any", "rebinding_refused").inc()
            await _answer(send, 403, f"memproxy: {refused}")
            return
        try:
            found: RequestScope | ProxyError = self._scopes.resolve(dict(scope))
        except ProxyError as error:  # told to the tool call that needs it, as a JSON-RPC error
            found = error
        try:
            # Read here, with every path's bounds: the SDK's own limit is fixed and it waits on a
            # stalled body forever.
            body = await read_body(receive, self._max_body_bytes, self._body_timeout_s)
        except ClientGone:
            return
        except ProxyError as error:
            await _answer(send, error.status, f"memproxy: {error}", [(b"connection", b"close")])
            return
        try:
            server = await self._tools_server()
        except Exception:  # logged once where it failed; /mcp is down, the rest of memproxy is not
            await _answer(send, 503, "memproxy: the MCP server is unavailable (see memproxy's log)")
            return
        await server.handle(scope, found, _replay(body, receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` for a body already read: the body, then whatever the connection says next."""
    pending = [body]

    async def replayed() -> dict[str, Any]:
        if pending:
            return {"type": "http.request", "body": pending.pop(), "more_body": False}
        return await receive()
    return replayed


async def _answer(send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A JSON-RPC error (no request id) with an HTTP status, for what never reaches the server."""
    raw = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": raw})
