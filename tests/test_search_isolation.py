"""A user's search scores and ranking come from that user's memory alone, on both stores.

BM25 weighs a word by how rare it is, a row by its length against the mean, among N rows:
counted over the whole store, another user saying a word 400 times moved a user's score
for it from 2e-06 to 5.9 and reordered the hits, so a score told one user something of
another's data. Here a user's searches are recorded, another user then says the word 400
times (messages, memories, reasoning traces), and every score and rank must be the same
to the bit: through the store's searches on SQLite (FTS5 finding, or the in-memory
postings) and PostgreSQL, and through the memory API's search and the injection log.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from contextlib import closing
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from proxy.models import ReasoningStep, Scope
from proxy.stores.base import FinishTurn, StartTurn, Store, StoreMemory, WriteOp
from proxy.stores.sqlite.store import SQLiteStore
from proxy.stores.sqlite.message_index import snapshot as message_snapshot
from proxy.stores.sqlite.postings import read_transaction
from proxy.stores.sqlite.search import MESSAGES
from proxy.stores.search_budget import SMALL_INDEX_ROWS
from proxy.stores.sqlite.user_stats import UserCounts, user_statistics
from proxy.terms import query_terms
from tests.api_helpers import NDJSON, RECORDS, api_url, chat, jsonl
from tests.store_backends import Backend, backend  # noqa: F401  (the fixture)

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ALICE = Scope("alice")
BOB = Scope("bob")
WORDS = "garden invoice holiday dentist marathon recipe lease guitar podcast laptop kayak bakery".split()
STEP = (ReasoningStep("lookup", "{}", "ok"),)
QUESTIONS = ("is the staging host up?", "staging garden invoice", "what about the kayak lease?")


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def alice_memory() -> list[WriteOp]:
    """700 messages (a few saying 'staging'), memories and traces, some saying it."""
    ops: list[WriteOp] = []
    for n in range(350):
        words = " ".join(WORDS[(n * k) % len(WORDS)] for k in (1, 3, 7))
        text = f"the staging host {words}" if n % 9 == 0 else f"notes on the {words}"
        at = T0 + timedelta(minutes=n)
        ops.append(StartTurn(ALICE, f"a{n}", f"c{n % 12}", f"h-a{n}", at, text))
        ops.append(FinishTurn(ALICE, f"a{n}", f"c{n % 12}", f"answer about the {words}", at + timedelta(seconds=5),
                              task=f"check the staging {words}" if n % 25 == 0 else f"look up {words}",
                              steps=STEP if n % 5 == 0 else ()))
    ops += [StoreMemory(ALICE, f"am{n}", f"the {WORDS[n % 12]} staging note {WORDS[(n * 5) % 12]}"
                        if n % 4 == 0 else f"a note on the {WORDS[n % 12]}", "fact", T0 + timedelta(seconds=n))
            for n in range(40)]
    return ops


def bob_says_it_400_times() -> list[WriteOp]:
    ops: list[WriteOp] = []
    for n in range(400):
        at = T0 + timedelta(days=1, minutes=n)
        ops.append(StartTurn(BOB, f"b{n}", f"b{n % 7}", f"h-b{n}", at, "staging staging staging"))
        ops.append(FinishTurn(BOB, f"b{n}", f"b{n % 7}", "staging", at + timedelta(seconds=5),
                              task="staging", steps=STEP if n % 4 == 0 else ()))
    ops += [StoreMemory(BOB, f"bm{n}", f"staging {n}", "fact", T0) for n in range(400)]
    return ops


async def alice_searches(store: Store) -> list[list[tuple[str, float]]]:
    """Every search a source makes, for each question: ids and scores, best first."""
    out = []
    for question in QUESTIONS:
        terms = query_terms(question)
        for where in ({}, {"exclude_conversation_id": "c3"}, {"conversation_ids": ["c1", "c5"]}):
            out.append([(m.id, s) for m, s in await store.search_messages(ALICE, terms, limit=16, **where)])
        out.append([(e.id, s) for e, s in await store.search_entities(ALICE, terms, limit=16)])
        out.append([(x.id, s) for x, s in await store.search_reasoning(ALICE, terms, limit=16)])
    return out


def test_another_user_saying_a_word_changes_no_score_of_a_user(backend: Backend) -> None:  # noqa: F811
    async def body() -> tuple[list[list[tuple[str, float]]], list[list[tuple[str, float]]]]:
        async with backend.opened() as store:
            await store.apply(alice_memory())
            before = await alice_searches(store)
            await store.apply(bob_says_it_400_times())
            return before, await alice_searches(store)

    before, after = run(body())
    assert after == before
    assert sum(map(len, before)) > 100 and all(score > 0.01 for hits in before for _, score in hits[:1])


def test_a_user_s_scores_are_the_same_from_fts5_and_from_the_postings_beside_another_user(tmp_path: Any) -> None:
    # The store answering from FTS5 alone (search_cache_mb=0) and the one answering from its
    # users' postings count the user's statistics two ways: the same scores to the bit.
    path = str(tmp_path / "m.db")

    async def body() -> tuple[list[Any], list[Any], list[Any]]:
        fts, mem = SQLiteStore(path, search_cache_mb=0), SQLiteStore(path)
        await fts.open()
        await mem.open()
        try:
            await fts.apply(alice_memory())
            before = await alice_searches(fts)
            await fts.apply(bob_says_it_400_times())
            while not (mem.message_indexes.holds("alice") and mem.entity_indexes.holds("alice")):
                await alice_searches(mem)
                await asyncio.sleep(0.02)
            return before, await alice_searches(fts), await alice_searches(mem)
        finally:
            await fts.close()
            await mem.close()

    before, from_fts, from_postings = run(body())
    assert from_fts == before and from_postings == before


# --- the memory API's search and the injection log ---------------------------------------


def bob_records() -> list[dict[str, Any]]:
    """Bob's memory as export records: 400 messages saying 'staging', and memories and traces saying it."""
    at = "2026-01-03T10:00:00+00:00"
    records: list[dict[str, Any]] = [{"kind": "conversation", "id": f"bc{n}", "created_at": at, "last_active_at": at}
                                     for n in range(4)]
    records += [{"kind": "message", "id": f"bm{n}", "conversation_id": f"bc{n % 4}", "role": "user",
                 "content": "staging staging host staging", "created_at": at} for n in range(400)]
    records += [{"kind": "entity", "id": f"be{n}", "name": f"Staging {n}", "type": "host",
                 "description": "the staging host", "memory_type": "fact", "confidence": 0.5, "tags": [],
                 "aliases": [], "provenance": [], "created_at": at, "updated_at": at} for n in range(40)]
    records += [{"kind": "reasoning", "id": f"bx{n}", "conversation_id": "bc0", "task": "Is the staging host up?",
                 "steps": [], "answer": "staging", "created_at": at} for n in range(40)]
    return records


def alice_records() -> list[dict[str, Any]]:
    """RECORDS (staging host, Alice Chen at Acme), and notes that say neither."""
    at = "2026-01-02T11:00:00+00:00"
    return RECORDS + [{"kind": "message", "id": f"note{n}", "conversation_id": "conv-b", "role": "user",
                       "content": f"a note on the {WORDS[n % len(WORDS)]}", "created_at": at} for n in range(12)]


@pytest.fixture(params=["sqlite", "postgres"])
def served(request: pytest.FixtureRequest, make_proxy: Any) -> Any:
    """The proxy on each store in turn, making no facts of a turn (its memory is then only what
    the test imports and the turn's conversation, which the test deletes)."""
    store = {} if request.param == "sqlite" else {"store__url": request.getfixturevalue("pg_url")}
    return make_proxy(extraction__from_roles=[], **store)


def scored(hits: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(h["rank"], h["source"], h["id"], h["reason"], h["score"]) for h in hits]


def test_the_api_s_scores_and_the_injection_log_tell_nothing_of_another_user(served: Any) -> None:
    question = "Is the staging host internal-hbr-2291.example up? Where does Alice Chen work?"
    headers = {"X-Memory-User": "alice", "X-Memory-Conversation": "conv-new"}

    def alice_sees(api: httpx.Client) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """The API's search, then the injection log of a turn asking the same (the turn's
        conversation deleted after it, so alice's memory is again what it was)."""
        found = api.post(api_url("alice", "search"), json={"query": question}).json()["hits"]
        turn = chat(api, headers, question).headers["x-memory-turn"]
        deadline = time.monotonic() + 10
        while not (entries := [e for e in api.get(api_url("alice", "injections")).json()["data"]
                               if e["turn_id"] == turn]):  # the log is written after the answer
            assert time.monotonic() < deadline, "the turn's injection log was never written"
            time.sleep(0.02)
        logged = entries[0]["log"]["hits"]
        assert api.delete(api_url("alice", "conversations", "conv-new")).status_code == 200
        return scored(found), [(h["source"], h["id"], h["reason"], h["score"]) for h in logged]

    with served.http() as api:
        assert api.post(api_url("alice", "import"), headers=NDJSON, content=jsonl(alice_records())).status_code == 200
        before = alice_sees(api)
        assert api.post(api_url("bob", "import"), headers=NDJSON, content=jsonl(bob_records())).status_code == 200
        after = alice_sees(api)
    assert after == before
    found, logged = before
    assert {("cross-session", "m1"), ("reasoning", "x1")} <= {(source, item) for _, source, item, _, _ in found}
    assert logged == [(source, item, reason, score) for _, source, item, reason, score in found]


def test_the_kept_counts_stay_what_the_user_s_rows_say_through_appends_and_deletions(tmp_path: Any) -> None:
    # UserCounts counts a user once, then adds the user's rows committed since (another
    # user's never); past SMALL_INDEX_ROWS it counts the own-words rows too (the plan reads
    # them); a deletion moves the epoch and it counts again. Each answer equals a fresh count
    # in the same read transaction.
    path = tmp_path / "m.db"
    terms = ["stage", "garden", "invoic", "kayak", "nowher"]
    counts = UserCounts(MESSAGES, SMALL_INDEX_ROWS)

    def agree() -> tuple[int, dict[str, int]]:
        with closing(sqlite3.connect(path, isolation_level=None)) as db, read_transaction(db):
            seen = message_snapshot(db)
            kept = counts.statistics(db, "alice", terms, seen.visible_seq, seen.epoch)
            assert kept == user_statistics(db, MESSAGES, "alice", terms, SMALL_INDEX_ROWS)
            return kept[0].rows, kept[1]

    async def write(ops: list[WriteOp]) -> None:
        store = SQLiteStore(str(path), search_cache_mb=0)
        await store.open()
        try:
            await store.apply(ops)
        finally:
            await store.close()

    run(write(alice_memory()[:600]))
    assert agree()[0] == 600
    run(write(bob_says_it_400_times()[:200] + alice_memory()[600:]))
    assert agree()[0] == 700
    run(write([StartTurn(ALICE, f"x{n}", "big", f"h-x{n}", T0 + timedelta(days=2, seconds=n), "kayak staging")
               for n in range(400)]))
    rows, finding = agree()
    assert rows == 1100 and finding["kayak"] > 400
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("DELETE FROM messages WHERE user_id = 'alice' AND seq % 3 = 0")
    assert agree()[0] < 800
