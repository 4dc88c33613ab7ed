"""Search cost bounds (conversation filter on SQLite; common terms on both backends), the
user's node and bounded edge reads on both backends, and the read pool."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Coroutine
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proxy.api.jsonl import parse_record
from proxy.models import ReasoningStep, Scope
from proxy.stores.base import FinishTurn, StartTurn, StoreError, StoreMemory
from proxy.stores.sqlite.store import SQLiteStore
from proxy.stores.search_budget import (
    CANDIDATE_MAX_ROWS,
    CANDIDATE_MIN_ROWS,
    SMALL_INDEX_ROWS,
    candidate_budget,
    candidate_terms,
)
from proxy.terms import query_terms
from tests.store_backends import Backend, backend  # noqa: F401  (the fixture)

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ALICE = Scope("alice")
BOB = Scope("bob")


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


class SQLiteStoreOpened:
    """`async with SQLiteStoreOpened(path) as store`: an open store on a real file, closed after."""

    def __init__(self, path: Path) -> None:
        self.store = SQLiteStore(str(path))

    async def __aenter__(self) -> SQLiteStore:
        await self.store.open()
        return self.store

    async def __aexit__(self, *exc: object) -> None:
        await self.store.close()


def said(scope: Scope, n: int, text: str, conv: str) -> StartTurn:
    return StartTurn(scope, f"{scope.user}-t{n}", conv, f"h{n}", T0 + timedelta(minutes=n), text)


def full_search(path: Path, user: str, terms: list[str], *, not_in: str | None = None) -> list[tuple[str, float]]:
    """The unbounded search: every row holding a term in its own words, scored over all terms
    by FTS5's bm25() in a copy of the store holding the user's messages alone (so with the
    user's own statistics)."""
    match = " OR ".join(f'"{t}"' for t in terms)
    own = f"terms : ({match})"
    alone = path.with_name(f"{path.stem}-{user}-alone.db")
    with closing(sqlite3.connect(path)) as source, closing(sqlite3.connect(alone)) as db:
        source.backup(db)
        with db:
            db.execute("DELETE FROM messages WHERE user_id != ?", (user,))
        rows = db.execute(
            "SELECT m.content, -bm25(messages_fts, 1.0, 0.3) AS score FROM messages_fts"
            " JOIN messages m ON m.seq = messages_fts.rowid WHERE messages_fts MATCH ? AND m.user_id = ?"
            " AND m.conversation_id IS NOT ? AND m.seq IN (SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?)"
            " ORDER BY score DESC, m.seq DESC",
            (match, user, not_in, own),
        ).fetchall()
    return [(content, round(score, 9)) for content, score in rows]


# --- the conversation filter ----------------------------------------------------------


def test_conversation_filter_finds_exactly_the_chosen_conversations(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> None:
        async with SQLiteStoreOpened(path) as store:
            # Conversations interleaved in time, so each one's rows spread over the others'.
            ops = [said(ALICE, n, f"penguin note {n} in {'abc'[n % 3]}", "abc"[n % 3]) for n in range(30)]
            ops += [said(BOB, 100 + n, f"penguin note of bob {n}", "a") for n in range(5)]
            await store.apply(ops)
            terms = query_terms("penguin notes")
            for chosen in (["a"], ["a", "c"], ["b", "c", "nowhere"]):
                hits = await store.search_messages(ALICE, terms, conversation_ids=chosen, limit=100)
                assert {m.conversation_id for m, _ in hits} == set(chosen) - {"nowhere"}
                assert len(hits) == 10 * len(set(chosen) - {"nowhere"})
                assert all("bob" not in m.content for m, _ in hits)
                # The same rows and scores as the unbounded search keeps for those conversations.
                every = [(c, s) for c, s in full_search(path, "alice", terms) if c[-1] in chosen]
                assert [(m.content, round(s, 9)) for m, s in hits] == every
            assert await store.search_messages(ALICE, terms, conversation_ids=["nowhere"]) == []
            assert await store.search_messages(ALICE, terms, conversation_ids=[]) == []
            assert await store.search_messages(BOB, terms, conversation_ids=["b"]) == []

    run(body())


def test_conversation_filter_respects_the_limit_and_order(tmp_path: Path) -> None:
    async def body() -> None:
        async with SQLiteStoreOpened(tmp_path / "m.db") as store:
            await store.apply([said(ALICE, n, "walrus walrus" if n == 7 else f"walrus {n}", "a") for n in range(12)])
            hits = await store.search_messages(ALICE, ["walrus"], conversation_ids=["a"], limit=3)
            assert hits[0][0].content == "walrus walrus"
            assert len(hits) == 3
            scores = [score for _, score in hits]
            assert scores == sorted(scores, reverse=True)

    run(body())


# --- common terms in a whole-history search ---------------------------------------------


def common_world(rare_rows: int = 3) -> list[StartTurn]:
    """Many rows saying 'deadline' (common), a few saying 'zephyr' (rare), one saying both."""
    ops = [said(ALICE, n, f"the deadline for item {n} moved", f"c{n % 40}") for n in range(SMALL_INDEX_ROWS + 100)]
    base = len(ops)
    ops += [said(ALICE, base + n, f"the zephyr project number {n}", f"z{n}") for n in range(rare_rows)]
    ops.append(said(ALICE, base + rare_rows, "the zephyr deadline is Friday", "zz"))
    ops += [said(BOB, 1000 + n, "bob zephyr deadline", "b") for n in range(3)]
    return ops


def test_common_terms_never_lose_a_rare_term_match(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> None:
        async with SQLiteStoreOpened(path) as store:
            await store.apply(common_world())
            terms = query_terms("when is the zephyr deadline?")
            assert terms == ["zephyr", "deadlin"]
            hits = await store.search_messages(ALICE, terms, exclude_conversation_id="c1", limit=10)
            # Every row holding the rare term, the one holding both first, scored as the
            # unbounded search scores it (the common term still counts toward the score).
            expected = [(c, s) for c, s in full_search(path, "alice", terms, not_in="c1") if "zephyr" in c]
            assert [(m.content, round(s, 9)) for m, s in hits] == expected
            assert hits[0][0].content == "the zephyr deadline is Friday"
            assert len(hits) == 4
            # The common term alone still finds its rows: it is the rarest that occurs.
            alone = await store.search_messages(ALICE, ["deadlin", "nosuchterm"], limit=5)
            assert len(alone) == 5 and all("deadline" in m.content for m, _ in alone)

    run(body())


def test_small_stores_score_every_match(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> None:
        async with SQLiteStoreOpened(path) as store:
            await store.apply([said(ALICE, n, f"the deadline {n}", "a") for n in range(SMALL_INDEX_ROWS - 1)]
                              + [said(ALICE, 5000, "the zephyr", "b")])
            hits = await store.search_messages(ALICE, ["zephyr", "deadlin"], limit=SMALL_INDEX_ROWS + 10)
            assert len(hits) == SMALL_INDEX_ROWS  # up to SMALL_INDEX_ROWS every match is scored

    run(body())


ROLLOUTS = sorted(f"the rollout {n} went fine" for n in range(20))


def crowded_history(owner: Scope, crowd_conversation: str) -> list[StartTurn]:
    """`owner`'s twenty older rollout messages, unrelated notes, then more of Alice's newest
    rollout messages (in `crowd_conversation`) than SQLite's candidate budget holds."""
    rows = SMALL_INDEX_ROWS + 500
    budget = candidate_budget(rows)
    owned = [said(owner, n, f"the rollout {n} went fine", f"old{n % 5}") for n in range(20)]
    filler = [said(ALICE, 100 + n, f"unrelated note {n}", "notes") for n in range(rows - 20 - budget - 10)]
    crowd = [said(ALICE, 5000 + n, f"rollout step {n}", crowd_conversation) for n in range(budget + 10)]
    return owned + filler + crowd


def test_a_left_out_conversation_never_fills_the_candidate_budget(backend: Backend) -> None:  # noqa: F811
    """Cross-session search during a long conversation: its own newest rows say the query's
    term more often than SQLite's candidate budget allows, and are left out; older
    conversations still answer."""
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply(crowded_history(ALICE, "now"))
            hits = await store.search_messages(ALICE, ["rollout"], exclude_conversation_id="now", limit=50)
            assert sorted(m.content for m, _ in hits) == ROLLOUTS

    run(body())


def test_another_agents_rows_never_fill_an_isolated_agents_candidate_budget(backend: Backend) -> None:  # noqa: F811
    ops_agent = Scope("alice", agent="ops", agent_isolated=True)

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply(crowded_history(ops_agent, "chat"))
            hits = await store.search_messages(ops_agent, ["rollout"], limit=50)
            assert sorted(m.content for m, _ in hits) == ROLLOUTS

    run(body())


def test_a_common_rarest_term_scores_only_its_newest_rows(tmp_path: Path) -> None:
    """Every term common: the newest budget's worth of rows saying the rarest are scored, not all."""
    path = tmp_path / "m.db"
    rows = SMALL_INDEX_ROWS + 500
    budget = candidate_budget(rows)

    async def body() -> None:
        async with SQLiteStoreOpened(path) as store:
            # "deadline" in every row, "budget" in every other row (the rarest term).
            ops = [said(ALICE, n, f"the deadline {n}" + (" budget" if n % 2 else ""), f"c{n % 40}")
                   for n in range(rows)]
            await store.apply(ops + [said(BOB, 9000 + n, "bob budget deadline", "b") for n in range(3)])
            hits = await store.search_messages(ALICE, ["budget", "deadlin"], limit=rows)
            assert len(hits) == budget
            newest = [f"the deadline {n} budget" for n in range(rows - 1, -1, -2)][:budget]
            assert {m.content for m, _ in hits} == set(newest)
            # Ranked by BM25 over both terms, as the unbounded search ranks them.
            expected = [(c, s) for c, s in full_search(path, "alice", ["budget", "deadlin"]) if c in set(newest)]
            assert [(m.content, round(s, 9)) for m, s in hits] == expected

    run(body())


def test_every_store_scores_only_the_newest_rows_saying_a_common_rarest_term(backend: Backend) -> None:  # noqa: F811
    """Both stores: past SMALL_INDEX_ROWS, when the rarest term alone overflows the budget, the
    newest budget's worth of visible rows saying it are scored; an older, better hit is not."""
    rows = SMALL_INDEX_ROWS + 500
    budget = candidate_budget(rows)

    async def body() -> None:
        async with backend.opened() as store:
            # "budget" in every other row (the rarest term), "deadline" in all; the oldest
            # row says "budget" three times, so it would score best if it were scored.
            ops = [said(ALICE, 0, "budget budget budget deadline", "c0")]
            ops += [said(ALICE, n, f"the deadline {n}" + (" budget" if n % 2 else ""), f"c{n % 40}")
                    for n in range(1, rows)]
            await store.apply(ops + [said(BOB, 9000 + n, "bob budget deadline", "b") for n in range(3)])
            hits = await store.search_messages(ALICE, ["budget", "deadlin"], limit=rows)
            assert len(hits) == budget
            newest = [f"the deadline {n} budget" for n in range(rows - 1, 0, -2)][:budget]
            assert {m.content for m, _ in hits} == set(newest)
            assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
            # Another conversation left out: its rows never take the budget's places.
            left_out = await store.search_messages(ALICE, ["budget", "deadlin"], exclude_conversation_id="c1",
                                                   limit=rows)
            assert len(left_out) == budget
            assert all(m.conversation_id != "c1" for m, _ in left_out)

    run(body())


def test_entity_search_is_bounded_like_message_search(backend: Backend) -> None:  # noqa: F811
    rows = SMALL_INDEX_ROWS + 500
    budget = candidate_budget(rows)

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([StoreMemory(ALICE, f"m{n}", f"I prefer tool{n} for project {n}", "fact", T0)
                               for n in range(rows)])
            await store.apply([StoreMemory(ALICE, "z1", "I prefer zanzibar for everything", "fact", T0),
                               StoreMemory(BOB, "z2", "I prefer zanzibar too", "fact", T0)])
            terms = query_terms("which tools do I prefer for my projects?")
            common = await store.search_entities(ALICE, terms, limit=rows)
            assert len(common) == budget  # the newest rows saying the rarest term, not all of them
            assert all(e.description.startswith("I prefer") or e.name.startswith("I prefer") for e, _ in common)
            rare = await store.search_entities(ALICE, query_terms("do I prefer zanzibar?"), limit=5)
            # The rare term's rows are the candidates (Bob's is not Alice's); "prefer" alone finds none.
            assert [e.name for e, _ in rare] == ["I prefer zanzibar for everything"]

    run(body())


def test_a_store_that_grows_while_searched_becomes_bounded(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    rows = SMALL_INDEX_ROWS + 500

    async def body() -> None:
        async with SQLiteStoreOpened(path) as store:
            terms = query_terms("which tools do I prefer for my projects?")
            await store.apply([StoreMemory(ALICE, "m0", "I prefer tool0 for project 0", "fact", T0)])
            assert len(await store.search_entities(ALICE, terms, limit=rows)) == 1  # small: searched whole
            await store.apply([StoreMemory(ALICE, f"m{n}", f"I prefer tool{n} for project {n}", "fact", T0)
                               for n in range(1, rows)])
            # Moments later, well within any cache's lifetime: no longer small, so bounded.
            assert len(await store.search_entities(ALICE, terms, limit=rows)) == candidate_budget(rows)

    run(body())


def test_reasoning_search_is_bounded_like_message_search(backend: Backend) -> None:  # noqa: F811
    rows = SMALL_INDEX_ROWS + 500
    budget = candidate_budget(rows)
    step = (ReasoningStep("lookup", "{}", "ok"),)

    def traced(scope: Scope, n: int, task: str) -> FinishTurn:
        return FinishTurn(scope, f"{scope.user}-t{n}", f"c{n % 40}", f"answer {n}", T0 + timedelta(minutes=n),
                          task=task, steps=step)

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([traced(ALICE, n, f"deploy service {n}") for n in range(rows)])
            await store.apply([traced(ALICE, rows, "deploy the zanzibar service"),
                               traced(BOB, 1, "deploy zanzibar too")])
            common = await store.search_reasoning(ALICE, query_terms("deploy the service"), limit=rows)
            assert len(common) == budget  # the newest traces saying the rarest term, not all of them
            assert {t.task for t, _ in common} == {"deploy the zanzibar service",
                                                   *(f"deploy service {n}" for n in range(rows - budget + 1, rows))}
            rare = await store.search_reasoning(ALICE, query_terms("deploy zanzibar"), limit=5)
            # The rare term's traces are the candidates (Bob's is not Alice's).
            assert [t.task for t, _ in rare] == ["deploy the zanzibar service"]

    run(body())


def test_candidate_terms() -> None:
    rows = 20_000  # the budget: 3% of the rows, 600
    assert candidate_budget(rows) == 600
    cases: list[tuple[dict[str, int], list[str] | None]] = [
        ({"a": 10, "b": 500}, None),  # every match fits: all are scored
        ({"a": 10, "b": 6_000}, ["a"]),
        ({"a": 10, "b": 6_000, "c": 0}, ["a"]),  # a term that never occurs is no candidate
        ({"a": 1_000, "b": 6_000}, ["a"]),  # nothing fits: the rarest that occurs
        ({"a": 0, "b": 6_000, "c": 900}, ["c"]),
        ({"a": 0, "b": 0}, None),
        ({"a": 10, "b": 580, "c": 6_000}, ["a", "b"]),  # the rarest, as many as fit
        ({"a": 10, "b": 600, "c": 6_000}, ["a"]),
        ({"a": 200, "b": 200, "c": 200, "d": 200}, ["a", "b", "c"]),
    ]
    for counts, expected in cases:
        assert candidate_terms(list(counts), counts, rows) == expected, counts
    big = SMALL_INDEX_ROWS + 1
    assert candidate_budget(big) == CANDIDATE_MIN_ROWS  # the floor
    assert candidate_terms(["a", "b"], {"a": 1, "b": CANDIDATE_MIN_ROWS - 1}, big) is None
    assert candidate_budget(10_000_000) == CANDIDATE_MAX_ROWS  # the ceiling
    assert candidate_terms(["a", "b"], {"a": 10, "b": 1_000}, SMALL_INDEX_ROWS) is None  # a small index: whole


def test_a_term_said_after_a_search_missed_it_is_found_at_once(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> None:
        async with SQLiteStoreOpened(path) as store:
            await store.apply([StoreMemory(ALICE, f"m{n}", f"I prefer tool{n}", "fact", T0)
                               for n in range(SMALL_INDEX_ROWS + 10)])
            terms = query_terms("who is zorblax?")
            assert await store.search_entities(ALICE, terms, limit=5) == []
            await store.apply([StoreMemory(ALICE, "z", "Zorblax is my dog", "fact", T0)])
            found = await store.search_entities(ALICE, terms, limit=5)
            assert [e.name for e, _ in found] == ["Zorblax is my dog"]

    run(body())


def test_a_term_spelled_otherwise_than_indexed_is_not_taken_for_absent(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> None:
        async with SQLiteStoreOpened(path) as store:
            await store.apply([StoreMemory(ALICE, "h", "the staging host is internal_hbr_2291", "fact", T0)])
            for terms in (["INTERNAL_HBR_2291"], ["internal_hbr_2291"], ["Internal_Hbr_2291", "nosuchterm"]):
                assert len(await store.search_entities(ALICE, terms, limit=5)) == 1, terms

    run(body())


def test_terms_no_row_holds_change_no_score(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        async with SQLiteStoreOpened(path) as store:
            await store.apply([StoreMemory(ALICE, f"m{n}", f"I prefer tool{n % 7} for project {n % 13}", "fact", T0)
                               for n in range(SMALL_INDEX_ROWS + 300)])
            plain = await store.search_entities(ALICE, query_terms("which project do I prefer?"), limit=20)
            padded = await store.search_entities(
                ALICE, query_terms("which project do I prefer, quux frobnicate 777777?"), limit=20)
            return ([(e.name, round(score, 9)) for e, score in plain],
                    [(e.name, round(score, 9)) for e, score in padded])

    plain, padded = run(body())
    assert len(plain) == 20
    assert padded == plain


# --- the user's node and bounded edges, on both backends -----------------------------------


def test_user_node(backend: Backend) -> None:  # noqa: F811
    async def body() -> None:
        async with backend.opened() as store:
            assert await store.user_node(ALICE) is None
            await backend.add_entity("alice", "User Users", "person", "talks about users")  # not the node
            assert await store.user_node(ALICE) is None
            node = await backend.add_entity("alice", "Sam Rivera", "user", "the user")
            await backend.add_entity("bob", "Bob", "user")
            found = await store.user_node(ALICE)
            assert found is not None and (found.id, found.name) == (node, "Sam Rivera")
            other = await store.user_node(BOB)
            assert other is not None and other.name == "Bob"
            # Under agent isolation only the agent's own node counts.
            assert await store.user_node(Scope("alice", agent="helper", agent_isolated=True)) is None
            await backend.add_entity("alice", "Sam (helper)", "user", agent="helper")
            isolated = await store.user_node(Scope("alice", agent="helper", agent_isolated=True))
            assert isolated is not None and isolated.name == "Sam (helper)"

    run(body())


def test_relationships_limit_keeps_the_newest(backend: Backend) -> None:  # noqa: F811
    async def body() -> None:
        async with backend.opened() as store:
            hub = await backend.add_entity("alice", "Hub")
            spokes = [await backend.add_entity("alice", f"Spoke {n}") for n in range(30)]
            for n, spoke in enumerate(spokes):
                outgoing = n % 2 == 0
                await backend.add_edge("alice", hub if outgoing else spoke, "KNOWS", spoke if outgoing else hub,
                                       valid_from=T0 + timedelta(days=n),
                                       invalid_at=T0 if n == 29 else None)
            every = await store.relationships(ALICE, hub)
            assert len(every) == 29
            newest = await store.relationships(ALICE, hub, limit=5)
            assert newest == every[:5]
            assert [e.to_name if e.from_name == "Hub" else e.from_name for e in newest] == [
                f"Spoke {n}" for n in (28, 27, 26, 25, 24)]
            history = await store.relationships(ALICE, hub, current_only=False, limit=2)
            assert [e.invalid_at is not None for e in history] == [True, False]
            assert await store.relationships(ALICE, hub, limit=0) == []
            assert await store.relationships(BOB, hub, limit=5) == []

    run(body())


# --- the read pool ------------------------------------------------------------------------


def test_reads_run_side_by_side_and_stop_at_close(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(str(tmp_path / "m.db"))
        await store.open()
        try:
            await store.apply([said(ALICE, n, f"otter {n}", f"c{n % 4}") for n in range(40)])
            results = await asyncio.gather(*(
                store.search_messages(ALICE, ["otter"], conversation_ids=[f"c{n % 4}"], limit=50)
                for n in range(40)))
            assert all(len(hits) == 10 for hits in results)
            assert await store.ping()
        finally:
            await store.close()
        assert not await store.ping()
        with pytest.raises(StoreError):
            await store.search_messages(ALICE, ["otter"])

    run(body())


def test_a_failing_read_is_a_store_error(tmp_path: Path) -> None:
    async def body() -> None:
        async with SQLiteStoreOpened(tmp_path / "m.db") as store:
            with pytest.raises(StoreError, match="no such table"):
                await store._rows("SELECT * FROM nowhere", [])
            assert await store.ping()  # the connection is still usable

    run(body())


def test_conversation_ids_are_data(tmp_path: Path) -> None:
    """Conversation ids are data, never SQL: quotes and brackets are matched as text."""

    async def body() -> None:
        odd = "c'); DROP TABLE messages; --[\"]"
        async with SQLiteStoreOpened(tmp_path / "m.db") as store:
            await store.apply([said(ALICE, 1, "heron sighting", odd), said(ALICE, 2, "heron again", "plain")])
            hits = await store.search_messages(ALICE, ["heron"], conversation_ids=[odd])
            assert [m.conversation_id for m, _ in hits] == [odd]

    run(body())


class CountingReads(SQLiteStore):
    """The real store, counting the reads it hands to its reader threads (not the event loop's lookups)."""

    reads = 0

    async def _read(self, work: Any, *, here: bool = False) -> Any:
        self.reads += not here
        return await super()._read(work, here=here)


def test_a_store_without_traces_answers_reasoning_searches_without_reading_until_one_is_saved(tmp_path: Path) -> None:
    steps = (ReasoningStep("deploy", '{"env": "staging"}', "ok"),)

    async def body() -> None:
        store = CountingReads(str(tmp_path / "m.db"))
        await store.open()
        try:
            assert await store.search_reasoning(ALICE, ["deploy"]) == []
            reads = store.reads
            assert await store.search_reasoning(ALICE, ["deploy"]) == []
            assert store.reads == reads  # no traces: one indexed lookup on the loop, no reader thread
            await store.apply([StartTurn(ALICE, "t1", "c1", "h1", T0, "deploy it"),
                               FinishTurn(ALICE, "t1", "c1", "deployed", T0, task="deploy it", steps=steps)])
            found = await store.search_reasoning(ALICE, ["deploy"])  # at once, not after the recheck
            assert [trace.task for trace, _ in found] == ["deploy it"]
            assert store.reads == reads + 1
        finally:
            await store.close()

    run(body())


def test_imported_traces_are_searched_at_once(tmp_path: Path) -> None:
    async def body() -> None:
        async with SQLiteStoreOpened(tmp_path / "m.db") as store:
            assert await store.search_reasoning(ALICE, ["deploy"]) == []
            record = {"kind": "reasoning", "id": "r1", "conversation_id": "c1", "task": "deploy the api",
                      "steps": [{"name": "deploy", "arguments": "{}", "result": "ok"}], "answer": "done",
                      "created_at": T0.isoformat()}
            await store.import_records(ALICE, [parse_record(record, "line 1")])  # as the memory API checks it
            found = await store.search_reasoning(ALICE, ["deploy"])
            assert [trace.task for trace, _ in found] == ["deploy the api"]

    run(body())
