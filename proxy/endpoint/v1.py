"""The /v1 proxy endpoint (and Gemini's /v1beta): one chat endpoint for every wire, and the pass-through.

A POST to a wire's chat path with a user scope gets memory (recall before, persistence
after); every other /v1 path, and any request without a scope, is a transparent
pass-through to the upstream its wire (or its `anthropic-version` header, or on a path no
wire names Google's key) names. Every path under /v1beta, and Gemini's uploads under
/upload/v1beta and /upload/v1, is Gemini's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from proxy.endpoint.ownership import Ownership
from proxy.endpoint.steps import InjectStep, open_upstream
from proxy.endpoint.tools_step import ToolsStep
from proxy.errors import BodyTooLarge, ClientGone, NotFound, ProxyError, Unauthenticated
from proxy.memory.chat_memory import NOT_A_TURN, ChatMemory, Recall
from proxy.metrics import Metrics
from proxy.http.asgi import (
    DisconnectWatch, Receive, ResponseAborted, Send, Sent, body_stream, declared_length, read_body,
    send_error,
)
from proxy.http.responses import end_interrupted, relay_chat, relay_plain
from proxy.identity.scope import RequestScope, ScopeResolver
from proxy.settings import Settings
from proxy.identity.side_requests import RequestFacts, SideRequests
from proxy.http.upstream import Upstream, provider_for, query_without_credentials, request_headers
from proxy.wires.anthropic_messages import AnthropicMessages
from proxy.wires.anthropic_tools import MessagesTools
from proxy.wires.base import ErrorShape, Provider, Wire, WireRequest, dump_json
from proxy.wires.gemini import GeminiGenerateContent, model_method
from proxy.wires.gemini_tools import (GeminiTools, unsupported as gemini_tools_unsupported,
                                      unsupported_stream as gemini_stream_unsupported,
                                      without_tools as gemini_without_tools)
from proxy.wires.openai_chat import OpenAIChat
from proxy.wires.openai_chat_tools import ChatTools, unsupported as chat_tools_unsupported
from proxy.wires.openai_responses import OpenAIResponses
from proxy.wires.openai_responses_tools import ResponsesTools
from proxy.wires.tool_rounds import ToolFormat

log = logging.getLogger("memproxy.request")

T = TypeVar("T")

_KEY_SETTING: dict[Provider, str] = {"openai": "upstream.api_key", "anthropic": "upstream.anthropic_api_key",
                                     "gemini": "upstream.gemini_api_key"}
_URL_SETTING: dict[Provider, str] = {"openai": "upstream.base_url", "anthropic": "upstream.anthropic_base_url",
                                     "gemini": "upstream.gemini_base_url"}
_GEMINI_VERSION = "/v1beta"  # every path under it is Gemini's
# Gemini's uploads (google-genai's `files.upload()`), each version's: every path under them is Gemini's.
_GEMINI_UPLOADS = ("/upload/v1beta", "/upload/v1")
_VERSIONS = ("/v1", _GEMINI_VERSION, *_GEMINI_UPLOADS)


class ProxyEndpoint:
    """ASGI app for every path under /v1."""

    def __init__(self, settings: Settings, upstream: Upstream, scopes: ScopeResolver, memory: ChatMemory,
                 metrics: Metrics, side_requests: SideRequests, ownership: Ownership) -> None:
        self.settings = settings
        self.ownership = ownership
        self.upstream = upstream
        self.scopes = scopes
        self.memory = memory
        self.metrics = metrics
        self.side_requests = side_requests
        self.hinted_404: set[Provider] = set()  # providers whose 404 on a chat path was explained once
        # Each wire's chat path (after /v1); adding a wire is one line here and its module.
        self.wires: dict[str, Wire] = {
            "/chat/completions": OpenAIChat(),
            "/messages": AnthropicMessages(settings.scope.context_tags),
            "/responses": OpenAIResponses(settings.scope.context_tags),
            # Gemini's model is in its path: `/models/{model}:method` is looked up as `/models/*:method`.
            "/models/*:generateContent": GeminiGenerateContent(settings.scope.context_tags),
            "/models/*:streamGenerateContent": GeminiGenerateContent(settings.scope.context_tags, stream=True),
        }
        # Each wire's tool format for tools mode, by the same path.
        self.tool_formats: dict[str, ToolFormat] = {"/chat/completions": ChatTools(), "/messages": MessagesTools(),
                                                    "/responses": ResponsesTools(),
                                                    "/models/*:generateContent": GeminiTools(),
                                                    "/models/*:streamGenerateContent": GeminiTools()}
        # What tools mode cannot serve on a wire, refused before the turn starts.
        # (the request's body and query string)
        self.tools_refusals: dict[str, Callable[[dict[str, Any], bytes], ProxyError | None]] = {
            "/chat/completions": lambda body, query: chat_tools_unsupported(body),
            "/models/*:generateContent": lambda body, query: gemini_tools_unsupported(body),
            "/models/*:streamGenerateContent": lambda body, query: (gemini_stream_unsupported(query)
                                                                    or gemini_tools_unsupported(body))}
        # Why a request the provider takes as it is cannot take the memory tools too (it goes on
        # without them, and X-Memory-Status says why).
        self.tools_unfit: dict[str, Callable[[dict[str, Any]], str | None]] = {
            "/models/*:generateContent": gemini_without_tools, "/models/*:streamGenerateContent": gemini_without_tools}
        # The shape of memproxy's own errors on a path no wire serves, by the upstream it goes to.
        self.shapes: dict[Provider, ErrorShape] = {"openai": self.wires["/chat/completions"],
                                                   "anthropic": self.wires["/messages"],
                                                   "gemini": self.wires["/models/*:generateContent"]}

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        version, path = _versioned_path(scope)
        outcome = "ok"
        send = Sent(send)
        wire = self.wires.get(_table_key(path)) if path is not None else None
        family = wire or self._family(path)
        if version != "/v1" and family is not None and (family.provider != "gemini" or version in _GEMINI_UPLOADS):
            wire = family = None  # under /v1beta only Gemini's paths are a wire's; an upload is no wire's
        send.shape = family or self.shapes[provider_for(scope["headers"], _version_provider(version),
                                                        scope["query_string"])]
        if wire is not None:
            send.error_headers = _status_header(NOT_A_TURN)  # every response to a chat path says the memory status
        try:
            if path is None:
                raise NotFound("no such path")
            limit = self.settings.server.max_body_bytes
            length = declared_length(scope["headers"])
            if length is not None and length > limit:
                raise BodyTooLarge(f"request body is larger than the limit of {limit} bytes")
            if scope["method"] == "POST" and wire is not None:
                outcome = await self._chat(scope, receive, send, path, wire, version)
            else:
                outcome = await self._passthrough(scope, receive, send, path, family, wire is not None, version)
        except ProxyError as error:
            outcome = error.code
            needs_status = wire is not None and "x-memory-status" not in error.headers
            await send_error(send, error, _status_header(NOT_A_TURN) if needs_status else None, send.shape)
        except ClientGone:
            outcome = "client_gone"
        except ResponseAborted:
            outcome = "upstream_cut"
        except asyncio.CancelledError:
            # Only uvicorn cancels a request (a client that leaves is DisconnectWatch's): the
            # server's grace period is over and it still runs.
            outcome = await _interrupted(send)
        finally:
            elapsed = time.perf_counter() - started
            self.metrics.request_done(path or "other", outcome, elapsed)
            log.info("request", extra={"path": path, "method": scope["method"], "outcome": outcome,
                                       "memory": send.memory_status, "ms": round(elapsed * 1000, 2)})

    def _upstream_headers(self, headers: list[tuple[bytes, bytes]], provider: Provider,
                          resolved: RequestScope) -> list[tuple[bytes, bytes]]:
        """The client's headers with the provider's credentials; in api-keys mode the client's
        key is memproxy's own, so the provider's key must be configured."""
        api_key = self.upstream.api_key(provider)
        if resolved.uses_proxy_key and not api_key:
            raise Unauthenticated(f"{_KEY_SETTING[provider]} is not configured: in api-keys mode the client's "
                                  "key is memproxy's own and never goes upstream")
        return request_headers(headers, api_key=api_key, proxy_key=resolved.proxy_key, provider=provider)

    def _url(self, path: str, query: bytes, provider: Provider, resolved: RequestScope, version: str) -> str:
        """The provider URL; in api-keys mode without a key the client may have put in the query."""
        if resolved.proxy_key is not None and query:
            query = query_without_credentials(query, resolved.proxy_key)
        return self.upstream.url(path, query, provider, version)

    def _family(self, path: str | None) -> Wire | None:
        """The wire whose chat path a path sits under (`/messages/count_tokens`, Gemini's
        `/models/{model}:countTokens`), if any."""
        if path is None:
            return None
        if model_method(path) is not None:
            return self.wires["/models/*:generateContent"]
        return next((wire for chat_path, wire in self.wires.items() if path.startswith(chat_path + "/")), None)

    async def _passthrough(self, scope: dict[str, Any], receive: Receive, send: Sent, path: str,
                           family: Wire | None, chat_path: bool, version: str) -> str:
        headers = scope["headers"]
        limit = self.settings.server.max_body_bytes
        length = declared_length(headers)
        provider = provider_for(headers, family.provider if family is not None else _version_provider(version),
                                scope["query_string"])
        identity = self.scopes.authenticate_passthrough(scope, own_key=bool(self.upstream.api_key(provider)))
        self._count_side_request(RequestFacts(scope["method"], path, headers), family)
        upstream_headers = self._upstream_headers(headers, provider, identity)
        owner = self.ownership.owner(identity, provider)
        creates = (await self.ownership.admit(owner, provider, scope["method"], path, version) if owner is not None
                   else None)
        if creates is not None:
            upstream_headers = _uncompressed(upstream_headers)  # its id is read from the answer
        has_body = scope["method"] not in ("GET", "HEAD", "OPTIONS") or bool(length)
        held: bytes | None = None
        if owner is not None and has_body and not _is_multipart(headers):
            # Read whole to check the objects it names before any of it goes.
            held = await read_body(receive, limit, self.settings.server.body_timeout_s)
            await self.ownership.check_body(owner, provider, path, held)
            length = len(held)
        if length is not None:
            upstream_headers.append((b"content-length", str(length).encode()))
        url = self._url(path, scope["query_string"], provider, identity, version)
        async with DisconnectWatch(receive, armed=not has_body or held is not None) as watch:
            content = held if held is not None or not has_body else body_stream(
                receive, limit, on_end=watch.arm, idle_s=self.settings.server.body_timeout_s)
            response = await open_upstream(self.upstream, self.metrics, scope["method"], url, upstream_headers,
                                           content)
            if creates is not None and owner is not None:
                response = self.ownership.recorded(response, owner, provider, creates,
                                                   listing=scope["method"] == "GET")
            try:
                # Every response to a chat path says the memory status (a GET: not a turn).
                await relay_plain(send, response, extra_headers=_status_header(NOT_A_TURN) if chat_path else [],
                                  shape=send.shape, heartbeat_s=self._heartbeat_s(send.shape))
            finally:
                await response.aclose()
        return "client_gone" if watch.gone else f"status_{response.status}"

    def _count_side_request(self, facts: RequestFacts, wire: Wire | None) -> bool:
        rule = self.side_requests.match(facts)
        if rule is None:
            return False
        self.metrics.side_requests.labels(rule, wire.name if wire is not None else "none").inc()
        return True

    def _complete_identity(self, scope: dict[str, Any], path: str, resolved: RequestScope, wire: Wire,
                           request: WireRequest) -> RequestScope:
        """The request's identity, finished before memory runs: the body's user, a side request."""
        resolved = self.scopes.with_body_user(resolved, request.transcript.body_user)
        facts = RequestFacts(scope["method"], path, scope["headers"], request.body, request.transcript.prompt)
        if resolved.memory_on and self._count_side_request(facts, wire):
            return replace(resolved, mode="off", side_request=True)
        return resolved

    def _heartbeat_s(self, shape: ErrorShape) -> float:
        """How often a silent stream gets a `: ping`; never on a wire whose clients cannot skip one."""
        return self.settings.server.heartbeat_s if shape.sse_comments else 0.0

    async def _chat(self, scope: dict[str, Any], receive: Receive, send: Sent, path: str, wire: Wire,
                    version: str) -> str:
        provider = provider_for(scope["headers"], wire.provider)
        resolved = self.scopes.resolve(scope, own_key=bool(self.upstream.api_key(provider)))
        upstream_headers = self._upstream_headers(scope["headers"], provider, resolved)
        owner = self.ownership.owner(resolved, provider)
        creates = await self.ownership.admit(owner, provider, "POST", path, version) if owner is not None else None
        body = await read_body(receive, self.settings.server.max_body_bytes, self.settings.server.body_timeout_s)
        if owner is not None:
            document = await self.ownership.check_body(owner, provider, path, body)
            creates = creates or self.ownership.created_by_body(path, document)
        parsed: WireRequest | str | None = None
        if resolved.needs_body:
            parsed = wire.parse(body)
            if isinstance(parsed, str):
                log.info("memory skipped: %s", parsed)
            else:
                resolved = self._complete_identity(scope, path, resolved, wire, parsed)
        request = parsed if isinstance(parsed, WireRequest) else None
        refuse = self.tools_refusals.get(_table_key(path))
        if request is not None and resolved.memory_on and resolved.mode == "tools" and refuse is not None:
            refusal = refuse(request.body, scope["query_string"])
            if refusal is not None:
                raise refusal
        recall: Recall | None = None  # None: the client left during the recall itself
        try:
            async with DisconnectWatch(receive) as watch:
                recall = await self.memory.recall(resolved, request.transcript if request is not None else None,
                                                  wire.name)
                tool_format = self._tool_format(path, wire, recall, request)
                send.error_headers = recall.headers()
                if recall.prompt is not None and request is not None:
                    request, body = await _off_loop_if(request.large, _with_prompt, wire, request, recall.prompt, body)
                out_body = await _off_loop_if(request is not None and request.large,
                                              _with_block, wire, request, recall, body)
                if recall.active or tool_format is not None or creates is not None:
                    # We read a copy of the answer (to save it, to find memory calls, to record its
                    # id): ask for it uncompressed.
                    upstream_headers = _uncompressed(upstream_headers)
                url = self._url(path, scope["query_string"], provider, resolved, version)
                if tool_format is not None and recall.tools is not None and request is not None:
                    tools = ToolsStep(self.upstream, self.metrics, tool_format, recall.tools, url, upstream_headers,
                                      self.settings.memory.tool_rounds, recall)
                    response = await _run_tools(tools, recall, request)
                else:
                    step = InjectStep(self.upstream, self.metrics, wire, url, upstream_headers)
                    response = await step.run(out_body, body, recall)
                if creates is not None and owner is not None:
                    response = self.ownership.recorded(response, owner, provider, creates)
                try:
                    await relay_chat(send, response, recall, wire, self._heartbeat_s(wire))
                finally:
                    await response.aclose()
        except asyncio.CancelledError:
            if recall is not None:
                recall.failed("interrupted")  # a turn already complete stays complete
            raise
        if watch.gone:  # the client left, perhaps before any provider call (no response)
            if recall is not None:
                recall.aborted()
            return "client_gone"
        if response.status == 404:
            self._hint_404(provider, url)
        return f"status_{response.status}"

    def _tool_format(self, path: str, wire: Wire, recall: Recall, request: WireRequest | None) -> ToolFormat | None:
        """The wire's tool format when the memory tools go with this request (tools mode); else None,
        and `recall.status` says why not when they were meant to."""
        if recall.tools is None or request is None:
            return None
        tool_format = self.tool_formats.get(_table_key(path))
        if tool_format is None:
            recall.status = f"degraded: no memory tools on the {wire.name} wire"
            return None
        unfit = self.tools_unfit.get(_table_key(path))
        why = unfit(request.body) if unfit is not None else None
        if why is not None:
            log.info("tools mode: %s; the request goes on without them", why)
            recall.status = f"degraded: {why}"
            return None
        return tool_format

    def _hint_404(self, provider: Provider, url: str) -> None:
        """A provider answering 404 on a chat path most often means a base URL without its
        version prefix (`https://api.openai.com` for `.../v1`): say so once a provider."""
        if provider in self.hinted_404:
            return
        self.hinted_404.add(provider)
        if provider == "gemini":  # its client sends the version: the base has none (checked at start-up)
            log.warning("the provider answered 404 on a chat path (%s): is the model's name right? %s takes the "
                        "host alone, for example https://generativelanguage.googleapis.com", url.split("?")[0],
                        _URL_SETTING[provider])
            return
        log.warning("the provider answered 404 on a chat path (%s); %s must include the provider's version "
                    "prefix, for example https://api.openai.com/v1", url.split("?")[0], _URL_SETTING[provider])


async def _run_tools(step: ToolsStep, recall: Recall, request: WireRequest) -> Any:
    """The tools step's response; a provider that fails the first round fails the request, as in inject mode."""
    try:
        return await step.run(request.body, request.stream)
    except ProxyError as error:
        recall.failed("upstream_failed")
        error.headers = {k.decode(): v.decode() for k, v in recall.headers()}
        raise


async def _interrupted(sent: Sent) -> str:
    """End a response the server stops at the end of its grace period, and say so."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()  # handled here: the response is ended, the task finishes normally
    log.info("response interrupted: the server's grace period is over")
    try:
        await end_interrupted(sent)
    except ResponseAborted:
        pass  # a JSON body half sent: the connection closes
    return "interrupted"


def _with_block(wire: Wire, request: WireRequest | None, recall: Recall, body: bytes) -> bytes:
    if not recall.block or request is None:
        return body
    try:
        return wire.insert_block(request, recall.block)
    except ValueError:  # too deep to re-serialise here: send what the client sent
        recall.dropped_block()
        return body


def _with_prompt(wire: Wire, request: WireRequest, prompt: str, body: bytes) -> tuple[WireRequest, bytes]:
    """The request with a hook's rewritten prompt, and its body (also what goes when the block must
    come out)."""
    rewritten = wire.with_prompt(request, prompt)
    try:
        return rewritten, dump_json(rewritten.body, in_pieces=rewritten.large)
    except ValueError:  # too deep to re-serialise here: the client's own words go
        return request, body


async def _off_loop_if(large: bool, function: Callable[..., T], *args: Any) -> T:
    """`function(*args)`, in a thread when the request is large enough that re-serialising it would
    hold the event loop up."""
    return await asyncio.to_thread(function, *args) if large else function(*args)


def _versioned_path(scope: dict[str, Any]) -> tuple[str, str | None]:
    """The request's version prefix (/v1, or Gemini's /v1beta, /upload/v1beta, /upload/v1) and its path
    after it (None: no path memproxy serves)."""
    raw = scope.get("raw_path") or scope["path"].encode()
    path = raw.split(b"?", 1)[0].decode("latin-1")
    version = next((v for v in _VERSIONS if path.startswith(v + "/")), None)
    if version is None:
        return "/v1", None
    rest = path[len(version):]
    segments = rest.lower().replace("%2e", ".").split("/")
    if any(segment in (".", "..") for segment in segments):
        return version, None  # no path may climb out of the provider's version prefix
    return version, rest


def _table_key(path: str) -> str:
    """A path as the wire table holds it: Gemini's `/models/{model}:method` without its model."""
    found = model_method(path)
    return f"/models/*:{found[1]}" if found is not None else path


def _version_provider(version: str) -> Provider | None:
    return "gemini" if version == _GEMINI_VERSION or version in _GEMINI_UPLOADS else None


def _uncompressed(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The headers asking the provider for an answer memproxy can read as it comes."""
    return [(k, v) for k, v in headers if k != b"accept-encoding"] + [(b"accept-encoding", b"identity")]


def _is_multipart(headers: list[tuple[bytes, bytes]]) -> bool:
    """A form upload (a file, audio): it names no stored object, and is streamed as it comes."""
    return any(name.lower() == b"content-type" and value.lower().lstrip().startswith(b"multipart/")
               for name, value in headers)


def _status_header(status: str) -> list[tuple[bytes, bytes]]:
    return [(b"x-memory-status", status.encode())]
