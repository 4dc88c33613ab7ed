"""recall(scope, request) -> the block and a TurnRecall; the answer is remembered after.

Memory never fails a request: the whole recall (turn lookup and retrieval) runs under
`memory.retrieval_timeout_ms`; a timeout, a store error or an open circuit sends the
request on without a block and says why in X-Memory-Status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar

from proxy.errors import MemoryUnavailable, PolicyBlocked
from proxy.ids import new_id
from proxy.memory.chat_memory import Recall, off_status
from proxy.memory.retrieval.admission import RecallGate
from proxy.memory.retrieval.block import DEFAULT_HEADER, strip_block
from proxy.memory.retrieval.base import QUERY_EDGE_CHARS, Query, Retrieved, Retriever
from proxy.memory.breaker import CircuitBreaker
from proxy.memory.hooks import turn_hooks
from proxy.memory.hooks.runner import HookContext, Hooks
from proxy.memory.learning.extractors import Extractor, RulesExtractor
from proxy.memory.learning.inline_facts import InlineFacts, queue_from
from proxy.memory.kept_step import earlier_steps, packed
from proxy.memory.learning.pending_facts import PendingFacts
from proxy.redaction.redact import INLINE_REDACT_CHARS, redact, restored
from proxy.memory.retrieval.sources import edges
from proxy.memory.tools import CallBounds, CircuitOpen, MemoryTools, Save, Search, ToolHooks
from proxy.memory.writer import Writer
from proxy.metrics import Metrics
from proxy.models import AssistantMessage, Hit, ReasoningStep, Scope, Transcript
from proxy.identity.scope import RequestScope
from proxy.settings import MemorySettings, Settings
from proxy.stores.base import (
    DropHookContext, FinishTurn, RecordResponse, RecordToolCalls, SaveBlock, SaveHookStart, SetTurnStatus, StartTurn,
    Store, StoreError, StoreMemory, text_hash,
)
from proxy.stores.generations import Generation
from proxy.stores.hash_key import load_hash_key
from proxy.memory.turns import TurnIdentity, fallback_identity, history_digest, identify, sealed_call_ids

log = logging.getLogger("memproxy.memory")

T = TypeVar("T")

STEP_RESULT_CHARS = 200  # a reasoning step keeps a short form of its tool's result
# Recalls that read the store at once (admission.py), and the share of a recall's budget it
# may wait for its turn: one that starts later would reach its sources' deadline (retrieval's
# SOURCE_SHARE) before they could answer.
RECALLS_RUNNING = 4
TURN_WAIT_SHARE = 0.8
# A recall's timeout counts against the store only when the store answered nothing for this
# many budgets (1 s by default): a garbage collection or a starved host can hold the event
# loop for a few hundred ms while the store itself is fine (breaker.py).
QUIET_BUDGETS = 4
# A tool result is read this far, redacted, then cut to its short form: a secret that
# begins within the short form ends within this.
STEP_RESULT_READ_CHARS = STEP_RESULT_CHARS + 4096
# The longest a request waits for its user's pending rules facts, as a share of
# memory.retrieval_timeout_ms: the retrieval after it still has the rest.
FACTS_WAIT_SHARE = 0.25
# A store_memory outside a chat turn (MCP) answers once committed, so the caller's next
# request finds it; a store locked past this gets "Accepted: it is being stored".
OUTSIDE_TURN_COMMIT_WAIT_S = 10.0


class MemoryService:
    """ChatMemory with a store: recall before the upstream call, persistence after."""

    def __init__(self, settings: Settings, store: Store, writer: Writer, retriever: Retriever,
                 metrics: Metrics, pending: PendingFacts | None = None, hooks: Hooks | None = None,
                 extractor: Extractor | None = None) -> None:
        self.settings = settings
        self.memory: MemorySettings = settings.memory
        self.store = store
        self.writer = writer
        self.retriever = retriever
        self.metrics = metrics
        self.hash_key = load_hash_key(settings.store)
        # Rules facts are stored within milliseconds: a user's next request waits for them.
        mined = settings.extraction.mode == "rules" and "user" in settings.extraction.from_roles
        self.pending = pending if mined else None
        # The extraction worker's extractor (the rules, in this mode): shared, so the rules run
        # one message at a time in one thread, as the GIL would have them anyway.
        self.inline_facts = (InlineFacts(writer, extractor or RulesExtractor(),
                                         isolate_agents=settings.scope.isolation == "agent")
                             if mined else None)
        self.breaker = CircuitBreaker(metrics)
        self.gate = RecallGate(RECALLS_RUNNING)
        self.hooks = hooks  # None: no hooks configured, and the request path does nothing for them
        self.hook_saves: set[asyncio.Task[None]] = set()  # saves waiting on a pre_memory_write hook

    async def settle_hook_saves(self, timeout_s: float) -> None:
        """Wait, at most `timeout_s`, for the saves still waiting on their hooks: a graceful stop
        must not drop a turn whose response went out before its pre_memory_write hook answered."""
        if self.hook_saves:
            await asyncio.wait(set(self.hook_saves), timeout=timeout_s)

    async def recall(self, resolved: RequestScope, request: Transcript | None, wire: str = "") -> Recall:
        """The Recall of one chat request (its identity already complete)."""
        if not resolved.memory_on or request is None or resolved.scope is None:
            return Recall(off_status(resolved, request))
        scope = resolved.scope
        persist = resolved.persist and self.memory.persist_interactions
        now = datetime.now(timezone.utc)
        status = "ok"
        retrieved = Retrieved()
        identity: TurnIdentity | None = None
        echoes: dict[str, str] = {}  # tools mode: the memory exchanges of the loop's earlier steps
        traces: dict[str, tuple[ReasoningStep, ...]] = {}  # tools mode: their memory calls, by call id
        provider: str | None = None  # tools mode: the provider's id of the response the request continues
        digest = await history_digest(scope, request, self.hash_key)
        hooked: turn_hooks.TurnStart | None = None  # None: no hooks, or they have not run yet
        queued: asyncio.Future[list[tuple[int, str]]] | None = None
        if not self.breaker.allow():
            status = "degraded: circuit open"
        else:
            started = time.perf_counter()
            budget_s = self.memory.retrieval_timeout_ms / 1000
            began = asyncio.get_running_loop().time()
            answer_by = began + budget_s
            reading = False  # the recall's turn came (admission.py) and it asked the store
            try:
                async with asyncio.timeout_at(answer_by) as budget:
                    if self.pending is not None:
                        # Waited for before a turn to read is taken: a store that cannot commit
                        # (locked) must not hold the admission slots of other recalls meanwhile.
                        await self.pending.settled(scope.user, budget_s * FACTS_WAIT_SHARE)
                    async with self.gate.admitted(began + budget_s * TURN_WAIT_SHARE):
                        reading = True
                        identity = await self._identify(scope, request, now, digest)
                        if resolved.mode == "tools":
                            echoes, traces, provider = await self._tool_state(scope, request, identity)
                        if self.hooks is None:
                            retrieved = await self._block(scope, request, identity, resolved, answer_by)
                    if self.hooks is not None:
                        # Outside the gate: a slow hook holds no other recall's turn to read.
                        hooked = await self._hooked(budget, scope, request, identity, wire)
                        answer_by = budget.when() or answer_by  # the budget waited while the hooks ran
                        request = turn_hooks.with_prompt(request, hooked.prompt)
                        queued = self._queued_context(scope, identity)  # read while retrieval runs
                        async with self.gate.admitted(answer_by - budget_s * (1 - TURN_WAIT_SHARE)):
                            retrieved = await self._block(scope, request, identity, resolved, answer_by)
                        retrieved = await self._kept(budget, scope, identity, retrieved, wire)
                        if queued is not None:
                            hooked = turn_hooks.with_queued(hooked, await queued)
                self.breaker.succeeded()
            except PolicyBlocked:
                raise  # a policy's refusal, not a memory fault: the client gets it
            except TimeoutError:
                if reading:  # one that timed out waiting for its turn learnt nothing about the store
                    self.breaker.timed_out(budget_s * QUIET_BUDGETS, self.store.answered_at)
                status = self._degraded("retrieval timeout")
            except StoreError as exc:
                self.breaker.failed()
                status = self._degraded("store unavailable", exc)
            except Exception as exc:  # the outermost boundary: memory must never fail a request
                self.breaker.failed()
                status = self._degraded("retrieval error", exc)
            finally:
                if queued is not None and queued.cancel() is False and not queued.cancelled():
                    queued.exception()  # retrieval failed first: the turn goes without what was queued
            retrieved.log["ms"] = round((time.perf_counter() - started) * 1000, 3)
        if status != "ok" and self.memory.required:
            # memory.required: memory is part of the answer here, so no answer without it.
            reason = status.removeprefix("degraded: ")
            error = MemoryUnavailable(f"memory is required (memory.required) and unavailable: {reason}")
            error.headers = {"x-memory-status": status}
            raise error
        identity = identity or fallback_identity(scope, digest=digest, now=now,
                                                 retry_window_s=self.memory.retry_window_s)
        if self.hooks is not None and hooked is None:
            # The store could not be asked: a policy still sees (and may block) the prompt.
            hooked = await self._start_hooks(scope, request, identity, wire)
            request = turn_hooks.with_prompt(request, hooked.prompt)
        hooked = hooked or turn_hooks.TurnStart()
        if hooked.context and not retrieved.log.get("cache"):  # a cached block carries its context
            retrieved.block = turn_hooks.with_context(retrieved.block, hooked.context, self.memory.max_tokens)
        parts = await saved(request, self.memory.block_header, hooked.context) if persist else Saved()
        recall = TurnRecall(self, scope, identity, persist, status, retrieved, parts, request.previous_response,
                            wire, hooked)
        if resolved.mode == "tools" and status == "ok":
            tool_hooks = (None if self.hooks is None else ToolHooks(
                self.hooks, turn_hooks.hook_context(scope, identity.conversation_id, identity.key, wire)))
            bounds = CallBounds(self.memory.commit_timeout_ms / 1000, self._degraded)
            header = self.memory.block_header
            shown = (user_text(request, header), *visible_texts(request, header), *identity.shown)
            recall.tools = MemoryTools(scope, self._searcher(scope, identity.conversation_id, shown), self._saver(),
                                       recall.logged_query, persist, identity.key, identity.conversation_id,
                                       bounds, tool_hooks, recall.generation)
            recall.echoes = echoes
            recall.earlier_trace = traces
            recall.provider_response = provider
        recall.started(now)
        return recall

    async def tools_outside_turn(self, resolved: RequestScope, wire: str, *, writes: bool) -> MemoryTools:
        """The memory tools for a caller with no chat turn (the MCP endpoint): the caller's scope (an
        `interaction` goes to the conversation it names, else the user's latest), hooks told `wire`
        and neither a turn nor a conversation. `writes`: a store_memory is
        coming, so the user's deletion generation is read first, as a turn reads it when it starts: a
        deletion while the write is in flight wins, on any replica."""
        assert resolved.scope is not None
        scope = resolved.scope
        call_key = new_id()  # what the call's memory id derives from, as a turn's key in tools mode
        generation = await self._generation(scope) if writes else None
        hooks = None if self.hooks is None else ToolHooks(
            self.hooks, HookContext(scope.user, None, scope.agent, None, wire))  # no turn, no conversation
        bounds = CallBounds(OUTSIDE_TURN_COMMIT_WAIT_S, self._degraded)
        return MemoryTools(scope, self._searcher(scope, scope.conversation or "", ()), self._saver(), _unlogged,
                           resolved.persist and self.memory.persist_interactions, call_key, scope.conversation,
                           bounds, hooks, generation, stored_via=wire)

    async def _generation(self, scope: Scope) -> Generation | None:
        """The user's deletion generation now; None (not checked) when the store cannot say."""
        try:
            found = await self.store.find_turn(scope, (), "", datetime.now(timezone.utc))
        except StoreError as exc:  # the write goes on, unchecked, and the writer retries it
            log.warning("deletion generation unread, the write goes unchecked (%s)", redact(str(exc))[:200])
            return None
        return Generation(found.generation, scope.conversation or "")

    def _searcher(self, scope: Scope, conversation_id: str, shown: tuple[str, ...]) -> Search:
        """query_memory's search: inject mode's retrieval, in the request's scope and conversation; what
        the request shows the model (`shown`: its prompt too, saved before the model asks) is never found
        again."""
        visible = tuple(edges(text, QUERY_EDGE_CHARS) for text in shown)

        async def search(text: str, limit: int) -> Retrieved:
            # As inject mode's retrieval: within its budget, admitted like any other recall, and
            # through the circuit breaker: a failing store is not waited on by every call.
            if not self.breaker.allow():
                raise CircuitOpen()
            began = asyncio.get_running_loop().time()
            budget_s = self.memory.retrieval_timeout_ms / 1000
            query = Query(edges(text, QUERY_EDGE_CHARS), conversation_id, visible, min(limit, 12),
                          answer_by=began + budget_s)
            reading = False  # its turn came (admission.py) and it asked the store
            try:
                async with asyncio.timeout_at(began + budget_s):
                    async with self.gate.admitted(began + budget_s * TURN_WAIT_SHARE):
                        reading = True
                        found = await self.retriever.retrieve(scope, query)
            except TimeoutError:
                if reading:  # counted as a recall's timeout is: only when the store answers nobody
                    self.breaker.timed_out(budget_s * QUIET_BUDGETS, self.store.answered_at)
                raise
            except Exception:  # a store or retrieval error, as a recall's counts; the call reports it
                self.breaker.failed()
                raise
            self.breaker.succeeded()
            return found
        return search

    def _saver(self) -> Save:
        """store_memory's write: through the writer, as every write (it retries a store that fails
        for a while, and a repeat merges by id), and through the circuit breaker."""
        async def save(op: StoreMemory, wait_s: float) -> bool:
            if not self.breaker.allow():
                raise CircuitOpen()
            committed = self.writer.submit(op, urgent=True)  # StoreError at once when the queue is full
            try:
                await asyncio.wait_for(asyncio.shield(committed), wait_s)
            except TimeoutError:  # still queued: it commits later; a store that answers nobody counts
                self.breaker.timed_out(self.memory.retrieval_timeout_ms / 1000 * QUIET_BUDGETS,
                                       self.store.answered_at)
                return False
            self.breaker.succeeded()
            return True
        return save

    async def _identify(self, scope: Scope, request: Transcript, now: datetime, digest: str) -> TurnIdentity:
        return await identify(self.store, scope, request, now=now, retry_window_s=self.memory.retry_window_s,
                              follow=self.settings.scope.conversation, key=self.hash_key, digest=digest)

    async def _tool_state(self, scope: Scope, request: Transcript, identity: TurnIdentity
                          ) -> tuple[dict[str, str], dict[str, tuple[ReasoningStep, ...]], str | None]:
        """Tools mode: the memory exchanges of the loop's earlier steps and their memory calls (for the
        trace), and the provider's id of the response the request continues."""
        # Filtered on the turn and the conversation the request was found in: a provider numbering
        # its calls per response (`call_0`) reuses ids across the user's conversations.
        sealed = dict(zip(sealed_call_ids(self.hash_key, request.tool_call_ids), request.tool_call_ids, strict=True))
        kept = (await self.store.memory_exchanges(scope, identity.key, list(sealed))
                if identity.existing is not None else {})
        echoes, traces = earlier_steps({sealed[call_id]: exchange for call_id, exchange in kept.items()},
                                       request.tool_call_ids)
        provider = (await self.store.provider_response(scope, identity.conversation_id, request.previous_response)
                    if request.previous_response is not None else None)
        return echoes, traces, provider

    async def _hooked(self, budget: asyncio.Timeout, scope: Scope, request: Transcript, identity: TurnIdentity,
                      wire: str) -> turn_hooks.TurnStart:
        """A new turn's start hooks, on their own timeouts (retrieval's budget waits meanwhile);
        a later step or a retry gets the prompt and the context the turn's hooks gave it."""
        if identity.existing is not None:
            prompt = identity.existing.prompt
            if prompt is not None:  # kept redacted: the client's resent words give its secrets back
                prompt = restored(prompt, user_text(request, self.memory.block_header))
            return turn_hooks.TurnStart(prompt, identity.existing.context or "")
        assert self.hooks is not None
        new_conversation = identity.new_conversation or (
            # A conversation the client names is new while the store has nothing of it.
            self.hooks.has("session_start") and scope.conversation is not None
            and await self.store.conversation_record(scope, scope.conversation) is None)
        return await _paused(budget, self._start_hooks(scope, request, identity, wire, new_conversation))

    async def _kept(self, budget: asyncio.Timeout, scope: Scope, identity: TurnIdentity, retrieved: Retrieved,
                    wire: str) -> Retrieved:
        """post_retrieval, outside the gate and on its own timeouts like the start hooks: a policy
        slower than retrieval is skipped at its timeout, never a degraded turn charged to the store."""
        assert self.hooks is not None
        if not self.hooks.has("post_retrieval") or not retrieved.hits:
            return retrieved
        context = turn_hooks.hook_context(scope, identity.conversation_id, identity.key, wire)
        return await _paused(budget, turn_hooks.kept_hits(self.hooks, context, retrieved, self.memory.block_header))

    async def _start_hooks(self, scope: Scope, request: Transcript, identity: TurnIdentity, wire: str,
                           new_conversation: bool = False) -> turn_hooks.TurnStart:
        assert self.hooks is not None
        context = turn_hooks.hook_context(scope, identity.conversation_id, identity.key, wire)
        return await turn_hooks.start_turn(self.hooks, context, user_text(request, self.memory.block_header),
                                           new_conversation)

    def _queued_context(self, scope: Scope, identity: TurnIdentity) -> asyncio.Future[list[tuple[int, str]]] | None:
        """What `stop` hooks left for this conversation's next turn (a new turn only)."""
        if self.hooks is None or not self.hooks.has("stop") or identity.existing is not None:
            return None
        if identity.new_conversation:
            return None  # nothing can be queued for a conversation the store does not have
        return asyncio.ensure_future(self.store.hook_context(scope, identity.conversation_id))

    async def _block(self, scope: Scope, request: Transcript, identity: TurnIdentity,
                     resolved: RequestScope, answer_by: float) -> Retrieved:
        if resolved.mode == "tools":
            return Retrieved()  # the model asks memory itself
        if identity.existing is not None and identity.existing.block is not None:
            # A later step of the turn: the first step's block, byte for byte.
            return Retrieved(identity.existing.block, identity.existing.injected, {"cache": True})
        limit = self.memory.max_memories if resolved.max_memories is None else resolved.max_memories
        header = self.memory.block_header
        query = Query(edges(user_text(request, header, markers=False), QUERY_EDGE_CHARS), identity.conversation_id,
                      tuple(edges(text, QUERY_EDGE_CHARS) for text in visible_texts(request, header) + identity.shown),
                      min(limit, 12), identity.new_conversation, answer_by)
        if query.max_memories == 0 or not query.text.strip():
            return Retrieved()
        return await self.retriever.retrieve(scope, query)

    def _degraded(self, reason: str, exc: BaseException | None = None) -> str:
        self.metrics.degraded.labels(reason).inc()
        if exc is None:
            log.warning("memory degraded: %s", reason)
        else:
            log.warning("memory degraded: %s (%s: %s)", reason, type(exc).__name__, redact(str(exc)))
        return f"degraded: {reason}"


async def _paused(budget: asyncio.Timeout, hooks: Coroutine[Any, Any, T]) -> T:
    """Hooks run on their own timeouts: retrieval's budget waits while they do."""
    left = (budget.when() or 0) - asyncio.get_running_loop().time()
    budget.reschedule(None)
    try:
        return await hooks
    finally:
        budget.reschedule(asyncio.get_running_loop().time() + max(left, 0))


def _unlogged(block: str, injected: int, entry: dict[str, Any]) -> None:
    """A query outside a turn has no injection-log entry to join: the log is per turn."""


def user_text(request: Transcript, header: str = DEFAULT_HEADER, *, markers: bool = True) -> str:
    """The turn's prompt as the user wrote it (any memory block removed).

    `markers=False`: its text parts alone, what recall searches by (only text feeds it); the
    saved message notes an image or a file where it was (`[image]`).
    """
    return strip_block(request.prompt if markers else request.query, header)


def visible_texts(request: Transcript, header: str = DEFAULT_HEADER) -> tuple[str, ...]:
    """Texts of every other message the request shows (they are never injected again)."""
    return tuple(strip_block(text, header) for text in request.shown)


def reasoning_steps(request: Transcript) -> tuple[ReasoningStep, ...]:
    """The tool calls after the turn's prompt, each with the start of its result (not redacted)."""
    return tuple(ReasoningStep(step.name, step.arguments, step.result[:STEP_RESULT_READ_CHARS])
                 for step in request.tool_steps)


@dataclass(frozen=True)
class Saved:
    """What a turn saves of its request, redacted: the user's message and the tool steps."""

    said: str = ""
    steps: tuple[ReasoningStep, ...] = ()
    call_ids: tuple[str, ...] = ()  # each step's call id

    def with_memory_calls(self, earlier: dict[str, tuple[ReasoningStep, ...]]) -> tuple[ReasoningStep, ...]:
        """The tool steps with the memory calls of the loop's earlier steps (tools mode) in their
        places: each step's before the first of its application calls."""
        return tuple(step for call_id, own in zip(self.call_ids, self.steps, strict=True)
                     for step in (*earlier.get(call_id, ()), own))


async def saved(request: Transcript, header: str, hook_context: str = "") -> Saved:
    """The request's Saved (the prompt as a hook rewrote it, without the turn's `hook_context`); a
    large one's redacted in a thread, so the event loop serves other streams meanwhile."""
    text = turn_hooks.without_context(user_text(request, header), hook_context)
    steps = reasoning_steps(request)
    call_ids = tuple(step.call_id for step in request.tool_steps)
    if len(text) + sum(len(step.arguments) + len(step.result) for step in steps) <= INLINE_REDACT_CHARS:
        return _redacted(text, steps, call_ids)
    return await asyncio.to_thread(_redacted, text, steps, call_ids)


def _redacted(text: str, steps: tuple[ReasoningStep, ...], call_ids: tuple[str, ...]) -> Saved:
    return Saved(redact(text), tuple(
        ReasoningStep(step.name, redact(step.arguments), redact(step.result)[:STEP_RESULT_CHARS])
        for step in steps), call_ids)


def thinking_step(message: AssistantMessage) -> tuple[ReasoningStep, ...]:
    """The answer's thinking as a step of the trace (it is never saved as the answer)."""
    if not message.reasoning.strip():
        return ()
    return (ReasoningStep("thinking", "", redact(message.reasoning)[:STEP_RESULT_CHARS]),)


class TurnRecall(Recall):
    """A request with memory on: block in, turn saved once, answer saved from the last step."""

    turn_key: str  # a turn always has its key

    def __init__(self, service: MemoryService, scope: Scope, identity: TurnIdentity, persist: bool, status: str,
                 retrieved: Retrieved, saved: Saved, previous_response: str | None = None, wire: str = "",
                 start: turn_hooks.TurnStart = turn_hooks.TurnStart()) -> None:
        super().__init__(status)
        self._saved = saved
        self._previous_response = previous_response  # the parent of the response this turn relays
        self._service = service
        self._scope = scope
        self._identity = identity
        self._persist = persist
        self.turn_key = identity.key
        self.generation = (None if identity.generation is None
                           else Generation(identity.generation, identity.conversation_id))
        self.block = retrieved.block or None
        self.injected = retrieved.injected if self.block else 0
        self._log = retrieved.log
        self._ending: str | None = None
        self._start = start
        self.prompt = start.prompt
        # What a turn saves of a hook's rewritten prompt: its redacted form, on every path that saves it.
        self._saved_prompt = None if start.prompt is None else redact(start.prompt)
        self._saves = self._hooked_saves(wire)
        self._queries: list[tuple[str, int, dict[str, Any]]] = []  # tools mode: what each query found
        self._memory_steps: list[ReasoningStep] = []  # tools mode: this step's memory calls, redacted
        self._facts: asyncio.Future[None] | None = None  # the facts of the turn's message, written inline
        # Tools mode: the memory calls of the loop's earlier steps, under the first call of each step.
        self.earlier_trace: dict[str, tuple[ReasoningStep, ...]] = {}

    def _hooked_saves(self, wire: str) -> turn_hooks.HookedSaves | None:
        hooks = self._service.hooks
        if hooks is None or not self._persist or not (hooks.has("pre_memory_write") or hooks.has("stop")):
            return None
        context = turn_hooks.hook_context(self._scope, self._identity.conversation_id, self._identity.key, wire)
        return turn_hooks.HookedSaves(hooks, context, lambda op, urgent: self._submit(op, urgent=urgent),
                                      self._service.hook_saves, self._service.hash_key.seal)

    @property
    def active(self) -> bool:
        """Whether the answer is read for the store: to save it, or (tools mode) to route the next step."""
        return self._persist or self.tools is not None

    def _submit(self, op: Any, *, urgent: bool = False) -> asyncio.Future[None] | None:
        return self._service.writer.submit(op, urgent=urgent) if self._persist else None

    def _route(self, op: Any, *, urgent: bool = False) -> asyncio.Future[None] | None:
        """Saved even when the turn is not persisted, in tools mode: how a later step finds the
        provider's response and the memory exchanges it continues (routing, no conversation text)."""
        return self._service.writer.submit(op, urgent=urgent) if self.active else None

    def started(self, now: datetime) -> None:
        """Save the turn and the user's message (once per turn: the store ignores repeats)."""
        self._service.metrics.injected.inc(self.injected)
        if self._identity.is_new:
            said, inline, pending = self._saved.said, self._service.inline_facts, self._service.pending
            # A hook may rewrite what is saved: such a message is mined from the store, as written.
            # Behind a message of the user the worker has not passed over yet (a long one, the
            # next request's wait for it ran out) the queue keeps the order: a name said again
            # replaces the one said before only when its facts land after them.
            mined = inline if inline is not None and self._saves is None and self._persist and inline.takes(said) \
                and not (pending is not None and pending.awaits_worker(self._scope.user)) else None
            message_id = new_id() if mined is not None else None
            start = StartTurn(self._scope, self.turn_key, self._identity.conversation_id,
                              self._identity.history_hash, now, said, self._persist, self.generation,
                              message_id=message_id, extract_from=queue_from(now) if mined is not None else None,
                              queued="user" in self._service.settings.extraction.from_roles)
            saved = self._saves.start(start) if self._saves is not None else self._route(start)
            if saved is not None and mined is not None and message_id is not None:
                # Not a pending write for the user's requests running beside this one (not its
                # next): the step's end waits for it, and notes it if still being written (_ending_facts).
                self._facts = mined.record(self._scope, message_id, said, now)
            elif saved is not None and pending is not None:
                pending.saving(self._scope.user, saved)
        # In tools mode the injection log holds what the model's queries found (logged_query).
        if not self._log.get("cache") and self.status == "ok" and self.tools is None:
            self._submit(SaveBlock(self._scope, self.turn_key, self.block or "", self.injected, self._log, now,
                                   generation=self.generation,
                                   prompt=self._saved_prompt, context=self._start.context or None))
        elif self._identity.existing is None and (self._start.prompt is not None or self._start.context):
            # No block to cache it with, but the turn's later steps and retries (whose hooks do not
            # run again) still need what the hooks gave; they compute the block themselves.
            self._submit(SaveHookStart(self._scope, self.turn_key, self._saved_prompt, self._start.context or None,
                                       now, self.generation))
        if self._start.queued_upto is not None:
            self._submit(DropHookContext(self._scope, self._identity.conversation_id, self._start.queued_upto))

    def answered(self, message: AssistantMessage) -> asyncio.Future[None] | None:
        """What the response's last event waits for: the step's commit, for as long as the writer gets
        through its queue (Writer.committed), so a completed response's turn is saved under load
        too. It never raises: a write that failed was counted and logged by the writer."""
        waiter = self._with_facts(self._answered(message))
        self._ending_facts()
        if waiter is None:
            return None
        # A save behind hooks waits for them off the response's path (turn_hooks.HookedSaves).
        return self._service.writer.committed(waiter, self._service.memory.commit_timeout_ms / 1000,
                                              patient=self._saves is None)

    def _ending_facts(self) -> None:
        """The step ends: the facts of the turn's message, if still being written, are pending for the
        user's next request, since the end may not wait for them (an upstream failure, a client gone,
        a commit past its bound). Requests already running do not wait for them."""
        facts, pending = self._facts, self._service.pending
        if facts is not None and not facts.done() and pending is not None:
            pending.saving(self._scope.user, facts, with_facts=True)

    def _with_facts(self, commit: asyncio.Future[None] | None) -> asyncio.Future[None] | None:
        """The commit the step's end waits for, with the facts of the turn's message once written: the
        user's next turn, on any replica, then finds them, and its own facts land after them (a
        name said again replaces the one said before)."""
        facts = self._facts
        if commit is None or facts is None or facts.done():
            return commit
        # Callbacks, not a task: `facts` never raises, and the step's end takes the commit's outcome.
        both: asyncio.Future[None] = commit.get_loop().create_future()

        def settled(_: asyncio.Future[None]) -> None:
            if not (facts.done() and commit.done()) or both.done():
                return
            if commit.cancelled():
                both.cancel()
            elif (exc := commit.exception()) is not None:
                both.set_exception(exc)
            else:
                both.set_result(None)
        facts.add_done_callback(settled)
        commit.add_done_callback(settled)
        return both

    def _answered(self, message: AssistantMessage) -> asyncio.Future[None] | None:
        now = datetime.now(timezone.utc)
        self._ended("tool_calls" if message.tool_calls else "paused" if message.continues else "complete")
        mapped = None
        if message.response_id:
            recorded = self._route(RecordResponse(self._scope, message.response_id, self.turn_key,
                                                  self._identity.conversation_id, self._previous_response, now,
                                                  self.provider_id), urgent=True)
            # An id the client saw that is not the provider's (a tools-mode stream shows its first round's)
            # is only found through this record, and the client may name it at once: the answer waits for it
            # even when nothing else of the turn is saved.
            mapped = recorded if self.provider_id is not None else None
        if message.tool_calls:
            # The step's memory calls wait with its exchange for the turn's final step, which saves the
            # trace (not kept for a turn that is not persisted: they do not route the next step).
            kept = None if self.exchange is None else packed(self.exchange, self._memory_steps if self._persist else ())
            if self.active and sum(len(c.arguments) for c in message.tool_calls) > INLINE_REDACT_CHARS:
                return asyncio.ensure_future(self._record_calls(message, now, kept))
            calls = tuple((self._call_id(c.id), c.name, redact(c.arguments)) for c in message.tool_calls)
            return self._route(RecordToolCalls(self._scope, self.turn_key, calls, now, self.generation, kept),
                               urgent=True)
        if message.continues:
            return mapped  # the provider resumes the turn on the client's next request; no answer yet
        answer = message.content or message.refusal
        if not answer.strip():
            return self._submit(SetTurnStatus(self._scope, self.turn_key, "complete", now, self.generation),
                                urgent=True) or mapped
        saved = redact(answer)
        finish = FinishTurn(
            self._scope, self.turn_key, self._identity.conversation_id, saved, now,
            task=self._saved.said,
            steps=self._saved.with_memory_calls(self.earlier_trace) + tuple(self._memory_steps)
            + thinking_step(message),
            answer_hash=self._answer_hash(answer, saved),
            generation=self.generation,
            queued="assistant" in self._service.settings.extraction.from_roles,
        )
        if self._saves is None:
            return self._submit(finish, urgent=True) or mapped
        # A retry of a turn already answered saves its regenerated answer, but the turn's
        # `stop` fired with the first one: it fires once per turn.
        existing = self._identity.existing
        return self._saves.finish(finish, stop=existing is None or existing.status != "complete")

    def _call_id(self, call_id: str) -> str:
        return self._service.hash_key.seal(call_id)

    def _answer_hash(self, answer: str, saved: str) -> str:
        """The digest the conversation is found by when the client sends `answer` back: sealed when
        redaction changed it (or, later, a pre_memory_write hook: turn_hooks.HookedSaves). One saved as received is kept by its plain digest, which tells nothing
        the text beside it does not, as a message the memory API edits or imports is."""
        digest = text_hash(answer)
        return digest if saved == answer else self._service.hash_key.seal(digest)

    async def _record_calls(self, message: AssistantMessage, now: datetime, kept: str | None) -> None:
        """A step's tool calls with large arguments (a file's code written out), redacted in a thread
        as a large request is (`saved`): reading what their escapes spell costs more than a hop."""
        redacted = await asyncio.to_thread(lambda: [redact(c.arguments) for c in message.tool_calls])
        calls = tuple((self._call_id(c.id), c.name, arguments)
                      for c, arguments in zip(message.tool_calls, redacted, strict=True))
        recorded = self._route(RecordToolCalls(self._scope, self.turn_key, calls, now, self.generation, kept),
                               urgent=True)
        if recorded is not None:
            await recorded

    def memory_called(self, name: str, arguments: str, result: str) -> None:
        """The memory exchanges go into the turn's reasoning trace, not into its conversation."""
        self._memory_steps.append(ReasoningStep(name, redact(arguments),
                                                redact(result[:STEP_RESULT_READ_CHARS])[:STEP_RESULT_CHARS]))

    def logged_query(self, block: str, injected: int, entry: dict[str, Any]) -> None:
        """A query_memory call's hits, for the injection log (written when the request's rounds end)."""
        self._queries.append((block, injected, entry))

    def rounds_done(self, tokens: dict[str, int]) -> None:
        """Tools mode: the request's rounds ended; its queries and token totals go to the injection log
        as one entry (the turn's first such entry is kept, as inject mode's block)."""
        if not self._queries:
            return
        first = self._queries[0][2]
        entry = {**first, "hits": [hit for _, _, logged in self._queries for hit in logged.get("hits", [])],
                 "budget_cut": any(logged.get("budget_cut") for _, _, logged in self._queries),
                 "tool_queries": [{"query": logged.get("tool_query", ""), "hits": injected}
                                  for _, injected, logged in self._queries],
                 "tokens": tokens}
        entry.pop("tool_query", None)
        block = "\n\n".join(found for found, _, _ in self._queries if found)
        injected = sum(count for _, count, _ in self._queries)
        self._submit(SaveBlock(self._scope, self.turn_key, block, injected, entry, datetime.now(timezone.utc),
                               generation=self.generation, prompt=self._saved_prompt))

    def failed(self, status: str) -> None:
        self._ended(status)
        self._ending_facts()
        at = datetime.now(timezone.utc)
        self._submit(SetTurnStatus(self._scope, self.turn_key, status, at, self.generation))  # type: ignore[arg-type]

    def aborted(self) -> None:
        self.failed("client_aborted")

    def bad_events(self, count: int) -> None:
        self._service.metrics.stream_bad_events.inc(count)

    def _ended(self, ending: str) -> None:
        """Count the step's ending once: a client that leaves after the answer came did get it."""
        if self._ending is None:
            self._ending = ending
            self._service.metrics.answers.labels(ending).inc()
