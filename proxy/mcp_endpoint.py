"""/mcp: tools mode's memory tools over the Model Context Protocol (docs/mcp.md).

The protocol is the official `mcp` SDK's streamable HTTP transport, stateless with JSON
answers: no session lives in a process, so any worker or replica serves any request, and
each request proves its identity by itself (headers from trusted clients, a memproxy key, a
signed token: scope.py, as on every other path). Identity is resolved here, before the SDK
reads the body; what it found rides in the request's ASGI scope to the tool call. A call
without an identity gets a JSON-RPC error naming what is missing, never an HTTP 401 (a 401
sends an MCP client into OAuth discovery, which memproxy does not offer).

The calls themselves are tools mode's (memory/tools.py): same schemas, results, hooks,
redaction and writer, outside any chat turn.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import AbstractAsyncContextManager
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.types import Message, Receive, Send
from starlette.types import Scope as AsgiScope

from proxy.errors import ProxyError
from proxy.memory.pipeline import MemoryService
from proxy.memory.redact import redact
from proxy.memory.tools import NAMES, SCHEMAS, STORE
from proxy.metrics import Metrics
from proxy.models import ToolCall
from proxy.scope import RequestScope, ScopeResolver
from proxy.settings import Settings

log = logging.getLogger("memproxy.mcp")

WIRE = "mcp"  # what the hooks' input says
# The JSON-RPC error of a call memproxy cannot name a user for (missing, malformed or refused
# identity); `data` carries the HTTP status and code the other paths would answer with.
IDENTITY_ERROR = -32010
_IDENTITY_KEY = "memproxy.identity"  # the request's resolved identity, in its ASGI scope
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
        self._hosts = [*names, *(f"{name}:*" for name in names), *settings.mcp.allowed_hosts]
        self._origins = [f"{scheme}://{name}{port}" for scheme in ("http", "https") for name in names
                         for port in ("", ":*")] + list(settings.mcp.allowed_origins)

    def refusal(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """What is wrong with the request's Host or Origin; None when both are allowed."""
        found = {name.lower(): value.decode("latin-1") for name, value in headers
                 if name.lower() in (b"host", b"origin")}
        host, origin = found.get(b"host"), found.get(b"origin")
        if host is None or not _allowed(host, self._hosts):
            return "Host is not one /mcp answers (add it to mcp.allowed_hosts)"
        if origin is not None and not _allowed(origin, self._origins):
            return "Origin is not one /mcp answers (add it to mcp.allowed_origins)"
        return None


def _allowed(value: str, allowed: list[str]) -> bool:
    for entry in allowed:
        if entry == "*" or entry == value:
            return True
        if entry.endswith(":*") and value.startswith(entry[:-1]) and value[len(entry) - 1:].isdigit():
            return True
    return False


class McpEndpoint:
    """The ASGI app mounted at /mcp, and the lifespan of the SDK's request handling."""

    def __init__(self, settings: Settings, scopes: ScopeResolver, memory: MemoryService, metrics: Metrics) -> None:
        self._scopes = scopes
        self._memory = memory
        self._metrics = metrics
        server: Server[Any] = Server("memproxy", version="1", instructions=(
            "Long-term memory of the user: query_memory before answering from what the user said in earlier "
            "conversations, store_memory for what is worth remembering."),
            on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        server.middleware.clear()  # no OpenTelemetry span per message: memproxy has its own metrics
        self._guard = RebindingGuard(settings)
        # The guard is memproxy's own (its `name:*` and `*` rules, its error body); the SDK's is off.
        self._manager = StreamableHTTPSessionManager(
            server, json_response=True, stateless=True,
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False))

    def running(self) -> AbstractAsyncContextManager[None]:
        """Held for the app's lifetime: the SDK's task group for requests in flight."""
        return self._manager.run()

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status: list[int] = []

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self._serve(scope, receive, tracked)
        finally:
            seconds = time.perf_counter() - started
            outcome = f"status_{status[0] if status else 0}"
            self._metrics.request_done("mcp", outcome, seconds)
            log.info("mcp request", extra={"method": scope.get("method"), "outcome": outcome,
                                           "ms": round(seconds * 1000, 2)})

    async def _serve(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            # No stream for server-initiated messages (memproxy sends none) and no session to end:
            # a GET held open would only hold a connection. The protocol's answer for that is 405.
            await _answer(send, 405, {"jsonrpc": "2.0", "id": None, "error": {
                "code": types.INVALID_REQUEST, "message": "memproxy: /mcp takes POST (stateless, no event stream)"}},
                [(b"allow", b"POST")])
            return
        refused = self._guard.refusal(scope["headers"])
        if refused is not None:
            self._metrics.mcp_calls.labels("any", "rebinding_refused").inc()
            await _answer(send, 403, {"jsonrpc": "2.0", "id": None,
                                      "error": {"code": types.INVALID_REQUEST, "message": f"memproxy: {refused}"}})
            return
        try:
            found: RequestScope | ProxyError = self._scopes.resolve(dict(scope))
        except ProxyError as error:  # told to the tool call that needs it, as a JSON-RPC error
            found = error
        await self._manager.handle_request({**scope, _IDENTITY_KEY: found}, receive, send)

    async def _list_tools(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                          ) -> types.ListToolsResult:
        # Listed without an identity: the tools are the same for everyone, and naming them tells nothing.
        return types.ListToolsResult(tools=[types.Tool(name=name, description=SCHEMAS[name][0],
                                                       input_schema=SCHEMAS[name][1]) for name in NAMES])

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                         ) -> types.CallToolResult:
        if params.name not in NAMES:
            self._metrics.mcp_calls.labels("other", "unknown_tool").inc()
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}: memproxy offers {', '.join(NAMES)}")
        resolved = self._identity(ctx, params.name)
        tools = await self._memory.tools_outside_turn(resolved, WIRE, writes=params.name == STORE)
        call = ToolCall(str(ctx.request_id or ""), params.name, json.dumps(params.arguments or {}))
        result = await tools.run(call)
        self._metrics.mcp_calls.labels(params.name, "error" if result.error else "ok").inc()
        return types.CallToolResult(content=[types.TextContent(text=result.text)], is_error=result.error)

    def _identity(self, ctx: ServerRequestContext[Any], tool: str) -> RequestScope:
        """The caller's scope, or the JSON-RPC error that says what is missing or wrong."""
        request = ctx.request
        found = request.scope.get(_IDENTITY_KEY) if request is not None else None
        if isinstance(found, ProxyError):
            self._metrics.mcp_calls.labels(tool, "no_identity").inc()
            log.info("mcp call refused: %s", redact(str(found)))
            raise MCPError(IDENTITY_ERROR, f"memproxy: {found}", {"status": found.status, "code": found.code})
        if not isinstance(found, RequestScope) or found.scope is None:
            self._metrics.mcp_calls.labels(tool, "no_identity").inc()
            raise MCPError(IDENTITY_ERROR, "memproxy: no identity, no memory: send X-Memory-User with the user's id "
                           "(from loopback or auth.trusted_networks)",
                           {"status": 401, "code": "invalid_memory_identity"})
        return found


async def _answer(send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
                  ) -> None:
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": raw})
