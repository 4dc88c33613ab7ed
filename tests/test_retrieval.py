"""Retrieval against real SQLite files: sources, merge, budget, block and log."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import asynccontextmanager, closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proxy.memory.retrieval.block import DEFAULT_HEADER, GRAPH_NOTE
from proxy.memory.retrieval.base import Query, Retrieved
from proxy.memory.retrieval.retriever import Retrieval, cut_query
from proxy.metrics import Metrics
from proxy.models import Entity, ReasoningStep, ReasoningTrace, Relationship, Scope, StoredMessage
from proxy.settings import MemorySettings
from proxy.stores.base import FinishTurn, StartTurn, StoreError
from proxy.stores.hash_key import HashKey
from proxy.stores.sqlite.store import SQLiteStore
from proxy.stores.indexed_text import entity_terms
from proxy.terms import terms as index_terms
from proxy.memory.turns import TurnIdentity, identify
from proxy.wires.openai_chat import OpenAIChat

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ALICE = Scope("alice")
BOB = Scope("bob")
CANARY = "zebracanary"


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def day(n: int) -> datetime:
    return T0 + timedelta(days=n)


class World:
    """One SQLite file: writes through the store's ops, entities and edges as extraction writes them."""

    def __init__(self, store: SQLiteStore, path: Path) -> None:
        self.store = store
        self.path = path
        self._turns = 0

    async def say(self, text: str, *, conv: str = "c1", role: str = "user", at: datetime = T0,
                  scope: Scope = ALICE, task: str = "", steps: tuple[ReasoningStep, ...] = ()) -> None:
        self._turns += 1
        key = f"t{self._turns}"
        if role == "user":
            await self.store.apply([StartTurn(scope, key, conv, f"h-{key}", at, text)])
        else:
            await self.store.apply([FinishTurn(scope, key, conv, text, at, task, steps)])

    def sql(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with closing(sqlite3.connect(self.path)) as db, db:
            db.execute("PRAGMA foreign_keys=ON")
            return db.execute(query, params).fetchall()

    def entity(self, name: str, type_: str = "", description: str = "", *, user: str = "alice") -> str:
        eid = f"e-{name.lower().replace(' ', '-')}-{user}" if name else uuid.uuid4().hex
        self.sql("INSERT INTO users (id, created_at) VALUES (?, 0) ON CONFLICT DO NOTHING", (user,))
        self.sql("INSERT INTO entities (id, user_id, name, canonical_name, type, description, name_terms, type_terms,"
                 " description_terms, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0)",
                 (eid, user, name, " ".join(name.casefold().split()), type_, description,
                  *entity_terms(name, type_, description)))
        return eid

    def edge(self, from_id: str, type_: str, to_id: str, *, at: datetime = T0, invalid_at: datetime | None = None,
             user: str = "alice") -> str:
        rid = f"r-{from_id}-{type_}-{to_id}"
        self.sql("INSERT INTO relationships (id, user_id, from_id, type, to_id, valid_from, invalid_at, created_at)"
                 " VALUES (?, ?, ?, ?, ?, ?, ?, 0)",
                 (rid, user, from_id, type_, to_id, at.timestamp(), invalid_at and invalid_at.timestamp()))
        return rid

    async def recall(self, text: str, *, conv: str = "c1", visible: Sequence[str] = (), limit: int = 6,
                     scope: Scope = ALICE, store: Any = None, metrics: Metrics | None = None,
                     **settings: Any) -> Retrieved:
        # A generous deadline unless a test sets one: these tests are about what comes back, and
        # a loaded CI machine once ran a fresh store's first recall past the default's 200 ms a source.
        settings.setdefault("retrieval_timeout_ms", 5000)
        retrieval = Retrieval(store or self.store, MemorySettings(**settings), metrics or Metrics())
        return await retrieval.retrieve(scope, Query(text, conv, tuple(visible), limit))


@asynccontextmanager
async def world(tmp_path: Path) -> AsyncIterator[World]:
    path = tmp_path / "memory.db"
    store = SQLiteStore(str(path))
    await store.open()
    try:
        yield World(store, path)
    finally:
        await store.close()


def lines(block: str) -> list[str]:
    return block.split("\n")[1:]


def sources(result: Retrieved) -> list[str]:
    return [hit["source"] for hit in result.log["hits"]]


# --- the block ---------------------------------------------------------------------------


def test_block_with_every_kind_of_line_and_the_graph_note(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            alice = w.entity("Alice Chen", "person", "staff engineer at Acme, prefers Go")
            acme = w.entity("Acme", "organization", "")
            w.edge(alice, "WORKS_AT", acme)
            await w.say("We settled on kebab-case file names.", conv="c0", role="assistant", at=day(-16))
            await w.say("the staging host is internal-hbr-2291.example", conv="c1", at=T0)
            await w.say("Booked the staging review for Friday.", conv="c1", role="assistant", at=T0)
            # Alice Chen shares four of the query's terms; Acme only its name, so it is a weak
            # hit that fills a slot nobody else takes.
            result = await w.recall("Alice, our staff engineer at Acme: which staging host and file names?", conv="c1",
                                    visible=["Booked the staging review for Friday."])
            assert result.block == "\n".join([
                DEFAULT_HEADER,
                "1. [long-term] Alice Chen — staff engineer at Acme, prefers Go",
                "2. [graph] (Alice Chen)-[WORKS_AT]->(Acme)",
                "3. [conversation] user (2026-11-02): the staging host is internal-hbr-2291.example",
                "4. [cross-session] assistant (2026-10-17): We settled on kebab-case file names.",
                "5. [long-term] Acme",
                GRAPH_NOTE,
            ])
            assert result.injected == 5
            assert sources(result) == ["long-term", "graph", "conversation", "cross-session", "long-term"]
            assert [hit["reason"] for hit in result.log["hits"]][:2] == ["rank", "graph expansion"]

    run(body())


def test_block_without_a_graph_hit_has_no_note(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("My dentist is Dr. Okafor on Elm Street.", conv="c0", at=day(-3))
            await w.say("The dentist appointment moved to Tuesday.", conv="c1", role="assistant", at=day(-1))
            result = await w.recall("when is the dentist appointment?", conv="c1")
            assert result.block == "\n".join([
                DEFAULT_HEADER,
                "1. [conversation] assistant (2026-11-01): The dentist appointment moved to Tuesday.",
                "2. [cross-session] user (2026-10-30): My dentist is Dr. Okafor on Elm Street.",
            ])
            assert GRAPH_NOTE not in result.block

    run(body())


def test_reasoning_trace_line(tmp_path: Path) -> None:
    steps = (ReasoningStep("get_weather", '{"city": "Oslo"}', "rain, 4°C"),)

    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("What is the weather in Oslo?", conv="c0", at=day(-2))
            await w.say("Rain and 4°C in Oslo.", conv="c0", role="assistant", at=day(-2),
                        task="What is the weather in Oslo?", steps=steps)
            result = await w.recall("weather forecast Oslo", conv="c1", cross_session_limit=0)
            assert lines(result.block) == [
                '1. [reasoning] What is the weather in Oslo? | tools: get_weather({"city": "Oslo"}) → rain, 4°C'
                " | answer: Rain and 4°C in Oslo."
            ]

    run(body())


def test_new_user_gets_no_block(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("the staging host is internal-hbr-2291.example", scope=BOB)
            result = await w.recall("what is the staging host?", scope=Scope("newcomer"))
            assert (result.block, result.injected, result.log["hits"]) == ("", 0, [])
            assert result.log["errors"] == {} and result.log["cache"] is False

    run(body())


def test_nothing_relevant_means_no_block(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("I adopted a cat named Miso.", conv="c0")
            assert (await w.recall("how do I configure nginx?")).block == ""
            assert (await w.recall("and the, of it?")).block == ""  # stop words only

    run(body())


# --- conversation -------------------------------------------------------------------------


def test_conversation_never_returns_what_the_request_shows(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            for n, text in enumerate(["the invoice for March is paid", "the invoice total was 120 euros",
                                      "the invoice number is INV-4471", "send the invoice to Bob"]):
                await w.say(text, role="user" if n % 2 == 0 else "assistant", at=T0 + timedelta(minutes=n))
            visible = ["the  invoice for March\nis paid ", "the invoice total was 120 euros"]
            result = await w.recall("send the invoice to Bob", visible=visible, cross_session_limit=0)
            assert lines(result.block) == ["1. [conversation] user (2026-11-02): the invoice number is INV-4471"]

    run(body())


def test_a_new_conversation_is_not_searched(tmp_path: Path) -> None:
    """The pipeline knows a conversation it just opened holds nothing: no search is made for it."""
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("the invoice number is INV-4471", conv="c1")
            retrieval = Retrieval(w.store, MemorySettings(cross_session_limit=0), Metrics())
            known = await retrieval.retrieve(ALICE, Query("which invoice number?", "c1", (), 6))
            assert lines(known.block) == ["1. [conversation] user (2026-11-02): the invoice number is INV-4471"]
            # Told that c1 is new, the source does not ask the store (which would have found it).
            fresh = await retrieval.retrieve(ALICE, Query("which invoice number?", "c1", (), 6, new_conversation=True))
            assert fresh.block == "" and fresh.log["candidates"]["conversation"] == 0

    run(body())


def test_identify_says_when_the_conversation_is_new(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("hello", conv="c1")
            await w.say("hi there", conv="c1", role="assistant")

            async def identity(messages: list[dict[str, str]], scope: Scope = ALICE) -> TurnIdentity:
                request = OpenAIChat().parse(json.dumps({"model": "m", "messages": messages}).encode())
                assert not isinstance(request, str)
                return await identify(w.store, scope, request.transcript, now=T0, retry_window_s=0,
                                      follow="history", key=HashKey(b"k" * 32))

            first = await identity([{"role": "user", "content": "a new chat"}])
            assert first.new_conversation and first.conversation_id != "c1"
            follow_up = await identity([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"},
                                        {"role": "user", "content": "and then?"}])
            assert not follow_up.new_conversation and follow_up.conversation_id == "c1"
            named = await identity([{"role": "user", "content": "x"}], Scope("alice", conversation="c9"))
            assert not named.new_conversation and named.conversation_id == "c9"

    run(body())


def test_conversation_finds_unseen_matches_behind_many_shown_ones(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            shown = [f"the parcel tracking update number {n}" for n in range(80)]
            await w.say("an old note: the parcel went to the neighbour", at=day(-5))
            for n, text in enumerate(shown):
                await w.say(text, at=T0 + timedelta(minutes=n))
            result = await w.recall("where is the parcel tracking?", visible=shown)
            assert lines(result.block) == ["1. [conversation] user (2026-10-28): an old note: the parcel went to the"
                                           " neighbour"]

    run(body())


def test_the_current_message_is_not_a_memory_of_itself(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("what time does the pool open?", conv="c1")  # saved by an earlier attempt
            await w.say("the pool opens at seven", conv="c1", role="assistant", at=T0 + timedelta(minutes=1))
            result = await w.recall("what time does the  pool open?", conv="c1")
            assert lines(result.block) == ["1. [conversation] assistant (2026-11-02): the pool opens at seven"]

    run(body())


def test_the_same_words_in_two_conversations_are_one_memory(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("the gate code is 1234", conv="c1", at=day(-1))
            await w.say("The gate code is  1234", conv="c0", at=day(-2))
            await w.say("gate code changes monthly", conv="c0", at=day(-2))
            result = await w.recall("gate code", conv="c1")
            assert lines(result.block) == ["1. [conversation] user (2026-11-01): the gate code is 1234",
                                           "2. [cross-session] user (2026-10-31): gate code changes monthly"]

    run(body())


# --- cross-session ------------------------------------------------------------------------


def test_cross_session_takes_every_relevant_message_of_one_conversation(tmp_path: Path) -> None:
    # No cap per conversation: an answer often sits in a few neighbouring turns of one chat.
    async def body() -> None:
        async with world(tmp_path) as w:
            for n in range(5):
                await w.say(f"budget spreadsheet row {n}", conv="busy", at=T0 + timedelta(minutes=n))
            for n in range(2):
                await w.say(f"budget spreadsheet note {n}", conv="quiet", at=day(-3) + timedelta(minutes=n))
            result = await w.recall("the budget spreadsheet", conv="new", limit=12)
            hits = result.log["hits"]
            assert all(hit["source"] == "cross-session" for hit in hits)
            # Every message is in the block; one said next to a better hit is joined to its line.
            assert sum(1 + len(hit.get("exchange", [])) for hit in hits) == 7
            said = [turn.rsplit(" ", 2)[-2] for line in lines(result.block) for turn in line.split(" | ")]
            assert said.count("row") == 5 and said.count("note") == 2

    run(body())


def test_a_when_question_ranks_first_the_message_that_dates_what_it_says(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("We moved to Porto with the kids.", conv="a", at=day(-40))
            await w.say("We moved to Porto with the kids last spring.", conv="b", at=day(-30))
            undated, dated = "We moved to Porto with the kids.", "We moved to Porto with the kids last spring."
            plain = await w.recall("Did we move to Porto with the kids?", conv="new")
            assert [line.split("): ")[1] for line in lines(plain.block)] == [undated, dated]  # shorter wins on BM25
            when = await w.recall("When did we move to Porto with the kids?", conv="new")
            assert [line.split("): ")[1] for line in lines(when.block)] == [dated, undated]
            assert [hit["score"].get("time_cue") for hit in when.log["hits"]] == [0.3, None]

    run(body())


def test_a_question_naming_a_period_ranks_first_the_message_written_then(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("Signed up for the pottery class again.", conv="a", at=datetime(2025, 4, 9, tzinfo=UTC))
            await w.say("Signed up for the pottery class.", conv="b", at=datetime(2026, 4, 9, tzinfo=UTC))
            plain = await w.recall("the pottery class", conv="new")
            assert lines(plain.block)[0].startswith("1. [cross-session] user (2026-04-09)")  # shorter wins on BM25
            for asked in ("Did I sign up for the pottery class in April 2025?", "the pottery class in 2025"):
                named = await w.recall(asked, conv="new")
                assert [line[:36] for line in lines(named.block)] == [
                    "1. [cross-session] user (2025-04-09)", "2. [cross-session] user (2026-04-09)"]
            other_month = await w.recall("the pottery class in May 2025", conv="new")
            assert lines(other_month.block)[0].startswith("1. [cross-session] user (2026-04-09)")

    run(body())


def test_a_non_answer_and_a_bare_question_only_fill_what_a_fact_leaves(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("what's my daughter's name?", conv="asked", at=day(-2))
            await w.say("I'm sorry, I don't know your daughter's name. You haven't told me.", conv="asked",
                        role="assistant", at=day(-2) + timedelta(seconds=1))
            await w.say("is my daughter's name on the school list?", conv="school", at=day(-3))
            await w.say("By the way, my daughter is Lena and she is seven.", conv="told", at=day(-1))
            result = await w.recall("what is my daughter's name?", conv="now", limit=1)
            assert lines(result.block) == [
                "1. [cross-session] user (2026-11-01): By the way, my daughter is Lena and she is seven."]
            # With room to spare a question fills a slot after the fact. The question asked again
            # ("what's my daughter's name?") is no memory at all, and its non-answer is none either.
            both = await w.recall("what is my daughter's name?", conv="now", limit=6)
            assert lines(both.block) == [
                "1. [cross-session] user (2026-11-01): By the way, my daughter is Lena and she is seven.",
                "2. [cross-session] user (2026-10-30): is my daughter's name on the school list?"]

    run(body())


def test_a_question_asked_again_gives_its_line_to_its_answer(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            # Typed without its "?": still a question, and every word of it is in the one asked now.
            await w.say("what is my cat called", conv="c0", at=day(-2))
            await w.say("Biscuit, the tabby.", conv="c0", role="assistant", at=day(-2) + timedelta(seconds=1))
            await w.say("thanks! And she is ten now", conv="c0", at=day(-2) + timedelta(seconds=2))
            await w.say("What is my cat called?", conv="c1", at=day(-1))  # asked again, never answered
            result = await w.recall("Remind me: what's my cat called?", conv="now")
            # The answer shares no word with the question: the question found it, and gives it its
            # slot. The question is not carried (the request says it), the turn after it is.
            assert lines(result.block) == [
                "1. [cross-session] assistant (2026-10-31): Biscuit, the tabby. | user: thanks! And she is ten now"]
            question, answer, after = (w.sql("SELECT id FROM messages WHERE conversation_id = 'c0' ORDER BY seq"))
            hit = result.log["hits"][0]
            assert (hit["id"], hit["reason"], hit["score"]["question"], hit["exchange"]) == (
                answer[0], "answer to the question asked again", question[0], [after[0]])

    run(body())


def test_a_message_hit_carries_its_exchange_within_the_budget(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("which hiking trail should I try this weekend?", conv="c0", at=T0)
            await w.say("Try the Eagle Ridge loop: the views are the best around.", conv="c0", role="assistant",
                        at=T0 + timedelta(seconds=1))
            result = await w.recall("hiking trail", conv="c1")
            assert lines(result.block) == [
                "1. [cross-session] user (2026-11-02): which hiking trail should I try this weekend? | assistant:"
                " Try the Eagle Ridge loop: the views are the best around."]
            answer = w.sql("SELECT id FROM messages WHERE role = 'assistant'")[0][0]
            assert result.log["hits"][0]["exchange"] == [answer]
            assert result.log["hits"][0]["tokens"] == 39  # the whole line, exchange included
            # The answer does not fit a budget that holds the question alone: the line is the question's.
            tight = await w.recall("hiking trail", conv="c1", max_tokens=60)
            assert lines(tight.block) == ["1. [cross-session] user (2026-11-02): which hiking trail should I try"
                                          " this weekend?"]
            assert "exchange" not in tight.log["hits"][0]
            # An answer the request already shows is not carried again.
            shown = await w.recall("hiking trail", conv="c1",
                                   visible=["Try the Eagle Ridge loop: the views are the best around."])
            assert lines(shown.block) == ["1. [cross-session] user (2026-11-02): which hiking trail should I try"
                                          " this weekend?"]

    run(body())


def test_a_hit_said_next_to_a_better_one_joins_its_line_and_gives_its_slot_back(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            said = ["We packed the car at dawn.", "The kayak trip to Lisbon was windy.", "More kayak trip photos.",
                    "Then we drove home."]
            for n, text in enumerate(said):
                await w.say(text, conv="c0", at=T0 + timedelta(seconds=n))
            await w.say("A kayak rental in Porto.", conv="c2", at=day(-1))
            result = await w.recall("the kayak trip", conv="c1", limit=2)
            # The Lisbon message ranks second but was said just before the first hit: it joins that
            # line, the Porto message takes the second slot, and the joined line still carries the
            # turns around both.
            assert lines(result.block) == [
                "1. [cross-session] user (2026-11-02): We packed the car at dawn. | user: The kayak trip to Lisbon"
                " was windy. | user: More kayak trip photos. | user: Then we drove home.",
                "2. [cross-session] user (2026-11-01): A kayak rental in Porto."]
            ids = {text: w.sql("SELECT id FROM messages WHERE content = ?", (text,))[0][0] for text in said}
            assert result.log["hits"][0]["id"] == ids[said[2]]
            assert result.log["hits"][0]["exchange"] == [ids[said[0]], ids[said[1]], ids[said[3]]]

    run(body())


@pytest.mark.parametrize("limit", [None, 5])
def test_cross_session_ties_go_to_the_most_recent_conversation(tmp_path: Path, limit: int | None) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("the wifi password is on the fridge", conv="old", at=day(-9))
            await w.say("the wifi password is on the fridge", conv="recent", at=day(-1))
            result = await w.recall("wifi password", conv="now", cross_session_limit=limit)
            # The same text never twice: the copy kept is the recent conversation's.
            assert lines(result.block) == ["1. [cross-session] user (2026-11-01): the wifi password is on the fridge"]

    run(body())


def test_cross_session_limit_keeps_the_most_recent_conversations(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            for n, conv in enumerate(["a", "b", "c"]):
                await w.say(f"gardening tip {conv}", conv=conv, at=day(n))
            await w.say("gardening question", conv="now", at=day(5))
            texts = {limit: [line.rsplit(" ", 1)[-1] for line in lines((await w.recall(
                "gardening tip", conv="now", cross_session_limit=limit)).block) if "[cross-session]" in line]
                for limit in (None, 2, 0)}
            assert texts == {None: ["c", "b", "a"], 2: ["c", "b"], 0: []}

    run(body())


# --- the merge ----------------------------------------------------------------------------


@pytest.mark.parametrize(("asked", "injected"), [(3, 3), (6, 6), (12, 12), (40, 12), (0, 0)])
def test_max_memories_and_the_hard_cap(tmp_path: Path, asked: int, injected: int) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            for n in range(8):
                w.entity(f"Lighthouse {n}", "place", "a lighthouse on the coast")
                await w.say(f"lighthouse visit number {n}", conv="c1", at=T0 + timedelta(minutes=n))
                await w.say(f"lighthouse photo album {n}", conv=f"other{n}", at=day(-1) + timedelta(minutes=n))
            result = await w.recall("lighthouse", conv="c1", limit=asked, graph_expansion_limit=0)
            assert result.injected == injected == len(lines(result.block))
            assert sources(result)[:3] == ["long-term", "conversation", "cross-session"][:injected]

    run(body())


def test_budget_cuts_and_says_so(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            filler = " ".join(f"word{n}" for n in range(300))
            for n in range(6):
                await w.say(f"harbour schedule {n}: {filler}", conv=f"c{n}", at=day(-n))
            result = await w.recall("harbour schedule", conv="now", max_tokens=200)
            assert result.log["budget_cut"] is True
            assert len(result.block) <= 200 * 4
            assert "…" in result.block
            assert result.injected == len(lines(result.block)) == len(result.log["hits"])
            roomy = await w.recall("harbour schedule", conv="now", max_tokens=100_000)
            assert roomy.log["budget_cut"] is False

    run(body())


def test_same_store_same_query_same_bytes(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            alice = w.entity("Alice", "user", "likes sailing")
            boat = w.entity("Seabird", "boat", "a small sailing boat")
            w.edge(alice, "OWNS", boat)
            for n in range(20):
                # Equal scores everywhere: only the tie-breaks decide the order.
                await w.say("sailing on Sunday", conv=f"c{n % 4}", at=T0)
            first = await w.recall("do I go sailing on my boat?", conv="c0", limit=12)
            second = await w.recall("do I go sailing on my boat?", conv="c0", limit=12)
            assert first.block and first.block == second.block
            assert first.log["hits"] == second.log["hits"]

    run(body())


# --- long-term and graph ------------------------------------------------------------------


def test_first_person_question_reaches_the_users_own_node(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            me = w.entity("Alice Chen", "user", "the user")
            acme = w.entity("Acme", "organization", "")
            w.edge(me, "WORKS_AT", acme)
            w.edge(me, "LIVES_IN", w.entity("Lisbon", "place"))
            result = await w.recall("where do I work?")
            # Only the relationship asked about: where Alice lives answers nothing here.
            assert lines(result.block) == ["1. [graph] (Alice Chen)-[WORKS_AT]->(Acme)", GRAPH_NOTE]
            assert lines((await w.recall("where do I live?")).block)[0] == "1. [graph] (Alice Chen)-[LIVES_IN]->(Lisbon)"
            assert "[long-term]" not in result.block  # the node itself matched nothing
            # Not in the first person: the node is nobody's hit.
            assert (await w.recall("where does the team work?")).block == ""

    run(body())


def test_graph_keeps_current_named_edges_five_per_entity(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            hub = w.entity("Orbit", "project", "the orbit project")
            w.edge(hub, "USED", w.entity("Perl", "language"), invalid_at=T0)
            w.edge(hub, "DEPENDS_ON", w.entity("", "thing"))  # target without a name
            for n in range(7):
                w.edge(hub, "USES", w.entity(f"Lib{n}", "library"), at=T0 + timedelta(hours=n))
            w.edge(hub, "OWNED_BY", w.entity("Platform Team", "team"), at=day(-30))
            result = await w.recall("who owns the orbit project?", graph_expansion_limit=1)
            graph = [line.split("] ", 1)[1] for line in lines(result.block) if ". [graph] " in line]
            # Most query terms shared first, then the newest; 5 at most.
            assert graph == ["(Orbit)-[OWNED_BY]->(Platform Team)", "(Orbit)-[USES]->(Lib6)",
                             "(Orbit)-[USES]->(Lib5)", "(Orbit)-[USES]->(Lib4)", "(Orbit)-[USES]->(Lib3)"]
            assert (await w.recall("orbit project", graph_expansion_limit=0)).log["hits"][0]["source"] == "long-term"
            assert "[graph]" not in (await w.recall("orbit project", graph_expansion_limit=0)).block

    run(body())


class FailingRelationships(SQLiteStore):
    """A store whose graph lookup fails for one entity."""

    def __init__(self, path: str, broken: str) -> None:
        super().__init__(path)
        self.broken = broken

    async def relationships(self, scope: Scope, entity_id: str, *, current_only: bool = True,
                            limit: int | None = None) -> list[Relationship]:
        if entity_id == self.broken:
            raise StoreError("disk I/O error")
        return await super().relationships(scope, entity_id, current_only=current_only, limit=limit)


def test_an_entity_that_fails_to_expand_is_skipped(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            kiwi = w.entity("Kiwi Cafe", "place", "cafe downtown")
            mango = w.entity("Mango Cafe", "place", "cafe uptown")
            w.edge(kiwi, "NEAR", w.entity("Station", "place"))
            w.edge(mango, "NEAR", w.entity("Harbour", "place"))
            broken = FailingRelationships(str(w.path), kiwi)
            await broken.open()
            try:
                result = await w.recall("which cafe?", store=broken)
            finally:
                await broken.close()
            assert "(Mango Cafe)-[NEAR]->(Harbour)" in result.block
            assert "Station" not in result.block and "Kiwi Cafe" in result.block
            assert result.log["errors"] == {}

    run(body())


# --- keyword retry ------------------------------------------------------------------------


class AllTermsStore(SQLiteStore):
    """A store whose text match needs every query term, as a phrase-style backend does."""

    matches_any_term = False

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.searches: list[tuple[str, tuple[str, ...]]] = []

    async def search_messages(self, scope: Scope, terms: Sequence[str], **kwargs: Any
                              ) -> list[tuple[StoredMessage, float]]:
        self.searches.append(("messages", tuple(terms)))
        rows = await super().search_messages(scope, terms, **kwargs)
        return [(m, s) for m, s in rows if set(terms) <= set(index_terms(m.content))]

    async def search_entities(self, scope: Scope, terms: Sequence[str], *, limit: int = 20
                              ) -> list[tuple[Entity, float]]:
        self.searches.append(("entities", tuple(terms)))
        rows = await super().search_entities(scope, terms, limit=limit)
        return [(e, s) for e, s in rows if set(terms) <= set(index_terms(f"{e.name} {e.type} {e.description}"))]


def test_keyword_retry_fires_only_when_the_full_query_finds_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("Lunch at the Peruvian restaurant was great", at=T0)
            await w.say("the restaurant near the office closes at nine", at=T0 + timedelta(minutes=1))
            w.entity("Casa Peru", "restaurant", "Peruvian restaurant the user loves")
            store = AllTermsStore(str(w.path))
            await store.open()
            try:
                # No message holds every word: the retry finds them, most shared words first.
                retried = await w.recall("which Peruvian restaurant did we like?", store=store,
                                         cross_session_limit=0, graph_expansion_limit=0)
                conversation = [h for h in retried.log["hits"] if h["source"] == "conversation"]
                # The second was said just after the first: it joins the first's line.
                assert [h["reason"] for h in conversation] == ["keyword retry"]
                assert len(conversation[0]["exchange"]) == 1
                # The entity shares two of the three terms: a weak hit, after the messages.
                assert lines(retried.block)[0] == ("1. [conversation] user (2026-11-02): Lunch at the Peruvian"
                                                   " restaurant was great | user: the restaurant near the office"
                                                   " closes at nine")
                assert "[long-term] Casa Peru" in lines(retried.block)[1]
                assert ("messages", ("peruvian",)) in store.searches
                assert ("entities", ("restaur",)) in store.searches
                # The full query finds something: no retry, and only what it found.
                store.searches.clear()
                direct = await w.recall("Peruvian restaurant", store=store, cross_session_limit=0,
                                        graph_expansion_limit=0)
                assert {h["reason"] for h in direct.log["hits"]} == {"rank"}
                # Only what it found is a hit; the next turn rides along as its exchange.
                assert [line for line in lines(direct.block) if "[conversation]" in line] == [
                    "2. [conversation] user (2026-11-02): Lunch at the Peruvian restaurant was great"
                    " | user: the restaurant near the office closes at nine"]
                assert store.searches.count(("messages", ("peruvian", "restaur"))) == 1
                assert ("messages", ("peruvian",)) not in store.searches
            finally:
                await store.close()

    run(body())


class AnyTermStore(SQLiteStore):
    """The SQLite store declaring what its search does: a row holding any one term matches."""

    matches_any_term = True

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.searched: list[tuple[str, ...]] = []

    async def search_messages(self, scope: Scope, terms: Sequence[str], **kwargs: Any
                              ) -> list[tuple[StoredMessage, float]]:
        self.searched.append(tuple(terms))
        return await super().search_messages(scope, terms, **kwargs)


def test_keyword_retry_skipped_where_it_cannot_find_more(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("the lighthouse keeper retired", conv="c0")
            store = AnyTermStore(str(w.path))
            await store.open()
            try:
                result = await w.recall("which Peruvian restaurant did we like?", store=store, conv="c1")
                assert result.block == ""
                # One search per message source: retrying "Peruvian" alone cannot match more
                # than "peruvian OR restaurant OR like" did.
                assert store.searched == [("peruvian", "restaur", "like")] * 2
            finally:
                await store.close()

    run(body())


# --- identifier trigger -------------------------------------------------------------------


def test_identifier_trigger_puts_the_holder_first(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            for n in range(60):
                await w.say(f"deploy deploy staging pipeline run {n}", conv="ops", at=T0 + timedelta(minutes=n))
            # Written with other separators: the same whole-identifier index term.
            await w.say("long ago we pointed deploys at internal_hbr_2291.example for a while", conv="ops",
                        at=day(-40))
            question = "deploy staging pipeline to internal-hbr-2291.example?"
            result = await w.recall(question, conv="now", limit=3)
            first = result.log["hits"][0]
            assert first["reason"] == "identifier trigger"
            assert "internal_hbr_2291.example" in lines(result.block)[0]
            # Shown in the transcript already: nothing to trigger, BM25 order stands.
            seen = await w.recall(question, conv="now", limit=3,
                                  visible=["we used internal-hbr-2291.example yesterday"])
            assert {hit["reason"] for hit in seen.log["hits"]} == {"rank"}

    run(body())


def test_identifier_trigger_promotes_within_a_source(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("the build flag is ENABLE_FAST_PATH and the build is green", conv="a", at=day(-2))
            await w.say("build build build: the build passed", conv="b", at=day(-1))
            result = await w.recall("is the build using ENABLE_FAST_PATH?", conv="now")
            assert lines(result.block)[0].endswith("the build flag is ENABLE_FAST_PATH and the build is green")
            assert result.log["hits"][0]["reason"] == "identifier trigger"

    run(body())


# --- faults and isolation -----------------------------------------------------------------


class FailingSearch(SQLiteStore):
    """A store whose named searches raise."""

    def __init__(self, path: str, failing: set[str]) -> None:
        super().__init__(path)
        self.failing = failing

    async def search_reasoning(self, scope: Scope, terms: Sequence[str], *, limit: int = 20
                               ) -> list[tuple[ReasoningTrace, float]]:
        if "reasoning" in self.failing:
            raise StoreError("database disk image is malformed")
        return await super().search_reasoning(scope, terms, limit=limit)

    async def search_messages(self, scope: Scope, terms: Sequence[str], **kwargs: Any
                              ) -> list[tuple[StoredMessage, float]]:
        if "messages" in self.failing:
            raise StoreError("database is locked")
        return await super().search_messages(scope, terms, **kwargs)

    async def search_entities(self, scope: Scope, terms: Sequence[str], *, limit: int = 20
                              ) -> list[tuple[Entity, float]]:
        if "entities" in self.failing:
            raise ValueError("a bug in the entity search")
        return await super().search_entities(scope, terms, limit=limit)


def test_a_failing_source_leaves_the_others_answering(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("the kayak rental opens at eight", conv="c0")
            w.entity("Kayak Club", "organization", "kayak rental by the lake")
            store = FailingSearch(str(w.path), {"reasoning", "entities"})
            await store.open()
            try:
                result = await w.recall("kayak rental", store=store)
                assert lines(result.block) == ["1. [cross-session] user (2026-11-02): the kayak rental opens at eight"]
                assert set(result.log["errors"]) == {"reasoning", "long-term"}
                assert result.log["errors"]["reasoning"].startswith("StoreError: database disk image")
                # Every source failing is an outage, not an empty memory: the pipeline degrades.
                store.failing = {"reasoning", "entities", "messages"}
                with pytest.raises(StoreError):
                    await w.recall("kayak rental", store=store)
            finally:
                await store.close()

    run(body())


def test_another_users_memory_never_appears(tmp_path: Path) -> None:
    steps = (ReasoningStep("lookup", f'{{"q": "{CANARY}"}}', CANARY),)

    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say(f"my secret word is {CANARY}", conv="c1", scope=BOB)
            await w.say(f"noted {CANARY}", conv="c1", role="assistant", scope=BOB, task=CANARY, steps=steps)
            await w.say(f"{CANARY} again", conv="c2", scope=BOB)
            bob = w.entity("Bob", "user", f"{CANARY} lover", user="bob")
            w.edge(bob, "LIKES", w.entity(CANARY.title(), "animal", CANARY, user="bob"), user="bob")
            await w.say("hello there", conv="c1")
            for conv in ("c1", "c2", "c3"):
                result = await w.recall(f"what is my {CANARY}?", conv=conv, limit=12)
                assert result.block == "" and CANARY not in repr(result.log)
            assert CANARY in (await w.recall(f"what is my {CANARY}?", conv="c3", scope=BOB)).block

    run(body())


# --- bounds, metrics, log -----------------------------------------------------------------


def test_a_huge_query_costs_bounded_time(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("the quarterly report draft is in the shared drive", conv="c0")
            huge = "quarterly report " + " ".join(f"filler{n % 5000}" for n in range(600_000)) + " shared drive"
            assert len(huge) > 5_000_000
            started = time.perf_counter()
            result = await w.recall(huge, conv="c1", visible=[huge[:1000]])
            assert time.perf_counter() - started < 2.0
            assert "quarterly report draft" in result.block

    run(body())


def test_cut_query_keeps_head_and_tail() -> None:
    assert cut_query("short question") == "short question"
    text = "alpha " * 1000 + "middle " * 1000 + "omega " * 1000
    cut = cut_query(text)
    assert cut.startswith("alpha") and cut.rstrip().endswith("omega") and "middle" not in cut
    assert len(cut) <= 4001


def test_log_entry_and_metrics(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("the bike lock code is 4412", conv="c0")
            metrics = Metrics()
            result = await w.recall("bike lock code", metrics=metrics)
            [hit] = result.log["hits"]
            assert set(hit) == {"source", "id", "reason", "score", "tokens"}
            assert hit["score"]["bm25"] > 0 and hit["score"]["rank"] == 1
            assert hit["tokens"] == -(-len(lines(result.block)[0]) // 4)
            assert set(result.log["sources_ms"]) == {"long-term", "conversation", "cross-session", "reasoning"}
            assert result.log["budget_cut"] is False and result.log["cache"] is False
            for source in ("long-term", "conversation", "cross-session", "reasoning"):
                count = metrics.registry.get_sample_value("memproxy_retrieval_seconds_count", {"source": source})
                assert count == 1

    run(body())


def test_relevance_floor_drops_weak_matches(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            for n in range(30):
                await w.say(f"note {n} about the weather", conv="c0")
            await w.say("the weather station antenna needs a new cable", conv="c0")
            loose = await w.recall("weather antenna cable", conv="c1", limit=12)
            strict = await w.recall("weather antenna cable", conv="c1", limit=12, relevance_floor=1.0)
            assert len(loose.log["hits"]) > 1
            # One hit, carrying the turn said just before it.
            assert lines(strict.block) == ["1. [cross-session] user (2026-11-02): note 29 about the weather | user:"
                                           " the weather station antenna needs a new cable"]

    run(body())



class HangingSearch(SQLiteStore):
    """A store whose reasoning search does not answer for a long time (a locked page, a slow disk)."""

    async def search_reasoning(self, scope: Scope, terms: Sequence[str], *, limit: int = 20
                               ) -> list[tuple[ReasoningTrace, float]]:
        await asyncio.sleep(5)
        return await super().search_reasoning(scope, terms, limit=limit)


def test_a_hanging_source_is_cut_at_its_deadline_and_the_others_still_make_the_block(tmp_path: Path) -> None:
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("the kayak rental opens at eight", conv="c0")
            store = HangingSearch(str(w.path))
            await store.open()
            try:
                started = time.perf_counter()
                result = await w.recall("kayak rental", store=store, retrieval_timeout_ms=400)
                elapsed = time.perf_counter() - started
                assert 0.3 <= elapsed < 1.0  # cut at the sources' share of the budget (0.32 s), not after the 5 s hang
                assert lines(result.block) == ["1. [cross-session] user (2026-11-02): the kayak rental opens at eight"]
                assert result.log["errors"] == {"reasoning": "TimeoutError: no answer before the deadline"}
            finally:
                await store.close()

    run(body())


def test_a_recall_cancelled_while_a_source_hangs_is_cancelled_not_cut_at_the_deadline(tmp_path: Path) -> None:
    """The sources' deadline turns only its own cancellation into a timeout: a recall cancelled from
    outside (the client gone) ends cancelled at once, and the deadline firing later changes nothing."""
    async def body() -> None:
        async with world(tmp_path) as w:
            await w.say("the kayak rental opens at eight", conv="c0")
            store = HangingSearch(str(w.path))
            await store.open()
            try:
                recall = asyncio.ensure_future(w.recall("kayak rental", store=store, retrieval_timeout_ms=400))
                await asyncio.sleep(0.1)  # the other sources answered; reasoning's search hangs
                recall.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await recall
                await asyncio.sleep(0.3)  # past the deadline: nothing left running to cancel
                assert recall.cancelled()
                assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
            finally:
                await store.close()

    run(body())


def test_a_statement_that_starts_like_a_question_is_no_question_asked_again(tmp_path: Path) -> None:
    """"when I was six I broke my left arm" is a fact, not a question typed without its "?": asked
    about again, the fact keeps its line (with its exchange) and the reply does not replace it."""
    async def body() -> tuple[str, list[str | None]]:
        async with world(tmp_path) as w:
            await w.say("when I was six I broke my left arm", conv="c0", at=day(-3))
            await w.say("Ouch, that sounds painful!", conv="c0", role="assistant", at=day(-3) + timedelta(seconds=1))
            r = await w.recall("did I tell you that when I was six I broke my left arm?", conv="now")
            return r.block, [h.get("reason") for h in r.log["hits"]]

    block, reasons = run(body())
    assert "user (" in block and "when I was six I broke my left arm | assistant" in block
    assert "answer to the question asked again" not in reasons


def test_a_question_whose_answer_is_gone_brings_no_other_message(tmp_path: Path) -> None:
    """The message said after a question is its answer only when it is the assistant's: with the
    answer deleted, the user's next words are not passed off as it."""
    async def body() -> str:
        async with world(tmp_path) as w:
            await w.say("what is my cat called", conv="c0", at=day(-2))
            await w.say("Biscuit, the tabby.", conv="c0", role="assistant", at=day(-2) + timedelta(seconds=1))
            await w.say("my bank is Monzo and I moved to Leeds", conv="c0", at=day(-2) + timedelta(seconds=2))
            (answer,) = w.sql("SELECT id FROM messages WHERE content LIKE 'Biscuit%'")
            await w.store.delete_item(ALICE, "message", answer[0])
            return (await w.recall("What is my cat called?", conv="now")).block

    assert "Monzo" not in run(body())
