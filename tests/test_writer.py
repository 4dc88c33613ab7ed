"""The writer's group commit: a turn's start waits briefly for company, an answer commits at once."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxy.memory.writer import Writer
from proxy.metrics import Metrics
from proxy.models import Scope
from proxy.stores.sqlite import store as sqlite_store
from proxy.stores.base import FinishTurn, StartTurn, WriteOp
from proxy.stores.sqlite.store import SQLiteStore

ALICE = Scope("alice")
AT = datetime(2026, 1, 1, tzinfo=UTC)
# Long against the pauses below, so a busy machine cannot make a test's timing race it.
DELAY_S = 1.0
PAUSE_S = 0.05


class CountingStore(SQLiteStore):
    """The real SQLite store, recording the ops of each transaction it commits."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.batches: list[list[str]] = []

    async def apply(self, ops: Sequence[WriteOp]) -> None:
        await super().apply(ops)
        self.batches.append([type(op).__name__ for op in ops])


def start(key: str) -> StartTurn:
    return StartTurn(ALICE, key, "c1", f"h-{key}", AT, f"question {key}")


def finish(key: str) -> FinishTurn:
    return FinishTurn(ALICE, key, "c1", f"answer {key}", AT)


def run_with_writer(path: Path, body):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        store = CountingStore(str(path))
        await store.open()
        writer = Writer(store, Metrics(), 100, commit_delay_s=DELAY_S)
        writer.start()
        try:
            return await body(writer), store.batches
        finally:
            await writer.close()
            await store.close()

    return asyncio.run(main())


def saved(path: Path) -> list[tuple[str, str]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT role, content FROM messages ORDER BY seq").fetchall()


def test_a_fast_answer_commits_with_its_turns_start_in_one_transaction(tmp_path: Path) -> None:
    async def body(writer: Writer) -> None:
        writer.submit(start("t1"))
        await asyncio.sleep(PAUSE_S)  # the upstream answers quickly
        await asyncio.wait_for(writer.submit(finish("t1"), urgent=True), 5)

    _, batches = run_with_writer(tmp_path / "m.db", body)
    assert batches == [["StartTurn", "FinishTurn"]]
    assert saved(tmp_path / "m.db") == [("user", "question t1"), ("assistant", "answer t1")]


def test_a_start_nobody_waits_for_still_commits_on_its_own(tmp_path: Path) -> None:
    async def body(writer: Writer) -> None:
        await asyncio.wait_for(writer.submit(start("t1")), 5)  # committed after at most DELAY_S
        await asyncio.wait_for(writer.submit(finish("t1"), urgent=True), 5)

    _, batches = run_with_writer(tmp_path / "m.db", body)
    assert batches == [["StartTurn"], ["FinishTurn"]]
    assert saved(tmp_path / "m.db") == [("user", "question t1"), ("assistant", "answer t1")]


def test_an_urgent_write_does_not_wait_for_company(tmp_path: Path) -> None:
    async def body(writer: Writer) -> None:
        answer = writer.submit(finish("t1"), urgent=True)
        await asyncio.sleep(PAUSE_S)  # within the delay a start would have waited
        await asyncio.wait_for(asyncio.gather(answer, writer.submit(start("t2"))), 5)

    _, batches = run_with_writer(tmp_path / "m.db", body)
    assert batches == [["FinishTurn"], ["StartTurn"]]


def test_flush_commits_what_is_queued_without_the_delay(tmp_path: Path) -> None:
    async def body(writer: Writer) -> bool:
        for key in ("t1", "t2", "t3"):
            writer.submit(start(key))
        return await writer.flush(5)

    flushed, batches = run_with_writer(tmp_path / "m.db", body)
    assert flushed is True
    assert batches == [["StartTurn", "StartTurn", "StartTurn"]]
    assert [text for _, text in saved(tmp_path / "m.db")] == ["question t1", "question t2", "question t3"]


class DriverFaultStore(CountingStore):
    """The real store, whose first `faults` batches raise what no store maps (a driver's own error)."""

    def __init__(self, path: str, faults: int) -> None:
        super().__init__(path)
        self.faults = faults

    async def apply(self, ops: Sequence[WriteOp]) -> None:
        if self.faults:
            self.faults -= 1
            raise RuntimeError("cannot switch to state 12; another operation (2) is in progress")
        await super().apply(ops)


def test_an_unexpected_store_error_is_retried_and_the_writer_lives_on(tmp_path: Path) -> None:
    async def main() -> tuple[list[list[str]], float | None]:
        store = DriverFaultStore(str(tmp_path / "m.db"), faults=2)
        await store.open()
        metrics = Metrics()
        writer = Writer(store, metrics, 100, commit_delay_s=DELAY_S)
        writer.start()
        try:
            await asyncio.wait_for(writer.submit(finish("t1"), urgent=True), 5)  # after two failed tries
            await asyncio.wait_for(writer.submit(finish("t2"), urgent=True), 5)  # the writer still runs
            return store.batches, metrics.registry.get_sample_value("memproxy_persistence_failures_total")
        finally:
            await writer.close()
            await store.close()

    batches, failures = asyncio.run(main())
    assert batches == [["FinishTurn"], ["FinishTurn"]]
    assert failures == 2
    assert saved(tmp_path / "m.db") == [("assistant", "answer t1"), ("assistant", "answer t2")]


def test_a_forgotten_users_writes_never_land_when_the_store_comes_back(tmp_path: Path, monkeypatch: Any) -> None:
    # A user deleted while the store is locked: the user's writes, queued or in the
    # batch being retried, are dropped; the other users' writes in that batch still land.
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_MS", 50)
    path = tmp_path / "m.db"
    zed = Scope("zed")

    async def main() -> tuple[int, list[list[str]]]:
        store = CountingStore(str(path))
        await store.open()
        writer = Writer(store, Metrics(), 100, commit_delay_s=0.01)
        writer.start()
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
        try:
            writer.submit(StartTurn(zed, "z1", "c9", "h-z1", AT, "my secret plan"))
            answer = writer.submit(start("t1"))
            await asyncio.sleep(0.4)  # the batch has failed and is being retried
            assert not answer.done()
            late = writer.submit(StartTurn(zed, "z2", "c9", "h-z2", AT, "another plan"))  # still queued
            dropped = writer.forget("zed")
            assert late.done()  # nobody waits on a dropped write
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        await asyncio.wait_for(answer, 10)
        await asyncio.sleep(0.1)  # the dropped write left in the queue is drained too
        await writer.close()
        await store.close()
        return dropped, store.batches

    dropped, batches = asyncio.run(main())
    assert dropped == 2
    assert batches == [["StartTurn"]]  # alice's start alone: zed's never reached the store
    assert saved(path) == [("user", "question t1")]


class SlowStore(CountingStore):
    """A store that takes `slow_s` over each commit: slow, but getting through its work."""

    slow_s = 0.4

    async def apply(self, ops: Sequence[WriteOp]) -> None:
        await asyncio.sleep(self.slow_s)
        await super().apply(ops)


def committed_after(tmp_path: Path, *, patient: bool) -> tuple[float, float | None, list[tuple[str, str]]]:
    """Seconds until an answer's wait for its commit ended (memory.commit_timeout_ms of 0.1 s, a
    commit taking 0.4 s), the answers counted unsaved, and what was saved by then."""
    async def main() -> tuple[float, float | None, list[tuple[str, str]]]:
        store = SlowStore(str(tmp_path / "m.db"))
        await store.open()
        metrics = Metrics()
        writer = Writer(store, metrics, 100, commit_delay_s=DELAY_S)
        writer.start()
        try:
            loop = asyncio.get_running_loop()
            began = loop.time()
            await writer.committed(writer.submit(finish("t1"), urgent=True), 0.1, patient=patient)
            waited = loop.time() - began
            return (waited, metrics.registry.get_sample_value("memproxy_answers_unsaved_total"),
                    saved(tmp_path / "m.db"))
        finally:
            await writer.close()
            await store.close()

    return asyncio.run(main())


def test_an_answer_waits_past_its_bound_for_a_store_that_is_slow_but_moving(tmp_path: Path) -> None:
    waited, unsaved, rows = committed_after(tmp_path, patient=True)
    assert 0.4 <= waited < 1.5
    assert unsaved == 0
    assert rows == [("assistant", "answer t1")]


def test_an_answer_behind_a_hook_goes_out_at_its_bound_counted_unsaved(tmp_path: Path) -> None:
    waited, unsaved, rows = committed_after(tmp_path, patient=False)
    assert 0.1 <= waited < 0.35
    assert unsaved == 1
    assert rows == []  # the commit lands later: the writer is flushed on close
