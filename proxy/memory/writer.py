"""The single writer: a bounded queue drained in batches, one transaction per batch.

Writes never delay a response beyond `memory.commit_timeout_ms` and never fail one: a
failing store is retried with backoff while new writes wait in the bounded queue; an
overflow is counted and logged with the number of writes dropped, never silent.

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
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

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


class Writer:
    """Owns every write to the store."""

    def __init__(self, store: Writes, metrics: Metrics, max_queue: int, *,
                 commit_delay_s: float = COMMIT_DELAY_S,
                 after_commit: Callable[[], Awaitable[None]] | None = None) -> None:
        self.store = store
        # Run after each committed batch, before its writes count as done (the vectors of
        # its items, memory/embedding_worker.py); it never raises.
        self.after_commit = after_commit
        self.commit_delay_s = commit_delay_s
        self.metrics = metrics
        self._queue: asyncio.Queue[tuple[WriteOp, asyncio.Future[None]]] = asyncio.Queue(max_queue)
        self._task: asyncio.Task[None] | None = None
        self._pending: dict[asyncio.Future[None], WriteOp] = {}  # queued or being committed
        self._hurry = asyncio.Event()  # commit what is queued now, without waiting for company
        self._dropped_turns: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.turns_dropped = 0  # turns that lost a write to a full queue, each counted once
        self.failing = False

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
            done.set_exception(StoreError("write queue full"))
            done.exception()  # retrieved: nobody else need wait on a dropped write
        if urgent or self._queue.qsize() >= BATCH_MAX:
            self._hurry.set()
        self.metrics.queue_depth.labels("writes").set(self._queue.qsize())
        return done

    def _dropped(self, op: WriteOp) -> None:
        """Count and log a write the full queue refused, and its turn once, so no loss is silent."""
        self.metrics.writes_dropped.inc()
        turn = getattr(op, "turn_key", None)
        if turn is None:  # not a turn's: an extraction result stays queued and is retried
            log.error("write queue full: dropped one %s for user %s", type(op).__name__, op.scope.user)
            return
        key = (op.scope.user, turn)
        if key not in self._dropped_turns:
            self.turns_dropped += 1
            self.metrics.turns_dropped.inc()
            self._dropped_turns[key] = None
            if len(self._dropped_turns) > DROPPED_TURNS_KEPT:
                self._dropped_turns.popitem(last=False)
        log.error("write queue full: dropped the %s of turn %s for user %s (turns that lost a write so far: %d)",
                  type(op).__name__, turn, op.scope.user, self.turns_dropped)

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
            await self._commit(batch)
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
                if self.after_commit is not None:
                    await self.after_commit()
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


def _resolve(batch: Sequence[tuple[WriteOp, asyncio.Future[None]]]) -> None:
    for _, done in batch:
        if not done.done():
            done.set_result(None)
