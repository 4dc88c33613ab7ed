"""The Store contract, run against both backends: a real SQLite file and a real PostgreSQL.

Every test here takes `backend` and runs once per backend with the same assertions: the
behaviour memory relies on is the same on both. Backend-specific checks (SQLite's locks
and FTS tombstones; PostgreSQL's advisory locks, recovery beside live replicas, outages)
live in test_store_sqlite.py and test_store_postgres.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Coroutine
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from proxy.models import ReasoningStep, Scope, Turn
from proxy.stores.base import (
    FinishTurn,
    RecordResponse,
    RecordToolCalls,
    SaveBlock,
    SetTurnStatus,
    StartTurn,
    Store,
    StoreError,
    StoreMemory,
    WriteOp,
    text_hash,
)
from proxy.stores.generations import Generation
from proxy.terms import query_terms
from tests.store_backends import Backend, SQLiteBackend, backend  # noqa: F401  (the fixture)
from tests.test_store_search import common_world, said

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ALICE = Scope("alice")
BOB = Scope("bob")
CANARY = "zebracanary"
STEP = (ReasoningStep("lookup", "{}", "ok"),)


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def start(scope: Scope, key: str, text: str | None = "hello", *, conv: str = "c1", at: datetime = T0,
          history: str | None = None, persist: bool = True) -> StartTurn:
    return StartTurn(scope, key, conv, history or f"h-{key}", at, text, persist)


def finish(scope: Scope, key: str, answer: str, *, conv: str = "c1", at: datetime = T0,
           task: str = "", steps: tuple[ReasoningStep, ...] = ()) -> FinishTurn:
    return FinishTurn(scope, key, conv, answer, at + timedelta(seconds=1), task, steps)


async def by_calls(store: Store, scope: Scope, call_ids: list[str]) -> Turn | None:
    """The turn `find_turn` finds by tool-call ids alone (no history matches)."""
    return (await store.find_turn(scope, call_ids, "no such history", T0 + timedelta(days=3650))).turn


async def by_history(store: Store, scope: Scope, history_hash: str, since: datetime) -> Turn | None:
    """The turn `find_turn` finds by history alone (no tool-call ids)."""
    return (await store.find_turn(scope, [], history_hash, since)).turn


# --- writes ----------------------------------------------------------------------------


def test_start_and_finish_are_idempotent(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
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
        assert await backend.sql("SELECT count(*) FROM extraction_queue") == [(2,)]

    run(body())


def test_a_message_of_a_role_not_mined_is_saved_and_not_queued(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([replace(start(ALICE, "t1", "where is the office?"), queued=False),
                               replace(finish(ALICE, "t1", "On Main Street."), queued=False),
                               start(ALICE, "t2", "and the car park?"), finish(ALICE, "t2", "Behind it.")])
            assert sorted(m.content for m in await store.messages(ALICE, "c1")) == [
                "Behind it.", "On Main Street.", "and the car park?", "where is the office?"]
        assert await backend.sql("SELECT m.content FROM extraction_queue q JOIN messages m ON m.user_id = q.user_id"
                                 " AND m.id = q.message_id ORDER BY m.content") == [("Behind it.",),
                                                                                      ("and the car park?",)]

    run(body())


def test_a_pasted_blob_is_saved_and_found_on_both_backends(backend: Backend) -> None:
    # One token of 6,400 characters (a pasted hash dump): PostgreSQL's postings index once took
    # it whole, refused the row (SQLSTATE 54000), and the writer retried that batch forever.
    blob = "".join(hashlib.sha256(str(n).encode()).hexdigest() for n in range(100))  # incompressible

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1", f"here is the key file {blob} keep it"),
                               finish(ALICE, "t1", f"noted {blob[:3000]}/{blob[:3000]}")])
            await store.apply([start(ALICE, "t2", "and the weather today?", at=T0 + timedelta(minutes=1))])
            assert [m.role for m in await store.messages(ALICE, "c1")] == ["user", "assistant", "user"]
            hits = await store.search_messages(ALICE, query_terms(f"the key file {blob}"), limit=5)
            assert [m.content[:20] for m, _ in hits][:1] == ["here is the key file"]

    run(body())


def test_an_identifier_with_a_dotted_capital_i_is_found_on_both_backends(backend: Backend) -> None:
    # "İ" lowers to "i" and a combining dot: PostgreSQL split such a term at the dot and
    # found nothing.
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1", "the ticket is İD42 for the ferry"),
                               start(ALICE, "t2", "an unrelated note about izmir", at=T0 + timedelta(minutes=1))])
            for query in ("what about İD42?", "id42"):
                hits = await store.search_messages(ALICE, query_terms(query), limit=5)
                assert [m.content for m, _ in hits] == ["the ticket is İD42 for the ferry"]

    run(body())


def test_a_message_with_no_words_leaves_no_empty_token_in_the_context_after_it(backend: Backend) -> None:
    # PostgreSQL counted the empty token in each following message's length, and BM25 then
    # ordered those messages unlike SQLite.
    async def body() -> list[tuple[str]]:
        async with backend.opened() as store:
            await store.apply([start(ALICE, f"t{n}", text, at=T0 + timedelta(minutes=n))
                               for n, text in enumerate(["hello world", "\U0001f600\U0001f600", "hello again"])])
            return await backend.sql("SELECT context FROM messages ORDER BY created_at")

    assert run(body()) == [("",), ("hello world",), ("hello world",)]


def test_a_long_merge_key_stored_whole_before_is_re_keyed_and_merges_again(backend: Backend) -> None:
    # Keys past 200 characters became a head and a hash (4742054): an entity stored before
    # with its whole key would never have merged again (found by review). Migration v4 re-keys.
    text = "Alice keeps her notes in a long sentence " * 8  # 328 characters, its own name

    async def body() -> list[tuple[Any, ...]]:
        async with backend.opened() as store:
            await store.apply([StoreMemory(ALICE, "m1", text, "fact", T0, tags=("a",))])
        whole = " ".join(text.split()).casefold()  # the key as memproxy kept it before
        await backend.sql("UPDATE entities SET canonical_name = ? WHERE id = 'm1'", whole)
        await backend.sql("DELETE FROM schema_version WHERE version >= 4")
        async with backend.opened() as store:  # migrates: v4 again (and any later script)
            await store.apply([StoreMemory(ALICE, "m2", text, "fact", T0 + timedelta(minutes=1), tags=("b",))])
        return await backend.sql("SELECT id, tags FROM entities ORDER BY id")

    assert run(body()) == [("m1", '["a", "b"]')]


def test_an_interaction_goes_to_the_conversation_it_names_once_per_id(backend: Backend) -> None:
    async def body() -> list[tuple[Any, ...]]:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1", conv="old")])
            for _ in range(2):  # a retry stores it again under the same id
                op = StoreMemory(ALICE, "m1", "We discussed the dog Biscuit", "interaction", T0, conversation_id="new")
                assert await store.store_memory(op) == "m1"
            op = StoreMemory(ALICE, "m2", "We discussed the cat", "interaction", T0, conversation_id="old")
            await store.store_memory(op)
        return await backend.sql("SELECT id, conversation_id FROM messages WHERE role = 'assistant' ORDER BY id")

    assert run(body()) == [("m1", "new"), ("m2", "old")]


def test_a_memory_merged_many_times_keeps_its_newest_ten_tags(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            for write in range(5):  # the same fact, each time with ten more tags (a memory keeps at most 10)
                tags = tuple(f"tag{write}-{n}" for n in range(10))
                await store.apply([StoreMemory(ALICE, f"m{write}", "Alice likes tea", "fact", T0, tags=tags)])
        rows = await backend.sql("SELECT tags FROM entities")
        assert len(rows) == 1 and json.loads(rows[0][0]) == [f"tag4-{n}" for n in range(10)]

    run(body())


def test_a_corrected_or_deleted_message_leaves_no_words_in_what_follows_it(backend: Backend) -> None:
    # Each message's index holds the words of the two said before it (its context): a correction
    # or a delete must take the old words out of those too.
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1", "my locker combination is quokka77"),
                               finish(ALICE, "t1", "Noted."),
                               start(ALICE, "t2", "and my desk is 4B", at=T0 + timedelta(minutes=1)),
                               finish(ALICE, "t2", "Noted too.", at=T0 + timedelta(minutes=1))])
            ids = {m.content: m.id for m in await store.messages(ALICE, "c1")}

            async def contexts() -> list[str]:
                rows = await backend.sql("SELECT context FROM messages ORDER BY created_at, seq")
                return [row[0] for row in rows]

            assert sum("quokka77" in c for c in await contexts()) == 2  # the two said after it
            assert await store.update_memory(ALICE, ids["my locker combination is quokka77"],
                                             "my locker combination is private") == "message"
            after_correction = await contexts()
            assert not any("quokka77" in c for c in after_correction)
            assert sum("privat" in c for c in after_correction) == 2
            assert await store.delete_item(ALICE, "message", ids["my locker combination is quokka77"]) is not None
            assert not any("privat" in c for c in await contexts())
            hits = await store.search_messages(ALICE, query_terms("locker combination noted"), limit=5)
            assert {m.content for m, _ in hits} <= {"Noted.", "Noted too."}

    run(body())


def test_a_turn_stays_in_the_conversation_it_began_in(backend: Backend) -> None:
    # A later write naming another conversation (a step identified while the store could not
    # be asked) goes to the turn's own: no message lands elsewhere, no empty conversation appears.
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1", "where is the office?", conv="c1")])
            await store.apply([start(ALICE, "t1", "where is the office?", conv="guessed"),
                               finish(ALICE, "t1", "On Main Street.", conv="guessed", task="find it",
                                      steps=(ReasoningStep("lookup", "{}", "Main St"),))])
            assert [(m.role, m.content) for m in await store.messages(ALICE, "c1")] == [
                ("user", "where is the office?"), ("assistant", "On Main Street.")]
        assert await backend.sql("SELECT id FROM conversations") == [("c1",)]
        assert await backend.sql("SELECT conversation_id FROM reasoning") == [("c1",)]

    run(body())


@pytest.mark.parametrize("question, found", [
    ("Где мой сервер?", "Мой сервер находится в Берлине"),
    ("北京怎么样?", "我住在北京，工作也在这里"),
    ("what about the café?", "The café on Rue Cler opens at seven"),
])
def test_words_of_any_script_are_found(backend: Backend, question: str, found: str) -> None:
    # Terms were ASCII only: Cyrillic or Chinese text was never found, and "café" was "caf".
    said = ["Мой сервер находится в Берлине", "我住在北京，工作也在这里", "The café on Rue Cler opens at seven",
            "Nothing else to say here"]

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, f"t{n}", text, conv=f"c{n}", at=T0 + timedelta(minutes=n))
                               for n, text in enumerate(said)])
            hits = await store.search_messages(ALICE, query_terms(question), limit=5)
            assert [m.content for m, _ in hits][:1] == [found]

    run(body())


def test_regenerated_answer_is_saved_beside_the_first(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1"), finish(ALICE, "t1", "first answer")])
            await store.apply([finish(ALICE, "t1", "second answer")])
            await store.apply([finish(ALICE, "t1", "first answer")])
            msgs = await store.messages(ALICE, "c1")
            assert [m.content for m in msgs] == ["hello", "first answer", "second answer"]

    run(body())


def test_persist_off_and_missing_text_save_no_message(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1", "secret plan", persist=False), start(ALICE, "t2", None)])
            assert await store.messages(ALICE, "c1") == []
            assert (await store.turn(ALICE, "t1")) is not None
            assert (await store.turn(ALICE, "t2")) is not None

    run(body())


def test_turn_status_never_leaves_complete(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1"), SetTurnStatus(ALICE, "t1", "upstream_failed", T0)])
            assert (await store.turn(ALICE, "t1")).status == "upstream_failed"  # type: ignore[union-attr]
            await store.apply([finish(ALICE, "t1", "done"), SetTurnStatus(ALICE, "t1", "client_aborted", T0)])
            assert (await store.turn(ALICE, "t1")).status == "complete"  # type: ignore[union-attr]

    run(body())


def test_finish_without_start_still_saves_the_answer(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([finish(ALICE, "lost", "an answer")])
            assert [m.content for m in await store.messages(ALICE, "c1")] == ["an answer"]
            assert (await store.turn(ALICE, "lost")).status == "complete"  # type: ignore[union-attr]

    run(body())


def test_reasoning_trace_saved_once_per_turn(backend: Backend) -> None:
    steps = (ReasoningStep("get_weather", '{"city": "Oslo"}', "rain"),)

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1", "weather in Oslo?"),
                               finish(ALICE, "t1", "It rains.", task="weather in Oslo?", steps=steps)])
            await store.apply([finish(ALICE, "t1", "It rains a lot.", task="weather in Oslo?", steps=steps)])
            await store.apply([start(ALICE, "t2"), finish(ALICE, "t2", "no tools here")])
            traces = await store.reasoning(ALICE)
            assert len(traces) == 1
            assert traces[0].steps == steps and traces[0].answer == "It rains." and traces[0].conversation_id == "c1"

    run(body())


def test_save_block_first_wins_and_log_keeps_last_20(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1"), SaveBlock(ALICE, "t1", "block one", 2, {"hits": 2}, T0)])
            await store.apply([SaveBlock(ALICE, "t1", "block two", 5, {"hits": 5}, T0)])
            turn = await store.turn(ALICE, "t1")
            assert turn is not None and (turn.block, turn.injected) == ("block one", 2)
            await store.apply([SaveBlock(ALICE, "unknown", "b", 1)])  # no turn: nothing to cache, no error
            for i in range(25):
                await store.apply([start(ALICE, f"u{i}"), SaveBlock(ALICE, f"u{i}", f"b{i}", 1, {"i": i})])
        assert await backend.sql("SELECT log FROM injections WHERE turn_key = 't1'") == []  # trimmed away
        assert await backend.sql("SELECT count(*), min(turn_key) FROM injections WHERE user_id = 'alice'") == [
            (20, "u10")]

    run(body())


def test_lone_surrogate_text_is_stored(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1", "bad \ud800 text")])
            assert [m.content for m in await store.messages(ALICE, "c1")] == ["bad \ufffd text"]

    run(body())


def test_giant_message_is_saved_whole_and_indexed_in_part(backend: Backend) -> None:
    giant = "opening " + "word " * 1_000_000 + "closing"

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1", giant)])
            assert (await store.messages(ALICE, "c1"))[0].content == giant
            assert await store.search_messages(ALICE, ["open"])
            assert await store.search_messages(ALICE, ["close"]) == []  # past INDEX_MAX_CHARS

    run(body())


# --- lookups ---------------------------------------------------------------------------


def test_tool_call_lookup(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            calls = (("call_1", "search", "{}"), ("call_2", "fetch", "{}"))
            await store.apply([start(ALICE, "t1"), RecordToolCalls(ALICE, "t1", calls, T0)])
            await store.apply([RecordToolCalls(ALICE, "t1", calls, T0)])  # a retried step
            await store.apply([RecordToolCalls(ALICE, "no-such-turn", (("call_9", "x", "{}"),), T0)])
            turn = await by_calls(store, ALICE, ["call_unknown", "call_2"])
            assert turn is not None and turn.key == "t1"
            assert await by_calls(store, ALICE, ["call_9"]) is None
            assert await by_calls(store, ALICE, []) is None
            assert await by_calls(store, BOB, ["call_1"]) is None
        assert await backend.sql("SELECT count(*) FROM turn_tool_calls") == [(2,)]

    run(body())


def test_memory_exchanges_are_kept_with_their_step_s_calls(backend: Backend) -> None:
    exchange = '[{"role":"assistant","content":"é","tool_calls":[]},{"role":"tool","content":"x"}]'

    async def body() -> None:
        async with backend.opened() as store:
            calls = (("call_a", "get_weather", "{}"), ("call_b", "get_time", "{}"))
            await store.apply([start(ALICE, "t1"), RecordToolCalls(ALICE, "t1", calls, T0, exchange=exchange),
                               RecordToolCalls(ALICE, "t1", (("call_c", "plain", "{}"),), T0)])
            await store.apply([start(ALICE, "t2")])
            assert await store.memory_exchanges(ALICE, "t1", ["call_b", "call_c", "call_x"]) == {"call_b": exchange}
            assert await store.memory_exchanges(BOB, "t1", ["call_a"]) == {}
            assert await store.memory_exchanges(ALICE, "t1", []) == {}
            # Another turn of the user naming the same id (a provider numbering its calls per
            # response) is not given this turn's exchange.
            assert await store.memory_exchanges(ALICE, "t2", ["call_a", "call_b"]) == {}

    run(body())


def test_a_deletion_drops_the_kept_memory_exchanges(backend: Backend) -> None:
    # An exchange may quote the deleted memory: the loop's next step is not given it back.
    async def body() -> None:
        async with backend.opened() as store:
            calls = (("call_a", "get_weather", "{}"),)
            await store.apply([start(ALICE, "t1"), StoreMemory(ALICE, "m1", "Home is Bergen", "fact", T0),
                               RecordToolCalls(ALICE, "t1", calls, T0, exchange="Home is Bergen"),
                               start(BOB, "t1"), RecordToolCalls(BOB, "t1", calls, T0, exchange="bob's")])
            assert await store.memory_exchanges(ALICE, "t1", ["call_a"]) == {"call_a": "Home is Bergen"}
            assert await store.delete_item(ALICE, "memory", "m1") is not None
            assert await store.memory_exchanges(ALICE, "t1", ["call_a"]) == {}
            assert await store.memory_exchanges(BOB, "t1", ["call_a"]) == {"call_a": "bob's"}  # another user's stay
            turn = await by_calls(store, ALICE, ["call_a"])
            assert turn is not None and turn.key == "t1"  # the step still finds its turn
            # A step that began before the deletion and writes after it keeps its calls, not its exchange.
            began = Generation(0, "c1")
            await store.apply([RecordToolCalls(ALICE, "t1", (("call_b", "x", "{}"),), T0, began, "Home is Bergen")])
            assert await store.memory_exchanges(ALICE, "t1", ["call_a", "call_b"]) == {}
            turn = await by_calls(store, ALICE, ["call_b"])
            assert turn is not None and turn.key == "t1"
            later = Generation(1, "c1")
            await store.apply([RecordToolCalls(ALICE, "t1", (("call_c", "x", "{}"),), T0, later, "kept")])
            assert await store.memory_exchanges(ALICE, "t1", ["call_c"]) == {"call_c": "kept"}

    run(body())


def test_a_call_id_another_turn_reuses_keeps_each_turn_s_row(backend: Backend) -> None:
    # A provider numbering its calls per response (`call_0`) reuses ids across the user's turns
    # and conversations: each turn keeps its own row and exchange, and the request finds the
    # turn it continues: the turn of the response it names, else the one of its history, else
    # the newest.
    later = T0 + timedelta(hours=1)

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "k1"),
                               RecordToolCalls(ALICE, "k1", (("call_0", "search", "{}"),), T0, exchange="first's"),
                               RecordResponse(ALICE, "resp_k1", "k1", "c1", None, T0)])
            await store.apply([start(ALICE, "k2", conv="c2", at=later),
                               RecordToolCalls(ALICE, "k2", (("call_0", "fetch", '{"n": 2}'), ("call_0", "fetch", "{}")),
                                               later, exchange="second's")])
            assert key(await by_calls(store, ALICE, ["call_0"])) == "k2"  # no other clue: the newest
            found = await store.find_turn(ALICE, ["call_0"], "h-k1", later)  # k1's history, long ago
            assert key(found.turn) == "k1"
            found = await store.find_turn(ALICE, ["call_0"], "h-k2", later, "resp_k1")
            assert key(found.turn) == "k1"  # the response named wins over the history
            found = await store.find_turn(ALICE, ["call_0"], "h-k2", later, "resp_unknown")
            assert key(found.turn) == "k2"
            assert (await store.find_turn(BOB, ["call_0"], "h-k1", later)).turn is None
            assert await store.memory_exchanges(ALICE, "k1", ["call_0"]) == {"call_0": "first's"}
            assert await store.memory_exchanges(ALICE, "k2", ["call_0"]) == {"call_0": "second's"}
            # A later step of the same turn naming the id again replaces that turn's row alone.
            await store.apply([RecordToolCalls(ALICE, "k1", (("call_0", "lookup", "{}"),), later, exchange="again")])
            assert await store.memory_exchanges(ALICE, "k1", ["call_0"]) == {"call_0": "again"}
            assert await store.memory_exchanges(ALICE, "k2", ["call_0"]) == {"call_0": "second's"}
        assert sorted(await backend.sql("SELECT turn_key, name, arguments FROM turn_tool_calls")) == [
            ("k1", "lookup", "{}"), ("k2", "fetch", "{}")]

    run(body())


def key(turn: Turn | None) -> str | None:
    return None if turn is None else turn.key


def test_history_lookup_respects_since(backend: Backend) -> None:
    later = T0 + timedelta(minutes=5)

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1", history="H"), start(ALICE, "t2", history="H", at=later)])
            found = await by_history(store, ALICE, "H", T0 - timedelta(seconds=30))
            assert found is not None and found.key == "t2"  # the latest
            found = await by_history(store, ALICE, "H", later)  # at or after
            assert found is not None and found.key == "t2"
            assert await by_history(store, ALICE, "H", later + timedelta(seconds=1)) is None
            assert await by_history(store, ALICE, "other", T0 - timedelta(days=1)) is None
            assert await by_history(store, BOB, "H", T0 - timedelta(days=1)) is None

    run(body())


def test_conversation_by_assistant_hashes(backend: Backend) -> None:
    def at(minutes: int) -> datetime:
        return T0 + timedelta(minutes=minutes)

    async def body() -> None:
        async with backend.opened() as store:
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
            # An older write never moves a conversation's activity back.
            await store.apply([start(ALICE, "t7", conv="c1", at=at(1))])
            assert await store.latest_conversation(ALICE) == "c1"
            # Another user's conversation is never returned, even for the same text.
            assert await store.conversation_by_assistant_hashes(BOB, [hx, hy]) is None

    run(body())


def test_conversation_found_by_the_hash_of_the_text_the_client_received(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            received = "your key is sk-abc123"
            saved = FinishTurn(ALICE, "t1", "c7", "your key is [REDACTED:api_key]", T0, answer_hash=text_hash(received))
            await store.apply([start(ALICE, "t1", conv="c7"), saved, saved])
            assert await store.conversation_by_assistant_hashes(ALICE, [text_hash(received)]) == "c7"
            assert [m.content for m in await store.messages(ALICE, "c7")] == ["hello", "your key is [REDACTED:api_key]"]

    run(body())


def test_latest_and_recent_conversations(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            assert await store.latest_conversation(ALICE) is None
            for i, conv in enumerate(["a", "b", "c", "a"]):
                await store.apply([start(ALICE, f"t{i}", conv=conv, at=T0 + timedelta(minutes=i))])
            assert await store.latest_conversation(ALICE) == "a"
            assert await store.recent_conversations(ALICE, None) == ["a", "c", "b"]
            assert await store.recent_conversations(ALICE, 2) == ["a", "c"]
            assert await store.recent_conversations(ALICE, 0) == []

    run(body())


def test_ties_break_by_id_in_byte_order(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, f"t-{conv}", conv=conv) for conv in ("b", "B", "a-1", "a_1", "A")])
            assert await store.recent_conversations(ALICE, None) == ["b", "a_1", "a-1", "B", "A"]

    run(body())


def test_lists_page_with_cursors(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            for i in range(5):
                at = T0 + timedelta(minutes=i)
                await store.apply([start(ALICE, f"t{i}", f"q{i}", conv=f"c{i}", at=at),
                                   start(ALICE, f"s{i}", f"m{i}", conv="main", at=at)])
            first = await store.message_page(ALICE, "main", limit=2)
            rest = await store.message_page(ALICE, "main", limit=10, after=first[-1][0])
            assert [m.content for _, m in first + rest] == ["m0", "m1", "m2", "m3", "m4"]
            page = await store.conversation_page(ALICE, limit=3)
            more = await store.conversation_page(ALICE, limit=10, after=page[-1][0])
            assert [c["id"] for _, c in page + more] == ["main", "c4", "c3", "c2", "c1", "c0"]
            assert page[0][1]["message_count"] == 5 and page[0][1]["last_active_at"] == T0 + timedelta(minutes=4)

    run(body())


def test_neighbours_are_the_messages_just_before_and_after_in_the_same_conversation(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            for i in range(3):
                at = T0 + timedelta(minutes=i)
                await store.apply([start(ALICE, f"t{i}", f"q{i}", conv="main", at=at),
                                   finish(ALICE, f"t{i}", f"a{i}", conv="main", at=at),
                                   start(BOB, f"b{i}", f"bob{i}", conv="main", at=at)])
            await store.apply([start(ALICE, "other", "elsewhere", conv="other", at=T0)])
            ids = {m.content: m.id for _, m in await store.message_page(ALICE, "main")}
            alone = (await store.message_page(ALICE, "other"))[0][1].id
            found = await store.neighbours(ALICE, [ids["q0"], ids["a1"], ids["a2"], alone, "no-such-id"])
            assert {hit: tuple(m.content if m else None for m in pair) for hit, pair in found.items()} == {
                ids["q0"]: (None, "a0"), ids["a1"]: ("q1", "q2"), ids["a2"]: ("q2", None)}
            assert await store.neighbours(BOB, [ids["q1"]]) == {}  # another user's message: not found
            assert await store.neighbours(ALICE, []) == {}

    run(body())


def test_a_page_goes_on_after_a_key_whose_item_is_deleted(backend: Backend) -> None:  # noqa: F811
    """A key is a place in the list's order: deleting its item (and the next) moves no other item."""
    async def body() -> None:
        async with backend.opened() as store:
            for i in range(5):
                at = T0 + timedelta(minutes=i)
                await store.apply([start(ALICE, f"t{i}", f"q{i}", conv=f"c{i}", at=at),
                                   finish(ALICE, f"t{i}", f"a{i}", conv=f"c{i}", at=at, task=f"task {i}", steps=STEP),
                                   start(ALICE, f"s{i}", f"m{i}", conv="main", at=at - timedelta(days=1))])
                await backend.add_entity("alice", f"Thing {i}")
            messages = await store.message_page(ALICE, "main", limit=2)
            conversations = await store.conversation_page(ALICE, limit=2)
            traces = await store.reasoning_page(ALICE, limit=2)
            entities = await store.entity_page(ALICE, limit=2)
            assert [c["id"] for _, c in conversations] == ["c4", "c3"]
            assert [t["task"] for _, t in traces] == ["task 4", "task 3"]
            ids = {m.content: m.id for _, m in await store.message_page(ALICE, "main")}
            for content in ("m1", "m2"):
                assert await store.delete_item(ALICE, "message", ids[content]) is not None
            for conversation in ("c3", "c2"):  # with their traces, "task 3" and "task 2"
                assert await store.delete_item(ALICE, "conversation", conversation) is not None
            names = {e["name"]: e["id"] for _, e in await store.entity_page(ALICE)}
            for name in ("Thing 1", "Thing 2"):
                assert await store.delete_item(ALICE, "entity", names[name]) is not None
            assert [m.content for _, m in await store.message_page(ALICE, "main", after=messages[-1][0])] == [
                "m3", "m4"]
            assert [c["id"] for _, c in await store.conversation_page(ALICE, after=conversations[-1][0])] == [
                "c1", "c0", "main"]
            assert [t["task"] for _, t in await store.reasoning_page(ALICE, after=traces[-1][0])] == [
                "task 1", "task 0"]
            assert [e["name"] for _, e in await store.entity_page(ALICE, after=entities[-1][0])] == [
                "Thing 3", "Thing 4"]

    run(body())


def test_page_key_finds_an_item_of_the_user_only(backend: Backend) -> None:  # noqa: F811
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1", "q", conv="c1"),
                               finish(ALICE, "t1", "a", conv="c1", task="t", steps=STEP)])
            entity = await backend.add_entity("alice", "Thing")
            [(message_key, message)] = await store.message_page(ALICE, "c1", limit=1)
            [(conversation_key, _)] = await store.conversation_page(ALICE)
            [(trace_key, trace)] = await store.reasoning_page(ALICE)
            [(entity_key, _)] = await store.entity_page(ALICE)
            assert await store.page_key(ALICE, "messages", message.id) == message_key
            assert await store.page_key(ALICE, "conversations", "c1") == conversation_key
            assert await store.page_key(ALICE, "reasoning", trace["id"]) == trace_key
            assert await store.page_key(ALICE, "entities", entity) == entity_key
            assert await store.page_key(BOB, "entities", entity) is None
            assert await store.page_key(ALICE, "entities", "no-such-entity") is None

    run(body())


def test_pending_turns_become_interrupted_at_open(backend: Backend) -> None:
    """Turns written at T0 (long ago) and left pending died with their process."""

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1", "unanswered question"),
                               start(ALICE, "t2"), finish(ALICE, "t2", "ok")])
        # A pending turn whose answer was saved finished; only its status was lost.
        await backend.sql("UPDATE turns SET status = 'pending' WHERE turn_key = 't2'")
        async with backend.opened() as store:
            assert (await store.turn(ALICE, "t1")).status == "interrupted"  # type: ignore[union-attr]
            assert (await store.turn(ALICE, "t2")).status == "complete"  # type: ignore[union-attr]
            assert "unanswered question" in [m.content for m in await store.messages(ALICE, "c1")]
        # Opened twice, migrated once: one row per schema version.
        assert await backend.sql("SELECT count(*) - max(version) FROM schema_version") == [(0,)]

    run(body())


# --- scopes ----------------------------------------------------------------------------


async def everything_visible_to(store: Store, scope: Scope, ids: dict[str, str]) -> str:
    """Every read and search of `scope`, aimed at the other user's ids, as one string."""
    terms = query_terms(f"{CANARY} hello answer Oslo")
    seen: list[Any] = [
        await store.messages(scope, "c1"),
        await store.message_page(scope, "c1"),
        await store.conversation_page(scope),
        await store.entity_page(scope),
        await store.reasoning_page(scope),
        await store.page_key(scope, "entities", ids["entity"]),
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
        await by_calls(store, scope, ["call_alice"]),
        await by_history(store, scope, "h-t-alice", T0 - timedelta(days=1)),
        await store.conversation_by_assistant_hashes(scope, [text_hash(f"answer {CANARY}")]),
        [record async for record in store.export(scope)],
    ]
    return repr(seen)


def test_no_read_returns_another_users_memory(backend: Backend) -> None:
    steps = (ReasoningStep("lookup", f'{{"q": "{CANARY}"}}', CANARY),)

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([
                start(ALICE, "t-alice", f"hello {CANARY}", conv="c1"),
                RecordToolCalls(ALICE, "t-alice", (("call_alice", "lookup", CANARY),), T0),
                finish(ALICE, "t-alice", f"answer {CANARY}", conv="c1", task=CANARY, steps=steps),
                SaveBlock(ALICE, "t-alice", f"block {CANARY}", 1),
                # Bob uses the same conversation id; it is a different conversation.
                start(BOB, "t1", "hello Oslo", conv="c1"), finish(BOB, "t1", "answer Oslo", conv="c1"),
            ])
            ids = {"entity": await backend.add_entity("alice", f"Alice {CANARY}", "person", f"likes {CANARY}")}
            ids["target"] = await backend.add_entity("alice", "Acme", "organization", CANARY)
            await backend.add_edge("alice", ids["entity"], "WORKS_AT", ids["target"], valid_from=T0)
            await backend.add_entity("bob", "Oslo", "place", "a city")
            seen_by_bob = await everything_visible_to(store, BOB, ids)
            assert "Oslo" in seen_by_bob and CANARY not in seen_by_bob
            seen_by_alice = await everything_visible_to(store, ALICE, ids)
            assert CANARY in seen_by_alice and "Oslo" not in seen_by_alice

    run(body())


def test_agent_isolation(backend: Backend) -> None:
    a1, a2 = Scope("alice", agent="a1"), Scope("alice", agent="a2")
    a1_only, a2_only = (Scope("alice", agent=a, agent_isolated=True) for a in ("a1", "a2"))
    step = (ReasoningStep("search", "{}", "found"),)

    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([
                start(a1, "t1", "planning the trip", conv="k1"),
                finish(a1, "t1", "booked", conv="k1", task="trip", steps=step),
                start(a2, "t2", "planning the budget", conv="k2", at=T0 + timedelta(minutes=1)),
                finish(a2, "t2", "saved", conv="k2", at=T0 + timedelta(minutes=1), task="budget", steps=step),
            ])
            await backend.add_entity("alice", "Trip planner", agent="a1")
            await backend.add_entity("alice", "Budget planner", agent="a2")
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
            assert [c["id"] for _, c in await store.conversation_page(a2_only)] == ["k2"]
            assert await store.turn(a1_only, "t2") is None
            assert await store.conversation_by_assistant_hashes(a1_only, [text_hash("saved")]) is None
            exported = repr([r async for r in store.export(a1_only)])
            assert "trip" in exported and "budget" not in exported

    run(body())


# --- search ----------------------------------------------------------------------------


def test_search_ranks_the_rare_term_first(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
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


def test_identifier_found_whole_and_by_part(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1", "the staging host is internal-hbr-2291.example"),
                               start(ALICE, "t2", "the production host is internal-prod.example"),
                               start(ALICE, "t3", "nothing to see")])
            for query in (query_terms("internal-hbr-2291.example"), ["internal_hbr_2291_example"], ["hbr"]):
                hits = await store.search_messages(ALICE, query)
                assert hits and "internal-hbr-2291.example" in hits[0][0].content, query
            assert len(await store.search_messages(ALICE, ["internal_hbr_2291_example"])) == 1
            assert len(await store.search_messages(ALICE, ["INTERNAL_HBR_2291_EXAMPLE"])) == 1

    run(body())


def test_search_messages_by_conversation(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
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


def test_search_entities_and_reasoning(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await backend.add_entity("alice", "Acme Corp", "organization", "the company Alice works at")
            await backend.add_entity("alice", "Berlin", "place", "where Acme has an office")
            await backend.add_entity("alice", "Go", "language", "preferred language")
            hits = await store.search_entities(ALICE, query_terms("what does Acme do?"))
            assert [e.name for e, _ in hits] == ["Acme Corp", "Berlin"]  # the name match ranks first
            steps = (ReasoningStep("run_sql", "SELECT * FROM invoices", "42 rows"),)
            await store.apply([start(ALICE, "t1"), finish(ALICE, "t1", "There are 42.", task="count invoices",
                                                          steps=steps)])
            traces = await store.search_reasoning(ALICE, query_terms("invoices run_sql"))
            assert [t.task for t, _ in traces] == ["count invoices"]
            assert traces[0][0].steps == steps

    run(body())


def test_search_sees_edits_and_deletes_of_items(backend: Backend) -> None:
    """Whatever path changes an item (an update, an FK cascade), its index entries follow."""

    async def body() -> None:
        async with backend.opened() as store:
            eid = await backend.add_entity("alice", "Nimbus", "project", "the old codename")
            await store.apply([start(ALICE, "t1", "the nimbus launch", conv="gone"),
                               start(ALICE, "t2", "nimbus retro", conv="kept")])
            await backend.sql("UPDATE entities SET name = 'Stratus', name_terms = 'stratus' WHERE id = ?", eid)
            assert await store.search_entities(ALICE, ["nimbus"]) == []
            assert [e.name for e, _ in await store.search_entities(ALICE, ["stratus"])] == ["Stratus"]
            await backend.sql("DELETE FROM conversations WHERE user_id = 'alice' AND id = 'gone'")
            assert [m.content for m, _ in await store.search_messages(ALICE, ["nimbus"])] == ["nimbus retro"]

    run(body())


def test_conversation_filter_finds_exactly_the_chosen_conversations(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            # Conversations interleaved in time, so each one's rows spread over the others'.
            ops = [said(ALICE, n, f"penguin note {n} in {'abc'[n % 3]}", "abc"[n % 3]) for n in range(30)]
            ops += [said(BOB, 100 + n, f"penguin note of bob {n}", "a") for n in range(5)]
            await store.apply(ops)
            terms = query_terms("penguin notes")
            every = await store.search_messages(ALICE, terms, limit=100)
            for chosen in (["a"], ["a", "c"], ["b", "c", "nowhere"]):
                hits = await store.search_messages(ALICE, terms, conversation_ids=chosen, limit=100)
                # The same rows and scores as the whole-history search holds for those conversations.
                assert hits == [(m, s) for m, s in every if m.conversation_id in chosen]
                assert len(hits) == 10 * len(set(chosen) - {"nowhere"})
            assert await store.search_messages(ALICE, terms, conversation_ids=["nowhere"]) == []
            assert await store.search_messages(BOB, terms, conversation_ids=["b"]) == []

    run(body())


def test_a_message_is_found_by_its_own_words_and_ranked_by_those_before_it(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply([said(ALICE, 0, "which walrus bites?", "q"), said(ALICE, 1, "the grey one", "q"),
                               said(ALICE, 2, "a walrus story", "s"), said(ALICE, 3, "the grey one again", "s2")])
            hits = await store.search_messages(ALICE, ["walrus"])
            assert sorted(m.content for m, _ in hits) == ["a walrus story", "which walrus bites?"]
            # "the grey one" says nothing of walruses, the question before it does: it ranks first,
            # and above "the grey one again", which has no walrus before it.
            graded = await store.search_messages(ALICE, ["grey", "walrus"])
            assert [m.content for m, _ in graded] == ["the grey one", "a walrus story", "which walrus bites?",
                                                      "the grey one again"]

    run(body())


def test_common_terms_never_lose_a_rare_term_match(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await store.apply(common_world())
            terms = query_terms("when is the zephyr deadline?")
            hits = await store.search_messages(ALICE, terms, exclude_conversation_id="c1", limit=10)
            # Every row holding the rare term, the one holding both first (the common term
            # still counts toward the score); a row holding only the common term is not a candidate.
            assert hits[0][0].content == "the zephyr deadline is Friday"
            assert sorted(m.content for m, _ in hits[1:]) == [f"the zephyr project number {n}" for n in range(3)]
            # The common term alone still finds its rows: it is the rarest that occurs.
            alone = await store.search_messages(ALICE, ["deadlin", "nosuchterm"], limit=5)
            assert len(alone) == 5 and all("deadline" in m.content for m, _ in alone)
            small = await store.search_messages(BOB, terms)
            assert len(small) == 3  # a term in few rows is never common

    run(body())


# --- export ----------------------------------------------------------------------------


def test_export_shapes(backend: Backend) -> None:
    steps = (ReasoningStep("lookup", "{}", "ok"),)

    async def body() -> list[dict[str, Any]]:
        async with backend.opened() as store:
            await store.apply([start(ALICE, "t1", "I work at Acme"),
                               finish(ALICE, "t1", "Noted.", task="remember", steps=steps)])
            alice = await backend.add_entity("alice", "Alice", "person", "the user")
            acme = await backend.add_entity("alice", "Acme", "organization")
            await backend.add_edge("alice", alice, "WORKS_AT", acme, valid_from=T0)
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
    names = {r["name"]: r["id"] for r in records if r["kind"] == "entity"}
    assert {k: edge[k] for k in ("from", "type", "to", "from_id", "to_id", "invalid_at")} == {
        "from": "Alice", "type": "WORKS_AT", "to": "Acme", "from_id": names["Alice"], "to_id": names["Acme"],
        "invalid_at": None}
    assert datetime.fromisoformat(edge["valid_from"]) == T0
    assert trace["steps"] == [{"name": "lookup", "arguments": "{}", "result": "ok"}]
    assert (trace["conversation_id"], trace["task"], trace["answer"]) == ("c1", "remember", "Noted.")


def test_export_pages_through_a_large_user(backend: Backend) -> None:
    async def body() -> list[dict[str, Any]]:
        async with backend.opened() as store:
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


def test_relationships_current_and_history(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            alice, acme, globex = [await backend.add_entity("alice", n) for n in ("Alice", "Acme", "Globex")]
            await backend.add_edge("alice", alice, "WORKS_AT", globex, valid_from=T0,
                                   invalid_at=T0 + timedelta(seconds=60))
            await backend.add_edge("alice", alice, "WORKS_AT", acme, valid_from=T0)
            current = await store.relationships(ALICE, alice)
            assert [(r.from_name, r.type, r.to_name) for r in current] == [("Alice", "WORKS_AT", "Acme")]
            every = await store.relationships(ALICE, alice, current_only=False)
            assert {r.to_name for r in every} == {"Acme", "Globex"}
            old = next(r for r in every if r.to_name == "Globex")
            assert old.invalid_at == T0 + timedelta(seconds=60) and old.valid_from == T0
            assert [r.from_name for r in await store.relationships(ALICE, acme)] == ["Alice"]  # edges *to* it too

    run(body())


# --- faults and scale ------------------------------------------------------------------


def test_failing_batch_raises_and_leaves_nothing(backend: Backend) -> None:
    carol = Scope("carol")

    async def body() -> None:
        async with backend.opened() as store:
            await backend.fail_on_message("boom")
            with pytest.raises(StoreError, match="injected failure") as failure:
                await store.apply([start(carol, "t1", "fine"), finish(carol, "t1", "fine too"),
                                   start(carol, "t2", "boom", conv="c2")])
            assert failure.value.transient is False  # the write itself is refused: retrying cannot help
            assert await store.recent_conversations(carol, None) == []
            assert await store.turn(carol, "t1") is None
            await store.apply([start(carol, "t1", "fine")])  # the connection is usable again
            assert [m.content for m in await store.messages(carol, "c1")] == ["fine"]
        assert await backend.sql("SELECT count(*) FROM users WHERE id = 'carol'") == [(1,)]

    run(body())


def test_closed_store_raises_store_error(backend: Backend) -> None:
    async def body() -> None:
        store = backend.store()
        with pytest.raises(StoreError):
            await store.apply([start(ALICE, "t1")])
        with pytest.raises(StoreError):
            await store.messages(ALICE, "c1")
        assert await store.ping() is False
        await store.open()
        assert await store.ping() is True
        await store.close()
        assert await store.ping() is False
        with pytest.raises(StoreError):
            await store.search_messages(ALICE, ["hello"])

    run(body())


def test_cancelled_batch_leaves_the_connection_usable(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            ops = [start(ALICE, f"t{i}", f"text {i}") for i in range(500)]
            task = asyncio.create_task(store.apply(ops))
            await asyncio.sleep(0)  # the batch has started; a fast machine may finish it in a few ms
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await store.apply([start(BOB, "t1", "after the cancel")])
            assert [m.content for m in await store.messages(BOB, "c1")] == ["after the cancel"]
            assert len(await store.messages(ALICE, "c1", limit=1000)) in (0, 500)  # all or nothing

    run(body())


def test_a_thousand_start_turns_in_one_batch(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            ops = [start(Scope(f"user{i % 10}"), f"t{i}", f"message number {i}", conv=f"c{i % 37}",
                         at=T0 + timedelta(seconds=i)) for i in range(1000)]
            await store.apply(ops)
            assert len(await store.messages(Scope("user3"), "c3", limit=1000)) == 3
            hits = await store.search_messages(Scope("user7"), query_terms("number 997"))
            assert hits[0][0].content == "message number 997"

    run(body())


def test_user_delete_cascades_through_every_table(backend: Backend) -> None:
    """What the delete-user work relies on: one DELETE of the user row empties every table."""
    token = f"{CANARY}uniquetoken"

    async def body() -> None:
        async with backend.opened() as store:
            steps = (ReasoningStep("t", "{}", token),)
            await store.apply([start(ALICE, "t1", f"hello {token}"),
                               RecordToolCalls(ALICE, "t1", (("c", "n", "a"),), T0),
                               finish(ALICE, "t1", token, task=token, steps=steps),
                               SaveBlock(ALICE, "t1", token, 1),
                               start(BOB, "t1", "bob stays")])
            await backend.add_entity("alice", token, "thing", token)
            assert await store.search_messages(ALICE, [token])
            await backend.sql("DELETE FROM users WHERE id = 'alice'")
            assert await store.search_messages(ALICE, [token]) == []
            assert await store.search_entities(ALICE, [token]) == []
            assert await store.search_reasoning(ALICE, [token]) == []
            assert [m.content for m in await store.messages(BOB, "c1")] == ["bob stays"]
        for table in await user_tables(backend):
            assert await backend.sql(f"SELECT count(*) FROM {table} WHERE user_id = 'alice'") == [(0,)], table
        assert await backend.sql("SELECT count(*) FROM messages WHERE user_id = 'bob'") == [(1,)]

    run(body())


async def user_tables(backend: Backend) -> list[str]:
    """Every table of the backend's schema with a user_id column (full-text shadow tables aside)."""
    if isinstance(backend, SQLiteBackend):
        rows = await backend.sql("SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE '%user_id%'"
                                 " AND name NOT LIKE '%fts%'")
    else:
        rows = await backend.sql("SELECT table_name FROM information_schema.columns WHERE column_name = 'user_id'"
                                 " AND table_schema = current_schema()")
    assert len(rows) >= 10
    return [name for (name,) in rows]
