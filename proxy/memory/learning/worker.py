"""The extraction worker: drains the store's durable queue into the users' graphs.

Saving a message enqueues it in the same transaction; this task claims due items oldest
first, extracts each (the rules in a thread, or the model through the LLM extractor) and
submits the results to the writer in queue order, so one user's facts land in the order
they were said. Each result also takes its item off the queue, in one transaction, so
nothing lives only in memory: a crash or restart loses no work. A failed item is retried
with exponential backoff, then parked with its error.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from proxy.memory.background_task import BackgroundTask
from proxy.memory.learning.facts import no_facts, to_record
from proxy.extracted import Extraction
from proxy.memory.learning.extractors import Extractor, RulesExtractor
from proxy.memory.learning.pending_facts import PendingFacts
from proxy.redaction.redact import redact
from proxy.memory.writer import Writer
from proxy.metrics import Metrics
from proxy.models import Scope
from proxy.stores.base import ExtractionFailed, ExtractionQueue, QueuedMessage, RecordFacts, StoreError, WriteOp

log = logging.getLogger("memproxy.extraction")

ERROR_CHARS = 500
# Only a message's start is mined. The rules cost ~7 µs a character while holding the GIL,
# so a 5 MB paste would stall the event loop (and every request's retrieval) for seconds;
# 8,000 characters cost ~50 ms, and hold the facts of any ordinary chat message.
MAX_EXTRACT_CHARS = 8000


@dataclass(frozen=True)
class WorkerLimits:
    """How much the worker takes at once, how often it looks, and how it retries."""

    # Items claimed (and writes queued) at once. Small, because the rules hold the GIL: a
    # burst of 64 every 0.2 s cost requests 0.6 ms p99 (paired runs, c=1, instant upstream);
    # 16 every 0.05 s kept most of the p50 gain of batching at a fraction of that.
    batch: int = 16
    idle_poll_s: float = 0.05  # after a part batch, the wait before the next claim
    # Each claim that finds nothing doubles the wait, up to this: an idle worker beside another
    # process's long backlog (one user's items, leased there) would otherwise read the queue 20
    # times a second. Its own commits still wake it at once (pending facts).
    idle_max_s: float = 1.0
    max_attempts: int = 5  # then the item is parked with its last error
    retry_first_s: float = 2.0
    retry_factor: float = 4.0
    retry_max_s: float = 900.0
    depth_every_s: float = 1.0  # the queue_depth gauge is refreshed at most this often
    error_pause_max_s: float = 10.0  # the longest wait between tries while the store fails


def retry_delay(attempts: int, limits: WorkerLimits) -> float:
    """Seconds before the next try after `attempts` failures (exponential, capped)."""
    return min(limits.retry_first_s * limits.retry_factor ** max(0, attempts - 1), limits.retry_max_s)


def head(text: str, limit: int = MAX_EXTRACT_CHARS) -> str:
    """The first `limit` characters of a text, cut at a space when there is one."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", limit // 2, limit)
    return text[: cut if cut > 0 else limit]


def speaker_of(role: str) -> str | None:
    """Whose words a message holds: None for the user (first person is the user's node)."""
    return None if role == "user" else role.capitalize()


class ExtractionWorker:
    """Owns the background extraction task of one app."""

    def __init__(self, store: ExtractionQueue, writer: Writer, metrics: Metrics, *, from_roles: Sequence[str],
                 isolate_agents: bool, extractor: Extractor | None = None,
                 limits: WorkerLimits = WorkerLimits(), pending: PendingFacts | None = None) -> None:
        self.store = store
        self.writer = writer
        self.metrics = metrics
        self.from_roles = frozenset(from_roles)
        self.isolate_agents = isolate_agents
        self.extractor = extractor or RulesExtractor()
        self.limits = limits
        self.pending = pending  # told of each pass, so a user's next request can wait for its facts
        self._task = BackgroundTask("memproxy-extraction", self._run)
        self._depth_at = 0.0

    def start(self) -> None:
        """Begin draining (inside the running loop)."""
        self._task.start()

    async def stop(self) -> None:
        """Stop at once: an item in flight stays queued (or its write is already with the writer)."""
        await self._task.stop()

    async def _run(self) -> None:
        pause = self.limits.idle_poll_s
        while True:
            number = self.pending.begin() if self.pending is not None else 0
            try:
                done = await self.drain_once()
                pause = self.limits.idle_poll_s if done else min(pause * 2, self.limits.idle_max_s)
            except StoreError as exc:
                log.warning("extraction: cannot read the queue (%s); retrying in %.1fs", exc, pause)
                done, pause = 0, min(pause * 2, self.limits.error_pause_max_s)
            except Exception:  # the task's outermost boundary: a bug must not end extraction for good
                log.exception("extraction: unexpected error; retrying in %.1fs", pause)
                done, pause = 0, min(pause * 2, self.limits.error_pause_max_s)
            if self.pending is not None:
                await self.pending.end(number)
            if done < self.limits.batch:
                # The queue is drained: let the next messages gather before claiming again.
                # A committed user message cuts the wait short (the user's next request wants
                # its facts), so under load a pass takes what the writer's last batch saved.
                await self._idle(pause)

    async def _idle(self, pause: float) -> None:
        if self.pending is None:
            await asyncio.sleep(pause)
            return
        # asyncio.timeout, not wait_for: a stop() that cancels the wait just as a commit sets `wake`
        # is swallowed by wait_for (Python 3.11), and the worker would go on and outlive its stop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(pause):
                await self.pending.wake.wait()

    async def drain_once(self) -> int:
        """Claim one batch of due items and record each; return how many were recorded."""
        items = await self.store.claim_extraction(self.limits.batch, datetime.now(UTC),
                                                  max_chars=MAX_EXTRACT_CHARS)
        if items:
            found = await asyncio.gather(*(self._extract(item) for item in items))
            ops = [self._write_for(item, result) for item, result in zip(items, found)]
            # The last write is urgent: the batch commits at once, as one, for a request may be waiting for it.
            submitted = [(item, op, self.writer.submit(op, urgent=n == len(ops) - 1))
                         for n, (item, op) in enumerate(zip(items, ops))]
            recorded = await self._settle(submitted)
        else:
            recorded = 0
        await self._report_depth()
        return recorded

    def _scope(self, item: QueuedMessage) -> Scope:
        return dataclasses.replace(item.scope, agent_isolated=self.isolate_agents and item.scope.agent is not None)

    async def _extract(self, item: QueuedMessage) -> Extraction | Exception | None:
        """What the message states; None for a role not mined; the error when extraction broke."""
        if item.message.role not in self.from_roles:
            return None
        try:
            return await self.extractor(head(item.message.content), speaker_of(item.message.role))
        except Exception as exc:  # the worker's boundary: one bad message must not stop the queue
            return exc

    def _write_for(self, item: QueuedMessage, found: Extraction | Exception | None) -> WriteOp:
        scope = self._scope(item)
        if found is None:
            return no_facts(item, scope)
        if isinstance(found, Exception):
            return self._failure(item, scope, f"{type(found).__name__}: {found}")
        return to_record(item, scope, found)

    def _failure(self, item: QueuedMessage, scope: Scope, error: str) -> ExtractionFailed:
        """Count the failure; retry later, or park the item once it has used its attempts."""
        attempts = item.attempts + 1
        park = attempts >= self.limits.max_attempts
        retry_at = datetime.now(UTC) + timedelta(seconds=retry_delay(attempts, self.limits))
        self.metrics.extraction_failures.inc()
        error = redact(error)[:ERROR_CHARS]
        log.warning("extraction: item %d of user %s failed (attempt %d%s): %s", item.queue_id, scope.user, attempts,
                    ", parked" if park else "", error)
        return ExtractionFailed(scope, item.queue_id, error, retry_at, park)

    async def _settle(self, submitted: list[tuple[QueuedMessage, WriteOp, asyncio.Future[None]]]) -> int:
        """Wait for the batch's writes; a result the store refused becomes a failed attempt."""
        recorded = 0
        refused: list[ExtractionFailed] = []
        unqueued: list[int] = []
        for item, op, done in submitted:
            try:
                await done
            except StoreError as exc:
                if isinstance(op, RecordFacts) and not exc.transient:
                    refused.append(self._failure(item, op.scope, f"store refused the facts: {exc}"))
                elif exc.transient:
                    unqueued.append(item.queue_id)  # the write queue was full: the item stays queued
                continue
            recorded += isinstance(op, RecordFacts)
        await self._hand_back(unqueued)
        for failure in refused:
            try:
                await self.writer.submit(failure)
            except StoreError as exc:
                log.error("extraction: cannot record the failure of item %d: %s", failure.queue_id, exc)
        return recorded

    async def _hand_back(self, queue_ids: list[int]) -> None:
        """Items whose results could not be queued are due again at once, ahead of their users'
        later items (a PostgreSQL lease would otherwise hold them for minutes while this replica
        went on with those later items)."""
        if not queue_ids:
            return
        try:
            await self.store.release_extraction(queue_ids)
        except StoreError as exc:
            log.warning("extraction: cannot hand back %d items (%s); their lease will run out", len(queue_ids), exc)

    async def _report_depth(self) -> None:
        now = time.monotonic()
        if now - self._depth_at < self.limits.depth_every_s:
            return
        self._depth_at = now
        depth = await self.store.queue_depth()
        self.metrics.queue_depth.labels("extraction").set(depth["pending"])
        self.metrics.queue_depth.labels("extraction_parked").set(depth["parked"])
