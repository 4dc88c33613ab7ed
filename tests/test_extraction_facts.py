"""An extraction as the store's RecordFacts: skip rules, the user's node, single-valued types."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from proxy.memory.extraction import extract
from proxy.memory.learning.facts import skipped, to_record
from proxy.extracted import ExtractedEntity, ExtractedRelation, Extraction
from proxy.models import Scope, StoredMessage
from proxy.stores.base import EntityFact, QueuedMessage, RecordFacts, RelationFact

AT = datetime(2026, 11, 2, tzinfo=UTC)
SCOPE = Scope("alice")


def record(found: Extraction) -> RecordFacts:
    item = QueuedMessage(7, SCOPE, StoredMessage("m1", "c1", "user", "text", AT), 0)
    return to_record(item, SCOPE, found)


@pytest.mark.parametrize(("name", "type_", "linked", "skip"), [
    ("", "person", False, True),
    ("   ", "person", False, True),
    ("Person", "person", False, True),
    ("organization", "Organization", False, True),
    ("meeting", "event", False, True),
    ("dark mode", "preference", False, True),
    ("dark mode", "preference", True, False),
    ("db-primary.prod.internal", "identifier", False, False),
    ("3f9c2ab", "identifier", False, False),
    ("Northwind Traders", "organization", False, False),
    ("iPhone", "product", False, False),
])
def test_skip_rules(name: str, type_: str, linked: bool, skip: bool) -> None:
    links = {name.strip().casefold()} if linked else set()
    assert skipped(ExtractedEntity(name, type_), links) is skip


def test_first_person_facts_attach_to_the_user_node() -> None:
    op = record(extract("I work at Northwind Traders and I prefer dark mode."))
    assert op.user_node == "User"
    assert op.relationships == (RelationFact("User", "WORKS_AT", "Northwind Traders", single_valued=True),
                                RelationFact("User", "PREFERS", "dark mode", single_valued=False))
    assert [e.name for e in op.entities] == ["Northwind Traders", "dark mode"]
    assert (op.queue_id, op.message_id, op.at, op.scope) == (7, "m1", AT, SCOPE)


def test_the_stated_name_names_the_node_and_is_no_entity() -> None:
    op = record(extract("My name is Dana Reyes and I live in Lisbon."))
    assert op.user_node == "Dana Reyes"
    assert op.relationships == (RelationFact("Dana Reyes", "LIVES_IN", "Lisbon", single_valued=True),)
    assert [e.name for e in op.entities] == ["Lisbon"]
    assert record(extract("My name is Dana Reyes.")).user_node == "Dana Reyes"


def test_no_node_without_a_first_person_fact() -> None:
    op = record(extract("Priya Raman from Initech called about the invoice."))
    assert op.user_node is None and op.relationships == ()


def test_an_edge_to_a_dropped_entity_is_dropped_and_model_names_are_tidied() -> None:
    found = Extraction(
        [ExtractedEntity("  Acme   Corp ", "organization", "makes\nanvils", 1.7), ExtractedEntity("user", "person"),
         ExtractedEntity("laptop", "product")],
        [ExtractedRelation("User", "WORKS_AT", "acme corp"), ExtractedRelation("Acme Corp", "OWNS", "Globex"),
         ExtractedRelation("user", "WORKS_AT", "Acme Corp")],
    )
    op = record(found)
    assert op.entities == (EntityFact("Acme Corp", "organization", "makes anvils", 1.0),)
    assert op.relationships == (RelationFact("User", "WORKS_AT", "acme corp", single_valued=True),)


def test_a_name_to_be_called_by_goes_to_the_store_as_the_nodes_alias() -> None:
    op = record(extract("My name is Alice. Call me Ally."))
    assert (op.user_node, op.user_alias, op.entities, op.relationships) == ("Alice", "Ally", (), ())
    op = record(extract("Call me Ally. I work at Acme."))
    assert (op.user_node, op.user_alias) == ("User", "Ally")
    assert op.relationships == (RelationFact("User", "WORKS_AT", "Acme", single_valued=True),)
    op = record(extract("Actually, call me Al."))
    assert (op.user_node, op.user_alias, op.entities) == (None, "Al", ())
    # the model's entity named like the alias is the user, not a person
    op = record(Extraction([ExtractedEntity("Ally", "person"), ExtractedEntity("Oslo", "place")],
                           [ExtractedRelation("Ally", "LIVES_IN", "Oslo")], user_alias="Ally"))
    assert (op.user_node, [e.name for e in op.entities]) == ("User", ["Oslo"])
    assert op.relationships == (RelationFact("User", "LIVES_IN", "Oslo", single_valued=True),)
