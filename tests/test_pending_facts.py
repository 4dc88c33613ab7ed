"""A user's next request finds the rules facts of the turn just saved, however the worker idles.

Real SQLite store, writer and extraction worker. A message saved through the queue: the
worker idles 60 s between passes, so only the wait for the user's pending facts (which
wakes it) can make the fact findable. A message mined as it is saved (inline_facts.py):
no worker runs at all.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

from proxy.app import Parts
from proxy.memory.learning.worker import ExtractionWorker, WorkerLimits
from proxy.memory.learning.extractors import RulesExtractor
from proxy.memory.learning.inline_facts import InlineFacts, queue_from
from proxy.memory.learning.pending_facts import PendingFacts
from proxy.memory.retrieval.base import Query
from proxy.memory.retrieval.retriever import Retrieval
from proxy.memory.writer import COMMIT_DELAY_S, Writer
from proxy.metrics import Metrics
from proxy.models import AssistantMessage, Scope
from proxy.identity.scope import RequestScope
from proxy.settings import MemorySettings, load_settings
from proxy.stores.base import StartTurn
from proxy.stores.sqlite.store import SQLiteStore
from tests.test_breaker import chat

ALICE = Scope("alice")


@asynccontextmanager
async def running(tmp_path: Path, *, commit_delay_s: float = COMMIT_DELAY_S, close_within_s: float = 5.0
                  ) -> AsyncIterator[tuple[SQLiteStore, Metrics, Writer, PendingFacts]]:
    """A real SQLite store, writer and extraction worker, the worker idling 60 s between passes."""
    store, metrics, pending = SQLiteStore(str(tmp_path / "memory.db")), Metrics(), PendingFacts()
    await store.open()
    writer = Writer(store, metrics, 100, commit_delay_s=commit_delay_s)
    worker = ExtractionWorker(store, writer, metrics, from_roles=["user"], isolate_agents=False,
                              limits=WorkerLimits(idle_poll_s=60.0), pending=pending)
    writer.start()
    worker.start()
    try:
        yield store, metrics, writer, pending
    finally:
        await worker.stop()
        await writer.close(close_within_s)
        await store.close()


def test_the_next_request_waits_for_the_users_pending_facts_and_finds_them(tmp_path: Path) -> None:
    async def body() -> tuple[list[str], float, bool, bool]:
        async with running(tmp_path) as (store, metrics, writer, pending):
            await asyncio.sleep(0.1)  # the worker's first pass found nothing: it idles for a minute
            saved = writer.submit(StartTurn(ALICE, "t1", "c1", "h1", datetime.now(UTC),
                                            "I live in Porto and my manager is Dana."))
            pending.saving(ALICE.user, saved)
            bob_free = not pending.pending("bob")  # another user has nothing to wait for
            started = time.perf_counter()
            settled = await pending.settled(ALICE.user, 5.0)
            waited = time.perf_counter() - started
            retrieved = await Retrieval(store, MemorySettings(retrieval_timeout_ms=5000), metrics).retrieve(
                ALICE, Query("Who is my manager?", "c2", (), 6, new_conversation=True))
            return retrieved.block.splitlines(), waited, settled, bob_free

    lines, waited, settled, bob_free = asyncio.run(body())
    assert settled and bob_free
    assert waited < 2.0  # the wait woke the worker: it did not sleep out its minute
    assert any(line.endswith(". [graph] (User)-[HAS_MANAGER]->(Dana)") for line in lines)


def test_writes_begun_after_the_request_asked_are_not_waited_for(tmp_path: Path) -> None:
    """The same user's other requests keep saving (a message every 2 ms) while one waits: it
    waits for the message saved before it asked and one pass, not for theirs."""
    async def body() -> tuple[list[str], float, bool]:
        async def others() -> None:
            for n in range(100_000):
                saved = writer.submit(StartTurn(ALICE, f"other-{n}", f"c-other-{n}", f"h-other-{n}",
                                                datetime.now(UTC), f"I like the colour number {n}."))
                pending.saving(ALICE.user, saved)
                await asyncio.sleep(0.002)

        async with running(tmp_path) as (store, metrics, writer, pending):
            await asyncio.sleep(0.1)
            saved = writer.submit(StartTurn(ALICE, "t1", "c1", "h1", datetime.now(UTC),
                                            "I live in Porto and my manager is Dana."))
            pending.saving(ALICE.user, saved)
            await saved
            stream = asyncio.create_task(others())
            await asyncio.sleep(0.05)  # the stream is under way: something of alice's is always pending
            started = time.perf_counter()
            settled = await pending.settled(ALICE.user, 3.0)
            waited = time.perf_counter() - started
            stream.cancel()
            retrieved = await Retrieval(store, MemorySettings(retrieval_timeout_ms=5000), metrics).retrieve(
                ALICE, Query("Who is my manager?", "c2", (), 6, new_conversation=True))
            return retrieved.block.splitlines(), waited, settled

    lines, waited, settled = asyncio.run(body())
    assert settled
    assert waited < 1.0  # not the 3 s bound: it did not chase the writes begun after it asked
    assert any(line.endswith(". [graph] (User)-[HAS_MANAGER]->(Dana)") for line in lines)


def test_a_saved_message_wakes_the_worker_before_anyone_asks(tmp_path: Path) -> None:
    """The pass over a committed message starts at once, overlapping the rest of the turn, not when
    the user's next request comes to wait for it: the worker idles a minute, and nobody waits."""
    async def body() -> bool:
        async with running(tmp_path) as (store, metrics, writer, pending):
            await asyncio.sleep(0.1)  # the worker's first pass found nothing: it idles for a minute
            saved = writer.submit(StartTurn(ALICE, "t1", "c1", "h1", datetime.now(UTC),
                                            "I live in Porto and my manager is Dana."))
            pending.saving(ALICE.user, saved)
            await saved
            for _ in range(500):  # at most 5 s, never 60
                if not pending.pending(ALICE.user):
                    return True
                await asyncio.sleep(0.01)
            return False

    assert asyncio.run(body())


def test_the_facts_of_a_pass_commit_without_waiting_for_other_writes(tmp_path: Path) -> None:
    """A request may be waiting for the pass: its facts commit at once, not after the writer's
    wait for company (made 30 s here, so only an urgent commit can settle within the bound)."""
    async def body() -> bool:
        async with running(tmp_path, commit_delay_s=30.0, close_within_s=0.1) as (store, metrics, writer, pending):
            await asyncio.sleep(0.1)
            saved = writer.submit(StartTurn(ALICE, "t1", "c1", "h1", datetime.now(UTC),
                                            "I live in Porto and my manager is Dana."), urgent=True)
            pending.saving(ALICE.user, saved)
            return await pending.settled(ALICE.user, 5.0)

    assert asyncio.run(body())


def test_a_message_mined_as_it_is_saved_is_findable_with_no_pass_of_the_worker(tmp_path: Path) -> None:
    """Its facts are written right behind it, and found with no extraction worker running at all;
    the queue item that backed the write up is gone, and nothing of it is pending for other requests."""
    async def body() -> tuple[list[str], dict[str, int], bool]:
        store, metrics = SQLiteStore(str(tmp_path / "memory.db")), Metrics()
        await store.open()
        writer = Writer(store, metrics, 100)
        writer.start()
        inline = InlineFacts(writer, RulesExtractor(), isolate_agents=False)
        try:
            now, text = datetime.now(UTC), "I live in Porto and my manager is Dana."
            writer.submit(StartTurn(ALICE, "t1", "c1", "h1", now, text, message_id="m1",
                                    extract_from=queue_from(now)))
            await asyncio.wait_for(inline.record(ALICE, "m1", text, now), 5.0)
            retrieved = await Retrieval(store, MemorySettings(retrieval_timeout_ms=5000), metrics).retrieve(
                ALICE, Query("Who is my manager?", "c2", (), 6, new_conversation=True))
            return retrieved.block.splitlines(), await store.queue_depth(), await store.claim_extraction(
                10, now + timedelta(hours=1)) == []
        finally:
            await writer.close()
            await store.close()

    lines, depth, unclaimed = asyncio.run(body())
    assert any(line.endswith(". [graph] (User)-[HAS_MANAGER]->(Dana)") for line in lines)
    assert depth == {"pending": 0, "parked": 0} and unclaimed


def test_a_turn_ends_once_the_facts_of_its_message_are_written(tmp_path: Path) -> None:
    """The commit a step's end waits for includes the facts of the user's message: the user's next
    turn, on any replica, finds them, and its own facts land after them. The real memory service;
    the answer comes at once, long before the rules are through a 1,900-character message."""
    settings = load_settings(environ={}, overrides={"store.url": f"sqlite:///{tmp_path}/memory.db"})
    text = "My manager is Dana. " + " ".join(f"Then Tom Baker met Anna Lee at Acme Corp in Berlin on day {n}."
                                               for n in range(30))
    text = text[:1900]

    async def scenario() -> list[tuple[str, str]]:
        parts = Parts(settings)
        await parts.start()
        try:
            recall = await parts.memory.recall(RequestScope(ALICE), chat(text))
            assert recall.status == "ok"
            commit = recall.answered(AssistantMessage("Noted."))
            assert commit is not None
            await commit
            with closing(sqlite3.connect(tmp_path / "memory.db")) as db:
                return db.execute("SELECT r.type, e.name FROM relationships r JOIN entities e ON e.id = r.to_id"
                                  " WHERE r.user_id = 'alice'").fetchall()
        finally:
            await parts.stop()

    assert ("HAS_MANAGER", "Dana") in asyncio.run(scenario())


def test_the_next_request_after_a_failed_turn_finds_its_facts(tmp_path: Path) -> None:
    """A turn whose upstream failed still saved the user's message: its answer never waited for the
    facts, so the user's next request does, and finds them. The real memory service. A generous
    recall budget: its share for that wait (a quarter) must outlast the worker's pass on a loaded
    machine; the wait itself is the subject."""
    settings = load_settings(environ={}, overrides={"store.url": f"sqlite:///{tmp_path}/memory.db",
                                                   "memory.retrieval_timeout_ms": 5000})
    text = "My manager is Dana. " + " ".join(f"Then Tom Baker met Anna Lee at Acme Corp in Berlin on day {n}."
                                               for n in range(30))
    text = text[:1900]

    async def scenario() -> str:
        parts = Parts(settings)
        await parts.start()
        try:
            first = await parts.memory.recall(RequestScope(ALICE), chat(text))
            assert first.status == "ok"
            first.failed("upstream_failed")  # the client is told at once, and asks again
            recall = await parts.memory.recall(RequestScope(ALICE), chat("Who is my manager?"))
            return recall.block or ""
        finally:
            await parts.stop()

    assert "[graph] (User)-[HAS_MANAGER]->(Dana)" in asyncio.run(scenario())


def test_a_name_said_next_replaces_one_still_waiting_for_the_worker(tmp_path: Path) -> None:
    """'My name is Ann' in a long message goes through the queue; 'My name is Anna' next, short,
    would be mined as it is saved. The next request's wait for the pass ran out (a small budget),
    so the short message's facts must not land before the long one's: the name said last stays."""
    settings = load_settings(environ={}, overrides={"store.url": f"sqlite:///{tmp_path}/memory.db",
                                                   "memory.retrieval_timeout_ms": 20})
    long_text = ("My name is Ann. " + " ".join(f"Then Tom Baker met Anna Lee at Acme Corp in Berlin on day {n}."
                                               for n in range(60)))[:3000]

    async def scenario() -> list[tuple[str]]:
        parts = Parts(settings)
        await parts.start()
        try:
            for text in (long_text, "My name is Anna."):
                recall = await parts.memory.recall(RequestScope(ALICE), chat(text))
                commit = recall.answered(AssistantMessage("Noted."))
                assert commit is not None
                await commit
            for _ in range(100):  # until the worker has passed over the long message
                if (await parts.store.queue_depth())["pending"] == 0:
                    break
                await asyncio.sleep(0.05)
            await parts.writer.flush(5.0)
        finally:
            await parts.stop()
        with closing(sqlite3.connect(tmp_path / "memory.db")) as db:
            return db.execute("SELECT name FROM entities WHERE user_id = 'alice' AND type = 'user'").fetchall()

    assert asyncio.run(scenario()) == [("Anna",)]


def test_inline_mining_and_the_worker_share_one_rules_extractor(tmp_path: Path) -> None:
    """The rules hold the GIL and run one message at a time per extractor: two extractors would
    mine in two threads at once, taking twice the event loop's share of the GIL under load."""
    settings = load_settings(environ={}, overrides={"store.url": f"sqlite:///{tmp_path}/memory.db"})
    parts = Parts(settings)
    assert parts.memory.inline_facts is not None
    assert parts.memory.inline_facts._rules is parts.extraction.extractor
