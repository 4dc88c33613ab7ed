"""The memory API under /memory/v1 (docs/memory-api.md): thin endpoints over the store and the retriever.

`ApiApp` is the pure-ASGI shell around them: the access rule (auth.py), OpenAI-style
error bodies for every failure, and one structured log line per request with the route's
template, never the ids or text in it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Match, Route, Router
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from proxy.api import records
from proxy.api.auth import ApiGuard
from proxy.api.cursors import Listing
from proxy.api.errors import (
    Conflict, InvalidRequest, ItemNotFound, MethodNotAllowed, PayloadTooLarge, StoreUnavailable,
    UnsupportedMediaType, WriteBlocked,
)
from proxy.api.injections import resolved
from proxy.api.jsonl import parse_lines, to_line
from proxy.api.schema import openapi
from proxy.api.search import search
from proxy.api.users import user_counts
from proxy.http.body_deadline import BodyDeadline
from proxy.errors import NotFound, ProxyError
from proxy.ids import new_id
from proxy.memory.hooks.runner import HookContext, Hooks
from proxy.memory.retrieval.base import Retriever
from proxy.redaction.redact import redact
from proxy.memory.writer import Writer
from proxy.metrics import Metrics
from proxy.models import Scope
from proxy.http.asgi import StatusKept, send_error
from proxy.settings import Settings
from proxy.stores.base import PageKey, Store, StoreError, StoreMemory

log = logging.getLogger("memproxy.api")

JSON_BODY_LIMIT = 1024 * 1024
JSON_TYPES = ("application/json",)
JSON_LINES_TYPES = ("application/x-ndjson", "application/jsonl")
FLUSH_BEFORE_DELETE_S = 5.0  # writes queued for the user commit first (then deleted); the rest are dropped
Endpoint = Callable[[Request], Awaitable[Response]]


def answer(data: Any, status: int = 200) -> Response:
    """A JSON answer."""
    return Response(records.dumps(data), status_code=status, media_type="application/json")


async def read_body(request: Request, limit: int, idle_s: float) -> bytes:
    """The request body, or 413 as soon as it passes `limit` bytes, or 408 when it stops
    arriving or trickles (http/body_deadline.py)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the body is larger than the limit of {limit} bytes")
    parts: list[bytes] = []
    size = 0
    deadline = BodyDeadline(idle_s)
    chunks = aiter(request.stream())
    while True:
        try:
            async with asyncio.timeout(deadline.wait_s()):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            return b"".join(parts)
        except TimeoutError:
            raise deadline.expired() from None
        size += len(chunk)
        deadline.received(len(chunk))
        if size > limit:
            raise PayloadTooLarge(f"the body is larger than the limit of {limit} bytes")
        parts.append(chunk)


def require_type(request: Request, accepted: tuple[str, ...]) -> None:
    """415 unless the body's Content-Type is one of `accepted` (parameters such as charset allowed).

    The types a web page may post to another site without a CORS preflight (text/plain, a
    form, or none) are never among them, so a page cannot write through a browser that the
    API trusts.
    """
    sent = request.headers.get("content-type")
    if sent is None or sent.split(";", 1)[0].strip().lower() not in accepted:
        raise UnsupportedMediaType(f"the body must be sent as Content-Type: {' or '.join(accepted)}"
                                   f"{'' if sent is None else f', not {sent!r}'}", param="Content-Type")


async def read_json(request: Request, idle_s: float) -> Any:
    """The JSON body, or 415 for another Content-Type, or 400."""
    require_type(request, JSON_TYPES)
    body = await read_body(request, JSON_BODY_LIMIT, idle_s)
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise InvalidRequest("the body must be a JSON object") from None


def user_scope(request: Request) -> Scope:
    """The scope named by the path: the whole user (every agent)."""
    return Scope(user=records.path_id(request.path_params["user"], "user"))


class MemoryApi:
    """The endpoints, over the app's store, retriever and writer."""

    def __init__(self, settings: Settings, store: Store, retriever: Retriever, writer: Writer,
                 hooks: Hooks | None = None) -> None:
        self.settings = settings
        self.store = store
        self.retriever = retriever
        self.writer = writer
        self.hooks = hooks

    def routes(self) -> list[Route]:
        """Every route of the memory API, relative to /memory/v1."""
        u = "/users/{user}"
        table: list[tuple[str, str, Endpoint]] = [
            ("/openapi.json", "GET", self.openapi),
            (u, "GET", self.user),
            (u, "DELETE", self.delete_user),
            (f"{u}/search", "POST", self.search),
            (f"{u}/memories", "GET", self.list_memories),
            (f"{u}/memories", "POST", self.store_memory),
            (f"{u}/memories/{{id}}", "GET", self.memory),
            (f"{u}/memories/{{id}}", "PATCH", self.correct_memory),
            (f"{u}/conversations", "GET", self.conversations),
            (f"{u}/conversations/{{id}}/messages", "GET", self.messages),
            (f"{u}/entities", "GET", self.entities),
            (f"{u}/entities/{{id}}", "GET", self.entity),
            (f"{u}/reasoning", "GET", self.reasoning),
            (f"{u}/injections", "GET", self.injections),
            (f"{u}/export", "GET", self.export),
            (f"{u}/import", "POST", self.import_records),
        ]
        for kind, plural in (("memory", "memories"), ("message", "messages"), ("entity", "entities"),
                             ("relationship", "relationships"), ("conversation", "conversations")):
            table.append((f"{u}/{plural}/{{id}}", "DELETE", self._deleter(kind)))
        return [Route(path, endpoint, methods=[method]) for path, method, endpoint in table]

    async def openapi(self, request: Request) -> Response:
        return answer(openapi())

    async def search(self, request: Request) -> Response:
        scope = user_scope(request)
        query = records.parse_search(await read_json(request, self.settings.server.body_timeout_s))
        memory = self.settings.memory
        return answer(await search(self.retriever, scope, query, memory.max_memories, memory.block_header))

    async def store_memory(self, request: Request) -> Response:
        scope = user_scope(request)
        memory = records.parse_memory(await read_json(request, self.settings.server.body_timeout_s))
        content = await self._written(scope, redact(memory.content))
        op = StoreMemory(scope, new_id(), content, memory.type, datetime.now(timezone.utc),
                         memory.confidence, tuple(redact(tag) for tag in memory.tags))
        return answer(await self._memory(scope, await self.store.store_memory(op)), 201)

    async def correct_memory(self, request: Request) -> Response:
        scope = user_scope(request)
        memory_id = records.path_id(request.path_params["id"], "id")
        correction = records.parse_correction(await read_json(request, self.settings.server.body_timeout_s))
        content = await self._written(scope, redact(correction))
        outcome = await self.store.update_memory(scope, memory_id, content)
        if outcome is None:
            raise ItemNotFound(f"user {scope.user} has no memory {memory_id}")
        if outcome == "conflict":
            raise Conflict("another memory of this user already has this text as its name")
        return answer(await self._memory(scope, memory_id))

    async def _written(self, scope: Scope, content: str) -> str:
        """A memory's text as the pre_memory_write hooks let it be saved; WriteBlocked when they refuse."""
        if self.hooks is None or not self.hooks.has("pre_memory_write"):
            return content
        # A memory written or corrected here is a store_memory write like the model's: the same
        # policies keep data out of memory (docs/hooks.md), failing closed.
        context = HookContext(scope.user, None, scope.agent, None, "memory_api")
        texts = await self.hooks.pre_memory_write(context, [("memory", content)])
        if texts is None:
            raise WriteBlocked("a pre_memory_write hook did not let this memory be saved")
        return texts[0]

    async def memory(self, request: Request) -> Response:
        scope = user_scope(request)
        return answer(await self._memory(scope, records.path_id(request.path_params["id"], "id")))

    async def _memory(self, scope: Scope, memory_id: str) -> dict[str, Any]:
        entity = await self.store.entity_record(scope, memory_id)
        if entity is not None:
            return records.memory_of_entity(entity)
        message = await self.store.message_record(scope, memory_id)
        if message is None:
            raise ItemNotFound(f"user {scope.user} has no memory {memory_id}")
        return records.memory_of_message(message)

    async def list_memories(self, request: Request) -> Response:
        return await self._listed(request, Listing("entities", user_scope(request).user),
                                  self.store.entity_page, records.memory_of_entity)

    async def conversations(self, request: Request) -> Response:
        return await self._listed(request, Listing("conversations", user_scope(request).user),
                                  self.store.conversation_page, records.conversation)

    async def messages(self, request: Request) -> Response:
        scope = user_scope(request)
        conversation_id = records.path_id(request.path_params["id"], "id")
        listing = Listing("messages", scope.user, conversation_id)
        limit, after = await self._page_params(request, scope, listing)
        if await self.store.conversation_record(scope, conversation_id) is None:
            raise ItemNotFound(f"user {scope.user} has no conversation {conversation_id}")
        rows = await self.store.message_page(scope, conversation_id, limit=limit + 1, after=after)
        return answer(records.page(rows, limit, listing, records.message))

    async def entities(self, request: Request) -> Response:
        return await self._listed(request, Listing("entities", user_scope(request).user),
                                  self.store.entity_page, records.without_kind)

    async def entity(self, request: Request) -> Response:
        scope = user_scope(request)
        entity_id = records.path_id(request.path_params["id"], "id")
        entity = await self.store.entity_record(scope, entity_id)
        if entity is None:
            raise ItemNotFound(f"user {scope.user} has no entity {entity_id}")
        edges = await self.store.relationships(scope, entity_id, current_only=False)
        return answer({**records.without_kind(entity), "relationships": [records.relationship(e) for e in edges]})

    async def reasoning(self, request: Request) -> Response:
        return await self._listed(request, Listing("reasoning", user_scope(request).user),
                                  self.store.reasoning_page, records.without_kind)

    async def _listed(self, request: Request, listing: Listing, fetch: Callable[..., Awaitable[Any]],
                      shape: Callable[[Any], dict[str, Any]]) -> Response:
        """One page of a user's list: `fetch(scope, limit=, after=)` gives keyed rows, `shape` each record."""
        scope = user_scope(request)
        limit, after = await self._page_params(request, scope, listing)
        return answer(records.page(await fetch(scope, limit=limit + 1, after=after), limit, listing, shape))

    async def _page_params(self, request: Request, scope: Scope, listing: Listing) -> tuple[int, PageKey | None]:
        """The page's limit, and the key it starts after (an old-style cursor's item is looked up)."""
        limit, cursor = records.parse_page(request.query_params, listing)
        if not isinstance(cursor, str):
            return limit, cursor
        key = await self.store.page_key(scope, listing.kind, cursor)
        if key is None:  # a bare id can only say where its item is while the item exists
            raise InvalidRequest(f"`cursor` names no item of this list ({cursor}); a next_cursor from a page"
                                 " keeps its place even when its item is deleted", param="cursor")
        return limit, key

    async def injections(self, request: Request) -> Response:
        scope = user_scope(request)
        if request.query_params:
            raise InvalidRequest("the injection log takes no query parameters (it holds the last 20 turns)")
        rows = await resolved(self.store, scope, await self.store.injections(scope))
        return answer({"object": "list", "data": [records.injection(row) for row in rows], "next_cursor": None})

    async def user(self, request: Request) -> Response:
        scope = user_scope(request)
        if request.query_params:
            raise InvalidRequest("a user's counts take no query parameters")
        found = await user_counts(self.store, scope)
        if found is None:
            raise ItemNotFound(f"memproxy holds nothing for user {scope.user}")
        return answer(found)

    async def export(self, request: Request) -> Response:
        scope = user_scope(request)
        found = self.store.export(scope).__aiter__()
        first = await anext(found, None)  # a store failure is a 503 before anything is sent

        async def lines() -> AsyncIterator[bytes]:
            if first is not None:
                yield to_line(first)
                async for record in found:
                    yield to_line(record)

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def import_records(self, request: Request) -> Response:
        scope = user_scope(request)
        require_type(request, JSON_LINES_TYPES)
        found = parse_lines(await read_body(request, self.settings.server.max_body_bytes,
                                           self.settings.server.body_timeout_s))
        return answer(await self.store.import_records(scope, found))

    def _deleter(self, kind: str) -> Endpoint:
        async def delete(request: Request) -> Response:
            scope = user_scope(request)
            item_id = records.path_id(request.path_params["id"], "id")
            counts = await self.store.delete_item(scope, kind, item_id)  # type: ignore[arg-type]
            if counts is None:
                raise ItemNotFound(f"user {scope.user} has no {kind} {item_id}")
            return answer({"id": item_id, "deleted": counts})

        return delete

    async def delete_user(self, request: Request) -> Response:
        scope = user_scope(request)
        await self.writer.flush(FLUSH_BEFORE_DELETE_S)
        self.writer.forget(scope.user)  # what could not commit by now (a locked store) never will
        deleted = await self.store.delete_user(scope)
        self.retriever.forget(scope.user)  # and its vectors held in memory: a deletion empties every cache
        return answer({"user": scope.user, "deleted": deleted})


class ApiApp:
    """Pure ASGI around the API's router: access rule, error bodies, one log line per request."""

    def __init__(self, api: MemoryApi, guard: ApiGuard, metrics: Metrics) -> None:
        self.router = Router(routes=api.routes(), redirect_slashes=False)
        self.guard = guard
        self.metrics = metrics

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        sent = StatusKept(send)
        try:
            if self._template(scope) != "/openapi.json":
                self.guard.check(scope)
            await self.router(scope, receive, sent)
        except Exception as exc:  # the API's outermost boundary: every failure gets an error body
            if sent.status:
                raise  # the answer has started (a long export): nothing better than cutting it
            await send_error(sent, _as_error(exc))
        finally:
            seconds = time.perf_counter() - started
            outcome = sent.outcome
            self.metrics.request_done("memory_api", outcome, seconds)
            log.info("memory api request", extra={"route": self._template(scope), "method": scope.get("method"),
                                                  "outcome": outcome, "ms": round(seconds * 1000, 2)})

    def _template(self, scope: AsgiScope) -> str:
        """The matched route's path template (ids stay out of the logs), or `unknown`."""
        for route in self.router.routes:
            match, _ = route.matches(scope)
            if match is not Match.NONE and isinstance(route, Route):
                return route.path
        return "unknown"


def _as_error(exc: Exception) -> ProxyError:
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, StoreError) and not exc.transient:
        # The write itself cannot be saved (a unique key it would break): retrying cannot help.
        log.info("memory api: write refused by the store (%s)", redact(str(exc)))
        return Conflict("the change clashes with what the user's memory already holds")
    if isinstance(exc, StoreError):
        log.warning("memory api: store failed (%s)", redact(str(exc)))
        return StoreUnavailable("the memory store is unavailable; retry later")
    if isinstance(exc, HTTPException) and exc.status_code == 405:
        return MethodNotAllowed("this path does not take this method")
    if isinstance(exc, HTTPException) and exc.status_code == 404:
        return NotFound("no such path")
    log.exception("memory api: unexpected error")
    return ProxyError("internal error")
