"""The single writer: a bounded queue drained in batches, one transaction per batch.

Writes never fail a response: a failing store is retried with backoff while new writes
wait in the bounded queue; an overflow is counted (every write and turn dropped) and
logged when it begins and when it ends, never once per write: a full queue under load
drops hundreds a second.

A response waits for its answer's commit before its last event (`committed`), so a turn
whose response completed is in the store even if the process dies right after. Under
load the queue may hold more than `memory.commit_timeout_ms` of work: the answer then
waits for as long as the writer is getting through it, which also holds each client back
to the pace the store commits at. Only a store that fails or stalls ends the wait at
`memory.commit_timeout_ms` (its outage must not hold every response): such answers go
out unsaved, counted and logged, never silently.

Group commit: a write nobody is waiting for (a turn's start, its block) waits up to
COMMIT_DELAY_S for company; an urgent one (an answer the response waits for) commits the
batch at once. A fast answer then commits with its turn's start in one transaction,
instead of queueing behind that start's own commit.

Deleting a user first `forget`s the user's writes not yet committed, queued or in
a batch being retried, so none of them lands after the delete and brings back what it
removed. A write counts as done once its future is; a batch applies only the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from proxy.metrics import Metrics
from proxy.stores.base import StoreError, WriteOp, Writes

log = logging.getLogger("memproxy.writer")

BATCH_MAX = 256
# Far below any provider's answer time, so a turn's start still commits while the upstream works.
COMMIT_DELAY_S = 0.005
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 5.0
# Turns remembered as having lost a write, so each is counted once: the log says exactly how many.
DROPPED_TURNS_KEPT = 10_000
# A batch in the store's hands this long is stuck, not slow (a batch of hundreds of writes
# commits in well under a second under load): the answers waiting on it go out.
STALLED_S = 2.0
# The longest an answer waits for its commit while the writer still moves; past it the answer goes
# out unsaved (counted). The PostgreSQL store's statements time out at 30 s.
COMMIT_WAIT_MAX_S = 30.0
# How often an answer still waiting past memory.commit_timeout_ms asks whether the writer moves.
PATIENCE_STEP_S = 0.05
# Answers sent before their commit are logged at most this often (with how many), not each one.
UNSAVED_LOG_EVERY_S = 10.0


class WriteQueueFull(StoreError):
    """The bounded queue refused a write: counted and logged by the writer, once per overflow."""

    def __init__(self) -> None:
        super().__init__("write queue full")


class CommitHooks(Protocol):
    """What runs around each batch's commit (the vectors of its items, memory/vectors/filler.py)."""

    async def before_commit(self, ops: Sequence[WriteOp]) -> list[WriteOp]:
        """The ops to apply in place of `ops`, one for one (with what they save beside them); never raises."""

    async def after_commit(self, ops: Sequence[WriteOp]) -> None:
        """After the ops committed, before they count as done; never raises."""


class Writer:
    """Owns every write to the store."""

    def __init__(self, store: Writes, metrics: Metrics, max_queue: int, *,
                 commit_delay_s: float = COMMIT_DELAY_S, hooks: CommitHooks | None = None) -> None:
        self.store = store
        self.hooks = hooks
        self.commit_delay_s = commit_delay_s
        self.metrics = metrics
        self._queue: asyncio.Queue[tuple[WriteOp, asyncio.Future[None]]] = asyncio.Queue(max_queue)
        self._task: asyncio.Task[None] | None = None
        self._pending: dict[asyncio.Future[None], WriteOp] = {}  # queued or being committed
        self._hurry = asyncio.Event()  # commit what is queued now, without waiting for company
        self._dropped_turns: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.writes_dropped = 0  # writes a full queue refused
        self.turns_dropped = 0  # turns that lost a write to a full queue, each counted once
        self._overflow: tuple[int, int] | None = None  # while the queue is full: writes and turns dropped before
        self.failing = False
        self._batch_began: float | None = None  # time.monotonic() the batch in the store's hands was first tried
        self._unsaved_logged: tuple[float, int] = (float("-inf"), 0)  # when, and how many answers went unsaved by then
        self.answers_unsaved = 0  # responses that ended before their answer's commit

    def start(self) -> None:
        """Begin draining (inside the running loop)."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="memproxy-writer")

    def submit(self, op: WriteOp, *, urgent: bool = False) -> asyncio.Future[None]:
        """Queue a write; the future completes when it is committed.

        `urgent`: someone is waiting for this commit, so the batch goes without delay.
        """
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait((op, done))
            self._pending[done] = op
            done.add_done_callback(self._settled)
        except asyncio.QueueFull:
            self._dropped(op)
            done.set_exception(WriteQueueFull())
            done.exception()  # retrieved: nobody else need wait on a dropped write
        if urgent or self._queue.qsize() >= BATCH_MAX:
            self._hurry.set()
        self.metrics.queue_depth.labels("writes").set(self._queue.qsize())
        return done

    def _dropped(self, op: WriteOp) -> None:
        """Count a write the full queue refused, and its turn once; the first of an overflow is logged."""
        self.writes_dropped += 1
        self.metrics.writes_dropped.inc()
        turn = getattr(op, "turn_key", None)
        if turn is not None:  # a turn's (an extraction result without one stays queued and is retried)
            key = (op.scope.user, turn)
            if key not in self._dropped_turns:
                self.turns_dropped += 1
                self.metrics.turns_dropped.inc()
                self._dropped_turns[key] = None
                if len(self._dropped_turns) > DROPPED_TURNS_KEPT:
                    self._dropped_turns.popitem(last=False)
        if self._overflow is None:
            self._overflow = (self.writes_dropped - 1, self.turns_dropped - (turn is not None))
            log.error("write queue full (%d writes): dropping new writes until it drains, first a %s of user %s;"
                      " counted in memproxy_writes_dropped_total and memproxy_turns_dropped_total",
                      self._queue.maxsize, type(op).__name__, op.scope.user)

    def _drained(self) -> None:
        """An overflow ends once the queue is half empty: one line says what it cost."""
        if self._overflow is not None and self._queue.qsize() <= self._queue.maxsize // 2:
            writes, turns = self._overflow
            self._overflow = None
            log.warning("write queue drained: %d writes dropped while it was full, %d turns lost a write"
                        " (turns that lost a write so far: %d)", self.writes_dropped - writes,
                        self.turns_dropped - turns, self.turns_dropped)

    def _settled(self, done: asyncio.Future[None]) -> None:
        self._pending.pop(done, None)

    def forget(self, user: str) -> int:
        """Drop the user's writes not yet committed (a user being deleted); how many there were."""
        dropped = [done for done, op in self._pending.items() if op.scope.user == user]
        for done in dropped:
            done.set_result(None)  # done without being applied: every batch skips it
        if dropped:
            log.info("dropped %d unsaved writes of user %s, who is being deleted", len(dropped), user)
        return len(dropped)

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    @property
    def moving(self) -> bool:
        """Whether the writer gets through its work: it runs, no batch failed since the last commit,
        and the one in the store's hands (if any) has not been there for STALLED_S."""
        running = self._task is not None and not self._task.done()
        return running and not self.failing and (self._batch_began is None
                                                 or time.monotonic() - self._batch_began < STALLED_S)

    def committed(self, waiter: asyncio.Future[None], timeout_s: float, *, patient: bool = True
                  ) -> asyncio.Future[None]:
        """What a response's last event waits for: the commit `waiter` ends with (done or failed).

        At least `timeout_s` (memory.commit_timeout_ms); past it, when `patient`, for as long as the
        writer moves and holds writes, up to COMMIT_WAIT_MAX_S: under load the answer is saved late
        rather than not at all. Not `patient`: a save behind a hook, which must not hold the response.
        The future ends once committed, or when the answer goes out before (counted and logged here);
        it never raises. Callbacks and a timer, not a task: one of these is made every saved turn.
        """
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        began = loop.time()
        timer: asyncio.TimerHandle | None = None

        def finished(_: asyncio.Future[None]) -> None:
            if timer is not None:
                timer.cancel()
            _seen(waiter)  # a write that failed was counted and logged where it failed
            if not ended.done():
                ended.set_result(None)

        def due() -> None:
            nonlocal timer
            if waiter.done() or ended.done():
                return  # its callback ends the wait
            waited = loop.time() - began
            if not (patient and self.moving and self._pending) or waited >= COMMIT_WAIT_MAX_S:
                waiter.remove_done_callback(finished)
                waiter.add_done_callback(_seen)  # a write that fails later was counted where it failed
                self._unsaved(waited, patient)
                ended.set_result(None)
                return
            timer = loop.call_at(loop.time() + min(PATIENCE_STEP_S, COMMIT_WAIT_MAX_S - waited), due)

        if waiter.done():
            finished(waiter)
        else:
            waiter.add_done_callback(finished)
            timer = loop.call_at(began + timeout_s, due)
        return ended

    def _unsaved(self, waited_s: float, patient: bool) -> None:
        self.answers_unsaved += 1
        self.metrics.answers_unsaved.inc()
        now = time.monotonic()
        logged_at, logged = self._unsaved_logged
        if now - logged_at >= UNSAVED_LOG_EVERY_S:
            self._unsaved_logged = (now, self.answers_unsaved)
            why = ("a hook holds its save" if not patient else "the store is failing" if self.failing
                   else "the writer is stuck or stopped" if not self.moving
                   else "its write is not with the writer yet" if not self._pending
                   else f"still queued after {COMMIT_WAIT_MAX_S:.0f} s")
            log.warning("answer sent before its commit after %.0f ms (%s); %d such answers since the last such line,"
                        " %d in all (memproxy_answers_unsaved_total)", waited_s * 1000, why,
                        self.answers_unsaved - logged, self.answers_unsaved)

    async def flush(self, timeout_s: float) -> bool:
        """Wait until everything queued so far is committed (or the timeout passes)."""
        waiting = list(self._pending)
        if not waiting:
            return True
        self._hurry.set()
        finished, _ = await asyncio.wait(waiting, timeout=timeout_s)
        return len(finished) == len(waiting)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Flush what is queued, then stop."""
        await self.flush(timeout_s)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            await self._company()
            while len(batch) < BATCH_MAX and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            self._batch_began = time.monotonic()
            try:
                await self._commit(batch)
            finally:
                self._batch_began = None
            self._drained()
            self.metrics.queue_depth.labels("writes").set(self._queue.qsize())

    async def _company(self) -> None:
        """Wait up to commit_delay_s for more writes, unless one is urgent."""
        if not self._hurry.is_set():
            timer = asyncio.get_running_loop().call_later(self.commit_delay_s, self._hurry.set)
            try:
                await self._hurry.wait()
            finally:
                timer.cancel()  # also when the writer is stopped meanwhile
        self._hurry.clear()

    async def _commit(self, batch: Sequence[tuple[WriteOp, asyncio.Future[None]]]) -> None:
        """Commit the batch, retrying for as long as the store's failure is transient."""
        if self.hooks is not None:
            prepared = await self.hooks.before_commit([op for op, _ in batch])
            batch = [(op, done) for op, (_, done) in zip(prepared, batch, strict=True)]
        delay = RETRY_FIRST_S
        while True:
            try:
                if ops := [op for op, done in batch if not done.done()]:  # none that were forgotten
                    await self.store.apply(ops)
            except StoreError as exc:
                self.failing = True
                self.metrics.write_failures.inc()
                if not exc.transient:
                    await self._isolate(batch, exc)
                    return
                log.warning("write batch of %d failed (%s); retrying in %.2fs", len(batch), exc, delay)
            except Exception:  # logged: a writer that died would lose every later write
                # A database driver can raise what no store maps (asyncpg's InternalClientError
                # after an outage): taken as transient, so the writer lives and the batch lands.
                self.failing = True
                self.metrics.write_failures.inc()
                log.exception("write batch of %d failed unexpectedly; retrying in %.2fs", len(batch), delay)
            else:
                self.failing = False
                if self.hooks is not None:
                    await self.hooks.after_commit(ops)
                _resolve(batch)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    async def _isolate(self, batch: Sequence[tuple[WriteOp, asyncio.Future[None]]], exc: StoreError) -> None:
        """An invalid write must not hold back the valid ones around it: retry them singly."""
        if len(batch) > 1:
            for item in batch:
                await self._commit([item])
            return
        op, done = batch[0]
        log.error("write %s for user %s is invalid and was dropped: %s", type(op).__name__, op.scope.user, exc)
        if not done.done():
            done.set_exception(exc)
            done.exception()


def _seen(done: asyncio.Future[None]) -> None:
    """Mark a future's exception retrieved: asyncio would log it once per future otherwise."""
    if not done.cancelled():
        done.exception()


def _resolve(batch: Sequence[tuple[WriteOp, asyncio.Future[None]]]) -> None:
    for _, done in batch:
        if not done.done():
            done.set_result(None)
