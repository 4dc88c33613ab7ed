"""SQLiteStore against real SQLite files: idempotent writes, lookups, scopes, search, export, faults."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager, closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proxy.models import ReasoningStep, Scope
from proxy.stores.base import (
    FinishTurn,
    RecordToolCalls,
    SaveBlock,
    SetTurnStatus,
    StartTurn,
    StoreError,
    WriteOp,
    text_hash,
)
from proxy.stores.sqlite import SQLiteStore
from proxy.stores.sqlite_rows import entity_terms
from proxy.stores.sqlite_schema import FTS_TABLES, MIGRATIONS
from proxy.terms import query_terms

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ALICE = Scope("alice")
BOB = Scope("bob")
CANARY = "zebracanary"


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


@asynccontextmanager
async def opened(path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(str(path))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def start(scope: Scope, key: str, text: str | None = "hello", *, conv: str = "c1", at: datetime = T0,
          history: str | None = None, persist: bool = True) -> StartTurn:
    return StartTurn(scope, key, conv, history or f"h-{key}", at, text, persist)


def finish(scope: Scope, key: str, answer: str, *, conv: str = "c1", at: datetime = T0,
           task: str = "", steps: tuple[ReasoningStep, ...] = ()) -> FinishTurn:
    return FinishTurn(scope, key, conv, answer, at + timedelta(seconds=1), task, steps)


def sql(path: Path, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("PRAGMA foreign_keys=ON")
        return db.execute(query, params).fetchall()


def add_entity(path: Path, user: str, name: str, type_: str = "", description: str = "",
               agent: str | None = None) -> str:
    """An entity written as the extraction work will write it (no write op exists yet)."""
    eid = uuid.uuid4().hex
    sql(path, "INSERT INTO users (id, created_at) VALUES (?, 0) ON CONFLICT DO NOTHING", (user,))
    sql(path, "INSERT INTO entities (id, user_id, agent_id, name, canonical_name, type, description, name_terms,"
              " type_terms, description_terms, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0)",
        (eid, user, agent, name, " ".join(name.lower().split()), type_, description,
         *entity_terms(name, type_, description)))
    return eid


def add_edge(path: Path, user: str, from_id: str, type_: str, to_id: str, *, invalid_at: float | None = None) -> str:
    rid = uuid.uuid4().hex
    sql(path, "INSERT INTO relationships (id, user_id, from_id, type, to_id, valid_from, invalid_at, created_at)"
              " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (rid, user, from_id, type_, to_id, T0.timestamp(), invalid_at, 0))
    return rid


# --- writes ----------------------------------------------------------------------------


def test_start_and_finish_are_idempotent(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            ops: list[WriteOp] = [start(ALICE, "t1", "where is the office?"), finish(ALICE, "t1", "On Main Street.")]
            await store.apply(ops)
            await store.apply(ops)
            await store.apply(ops + ops)
            msgs = await store.messages(ALICE, "c1")
            assert [(m.role, m.content) for m in msgs] == [("user", "where is the office?"),
                                                           ("assistant", "On Main Street.")]
            assert msgs[0].created_at == T0 and msgs[0].created_at.tzinfo is not None
            turn = await store.turn(ALICE, "t1")
            assert turn is not None and turn.status == "complete" and turn.conversation_id == "c1"

    run(body())
    assert sql(tmp_path / "m.db", "SELECT count(*) FROM extraction_queue") == [(2,)]


def test_regenerated_answer_is_saved_beside_the_first(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            await store.apply([start(ALICE, "t1"), finish(ALICE, "t1", "first answer")])
            await store.apply([finish(ALICE, "t1", "second answer")])
            await store.apply([finish(ALICE, "t1", "first answer")])
            msgs = await store.messages(ALICE, "c1")
            assert [m.content for m in msgs] == ["hello", "first answer", "second answer"]

    run(body())


def test_persist_off_and_missing_text_save_no_message(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            await store.apply([start(ALICE, "t1", "secret plan", persist=False), start(ALICE, "t2", None)])
            assert await store.messages(ALICE, "c1") == []
            assert (await store.turn(ALICE, "t1")) is not None
            assert (await store.turn(ALICE, "t2")) is not None

    run(body())


def test_turn_status_never_leaves_complete(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            await store.apply([start(ALICE, "t1"), SetTurnStatus(ALICE, "t1", "upstream_failed", T0)])
            assert (await store.turn(ALICE, "t1")).status == "upstream_failed"  # type: ignore[union-attr]
            await store.apply([finish(ALICE, "t1", "done"), SetTurnStatus(ALICE, "t1", "client_aborted", T0)])
            assert (await store.turn(ALICE, "t1")).status == "complete"  # type: ignore[union-attr]

    run(body())


def test_finish_without_start_still_saves_the_answer(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            await store.apply([finish(ALICE, "lost", "an answer")])
            assert [m.content for m in await store.messages(ALICE, "c1")] == ["an answer"]
            assert (await store.turn(ALICE, "lost")).status == "complete"  # type: ignore[union-attr]

    run(body())


def test_reasoning_trace_saved_once_per_turn(tmp_path: Path) -> None:
    steps = (ReasoningStep("get_weather", '{"city": "Oslo"}', "rain"),)
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            await store.apply([start(ALICE, "t1", "weather in Oslo?"),
                               finish(ALICE, "t1", "It rains.", task="weather in Oslo?", steps=steps)])
            await store.apply([finish(ALICE, "t1", "It rains a lot.", task="weather in Oslo?", steps=steps)])
            await store.apply([start(ALICE, "t2"), finish(ALICE, "t2", "no tools here")])
            traces = await store.reasoning(ALICE)
            assert len(traces) == 1
            assert traces[0].steps == steps and traces[0].answer == "It rains." and traces[0].conversation_id == "c1"

    run(body())


def test_save_block_first_wins_and_log_keeps_last_20(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            await store.apply([start(ALICE, "t1"), SaveBlock(ALICE, "t1", "block one", 2, {"hits": 2}, T0)])
            await store.apply([SaveBlock(ALICE, "t1", "block two", 5, {"hits": 5}, T0)])
            turn = await store.turn(ALICE, "t1")
            assert turn is not None and (turn.block, turn.injected) == ("block one", 2)
            await store.apply([SaveBlock(ALICE, "unknown", "b", 1)])  # no turn: nothing to cache, no error
            for i in range(25):
                await store.apply([start(ALICE, f"u{i}"), SaveBlock(ALICE, f"u{i}", f"b{i}", 1, {"i": i})])

    run(body())
    path = tmp_path / "m.db"
    assert sql(path, "SELECT log FROM injections WHERE turn_key = 't1'") == []  # trimmed away
    assert sql(path, "SELECT count(*), min(turn_key) FROM injections WHERE user_id = 'alice'") == [(20, "u10")]


def test_lone_surrogate_text_is_stored(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            await store.apply([start(ALICE, "t1", "bad \ud800 text")])
            assert [m.content for m in await store.messages(ALICE, "c1")] == ["bad \ufffd text"]

    run(body())


def test_giant_message_is_saved_whole_and_indexed_in_part(tmp_path: Path) -> None:
    giant = "opening " + "word " * 1_000_000 + "closing"

    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            await store.apply([start(ALICE, "t1", giant)])
            assert (await store.messages(ALICE, "c1"))[0].content == giant
            assert await store.search_messages(ALICE, ["open"])
            assert await store.search_messages(ALICE, ["close"]) == []  # past INDEX_MAX_CHARS

    run(body())


# --- lookups ---------------------------------------------------------------------------


def test_tool_call_lookup(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            calls = (("call_1", "search", "{}"), ("call_2", "fetch", "{}"))
            await store.apply([start(ALICE, "t1"), RecordToolCalls(ALICE, "t1", calls, T0)])
            await store.apply([RecordToolCalls(ALICE, "no-such-turn", (("call_9", "x", "{}"),), T0)])
            turn = await store.turn_by_tool_calls(ALICE, ["call_unknown", "call_2"])
            assert turn is not None and turn.key == "t1"
            assert await store.turn_by_tool_calls(ALICE, ["call_9"]) is None
            assert await store.turn_by_tool_calls(ALICE, []) is None
            assert await store.turn_by_tool_calls(BOB, ["call_1"]) is None

    run(body())


def test_history_lookup_respects_since(tmp_path: Path) -> None:
    later = T0 + timedelta(minutes=5)

    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            await store.apply([start(ALICE, "t1", history="H"), start(ALICE, "t2", history="H", at=later)])
            found = await store.turn_by_history(ALICE, "H", T0 - timedelta(seconds=30))
            assert found is not None and found.key == "t2"  # the latest
            found = await store.turn_by_history(ALICE, "H", later)  # at or after
            assert found is not None and found.key == "t2"
            assert await store.turn_by_history(ALICE, "H", later + timedelta(seconds=1)) is None
            assert await store.turn_by_history(ALICE, "other", T0 - timedelta(days=1)) is None
            assert await store.turn_by_history(BOB, "H", T0 - timedelta(days=1)) is None

    run(body())


def test_conversation_by_assistant_hashes(tmp_path: Path) -> None:
    def at(minutes: int) -> datetime:
        return T0 + timedelta(minutes=minutes)

    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            await store.apply([
                start(ALICE, "t1", conv="c1", at=at(0)), finish(ALICE, "t1", "answer x", conv="c1", at=at(0)),
                start(ALICE, "t2", conv="c2", at=at(10)), finish(ALICE, "t2", "answer y", conv="c2", at=at(10)),
                start(ALICE, "t3", "answer q", conv="c3", at=at(15)),  # a *user* message with that text
            ])
            hx, hy = text_hash("answer x"), text_hash("answer y")
            assert await store.conversation_by_assistant_hashes(ALICE, [hy, hx]) == "c2"
            assert await store.conversation_by_assistant_hashes(ALICE, [text_hash("nope"), hx]) == "c1"
            assert await store.conversation_by_assistant_hashes(ALICE, [text_hash("answer q")]) is None
            assert await store.conversation_by_assistant_hashes(ALICE, []) is None
            # The same text in two conversations: the most recently active one wins.
            await store.apply([
                start(ALICE, "t4", conv="c1", at=at(20)), finish(ALICE, "t4", "Sure.", conv="c1", at=at(20)),
                start(ALICE, "t5", conv="c2", at=at(30)), finish(ALICE, "t5", "Sure.", conv="c2", at=at(30)),
            ])
            assert await store.conversation_by_assistant_hashes(ALICE, [text_hash("Sure.")]) == "c2"
            await store.apply([start(ALICE, "t6", conv="c1", at=at(40))])
            assert await store.conversation_by_assistant_hashes(ALICE, [text_hash("Sure.")]) == "c1"
            # Another user's conversation is never returned, even for the same text.
            assert await store.conversation_by_assistant_hashes(BOB, [hx, hy]) is None

    run(body())


def test_conversation_found_by_the_hash_of_the_text_the_client_received(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            received = "your key is sk-abc123"
            saved = FinishTurn(ALICE, "t1", "c7", "your key is [REDACTED:api_key]", T0, answer_hash=text_hash(received))
            await store.apply([start(ALICE, "t1", conv="c7"), saved, saved])
            assert await store.conversation_by_assistant_hashes(ALICE, [text_hash(received)]) == "c7"
            assert [m.content for m in await store.messages(ALICE, "c7")] == ["hello", "your key is [REDACTED:api_key]"]

    run(body())


def test_latest_and_recent_conversations(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            assert await store.latest_conversation(ALICE) is None
            for i, conv in enumerate(["a", "b", "c", "a"]):
                await store.apply([start(ALICE, f"t{i}", conv=conv, at=T0 + timedelta(minutes=i))])
            assert await store.latest_conversation(ALICE) == "a"
            assert await store.recent_conversations(ALICE, None) == ["a", "c", "b"]
            assert await store.recent_conversations(ALICE, 2) == ["a", "c"]
            assert await store.recent_conversations(ALICE, 0) == []

    run(body())


def test_lists_page_with_cursors(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            for i in range(5):
                at = T0 + timedelta(minutes=i)
                await store.apply([start(ALICE, f"t{i}", f"q{i}", conv=f"c{i}", at=at),
                                   start(ALICE, f"s{i}", f"m{i}", conv="main", at=at)])
            first = await store.messages(ALICE, "main", limit=2)
            rest = await store.messages(ALICE, "main", limit=10, cursor=first[-1].id)
            assert [m.content for m in first + rest] == ["m0", "m1", "m2", "m3", "m4"]
            page = await store.conversations(ALICE, limit=3)
            more = await store.conversations(ALICE, limit=10, cursor=page[-1]["id"])
            assert [c["id"] for c in page + more] == ["main", "c4", "c3", "c2", "c1", "c0"]
            assert page[0]["message_count"] == 5 and page[0]["last_active_at"] == T0 + timedelta(minutes=4)

    run(body())


def test_pending_turns_become_interrupted_at_open(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def first_run() -> None:
        async with opened(path) as store:
            await store.apply([start(ALICE, "t1", "unanswered question"),
                               start(ALICE, "t2"), finish(ALICE, "t2", "ok")])

    async def second_run() -> None:
        async with opened(path) as store:
            assert (await store.turn(ALICE, "t1")).status == "interrupted"  # type: ignore[union-attr]
            assert (await store.turn(ALICE, "t2")).status == "complete"  # type: ignore[union-attr]
            assert "unanswered question" in [m.content for m in await store.messages(ALICE, "c1")]

    run(first_run())
    # A pending turn whose answer was saved finished; only its status was lost.
    sql(path, "UPDATE turns SET status = 'pending' WHERE turn_key = 't2'")
    run(second_run())
    assert sql(path, "SELECT version FROM schema_version") == [(v,) for v in range(1, len(MIGRATIONS) + 1)]


# --- scopes ----------------------------------------------------------------------------


async def everything_visible_to(store: SQLiteStore, scope: Scope, path: Path, ids: dict[str, str]) -> str:
    """Every read and search of `scope`, aimed at the other user's ids, as one string."""
    terms = query_terms(f"{CANARY} hello answer Oslo")
    seen: list[Any] = [
        await store.messages(scope, "c1"),
        await store.conversations(scope),
        await store.reasoning(scope),
        await store.turn(scope, "t1"),
        await store.turn(scope, "t-alice"),
        await store.entities(scope),
        await store.relationships(scope, ids["entity"]),
        await store.relationships(scope, ids["target"], current_only=False),
        await store.search_messages(scope, terms),
        await store.search_messages(scope, terms, conversation_ids=["c1"]),
        await store.search_entities(scope, terms),
        await store.search_reasoning(scope, terms),
        await store.recent_conversations(scope, None),
        await store.latest_conversation(scope),
        await store.turn_by_tool_calls(scope, ["call_alice"]),
        await store.turn_by_history(scope, "h-t-alice", T0 - timedelta(days=1)),
        await store.conversation_by_assistant_hashes(scope, [text_hash(f"answer {CANARY}")]),
        [record async for record in store.export(scope)],
    ]
    return repr(seen)


def test_no_read_returns_another_users_memory(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    steps = (ReasoningStep("lookup", f'{{"q": "{CANARY}"}}', CANARY),)

    async def body() -> None:
        async with opened(path) as store:
            await store.apply([
                start(ALICE, "t-alice", f"hello {CANARY}", conv="c1"),
                RecordToolCalls(ALICE, "t-alice", (("call_alice", "lookup", CANARY),), T0),
                finish(ALICE, "t-alice", f"answer {CANARY}", conv="c1", task=CANARY, steps=steps),
                SaveBlock(ALICE, "t-alice", f"block {CANARY}", 1),
                # Bob uses the same conversation id; it is a different conversation.
                start(BOB, "t1", "hello Oslo", conv="c1"), finish(BOB, "t1", "answer Oslo", conv="c1"),
            ])
            ids = {"entity": add_entity(path, "alice", f"Alice {CANARY}", "person", f"likes {CANARY}")}
            ids["target"] = add_entity(path, "alice", "Acme", "organization", CANARY)
            add_edge(path, "alice", ids["entity"], "WORKS_AT", ids["target"])
            add_entity(path, "bob", "Oslo", "place", "a city")
            seen_by_bob = await everything_visible_to(store, BOB, path, ids)
            assert "Oslo" in seen_by_bob and CANARY not in seen_by_bob
            seen_by_alice = await everything_visible_to(store, ALICE, path, ids)
            assert CANARY in seen_by_alice and "Oslo" not in seen_by_alice

    run(body())


def test_agent_isolation(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    a1, a2 = Scope("alice", agent="a1"), Scope("alice", agent="a2")
    a1_only, a2_only = (Scope("alice", agent=a, agent_isolated=True) for a in ("a1", "a2"))
    step = (ReasoningStep("search", "{}", "found"),)

    async def body() -> None:
        async with opened(path) as store:
            await store.apply([
                start(a1, "t1", "planning the trip", conv="k1"),
                finish(a1, "t1", "booked", conv="k1", task="trip", steps=step),
                start(a2, "t2", "planning the budget", conv="k2", at=T0 + timedelta(minutes=1)),
                finish(a2, "t2", "saved", conv="k2", at=T0 + timedelta(minutes=1), task="budget", steps=step),
            ])
            add_entity(path, "alice", "Trip planner", agent="a1")
            add_entity(path, "alice", "Budget planner", agent="a2")
            plan = query_terms("planning planner")
            # Shared memory: both agents read every source except reasoning, which is per agent.
            assert len(await store.search_messages(a1, plan)) == 2
            assert len(await store.search_entities(a1, plan)) == 2
            assert [t.task for t in await store.reasoning(a1)] == ["trip"]
            assert [t.task for t, _ in await store.search_reasoning(a2, query_terms("budget trip"))] == ["budget"]
            assert {t.task for t in await store.reasoning(ALICE)} == {"trip", "budget"}
            # Isolated: every read is limited to the agent.
            assert [m.content for m, _ in await store.search_messages(a1_only, plan)] == ["planning the trip"]
            assert [e.name for e, _ in await store.search_entities(a1_only, plan)] == ["Trip planner"]
            assert [e.name for e in await store.entities(a2_only)] == ["Budget planner"]
            assert await store.messages(a1_only, "k2") == []
            assert await store.latest_conversation(a1_only) == "k1"
            assert await store.latest_conversation(a1) == "k2"
            assert [c["id"] for c in await store.conversations(a2_only)] == ["k2"]
            assert await store.turn(a1_only, "t2") is None
            assert await store.conversation_by_assistant_hashes(a1_only, [text_hash("saved")]) is None
            exported = repr([r async for r in store.export(a1_only)])
            assert "trip" in exported and "budget" not in exported

    run(body())


# --- search ----------------------------------------------------------------------------


def test_search_ranks_the_rare_term_first(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            texts = [f"we talked about the deployment plan, part {i}" for i in range(8)]
            texts.insert(3, "the deployment of the quokka service is on Friday")
            await store.apply([start(ALICE, f"t{i}", text) for i, text in enumerate(texts)])
            hits = await store.search_messages(ALICE, query_terms("when is the quokka deployment?"))
            assert "quokka" in hits[0][0].content
            assert len(hits) == 9
            scores = [score for _, score in hits]
            assert scores == sorted(scores, reverse=True) and scores[0] > scores[1] > 0
            assert await store.search_messages(ALICE, query_terms("the and of")) == []
            assert await store.search_messages(ALICE, ['"', "or", "NEAR"]) == []

    run(body())


def test_identifier_found_whole_and_by_part(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            await store.apply([start(ALICE, "t1", "the staging host is internal-hbr-2291.example"),
                               start(ALICE, "t2", "the production host is internal-prod.example"),
                               start(ALICE, "t3", "nothing to see")])
            for query in (query_terms("internal-hbr-2291.example"), ["internal_hbr_2291_example"], ["hbr"]):
                hits = await store.search_messages(ALICE, query)
                assert hits and "internal-hbr-2291.example" in hits[0][0].content, query
            assert len(await store.search_messages(ALICE, ["internal_hbr_2291_example"])) == 1

    run(body())


def test_search_messages_by_conversation(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            await store.apply([start(ALICE, f"t{c}", f"notes about penguins in {c}", conv=c) for c in "abc"])
            terms = query_terms("penguins")

            async def convs(**kwargs: Any) -> set[str]:
                return {m.conversation_id for m, _ in await store.search_messages(ALICE, terms, **kwargs)}

            assert await convs() == {"a", "b", "c"}
            assert await convs(conversation_ids=["a", "c"]) == {"a", "c"}
            assert await convs(conversation_ids=[]) == set()
            assert await convs(exclude_conversation_id="b") == {"a", "c"}
            assert await convs(limit=1) == {"c"}  # equal scores: newest first

    run(body())


def test_search_entities_and_reasoning(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> None:
        async with opened(path) as store:
            add_entity(path, "alice", "Acme Corp", "organization", "the company Alice works at")
            add_entity(path, "alice", "Berlin", "place", "where Acme has an office")
            add_entity(path, "alice", "Go", "language", "preferred language")
            hits = await store.search_entities(ALICE, query_terms("what does Acme do?"))
            assert [e.name for e, _ in hits] == ["Acme Corp", "Berlin"]  # the name match ranks first
            steps = (ReasoningStep("run_sql", "SELECT * FROM invoices", "42 rows"),)
            await store.apply([start(ALICE, "t1"), finish(ALICE, "t1", "There are 42.", task="count invoices",
                                                          steps=steps)])
            traces = await store.search_reasoning(ALICE, query_terms("invoices run_sql"))
            assert [t.task for t, _ in traces] == ["count invoices"]
            assert traces[0][0].steps == steps

    run(body())


# --- export ----------------------------------------------------------------------------


def test_export_shapes(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    steps = (ReasoningStep("lookup", "{}", "ok"),)

    async def body() -> list[dict[str, Any]]:
        async with opened(path) as store:
            await store.apply([start(ALICE, "t1", "I work at Acme"),
                               finish(ALICE, "t1", "Noted.", task="remember", steps=steps)])
            alice = add_entity(path, "alice", "Alice", "person", "the user")
            acme = add_entity(path, "alice", "Acme", "organization")
            add_edge(path, "alice", alice, "WORKS_AT", acme)
            return [record async for record in store.export(ALICE)]

    records = run(body())
    assert [r["kind"] for r in records] == ["conversation", "message", "message", "entity", "entity",
                                            "relationship", "reasoning"]
    conversation, user_msg, _, _, _, edge, trace = records
    entity = next(r for r in records if r["kind"] == "entity" and r["name"] == "Alice")
    assert conversation == {"kind": "conversation", "id": "c1", "created_at": "2026-11-02T10:00:00+00:00",
                            "last_active_at": "2026-11-02T10:00:01+00:00"}
    assert {k: user_msg[k] for k in ("conversation_id", "role", "content", "created_at")} == {
        "conversation_id": "c1", "role": "user", "content": "I work at Acme", "created_at": "2026-11-02T10:00:00+00:00"}
    assert set(entity) >= {"kind", "id", "name", "type", "description", "memory_type", "confidence", "tags",
                           "aliases", "provenance"}
    assert (entity["name"], entity["tags"], entity["confidence"]) == ("Alice", [], 0.7)
    assert {k: edge[k] for k in ("from", "type", "to", "from_id", "to_id", "invalid_at")} == {
        "from": "Alice", "type": "WORKS_AT", "to": "Acme", "from_id": alice_id(records), "to_id": acme_id(records),
        "invalid_at": None}
    assert datetime.fromisoformat(edge["valid_from"]) == T0
    assert trace["steps"] == [{"name": "lookup", "arguments": "{}", "result": "ok"}]
    assert (trace["conversation_id"], trace["task"], trace["answer"]) == ("c1", "remember", "Noted.")


def test_export_pages_through_a_large_user(tmp_path: Path) -> None:
    async def body() -> list[dict[str, Any]]:
        async with opened(tmp_path / "m.db") as store:
            await store.apply([start(ALICE, f"t{i}", f"message {i}", conv=f"c{i % 3}", at=T0 + timedelta(seconds=i))
                               for i in range(1200)])
            await store.apply([start(BOB, "t1", "not alice's")])
            return [record async for record in store.export(ALICE)]

    records = run(body())
    messages = [r for r in records if r["kind"] == "message"]
    assert [r["id"] for r in records if r["kind"] == "conversation"] == ["c0", "c1", "c2"]
    assert len(messages) == 1200 and len({m["id"] for m in messages}) == 1200
    assert [m["content"] for m in messages[:2]] == ["message 0", "message 3"]  # by conversation, then time
    assert messages[400]["content"] == "message 1"


def alice_id(records: list[dict[str, Any]]) -> str:
    return str(next(r["id"] for r in records if r["kind"] == "entity" and r["name"] == "Alice"))


def acme_id(records: list[dict[str, Any]]) -> str:
    return str(next(r["id"] for r in records if r["kind"] == "entity" and r["name"] == "Acme"))


def test_relationships_current_and_history(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> None:
        async with opened(path) as store:
            alice, acme, globex = (add_entity(path, "alice", n) for n in ("Alice", "Acme", "Globex"))
            add_edge(path, "alice", alice, "WORKS_AT", globex, invalid_at=T0.timestamp() + 60)
            add_edge(path, "alice", alice, "WORKS_AT", acme)
            current = await store.relationships(ALICE, alice)
            assert [(r.from_name, r.type, r.to_name) for r in current] == [("Alice", "WORKS_AT", "Acme")]
            every = await store.relationships(ALICE, alice, current_only=False)
            assert {r.to_name for r in every} == {"Acme", "Globex"}
            old = next(r for r in every if r.to_name == "Globex")
            assert old.invalid_at == T0 + timedelta(seconds=60) and old.valid_from == T0
            assert [r.from_name for r in await store.relationships(ALICE, acme)] == ["Alice"]  # edges *to* it too

    run(body())


# --- faults, recovery, scale ---------------------------------------------------------------


def test_failing_batch_raises_and_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    carol = Scope("carol")

    async def body() -> None:
        async with opened(path) as store:
            sql(path, "CREATE TRIGGER fault BEFORE INSERT ON messages WHEN new.content = 'boom'"
                      " BEGIN SELECT RAISE(ABORT, 'injected failure'); END")
            with pytest.raises(StoreError, match="injected failure"):
                await store.apply([start(carol, "t1", "fine"), finish(carol, "t1", "fine too"),
                                   start(carol, "t2", "boom", conv="c2")])
            assert await store.recent_conversations(carol, None) == []
            assert await store.turn(carol, "t1") is None
            await store.apply([start(carol, "t1", "fine")])  # the connection is usable again
            assert [m.content for m in await store.messages(carol, "c1")] == ["fine"]

    run(body())
    assert sql(path, "SELECT count(*) FROM users WHERE id = 'carol'") == [(1,)]
    assert sql(path, "PRAGMA integrity_check") == [("ok",)]


def test_closed_store_raises_store_error(tmp_path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(str(tmp_path / "m.db"))
        with pytest.raises(StoreError):
            await store.apply([start(ALICE, "t1")])
        with pytest.raises(StoreError):
            await store.messages(ALICE, "c1")
        assert await store.ping() is False
        await store.open()
        assert await store.ping() is True
        await store.close()
        assert await store.ping() is False

    run(body())


def test_open_fails_with_store_error(tmp_path: Path) -> None:
    async def body() -> None:
        with pytest.raises(StoreError, match="cannot open"):
            await SQLiteStore(str(tmp_path / "missing-dir" / "m.db")).open()

    run(body())
    with pytest.raises(ValueError, match="synchronous"):
        SQLiteStore(str(tmp_path / "m.db"), synchronous="sometimes")


def test_apply_waits_for_a_lock_held_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> None:
        async with opened(path) as store:
            await store.apply([start(ALICE, "t0")])
            with closing(sqlite3.connect(path, isolation_level=None)) as blocker:
                blocker.execute("BEGIN EXCLUSIVE")
                began = time.monotonic()
                task = asyncio.create_task(store.apply([start(ALICE, "t1", "written after the lock")]))
                await asyncio.sleep(0.4)
                assert not task.done()
                assert await store.turn(ALICE, "t0") is not None  # WAL: reads go on meanwhile
                blocker.execute("COMMIT")
            await asyncio.wait_for(task, timeout=2)
            assert 0.4 <= time.monotonic() - began < 2.5
            assert "written after the lock" in [m.content for m in await store.messages(ALICE, "c1")]

    run(body())


def test_cancelled_batch_leaves_the_connection_usable(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            ops = [start(ALICE, f"t{i}", f"text {i}") for i in range(500)]
            task = asyncio.create_task(store.apply(ops))
            await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await store.apply([start(BOB, "t1", "after the cancel")])
            assert [m.content for m in await store.messages(BOB, "c1")] == ["after the cancel"]
            assert len(await store.messages(ALICE, "c1", limit=1000)) in (0, 500)  # all or nothing

    run(body())


def test_a_thousand_start_turns_in_one_batch(tmp_path: Path) -> None:
    async def body() -> None:
        async with opened(tmp_path / "m.db") as store:
            ops = [start(Scope(f"user{i % 10}"), f"t{i}", f"message number {i}", conv=f"c{i % 37}",
                         at=T0 + timedelta(seconds=i)) for i in range(1000)]
            await store.apply(ops)
            assert len(await store.messages(Scope("user3"), "c3", limit=1000)) == 3
            hits = await store.search_messages(Scope("user7"), query_terms("number 997"))
            assert hits[0][0].content == "message number 997"

    run(body())


def test_user_delete_cascades_and_optimize_drops_the_tokens(tmp_path: Path) -> None:
    """What the later delete-user work relies on: FK cascades fire the FTS triggers."""
    path = tmp_path / "m.db"
    token = f"{CANARY}uniquetoken"

    async def body() -> None:
        async with opened(path) as store:
            steps = (ReasoningStep("t", "{}", token),)
            await store.apply([start(ALICE, "t1", f"hello {token}"),
                               RecordToolCalls(ALICE, "t1", (("c", "n", "a"),), T0),
                               finish(ALICE, "t1", token, task=token, steps=steps),
                               SaveBlock(ALICE, "t1", token, 1),
                               start(BOB, "t1", "bob stays")])
            add_entity(path, "alice", token, "thing", token)
            assert await store.search_messages(ALICE, [token])

    run(body())
    assert index_holds(path, token)
    sql(path, "DELETE FROM users WHERE id = 'alice'")
    for fts in FTS_TABLES:
        sql(path, f"INSERT INTO {fts}({fts}) VALUES ('optimize')")
    assert not index_holds(path, token)
    tables = [name for (name,) in sql(path, "SELECT name FROM sqlite_master WHERE type = 'table'"
                                            " AND sql LIKE '%user_id%' AND name NOT LIKE '%fts%'")]
    for table in tables:
        assert sql(path, f"SELECT count(*) FROM {table} WHERE user_id = 'alice'") == [(0,)], table
    assert sql(path, "SELECT count(*) FROM messages WHERE user_id = 'bob'") == [(1,)]


def index_holds(path: Path, token: str) -> bool:
    needle = token.encode()
    return any(sql(path, f"SELECT count(*) FROM {fts}_data WHERE instr(block, ?) > 0", (needle,))[0][0]
               for fts in FTS_TABLES)
