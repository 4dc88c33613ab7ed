"""The /v1 proxy endpoint: parse → scope → memory → upstream → respond.

Chat completions with a user scope get memory (recall before, persistence after); every
other /v1 path, and any request without a scope, is a transparent pass-through.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from proxy.errors import BodyTooLarge, ClientGone, NotFound, ProxyError, UpstreamProtocolError, UpstreamTimeout
from proxy.exchange import ChatMemory, Recall
from proxy.metrics import Metrics
from proxy.relay import (
    DisconnectWatch, Receive, ResponseAborted, Send, Sent, body_stream, declared_length, read_body,
    send_error,
)
from proxy.responses import end_interrupted, readable_body, relay_chat, relay_plain
from proxy.scope import ScopeResolver
from proxy.settings import Settings
from proxy.upstream import StreamCut, Upstream, request_headers
from proxy.wire.openai_chat import ChatRequest, insert_block, is_context_length_error, parse_chat_request

log = logging.getLogger("memproxy.request")

CHAT_PATH = "/chat/completions"
# A body longer than this gets its memory block in a thread: writing a 30 MB body again
# would otherwise hold the event loop (and every other stream) for a large fraction of a second.
BLOCK_INLINE_BYTES = 1 << 20


class ProxyEndpoint:
    """ASGI app for every path under /v1."""

    def __init__(
        self, settings: Settings, upstream: Upstream, scopes: ScopeResolver, memory: ChatMemory, metrics: Metrics
    ) -> None:
        self.settings = settings
        self.upstream = upstream
        self.scopes = scopes
        self.memory = memory
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        path = _path_after_v1(scope)
        outcome = "ok"
        send = Sent(send)
        if path == CHAT_PATH:
            send.error_headers = _status_header("off")  # SPEC 1: every chat response says the memory status
        try:
            if path is None:
                raise NotFound("no such path")
            limit = self.settings.server.max_body_bytes
            length = declared_length(scope["headers"])
            if length is not None and length > limit:
                raise BodyTooLarge(f"request body is larger than the limit of {limit} bytes")
            if scope["method"] == "POST" and path == CHAT_PATH:
                outcome = await self._chat(scope, receive, send, path)
            else:
                outcome = await self._passthrough(scope, receive, send, path)
        except ProxyError as error:
            outcome = error.code
            needs_status = path == CHAT_PATH and "x-memory-status" not in error.headers
            await send_error(send, error, _status_header("off") if needs_status else None)
        except ClientGone:
            outcome = "client_gone"
        except ResponseAborted:
            outcome = "upstream_cut"
        except asyncio.CancelledError:
            # Only uvicorn cancels a request (a client that leaves is DisconnectWatch's): the
            # server's grace period is over and it still runs (RELIABILITY 5.2 case 24).
            outcome = await _interrupted(send)
        finally:
            elapsed = time.perf_counter() - started
            self.metrics.request_done(path or "other", outcome, elapsed)
            log.info("request", extra={"path": path, "method": scope["method"], "outcome": outcome,
                                       "ms": round(elapsed * 1000, 2)})

    async def _passthrough(self, scope: dict[str, Any], receive: Receive, send: Send, path: str) -> str:
        headers = scope["headers"]
        limit = self.settings.server.max_body_bytes
        length = declared_length(headers)
        identity = self.scopes.authenticate_passthrough(scope)
        upstream_headers = request_headers(headers, api_key=self.settings.upstream.api_key,
                                           drop_authorization=identity.uses_proxy_key)
        if length is not None:
            upstream_headers.append((b"content-length", str(length).encode()))
        has_body = scope["method"] not in ("GET", "HEAD", "OPTIONS") or bool(length)
        url = self.upstream.url(path, scope["query_string"])
        async with DisconnectWatch(receive, armed=not has_body) as watch:
            content = (body_stream(receive, limit, on_end=watch.arm, idle_s=self.settings.server.body_timeout_s)
                       if has_body else None)
            response = await self._open(scope["method"], url, upstream_headers, content)
            try:
                # SPEC 1: every response to the chat path says the memory status (a GET: off).
                await relay_plain(send, response, extra_headers=_status_header("off") if path == CHAT_PATH else [],
                                  heartbeat_s=self.settings.server.heartbeat_s)
            finally:
                await response.aclose()
        return "client_gone" if watch.gone else f"status_{response.status}"

    async def _open(self, method: str, url: Any, headers: Any, content: Any) -> Any:
        """The provider's response (headers read), its latency counted whether it came or failed."""
        started = time.perf_counter()
        try:
            return await self.upstream.open(method, url, headers, content)
        finally:
            self.metrics.upstream_seconds.observe(time.perf_counter() - started)

    async def _chat(self, scope: dict[str, Any], receive: Receive, send: Sent, path: str) -> str:
        resolved = self.scopes.resolve(scope)
        body = await read_body(receive, self.settings.server.max_body_bytes, self.settings.server.body_timeout_s)
        parsed: ChatRequest | str | None = None
        if resolved.needs_body:
            parsed = parse_chat_request(body)
            if isinstance(parsed, str):
                log.info("memory skipped: %s", parsed)
        recall: Recall | None = None  # None: the client left during the recall itself
        try:
            async with DisconnectWatch(receive) as watch:
                recall = await self.memory.recall(resolved, parsed if isinstance(parsed, ChatRequest) else None)
                send.error_headers = recall.headers()
                out_body = (_with_block(parsed, recall, body) if len(body) <= BLOCK_INLINE_BYTES
                            else await asyncio.to_thread(_with_block, parsed, recall, body))
                response = await self._send_chat(scope, resolved, out_body, recall, body)
                try:
                    await relay_chat(send, response, recall, self.settings.memory.commit_timeout_ms / 1000,
                                     self.settings.server.heartbeat_s)
                finally:
                    await response.aclose()
        except asyncio.CancelledError:
            if recall is not None:
                recall.failed("interrupted")  # a turn already complete stays complete
            raise
        if watch.gone:
            if recall is not None:
                recall.aborted()
            return "client_gone"
        return f"status_{response.status}"

    async def _send_chat(self, scope: dict[str, Any], resolved: Any, out_body: bytes, recall: Recall,
                         original: bytes) -> Any:
        headers = request_headers(scope["headers"], api_key=self.settings.upstream.api_key,
                                  drop_authorization=resolved.uses_proxy_key)
        if recall.active:
            # We read a copy of the answer to save it: ask for it uncompressed.
            headers = [(k, v) for k, v in headers if k != b"accept-encoding"] + [(b"accept-encoding", b"identity")]
        url = self.upstream.url(CHAT_PATH, scope["query_string"])
        try:
            response = await self._open("POST", url, headers, out_body)
            if recall.block and response.status == 400:
                response = await self._retry_without_block(response, url, headers, original, recall)
        except ProxyError as error:
            recall.failed("upstream_failed")
            error.headers = {k.decode(): v.decode() for k, v in recall.headers()}
            raise
        return response

    async def _retry_without_block(self, response: Any, url: Any, headers: Any, original: bytes,
                                   recall: Recall) -> Any:
        """SPEC 1: memory never turns an accepted request into a context-length error."""
        try:
            body = b"".join([chunk async for chunk in response.chunks()])
        except StreamCut as cut:  # nothing has gone to the client yet: answer as for no answer
            if cut.code == "upstream_idle_timeout":
                raise UpstreamTimeout(cut.message) from cut
            raise UpstreamProtocolError(cut.message) from cut
        finally:
            await response.aclose()
        # Read as memproxy reads an answer: a provider may gzip its errors (and the client's
        # accept-encoding goes along when the answer is not saved).
        if not is_context_length_error(400, readable_body(response, body)):
            return _Replayed(response, body)
        recall.dropped_block()
        return await self._open("POST", url, headers, original)


class _Replayed:
    """A response whose body was already read, replayed to the client as it came."""

    def __init__(self, response: Any, body: bytes) -> None:
        self.response = response.response
        self.status = response.status
        self.content_type = response.content_type
        self._body = body

    async def chunks(self) -> Any:
        yield self._body

    async def aclose(self) -> None:
        return None


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


def _with_block(parsed: ChatRequest | str | None, recall: Recall, body: bytes) -> bytes:
    if not recall.block or not isinstance(parsed, ChatRequest):
        return body
    try:
        return insert_block(parsed, recall.block)
    except ValueError:  # too deep to re-serialise here: send what the client sent
        recall.dropped_block()
        return body


def _path_after_v1(scope: dict[str, Any]) -> str | None:
    raw = scope.get("raw_path") or scope["path"].encode()
    path = raw.split(b"?", 1)[0].decode("latin-1")
    if not path.startswith("/v1/"):
        return None
    rest = path[3:]
    segments = rest.lower().replace("%2e", ".").split("/")
    if any(segment in (".", "..") for segment in segments):
        return None  # no path may climb out of the provider's /v1 prefix
    return rest


def _status_header(status: str) -> list[tuple[bytes, bytes]]:
    return [(b"x-memory-status", status.encode())]
