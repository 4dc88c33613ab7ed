"""Tools mode: the two memory tools the model may call, and running one call (docs/tools-mode.md).

`query_memory` reads through the same retriever as inject mode, in the request's scope;
`store_memory` writes what the memory API writes (redacted, then through the
`pre_memory_write` hooks), through the writer every other write goes through. Each call goes
through the `pre_tool_use` and `post_tool_use` hooks (docs/hooks.md), and through the
circuit breaker as inject mode's recall does (the pipeline's search and save). Whatever goes
wrong becomes an error result for the model: a memory call never fails the request.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from proxy.extracted import canonical_name
from proxy.ids import derived_id, id_time_ns
from proxy.memory.hooks.runner import HookContext, Hooks
from proxy.redaction.redact import redact
from proxy.models import Scope, ToolCall
from proxy.stores.base import TAGS_MAX, StoreError, StoreMemory
from proxy.stores.generations import Generation

log = logging.getLogger("memproxy.tools")

QUERY = "query_memory"
STORE = "store_memory"
NAMES = (QUERY, STORE)
MEMORY_TYPES = ("fact", "interaction", "pattern", "user_preference")
CONTENT_MAX_CHARS = 2000
TAG_MAX_CHARS = 40
QUERY_LIMIT_MAX = 20
QUERY_LIMIT_DEFAULT = 5
NOTHING_FOUND = ("No relevant memories found. If the user asks about something you were not told, say that "
                 "you were not told rather than guess.")
WRITE_BLOCKED = "Error: a memory policy kept this out of memory; nothing was stored."
ROUNDS_USED = ("Memory tool limit reached for this request: answer now with what you already have, without "
               "calling a memory tool again.")
STORED = "Stored as memory for later conversations."
# The writer took the write and commits it (retrying a store that is busy or down for a
# moment), and a repeat merges by its id: the model must not think it failed and store it
# again, or tell the user it could not remember.
STORING = "Accepted: it is being stored in memory and will be there in later conversations."
REFUSED = "Error: store_memory failed; nothing was stored. Go on without it."
UNAVAILABLE = "Error: memory is unavailable right now (its store keeps failing); go on without it."

# The tools as JSON Schema; each wire's module wraps them in its own tool format.
SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    QUERY: ("Search the user's long-term memory (earlier conversations, stored facts and preferences). "
            "Call it when the answer may depend on something the user said before.",
            {"type": "object", "properties": {
                "query": {"type": "string", "description": "What to look for, in the user's words."},
                "limit": {"type": "integer", "minimum": 1, "maximum": QUERY_LIMIT_MAX,
                          "description": f"How many memories to return (default {QUERY_LIMIT_DEFAULT})."}},
             "required": ["query"], "additionalProperties": False}),
    STORE: ("Remember something about the user for later conversations: a fact, a preference, a pattern, or "
            "an interaction worth keeping.",
            {"type": "object", "properties": {
                "content": {"type": "string", "minLength": 1, "maxLength": CONTENT_MAX_CHARS},
                "type": {"type": "string", "enum": list(MEMORY_TYPES)},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1,
                               "description": "How sure you are (default 0.7)."},
                "tags": {"type": "array", "maxItems": TAGS_MAX,
                         "items": {"type": "string", "minLength": 1, "maxLength": TAG_MAX_CHARS}}},
             "required": ["content", "type"], "additionalProperties": False}),
}


@dataclass(frozen=True)
class CallResult:
    """What a memory call gives the model: text, and whether it is an error."""

    text: str
    error: bool = False


class BadArguments(ValueError):
    """The model's arguments are not what the tool takes (the model is told why)."""


class Found(Protocol):
    """What a search found (pipeline.Retrieved): the block and its injection-log entry."""

    block: str
    injected: int
    log: dict[str, Any]


# The retriever of inject mode, asked in the request's scope, within inject mode's retrieval
# budget: (query text, limit) -> what it found. TimeoutError past the budget; CircuitOpen.
Search = Callable[[str, int], Awaitable[Found]]
# The writer, given a write and how long to wait for its commit: True once committed, False
# while it is still queued (it commits later). StoreError when it was refused; CircuitOpen.
Save = Callable[[StoreMemory, float], Awaitable[bool]]
# Where a query's injection-log entry goes (the turn's recall): (block, injected, entry).
LogQuery = Callable[[str, int, dict[str, Any]], None]


class CircuitOpen(Exception):
    """The store failed repeatedly (the circuit breaker is open): the call does not wait on it."""


@dataclass(frozen=True)
class CallBounds:
    """How long a store_memory waits for its commit (a locked store must not hold the round), and
    where a query past its budget is counted (with the degraded recalls)."""

    store_s: float
    timed_out: Callable[[str], object]


@dataclass(frozen=True)
class ToolHooks:
    """The hooks a request's memory calls go through, with the turn's own hook context."""

    hooks: Hooks
    context: HookContext


class MemoryTools:
    """The memory calls of one request, in its user's scope."""

    def __init__(self, scope: Scope, search: Search, save: Save, log_query: LogQuery, persist: bool,
                 turn_key: str, conversation_id: str | None, bounds: CallBounds, hooks: ToolHooks | None = None,
                 generation: Generation | None = None, stored_via: str = "tools") -> None:
        self.scope = scope
        self.stored_via = stored_via  # what a stored memory says it came through
        self.turn_key = turn_key  # a retry is the same turn: what it stores again merges by id
        self.conversation_id = conversation_id  # where an `interaction` goes (None: the user's latest)
        self.generation = generation  # the turn's: what it stores goes with a deletion made meanwhile
        self.search = search
        self.save = save
        self.log_query = log_query
        self.persist = persist
        self.bounds = bounds
        self.hooks = hooks

    async def run(self, call: ToolCall) -> CallResult:
        """Run one memory call through its hooks; every failure is an error result.

        Arguments that are not a JSON object get their error without the hooks: there is no
        input to show them, and the call does not run.
        """
        try:
            arguments = _arguments(call.arguments)
        except BadArguments as exc:
            return CallResult(f"Error: {exc}", error=True)
        if self.hooks is None:
            return await self._run(call.name, arguments)
        hooks, context = self.hooks.hooks, self.hooks.context
        decision = await hooks.pre_tool_use(context, call.name, arguments)
        if decision.denied is not None:
            return CallResult(decision.denied, error=True)  # the call does not run
        result = await self._run(call.name, decision.input)
        if not hooks.has("post_tool_use"):
            return result
        output = await hooks.post_tool_use(context, call.name, decision.input, result.text)
        return dataclasses.replace(result, text=output)

    async def _run(self, name: str, arguments: dict[str, Any]) -> CallResult:
        try:
            if name == QUERY:
                return await self._query(arguments)
            return await self._store(arguments)
        except BadArguments as exc:
            return CallResult(f"Error: {exc}", error=True)
        except CircuitOpen:
            return CallResult(UNAVAILABLE, error=True)
        except TimeoutError:
            self.bounds.timed_out(f"{name} timeout")
            return CallResult(f"Error: {name} timed out; go on without it.", error=True)
        except Exception as exc:  # memory never fails a request: the model hears it failed
            log.warning("memory tool %s failed (%s: %s)", name, type(exc).__name__, redact(str(exc))[:200])
            return CallResult(f"Error: {name} failed; go on without it.", error=True)

    async def _query(self, arguments: dict[str, Any]) -> CallResult:
        text = arguments.get("query")
        if not isinstance(text, str) or not text.strip():
            raise BadArguments("`query` must be a non-empty string")
        limit = _limit(arguments.get("limit", QUERY_LIMIT_DEFAULT))
        found = await self.search(text, limit)
        self.log_query(found.block, found.injected, {**found.log, "tool_query": redact(text)})
        if not found.block:
            return CallResult(NOTHING_FOUND)
        return CallResult(found.block)

    async def _store(self, arguments: dict[str, Any]) -> CallResult:
        content, kind, confidence, tags = _memory(arguments)
        if not self.persist:
            return CallResult("Error: memory is read-only for this request; nothing was stored.", error=True)
        content = redact(content)
        if self.hooks is not None and self.hooks.hooks.has("pre_memory_write"):
            # The memory API's write and this one keep data out of memory by the same policies, failing closed.
            texts = await self.hooks.hooks.pre_memory_write(self.hooks.context, [("memory", content)])
            if texts is None:
                return CallResult(WRITE_BLOCKED, error=True)
            content = texts[0]
        memory_id = derived_id(f"memory {self.turn_key} {kind} {content}", id_time_ns(self.turn_key))
        op = StoreMemory(self.scope, memory_id, content, kind, datetime.now(timezone.utc), confidence,
                         tuple(redact(tag) for tag in tags), self.conversation_id, self.generation,
                         self.stored_via)
        # The round waits at most the commit bound (the hooks above ran on their own timeouts);
        # past it the write is still the writer's, and lands.
        try:
            committed = await self.save(op, self.bounds.store_s)
        except StoreError as exc:  # refused: the writer's queue is full, or the store refused the write
            log.warning("memory tool %s: the write was refused (%s)", STORE, redact(str(exc))[:200])
            return CallResult(REFUSED, error=True)
        return CallResult(STORED if committed else STORING)


def _arguments(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text or "{}")
    except (ValueError, RecursionError):
        raise BadArguments("the arguments are not valid JSON") from None
    if not isinstance(doc, dict):
        raise BadArguments("the arguments must be a JSON object")
    return doc


def _limit(value: Any) -> int:
    """query_memory's `limit`: a whole number, also as models write one (`5.0`, `"5"`)."""
    number = value
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if isinstance(number, float) and math.isfinite(number) and number.is_integer():
        number = int(number)
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= QUERY_LIMIT_MAX:
        raise BadArguments(f"`limit` must be a whole number from 1 to {QUERY_LIMIT_MAX}")
    return number


def _memory(arguments: dict[str, Any]) -> tuple[str, str, float, tuple[str, ...]]:
    """store_memory's arguments checked as the memory API checks POST /memories."""
    content = arguments.get("content")
    if not isinstance(content, str) or not content.strip() or len(content) > CONTENT_MAX_CHARS:
        raise BadArguments(f"`content` must be a string of 1-{CONTENT_MAX_CHARS} characters")
    kind = arguments.get("type")
    if kind not in MEMORY_TYPES:
        raise BadArguments(f"`type` must be one of {', '.join(MEMORY_TYPES)}")
    if kind != "interaction" and not canonical_name(content):  # refused here, not by the writer after the round
        raise BadArguments("`content` must hold some words")
    confidence = arguments.get("confidence", 0.7)
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not math.isfinite(confidence) \
            or not 0 <= confidence <= 1:
        raise BadArguments("`confidence` must be a number from 0 to 1")
    tags = arguments.get("tags", [])
    if not isinstance(tags, list) or len(tags) > TAGS_MAX or not all(
            isinstance(t, str) and 1 <= len(t) <= TAG_MAX_CHARS for t in tags):
        raise BadArguments(f"`tags` must be at most {TAGS_MAX} strings of 1-{TAG_MAX_CHARS} characters")
    return content, kind, float(confidence), tuple(dict.fromkeys(tags))
