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
import re
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.types import Send
from starlette.types import Scope as AsgiScope

from proxy.errors import ClientGone, ProxyError
from proxy.memory.pipeline import MemoryService
from proxy.metrics import Metrics
from proxy.http.asgi import Receive, StatusKept, read_body
from proxy.identity.scope import RequestScope, ScopeResolver
from proxy.settings import Settings

if TYPE_CHECKING:
    from proxy.mcp.tools_server import ToolsServer

log = logging.getLogger("memproxy.mcp")

INVALID_REQUEST = -32600  # JSON-RPC's code for a request the server will not take
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_ANY_ADDRESS = ("0.0.0.0", "::", "[::]")


class RebindingGuard:
    """The Host and Origin values /mcp answers: loopback, server.host, and mcp.allowed_* (`*`: any).

    A web page a user visits can resolve its own name to 127.0.0.1 (DNS rebinding) and post
    to a local server; its Host and Origin still name the page's site, so they are refused.
    An agent sends no Origin; a browser always does.
    """

    def __init__(self, settings: Settings) -> None:
        names = [*LOOPBACK_HOSTS]
        host = settings.server.host
        if host not in _ANY_ADDRESS and host not in names:
            names.append(f"[{host}]" if ":" in host else host)
        self._hosts = [*names, *(f"{name}:*" for name in names), *map(_dns_form, settings.mcp.allowed_hosts)]
        self._origins = [f"{scheme}://{name}{port}" for scheme in ("http", "https") for name in names
                         for port in ("", ":*")] + [_dns_form(origin) for origin in settings.mcp.allowed_origins]

    def refusal(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """What is wrong with the request's Host or Origin; None when both are allowed."""
        found = {name.lower(): value.decode("latin-1") for name, value in headers
                 if name.lower() in (b"host", b"origin")}
        host, origin = (None if value is None else _dns_form(value) for value in (found.get(b"host"),
                                                                                  found.get(b"origin")))
        if host is None or not _allowed(host, self._hosts):
            return "Host is not one /mcp answers (add it to mcp.allowed_hosts)"
        if origin is not None and not _allowed(origin, self._origins):
            return "Origin is not one /mcp answers (add it to mcp.allowed_origins)"
        return None


def _dns_form(value: str) -> str:
    """A Host or Origin as DNS reads its name: in any case, and with a root dot (`localhost.`) or without."""
    return re.sub(r"\.(?=(:\d*)?$)", "", value.lower())


def _allowed(value: str, allowed: list[str]) -> bool:
    for entry in allowed:
        if entry == "*" or entry == value:
            return True
        if entry.endswith(":*") and value.startswith(entry[:-1]) and value[len(entry) - 1:].isdigit():
            return True
    return False


class McpEndpoint:
    """The ASGI app mounted at /mcp."""

    def __init__(self, settings: Settings, scopes: ScopeResolver, memory: MemoryService, metrics: Metrics) -> None:
        self._scopes = scopes
        self._memory = memory
        self._metrics = metrics
        self._guard = RebindingGuard(settings)
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
