"""Deleting messages takes what was derived only from them, in the Store contract, on both
backends (stores/provenance.py): a conversation's deletion leaves no entity, edge,
description or alias that only its messages said.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from proxy.models import Scope
from proxy.stores.base import EntityFact, RecordFacts, RelationFact, StartTurn, Store
from proxy.stores.provenance import Drop, KeepEntity, entity_change
from proxy.terms import query_terms
from tests.store_backends import Backend, backend  # noqa: F401  (the fixture)

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ALICE = Scope("alice")
BOB = Scope("bob")
CODEWORD = "swordfish"
SECRET_SENTENCE = f"My locker codeword is {CODEWORD} and ACME is my employer."


async def say(store: Store, scope: Scope, message_id: str, conversation: str, day: int, text: str,
              entities: tuple[EntityFact, ...], relations: tuple[RelationFact, ...] = ()) -> None:
    at = T0 + timedelta(days=day)
    await store.apply([StartTurn(scope, f"t-{message_id}", conversation, f"h-{message_id}", at, text,
                                 message_id=message_id)])
    await store.apply([RecordFacts(scope, None, message_id, entities, relations, at, "User")])


async def history(store: Store, scope: Scope = ALICE) -> None:
    """Acme said in two conversations; the codeword only in the one that is deleted."""
    await say(store, scope, "m-rockets", "kept", 0, "Acme makes rockets.",
              (EntityFact("Acme", "organization", "Acme makes rockets."), EntityFact("Rockets", "product", "")),
              (RelationFact("Acme", "MAKES", "Rockets"),))
    await say(store, scope, "m-secret", "gone", 1, SECRET_SENTENCE,
              (EntityFact("ACME", "organization", SECRET_SENTENCE),
               EntityFact("Swordfish", "codeword", SECRET_SENTENCE)),
              (RelationFact("User", "WORKS_AT", "ACME"), RelationFact("User", "KNOWS", "Swordfish")))
    await say(store, scope, "m-hired", "kept", 2, "Acme hired me.",
              (EntityFact("Acme", "organization", "Acme hired me."),), (RelationFact("User", "WORKS_AT", "Acme"),))


async def graph(backend: Backend, user: str = "alice") -> dict[str, tuple[str, list[str], list[str]]]:
    rows = await backend.sql("SELECT name, description, aliases, provenance FROM entities WHERE user_id = ?"
                             " ORDER BY name", user)
    return {name: (description, json.loads(aliases), json.loads(provenance))
            for name, description, aliases, provenance in rows}


async def edges(backend: Backend, user: str = "alice") -> list[tuple[str, str, str, list[str]]]:
    rows = await backend.sql(
        "SELECT f.name, r.type, t.name, r.provenance FROM relationships r JOIN entities f ON f.user_id = r.user_id"
        " AND f.id = r.from_id JOIN entities t ON t.user_id = r.user_id AND t.id = r.to_id WHERE r.user_id = ?"
        " ORDER BY r.type", user)
    return [(f, t, to, json.loads(p)) for f, t, to, p in rows]


def test_a_conversations_deletion_takes_what_only_its_messages_said(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await history(store)
            await history(store, BOB)
            assert (await graph(backend))["Acme"] == (
                f"Acme makes rockets. | {SECRET_SENTENCE} | Acme hired me.", ["ACME"],
                ["m-rockets", "m-secret", "m-hired"])
            counts = await store.delete_item(ALICE, "conversation", "gone")
            assert counts is not None and (counts["entities"], counts.get("relationships", 0)) == (1, 1)
            assert await graph(backend) == {
                "Acme": ("Acme makes rockets. | Acme hired me.", [], ["m-rockets", "m-hired"]),
                "Rockets": ("", [], ["m-rockets"]),
                "User": ("", [], ["m-rockets", "m-hired"]),
            }
            assert await edges(backend) == [("Acme", "MAKES", "Rockets", ["m-rockets"]),
                                            ("User", "WORKS_AT", "Acme", ["m-hired"])]
            # Nothing of the deleted words is exported or found any more; bob's graph is his.
            exported = json.dumps([record async for record in store.export(ALICE)])
            assert CODEWORD not in exported.lower() and "locker" not in exported.lower()
            assert await store.search_entities(ALICE, query_terms(f"locker codeword {CODEWORD}")) == []
            assert [e.name for e, _ in await store.search_entities(ALICE, query_terms("who hired"))] == ["Acme"]
            assert "Swordfish" in await graph(backend, "bob")
            assert len(await edges(backend, "bob")) == 3

    asyncio.run(body())


def test_a_messages_deletion_takes_what_only_it_said(backend: Backend) -> None:
    async def body() -> None:
        async with backend.opened() as store:
            await history(store)
            await store.delete_item(ALICE, "message", "m-rockets")
            entities = await graph(backend)
            assert sorted(entities) == ["Acme", "Swordfish", "User"]
            assert entities["Acme"] == (f"{SECRET_SENTENCE} | Acme hired me.", ["ACME"], ["m-secret", "m-hired"])
            assert [edge[1] for edge in await edges(backend)] == ["KNOWS", "WORKS_AT"]

    asyncio.run(body())


def test_a_rules_note_on_a_remaining_sentence_stays() -> None:
    row = {"seq": 7, "name": "Miso", "type": "pet", "aliases": "[]", "provenance": json.dumps(["m1", "m2"]),
           "description": "cat; I live with my cat Miso. | kitten; My cat Miso guards the vault code 4471."}
    change = entity_change(row, {"m2"}, ["I live with my cat Miso."])
    assert isinstance(change, KeepEntity)
    assert (change.description, change.provenance) == ("cat; I live with my cat Miso.", '["m1"]')
    assert entity_change(row, {"m1", "m2"}, []) == Drop(7)
