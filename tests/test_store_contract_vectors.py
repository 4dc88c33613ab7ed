"""The Store contract for embeddings, run against both backends (SQLite file, PostgreSQL schema).

What needs a vector, saving one only while its item still reads the embedded text, reading
a user's vectors back bit for bit, and the items a vector names, filtered as searches are.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

from proxy.models import ReasoningStep, Scope
from proxy.stores.base import FinishTurn, NewEmbedding, StartTurn
from tests.store_backends import Backend, backend  # noqa: F401  (the fixture)

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ALICE = Scope("alice")
BOB = Scope("bob")
MODEL = "embed-small"


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def vec(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


async def teach(store: Any, scope: Scope, key: str, text: str, answer: str, *, conv: str = "c1",
                steps: tuple[ReasoningStep, ...] = ()) -> None:
    await store.apply([StartTurn(scope, key, conv, f"h-{key}", T0, text),
                       FinishTurn(scope, key, conv, answer, T0 + timedelta(seconds=1), text, steps)])


def new(item: Any, vector: bytes) -> NewEmbedding:
    return NewEmbedding(item.scope.user, item.kind, item.item_id, item.text, vector)


def test_unembedded_lists_each_kind_until_its_vector_is_saved(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await teach(store, ALICE, "t1", "I sail catamarans", "Nice.", conv="a1",
                        steps=(ReasoningStep("lookup", "{}", "ok"),))
            await teach(store, BOB, "t2", "Bob's own words", "Sure.", conv="b1")
            eid = await backend.add_entity("alice", "Priya", "person", "sister who sails")
            messages = await store.unembedded(MODEL, "message")
            assert [(m.scope.user, m.text, m.group) for m in messages] == [
                ("alice", "I sail catamarans", "a1"), ("alice", "Nice.", "a1"),
                ("bob", "Bob's own words", "b1"), ("bob", "Sure.", "b1")]
            assert [m.seq for m in messages] == sorted(m.seq for m in messages)
            assert [m.text for m in await store.unembedded(MODEL, "message", user="bob")] == [
                "Bob's own words", "Sure."]
            assert len(await store.unembedded(MODEL, "message", after=messages[1].seq, limit=1)) == 1
            assert [m.text for m in await store.unembedded(MODEL, "message", after=messages[0].seq,
                                                           upto=messages[2].seq)] == ["Nice.", "Bob's own words"]
            assert await store.unembedded(MODEL, "message", after=messages[3].seq, upto=messages[3].seq) == []
            entities = await store.unembedded(MODEL, "entity")
            assert [(e.item_id, e.text) for e in entities] == [(eid, "Priya sister who sails")]
            traces = await store.unembedded(MODEL, "reasoning")
            assert [(t.text, t.group) for t in traces] == [("I sail catamarans Nice.", "a1")]

            saved = await store.save_embeddings(MODEL, [new(messages[0], vec(1, 0)), new(entities[0], vec(0, 1)),
                                                        new(traces[0], vec(0.5, 0.5))])
            assert saved == 3
            assert [m.text for m in await store.unembedded(MODEL, "message")] == [
                "Nice.", "Bob's own words", "Sure."]
            assert await store.unembedded(MODEL, "entity") == []
            assert await store.unembedded(MODEL, "reasoning") == []
            assert len(await store.unembedded("other-model", "message")) == 4  # per model

    run(body())


def test_vectors_round_trip_per_user_and_replace_on_a_second_save(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await teach(store, ALICE, "t1", "alpha words", "beta words", conv="a1")
            await teach(store, BOB, "t2", "gamma words", "delta words", conv="b1")
            items = await store.unembedded(MODEL, "message")
            exact = vec(0.1, -2.5, 3.25e-8)
            assert await store.save_embeddings(MODEL, [new(i, exact) for i in items]) == 4
            alice = await store.vectors(ALICE, "message", MODEL)
            assert len(alice) == 2 and all(v.vector == exact and v.group == "a1" for v in alice)
            # In the order they were saved (their seq), and from a seq on: what a cache lacks.
            assert sorted(v.item_id for v in alice) == sorted(i.item_id for i in items if i.scope.user == "alice")
            assert alice[0].seq < alice[1].seq
            assert [v.item_id for v in await store.vectors(ALICE, "message", MODEL, after=alice[0].seq)] == [
                alice[1].item_id]
            marks = await store.vector_marks(ALICE, MODEL)
            assert list(marks) == ["message"] and marks["message"].seq == max(v.seq for v in alice)
            assert {v.item_id for v in await store.vectors(BOB, "message", MODEL)} == {
                i.item_id for i in items if i.scope.user == "bob"}
            assert await store.vectors(ALICE, "message", "other-model") == []
            assert await store.vectors(ALICE, "entity", MODEL) == []
            assert await store.save_embeddings(MODEL, [new(items[0], vec(9, 9, 9))]) == 1
            again = {v.item_id: v.vector for v in await store.vectors(ALICE, "message", MODEL)}
            assert again[items[0].item_id] == vec(9, 9, 9)

    run(body())


def test_a_vector_is_numbered_above_every_one_before_even_once_the_newest_were_deleted(backend: Backend) -> None:
    """A process's cached vectors are current to a mark (the newest seq it read): a seq coming
    again, after the newest rows were deleted, would put a new vector at or below that mark."""
    async def body() -> None:
        async with backend.opened() as store:
            for n in range(4):
                await teach(store, ALICE, f"t{n}", f"words {n}", f"answer {n}", conv=f"c{n}")
            items = await store.unembedded(MODEL, "message")
            assert await store.save_embeddings(MODEL, [new(i, vec(1, 0)) for i in items[:6]]) == 6
            cached = (await store.vector_marks(ALICE, MODEL))["message"].seq
            for conversation in ("c1", "c2"):  # the newest vectors go with their conversations
                assert await store.delete_item(ALICE, "conversation", conversation) is not None
            assert (await store.vector_marks(ALICE, MODEL))["message"].seq < cached
            assert await store.save_embeddings(MODEL, [new(i, vec(0, 1)) for i in items[6:]]) == 2
            assert (await store.vector_marks(ALICE, MODEL))["message"].seq > cached
            assert [v.item_id for v in await store.vectors(ALICE, "message", MODEL, after=cached)] == [
                i.item_id for i in items[6:]]

    run(body())


def test_a_vector_of_changed_or_deleted_text_is_not_kept(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await teach(store, ALICE, "t1", "my editor is Helix", "Noted.")
            eid = await backend.add_entity("alice", "Helix", "editor", "a modal editor")
            (entity,) = await store.unembedded(MODEL, "entity")
            assert await store.update_memory(ALICE, eid, "a terminal editor") == "entity"
            # Embedded before the edit, saved after it: it describes text the item no longer has.
            assert await store.save_embeddings(MODEL, [new(entity, vec(1, 1))]) == 0
            (entity,) = await store.unembedded(MODEL, "entity")
            assert entity.text == "Helix a terminal editor"
            assert await store.save_embeddings(MODEL, [new(entity, vec(1, 1))]) == 1
            # An edit drops the vector (the trigger), so the item is listed again.
            assert await store.update_memory(ALICE, eid, "an editor written in Rust") == "entity"
            assert await store.vectors(ALICE, "entity", MODEL) == []
            assert len(await store.unembedded(MODEL, "entity")) == 1
            messages = await store.unembedded(MODEL, "message")
            assert await store.save_embeddings(MODEL, [new(m, vec(1, 0)) for m in messages]) == 2
            assert await store.delete_item(ALICE, "message", messages[0].item_id) is not None
            assert [v.item_id for v in await store.vectors(ALICE, "message", MODEL)] == [messages[1].item_id]
            gone = NewEmbedding("alice", "message", "no-such-id", "x", vec(1, 0))
            assert await store.save_embeddings(MODEL, [gone]) == 0

    run(body())


def test_embedded_items_are_the_users_own_with_a_vector_and_the_right_agent(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await teach(store, ALICE, "t1", "alice one", "alice two", conv="a1")
            await teach(store, BOB, "t2", "bob one", "bob two", conv="b1")
            await teach(store, Scope("alice", agent="coder"), "t3", "agent words", "agent answer", conv="a2",
                        steps=(ReasoningStep("run", "{}", "ok"),))
            items = await store.unembedded(MODEL, "message")
            embedded = [i for i in items if i.text != "alice two"]
            await store.save_embeddings(MODEL, [new(i, vec(1, 0)) for i in embedded])
            ids = [i.item_id for i in items]
            found = await store.embedded_items(ALICE, "message", ids, MODEL)
            assert sorted(m.content for m in found) == ["agent answer", "agent words", "alice one"]
            assert [m.id for m in found] == sorted(m.id for m in found)
            isolated = Scope("alice", agent="coder", agent_isolated=True)
            assert sorted(m.content for m in await store.embedded_items(isolated, "message", ids, MODEL)) == [
                "agent answer", "agent words"]
            assert sorted(m.content for m in await store.embedded_items(BOB, "message", ids, MODEL)) == [
                "bob one", "bob two"]
            assert await store.embedded_items(ALICE, "message", ids, "other-model") == []
            assert await store.embedded_items(ALICE, "message", [], MODEL) == []
            (trace,) = await store.unembedded(MODEL, "reasoning")
            await store.save_embeddings(MODEL, [new(trace, vec(0, 1))])
            assert [t.task for t in await store.embedded_items(Scope("alice", agent="coder"), "reasoning",
                                                                [trace.item_id], MODEL)] == ["agent words"]
            # Reasoning is per agent whenever an agent is set.
            assert await store.embedded_items(Scope("alice", agent="other"), "reasoning", [trace.item_id], MODEL) == []
            vectors = await store.vectors(ALICE, "message", MODEL)
            assert {(v.group, v.agent) for v in vectors} == {("a1", None), ("a2", "coder")}
            # An item read back is the one a search finds, every field of it.
            ((searched, _),) = await store.search_messages(ALICE, ["one"], conversation_ids=["a1"])
            assert await store.embedded_items(ALICE, "message", [searched.id], MODEL) == [searched]
            eid = await backend.add_entity("alice", "Priya", "person", "sister who sails")
            (entity,) = await store.unembedded(MODEL, "entity")
            await store.save_embeddings(MODEL, [new(entity, vec(1, 1))])
            ((priya, _),) = await store.search_entities(ALICE, ["priya"])
            assert priya.id == eid and await store.embedded_items(ALICE, "entity", [eid], MODEL) == [priya]
            ((traced, _),) = await store.search_reasoning(Scope("alice", agent="coder"), ["agent"])
            assert await store.embedded_items(Scope("alice", agent="coder"), "reasoning", [traced.id], MODEL) == [
                traced]

    run(body())
