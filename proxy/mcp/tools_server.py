"""The MCP server behind /mcp, on the official `mcp` SDK: the two memory tools, stateless
streamable HTTP with JSON answers (endpoint.py loads it on the first /mcp request: the
SDK's import is about as long as the rest of memproxy's, and most deployments never use it).

Each call runs tools mode's MemoryTools (memory/tools.py) outside any chat turn, in the
identity endpoint.py resolved for its HTTP request; none gets a JSON-RPC error.
"""

from __future__ import annotations

import json
import logging
from contextlib import AbstractAsyncContextManager
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from proxy.errors import ProxyError
from proxy.memory.pipeline import MemoryService
from proxy.redaction.redact import redact
from proxy.memory.tools import NAMES, SCHEMAS, STORE
from proxy.metrics import Metrics
from proxy.models import ToolCall
from proxy.identity.scope import RequestScope

log = logging.getLogger("memproxy.mcp")

WIRE = "mcp"  # what the hooks' input says
# The JSON-RPC error of a call memproxy cannot name a user for (missing, malformed or refused
# identity); `data` carries the HTTP status and code the other paths would answer with.
IDENTITY_ERROR = -32010
IDENTITY_KEY = "memproxy.identity"  # the request's resolved identity, in its ASGI scope


class ToolsServer:
    """The SDK's server and its request handling, for one app."""

    def __init__(self, memory: MemoryService, metrics: Metrics, max_body_bytes: int) -> None:
        self._memory = memory
        self._metrics = metrics
        server: Server[Any] = Server("memproxy", version="1", instructions=(
            "Long-term memory of the user: query_memory before answering from what the user said in earlier "
            "conversations, store_memory for what is worth remembering."),
            on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        server.middleware.clear()  # no OpenTelemetry span per message: memproxy has its own metrics
        # The rebinding guard and the body's bounds are memproxy's own (endpoint.py): the SDK's
        # guard is off, and its body limit is server.max_body_bytes, not its own 4 MiB.
        self._manager = StreamableHTTPSessionManager(
            server, json_response=True, stateless=True, max_request_body_size=max_body_bytes,
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False))

    def running(self) -> AbstractAsyncContextManager[None]:
        """The SDK's task group for requests in flight: entered and left by one task."""
        return self._manager.run()

    async def handle(self, scope: AsgiScope, identity: RequestScope | ProxyError, receive: Receive,
                     send: Send) -> None:
        await self._manager.handle_request({**scope, IDENTITY_KEY: identity}, receive, send)

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
        found = request.scope.get(IDENTITY_KEY) if request is not None else None
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
