"""The graph's writes (RecordFacts, ExtractionFailed) and the extraction queue, on both backends.

Entity merge, the user's node, edges in time and the queue's claims, with the same
assertions against each backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from proxy.models import Entity, Scope
from proxy.stores.base import (
    EntityFact, ExtractionFailed, FinishTurn, QueuedMessage, RecordFacts, RelationFact, StartTurn, Store,
)
from proxy.stores.export_records import OBJECT_DESCRIPTION_HEAD_CHARS
from proxy.terms import query_terms
from tests.store_backends import Backend, backend  # noqa: F401  (the fixture)

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ALICE = Scope("alice")
BOB = Scope("bob")


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def at(days: int) -> datetime:
    return T0 + timedelta(days=days)


class Graph:
    """A store on one file, with messages said on given days and their facts recorded."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.turns = 0

    async def said(self, text: str, day: int = 0, scope: Scope = ALICE) -> QueuedMessage:
        self.turns += 1
        await self.store.apply([StartTurn(scope, f"t{self.turns}", "c1", f"h{self.turns}", at(day), text)])
        items = await self.store.claim_extraction(100, at(1000))
        return next(item for item in items if item.message.content == text and item.scope.user == scope.user)

    async def facts(self, item: QueuedMessage, entities: tuple[EntityFact, ...] = (),
                    relations: tuple[RelationFact, ...] = (), user_node: str | None = None,
                    scope: Scope | None = None, user_alias: str | None = None) -> None:
        await self.store.apply([RecordFacts(scope or item.scope, item.queue_id, item.message.id, entities, relations,
                                            item.message.created_at, user_node, user_alias)])

    async def tell(self, text: str, *entities: EntityFact, relations: tuple[RelationFact, ...] = (),
                   user_node: str | None = None, day: int = 0, scope: Scope = ALICE,
                   user_alias: str | None = None) -> str:
        item = await self.said(text, day, scope)
        await self.facts(item, entities, relations, user_node, scope, user_alias)
        return item.message.id

    async def entity(self, name: str, scope: Scope = ALICE) -> Entity:
        return next(e for e in await self.store.entities(scope) if e.name == name)

    async def edges(self, name: str, *, current_only: bool = True) -> list[tuple[str, str, str, float | None]]:
        entity = await self.entity(name)
        return [(r.from_name, r.type, r.to_name or "", r.invalid_at and r.invalid_at.timestamp())
                for r in await self.store.relationships(ALICE, entity.id, current_only=current_only)]


@asynccontextmanager
async def graph(backend: Backend) -> AsyncIterator[Graph]:
    async with backend.opened() as store:
        yield Graph(store)


def org(name: str, description: str = "", confidence: float = 0.7) -> EntityFact:
    return EntityFact(name, "organization", description, confidence)


WORKS_AT = "WORKS_AT"


def works_at(who: str, where: str) -> tuple[RelationFact, ...]:
    return (RelationFact(who, WORKS_AT, where, single_valued=True),)


def test_entities_merge_by_canonical_name_keeping_aliases_and_provenance(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            first = await g.tell("Acme Corp is great", org("Acme Corp", "Acme Corp is great", 0.6))
            second = await g.tell("ACME   corp hired me", org("ACME   corp", "ACME corp hired me", 0.9))
            third = await g.tell("Acme Corp's office", org("Acme Corp's", "Acme Corp is great", 0.5))
            (acme,) = await g.store.entities(ALICE)
            assert (acme.name, acme.type, acme.aliases) == ("Acme Corp", "organization", ("ACME corp", "Acme Corp's"))
            assert acme.description == "Acme Corp is great | ACME corp hired me"
            assert acme.provenance == (first, second, third)
            assert acme.confidence == 0.9
            assert [e.name for e, _ in await g.store.search_entities(ALICE, ["hire"])] == ["Acme Corp"]

    run(body())


def test_a_control_character_in_a_name_is_not_part_of_its_merge_key(backend: Backend) -> None:
    # Names can come from imports and other extractors, not only the model (whose names are
    # cleaned): a NUL in the merge key made PostgreSQL refuse the whole batch of facts.
    async def body() -> None:
        async with graph(backend) as g:
            await g.tell("Acme Corp is great", org("Acme\x00 Corp", "Acme Corp is great"))
            await g.tell("Acme Corp hired me", org("Acme\x07 Corp", "Acme Corp hired me"))
            await g.tell("ACME corp again", org("ACME corp", "ACME corp again"))
            (acme,) = await g.store.entities(ALICE)
            assert acme.description == "Acme Corp is great | Acme Corp hired me | ACME corp again"
            assert len(acme.provenance) == 3

    run(body())


def test_entities_are_per_user_and_per_agent_under_isolation(backend: Backend) -> None:
    planner = Scope("alice", agent="planner", agent_isolated=True)
    async def body() -> None:
        async with graph(backend) as g:
            await g.tell("Acme", org("Acme"))
            await g.tell("Acme", org("Acme"), scope=BOB)
            await g.tell("Acme too", org("Acme"), scope=planner)
            assert await backend.sql("SELECT user_id, agent_id FROM entities ORDER BY seq") == [
                ("alice", None), ("bob", None), ("alice", "planner")]
            assert [e.name for e in await g.store.entities(planner)] == ["Acme"]

    run(body())


def test_user_node_created_then_renamed_keeping_its_id_and_edges(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            await g.tell("I work at Northwind", org("Northwind"), relations=works_at("User", "Northwind"),
                         user_node="User")
            node = await g.entity("User")
            assert node.type == "user"
            await g.tell("My name is Dana Reyes", user_node="Dana Reyes", day=1)
            renamed = await g.entity("Dana Reyes")
            assert (renamed.id, renamed.type, renamed.aliases) == (node.id, "user", ())
            assert await g.edges("Dana Reyes") == [("Dana Reyes", WORKS_AT, "Northwind", None)]
            # Later first-person facts still say "User": they reach the renamed node.
            await g.tell("I like Oslo", EntityFact("Oslo", "place"), relations=(RelationFact("User", "LIKES", "Oslo"),),
                         user_node="User", day=2)
            assert [e.name for e in await g.store.entities(ALICE)] == ["Dana Reyes", "Northwind", "Oslo"]
            assert ("Dana Reyes", "LIKES", "Oslo", None) in await g.edges("Dana Reyes")

    run(body())


def test_stated_name_merges_an_entity_of_that_name_into_the_user_node(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            await g.tell("I work at Northwind", org("Northwind"), relations=works_at("User", "Northwind"),
                         user_node="User")
            mention = await g.tell("Dana Reyes knows Bo", EntityFact("Dana Reyes", "person", "Dana Reyes knows Bo"),
                                   EntityFact("Bo", "person"), relations=(RelationFact("Dana Reyes", "KNOWS", "Bo"),))
            node = await g.entity("User")
            await g.tell("call me dana reyes", user_node="dana reyes", day=1)
            names = [(e.name, e.type) for e in await g.store.entities(ALICE)]
            assert names == [("dana reyes", "user"), ("Northwind", "organization"), ("Bo", "person")]
            merged = await g.entity("dana reyes")
            assert merged.id == node.id and merged.aliases == ("Dana Reyes",)
            assert merged.description == "Dana Reyes knows Bo" and mention in merged.provenance
            assert sorted(await g.edges("dana reyes")) == [("dana reyes", "KNOWS", "Bo", None),
                                                           ("dana reyes", WORKS_AT, "Northwind", None)]

    run(body())


def test_a_stated_name_leaves_someone_the_user_knows_by_that_name_alone(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            await g.tell("My friend Tom lives in Berlin", EntityFact("Tom", "person"), EntityFact("Berlin", "place"),
                         relations=(RelationFact("User", "HAS_FRIEND", "Tom"), RelationFact("Tom", "LIVES_IN", "Berlin")),
                         user_node="User")
            node, friend = await g.entity("User"), await g.entity("Tom")
            await g.tell("My name is Tom too", user_node="Tom", day=1)
            assert [(e.name, e.type) for e in await g.store.entities(ALICE)] == [
                ("User", "user"), ("Tom", "person"), ("Berlin", "place")]
            me = await g.entity("User")
            assert (me.id, me.aliases) == (node.id, ("Tom",))
            assert (await g.entity("Tom")).id == friend.id
            assert await g.edges("User") == [("User", "HAS_FRIEND", "Tom", None)]
            assert sorted(await g.edges("Tom")) == [("Tom", "LIVES_IN", "Berlin", None),
                                                    ("User", "HAS_FRIEND", "Tom", None)]

    run(body())


def test_stated_name_before_any_fact_makes_the_node(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            await g.tell("My name is Dana", user_node="Dana")
            await g.tell("I work at Fabrikam", org("Fabrikam"), relations=works_at("User", "Fabrikam"),
                         user_node="User", day=1)
            assert [(e.name, e.type) for e in await g.store.entities(ALICE)] == [("Dana", "user"),
                                                                                ("Fabrikam", "organization")]
            assert await g.edges("Dana") == [("Dana", WORKS_AT, "Fabrikam", None)]

    run(body())


def test_a_name_to_be_called_by_is_an_alias_of_the_named_node_and_never_renames_it(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            await g.tell("My name is Alice. Call me Ally.", user_node="Alice", user_alias="Ally")
            node = await g.entity("Alice")
            assert (node.type, node.aliases) == ("user", ("Ally",))
            await g.tell("I work at Acme", org("Acme"), relations=works_at("User", "Acme"), user_node="User", day=1)
            called = await g.tell("Actually, call me Al", user_alias="Al", day=2)
            await g.tell("call me ALICE", user_alias="ALICE", day=3)  # her own name is no alias
            names = [(e.name, e.type, e.aliases) for e in await g.store.entities(ALICE)]
            assert names == [("Alice", "user", ("Ally", "Al")), ("Acme", "organization", ())]
            assert called in (await g.entity("Alice")).provenance
            assert await g.edges("Alice") == [("Alice", WORKS_AT, "Acme", None)]
            assert [e.name for e, _ in await g.store.search_entities(ALICE, query_terms("who is Ally?"))] == ["Alice"]

    run(body())


def test_a_name_to_be_called_by_names_a_node_without_a_stated_name(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            await g.tell("I work at Acme", org("Acme"), relations=works_at("User", "Acme"), user_node="User")
            await g.tell("Ally knows Bo", EntityFact("Ally", "person"), EntityFact("Bo", "person"),
                         relations=(RelationFact("Ally", "KNOWS", "Bo"),))
            node = await g.entity("User")
            # an entity already called Ally (a friend, say) stays someone else
            await g.tell("Call me Ally", user_alias="Ally", day=1)
            await g.tell("My name is Alice", user_node="Alice", day=2)
            renamed = await g.entity("Alice")
            assert (renamed.id, renamed.type, renamed.aliases) == (node.id, "user", ("Ally",))
            assert [(e.name, e.type) for e in await g.store.entities(ALICE)] == [
                ("Alice", "user"), ("Acme", "organization"), ("Ally", "person"), ("Bo", "person")]
            assert await g.edges("Alice") == [("Alice", WORKS_AT, "Acme", None)]
            assert await g.edges("Ally") == [("Ally", "KNOWS", "Bo", None)]
            # with no node yet, a "User" node is made to take the alias
            await g.tell("Ally knows Bo", EntityFact("Ally", "person"), scope=BOB)
            await g.tell("Call me Ally", user_alias="Ally", day=1, scope=BOB)
            assert [(e.name, e.type, e.aliases) for e in await g.store.entities(BOB)] == [
                ("Ally", "person", ()), ("User", "user", ("Ally",))]

    run(body())


def test_a_name_to_be_called_by_before_any_fact_makes_the_node(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            await g.tell("Call me Ally", user_alias="Ally")
            await g.tell("I work at Acme", org("Acme"), relations=works_at("User", "Acme"), user_node="User", day=1)
            assert [(e.name, e.type, e.aliases) for e in await g.store.entities(ALICE)] == [
                ("Ally", "user", ()), ("Acme", "organization", ())]
            assert await g.edges("Ally") == [("Ally", WORKS_AT, "Acme", None)]

    run(body())


def test_single_valued_fact_invalidates_the_old_edge_and_keeps_it(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            await g.tell("Northwind", org("Northwind"), relations=works_at("User", "Northwind"), user_node="User")
            again = await g.tell("still Northwind", org("Northwind"), relations=works_at("User", "Northwind"),
                                 user_node="User", day=1)
            await g.tell("Contoso", org("Contoso"), relations=works_at("User", "Contoso"), user_node="User", day=2)
            assert await g.edges("User") == [("User", WORKS_AT, "Contoso", None)]
            history = await g.store.relationships(ALICE, (await g.entity("User")).id, current_only=False)
            assert [(r.to_name, r.valid_from, r.invalid_at) for r in history] == [
                ("Contoso", at(2), None), ("Northwind", at(0), at(2))]
            assert again in history[1].provenance and len(history[1].provenance) == 2

    run(body())


def test_multi_valued_edges_accumulate(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            for day, name in enumerate(["Ana", "Bo"]):
                await g.tell(name, EntityFact(name, "person"), relations=(RelationFact("User", "HAS_FRIEND", name),),
                             user_node="User", day=day)
            assert sorted(await g.edges("User")) == [("User", "HAS_FRIEND", "Ana", None),
                                                     ("User", "HAS_FRIEND", "Bo", None)]

    run(body())


def test_an_edge_is_read_with_its_objects_type_and_the_start_of_its_description(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            description = "cat; My cat Biscuit is sick, and the vet says she needs a special diet for a month."
            await g.tell("My cat Biscuit is sick.", EntityFact("Biscuit", "pet", description),
                         relations=(RelationFact("User", "HAS_PET", "Biscuit"),), user_node="User")
            for edges in (await g.store.relationships(ALICE, (await g.entity("User")).id, limit=5),
                          await g.store.relationships(ALICE, (await g.entity("Biscuit")).id, current_only=False)):
                assert [(r.to_name, r.to_type, r.to_description) for r in edges] == [
                    ("Biscuit", "pet", description[:OBJECT_DESCRIPTION_HEAD_CHARS])]

    run(body())


def test_an_older_fact_arriving_late_is_stored_as_already_replaced(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            old = await g.said("I work at Northwind", day=0)
            await g.tell("Contoso", org("Contoso"), relations=works_at("User", "Contoso"), user_node="User", day=5)
            await g.facts(old, (org("Northwind"),), works_at("User", "Northwind"), "User")
            assert await g.edges("User") == [("User", WORKS_AT, "Contoso", None)]
            history = await g.store.relationships(ALICE, (await g.entity("User")).id, current_only=False)
            assert [(r.to_name, r.valid_from, r.invalid_at) for r in history] == [
                ("Contoso", at(5), None), ("Northwind", at(0), at(5))]

    run(body())


def test_an_entitys_newest_edges_are_read_from_both_directions_within_the_limit(backend: Backend) -> None:
    """A recall reads an entity's `limit` newest current edges, whichever end it is, newest first."""
    async def body() -> None:
        async with graph(backend) as g:
            names = ["Ana", "Bo", "Cy", "Di", "Ed"]
            for day, name in enumerate(names):  # Ana..Ed on days 0..4, edges alternating direction
                edge = (RelationFact("Kim", "KNOWS", name) if day % 2 else RelationFact(name, "MENTORS", "Kim"))
                await g.tell(name, EntityFact("Kim", "person"), EntityFact(name, "person"), relations=(edge,), day=day)
            await g.tell("Kim left Acme", EntityFact("Kim", "person"), org("Acme"),
                         relations=works_at("Kim", "Acme"), day=5)
            await g.tell("Kim moved to Globex", EntityFact("Kim", "person"), org("Globex"),
                         relations=works_at("Kim", "Globex"), day=6)
            kim = (await g.entity("Kim")).id
            newest = await g.store.relationships(ALICE, kim, current_only=True, limit=3)
            assert [(r.from_name, r.type, r.to_name) for r in newest] == [
                ("Kim", WORKS_AT, "Globex"), ("Ed", "MENTORS", "Kim"), ("Kim", "KNOWS", "Di")]
            every = await g.store.relationships(ALICE, kim, current_only=False)
            assert [r.to_name if r.from_name == "Kim" else r.from_name for r in every] == [
                "Globex", "Acme", "Ed", "Di", "Cy", "Bo", "Ana"]
            assert every[1].invalid_at == at(6) and [r.valid_from for r in every] == [at(d) for d in range(6, -1, -1)]

    run(body())


def test_edges_need_both_ends_and_two_different_entities(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            await g.tell("x", org("Acme"), relations=(RelationFact("Acme", "OWNS", "Nobody Known"),
                                                        RelationFact("Acme", "IS", "acme"),
                                                        RelationFact("Acme", "", "Acme")))
            assert await backend.sql("SELECT count(*) FROM relationships") == [(0,)]

    run(body())


def test_recorded_item_leaves_the_queue_and_a_repeat_writes_nothing(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            item = await g.said("I work at Northwind")
            assert await g.store.queue_depth() == {"pending": 1, "parked": 0}
            await g.facts(item, (org("Northwind"),), works_at("User", "Northwind"), "User")
            assert await g.store.queue_depth() == {"pending": 0, "parked": 0}
            # Applied twice (say, by a retried batch), or after the user was deleted: nothing changes.
            await backend.sql("DELETE FROM entities")
            await g.facts(item, (org("Northwind"),), works_at("User", "Northwind"), "User")
            assert await g.store.entities(ALICE) == []

    run(body())


def test_facts_written_with_their_message_take_it_off_the_queue_by_its_id(backend: Backend) -> None:
    """A message mined as it is saved: its own id, a queue item due later (the worker's backup), and
    facts that dequeue it by message id; the worker's later result for it then writes nothing."""
    async def body() -> None:
        async with graph(backend) as g:
            await g.store.apply([StartTurn(ALICE, "t1", "c1", "h1", at(0), "I work at Northwind",
                                           message_id="m-northwind", extract_from=at(0) + timedelta(seconds=30))])
            assert [m.id for m in await g.store.messages(ALICE, "c1")] == ["m-northwind"]
            assert await g.store.claim_extraction(10, at(0) + timedelta(seconds=29)) == []  # not due yet
            assert await g.store.queue_depth() == {"pending": 1, "parked": 0}
            backup = (await g.store.claim_extraction(10, at(0) + timedelta(seconds=31)))[0]
            assert backup.message.id == "m-northwind"
            await g.store.apply([RecordFacts(ALICE, None, "m-northwind", (org("Northwind"),),
                                             works_at("User", "Northwind"), at(0), "User")])
            assert await g.store.queue_depth() == {"pending": 0, "parked": 0}
            assert await g.edges("Northwind") == [("User", WORKS_AT, "Northwind", None)]
            # The worker's backup result, and a repeat of the inline write, find the item gone.
            await backend.sql("DELETE FROM relationships")
            await g.facts(backup, (org("Northwind"),), works_at("User", "Northwind"), "User")
            await g.store.apply([RecordFacts(ALICE, None, "m-northwind", (org("Northwind"),),
                                             works_at("User", "Northwind"), at(0), "User")])
            assert await backend.sql("SELECT count(*) FROM relationships") == [(0,)]

    run(body())


def test_facts_written_with_their_message_wait_behind_an_earlier_message_the_worker_has_not_mined(
        backend: Backend) -> None:
    """Replicas share the queue: a long message said on one (mined by the worker) and a short one
    said next on another (mined as it is saved) must land their facts in the order they were said,
    or "my name is Ana" then "call me Bea" would leave Ana. The short one's facts then apply
    nothing, and its queue item is due at once, behind the earlier one."""
    async def body() -> None:
        async with graph(backend) as g:
            await g.store.apply([StartTurn(ALICE, "t1", "c1", "h1", at(0), "My name is Ana. " + "x " * 1500)])
            await g.store.apply([StartTurn(ALICE, "t2", "c2", "h2", at(0) + timedelta(seconds=5), "Call me Bea",
                                           message_id="m-bea", extract_from=at(0) + timedelta(seconds=35))])
            await g.store.apply([RecordFacts(ALICE, None, "m-bea", (), (), at(0) + timedelta(seconds=5),
                                             user_node="Bea")])
            assert await g.store.entities(ALICE) == []  # not before the earlier message's facts
            due = await g.store.claim_extraction(10, at(0) + timedelta(seconds=6))
            assert [item.message.id for item in due][1:] == ["m-bea"] and len(due) == 2
            await g.facts(due[0], user_node="Ana")
            await g.facts(due[1], user_node="Bea")
            assert [e.name for e in await g.store.entities(ALICE)] == ["Bea"]
            # With nothing earlier waiting, facts written with their message apply at once: an answer
            # still queued (the worker passes over it without facts) is not waited behind.
            await g.store.apply([FinishTurn(ALICE, "t2", "c2", "Hello Bea", at(1) - timedelta(seconds=1))])
            await g.store.apply([StartTurn(ALICE, "t3", "c3", "h3", at(1), "Call me Cy", message_id="m-cy",
                                           extract_from=at(1) + timedelta(seconds=30))])
            await g.store.apply([RecordFacts(ALICE, None, "m-cy", (), (), at(1), user_node="Cy")])
            assert [e.name for e in await g.store.entities(ALICE)] == ["Cy"]
            assert await g.store.queue_depth() == {"pending": 1, "parked": 0}  # the answer's item

    run(body())


def test_claim_returns_due_unparked_items_oldest_first(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            for day, text in [(2, "third"), (0, "first"), (1, "second"), (3, "x" * 50)]:
                await g.store.apply([StartTurn(ALICE, text[:9], "c1", text[:9], at(day), text)])
            items = await g.store.claim_extraction(10, at(2), max_chars=5)
            assert [i.message.content for i in items] == ["first", "secon", "third"]
            assert [i.attempts for i in items] == [0, 0, 0]
            assert [i.message.content for i in await g.store.claim_extraction(2, at(9))] == ["first", "second"]
            assert (await g.store.claim_extraction(10, at(9)))[-1].message.content == "x" * 50

    run(body())


def test_failures_count_attempts_then_park_with_the_error(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            item = await g.said("hello")
            await g.store.apply([ExtractionFailed(ALICE, item.queue_id, "boom", at(3))])
            assert await g.store.claim_extraction(10, at(2)) == []
            (again,) = await g.store.claim_extraction(10, at(3))
            assert again.attempts == 1
            await g.store.apply([ExtractionFailed(ALICE, item.queue_id, "boom twice", at(4), park=True)])
            assert await g.store.claim_extraction(10, at(99)) == []
            assert await g.store.queue_depth() == {"pending": 0, "parked": 1}
        assert await backend.sql("SELECT attempts, parked, last_error FROM extraction_queue") == [(2, 1, "boom twice")]

    run(body())


def test_agent_of_a_queued_message_is_its_scope_agent(backend: Backend) -> None:
    async def body() -> None:
        async with graph(backend) as g:
            await g.store.apply([StartTurn(Scope("alice", agent="planner"), "t1", "c1", "h", T0, "hi")])
            (item,) = await g.store.claim_extraction(10, at(1))
            assert item.scope == Scope("alice", agent="planner")

    run(body())


def test_a_result_the_full_write_queue_refused_is_extracted_again_before_the_users_later_messages(
        backend: Backend) -> None:
    # On PostgreSQL the refused item stayed leased for minutes while this replica went on
    # with the user's later messages: the correction landed first, and the user was Alice.
    from proxy.memory.learning.worker import ExtractionWorker, WorkerLimits
    from proxy.memory.writer import Writer
    from proxy.metrics import Metrics
    from proxy.stores.base import SetTurnStatus

    async def body() -> tuple[str, list[str]]:
        async with backend.opened() as store:
            await store.apply([StartTurn(ALICE, "t0", "c1", "h0", T0, "My name is Alice."),
                               StartTurn(ALICE, "t1", "c1", "h1", T0 + timedelta(minutes=1),
                                         "Actually, my name is Alicia.")])
            metrics = Metrics()
            writer = Writer(store, metrics, 1)
            writer.submit(SetTurnStatus(BOB, "other", "interrupted", T0))  # the queue is full now
            worker = ExtractionWorker(store, writer, metrics, from_roles=["user"], isolate_agents=False,
                                      limits=WorkerLimits(batch=1, depth_every_s=0.0))
            assert await worker.drain_once() == 0  # "My name is Alice." could not be queued
            writer.start()
            applied = []
            for _ in range(4):
                waiting = await pending_texts(backend)
                await worker.drain_once()
                await writer.flush(5)
                applied += sorted(waiting - await pending_texts(backend))
            await writer.close()
            (node,) = [e for e in await store.entities(ALICE) if e.type == "user"]
            return node.name, applied

    assert run(body()) == ("Alicia", ["My name is Alice.", "Actually, my name is Alicia."])


async def pending_texts(backend: Backend) -> set[str]:
    return {text for (text,) in await backend.sql("SELECT m.content FROM extraction_queue q JOIN messages m"
                                                  " ON m.id = q.message_id WHERE q.user_id = 'alice'")}
