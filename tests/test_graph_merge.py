"""The graph merge as a plan of steps, with no database: what it reads and writes, in order.

Both backends run these steps (tests/test_store_contract_graph.py holds them to the same
graph); here the plan itself is checked against scripted answers to its reads.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from proxy.models import Scope
from proxy.stores import graph_merge as gm
from proxy.stores.base import EntityFact, RecordFacts, RelationFact

AT = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


def plan(op: RecordFacts, answers: dict[type, list[Any]], clean: Any = str) -> list[gm.Step]:
    """Every step of merging `op`, each read answered with the next scripted answer of its kind."""
    steps = gm.merge(op, AT, clean)
    taken: list[gm.Step] = []
    answer = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration:
            return taken
        taken.append(step)
        pending = answers.get(type(step))
        answer = pending.pop(0) if pending else None


def op(**kwargs: Any) -> RecordFacts:
    return RecordFacts(Scope("alice"), queue_id=7, message_id="m1", at=AT, **{"entities": (), "relationships": (),
                                                                              **kwargs})


def test_an_item_already_taken_off_the_queue_writes_nothing() -> None:
    steps = plan(op(entities=(EntityFact("Tom", "person"),)), {gm.Dequeue: [False]})
    assert steps == [gm.Dequeue(7, "m1", AT)]


def test_a_new_entity_and_a_late_single_valued_fact_arrive_already_replaced() -> None:
    later = datetime(2026, 11, 3, tzinfo=UTC)
    current = [{"seq": 3, "to_id": "e-berlin", "valid_from": later, "provenance": "[]"}]
    tom = {"id": "e-tom", "seq": 1, "name": "Tom", "canonical_name": "tom", "type": "person", "description": "",
           "aliases": "[]", "provenance": "[]"}
    steps = plan(
        op(entities=(EntityFact("Paris", "city\x00"),), relationships=(RelationFact("Tom", "LIVES_IN", "Paris", True),)),
        {gm.Dequeue: [True], gm.FindEntity: [None, tom], gm.CurrentEdges: [current]},
        clean=lambda text: text.replace("\x00", "\ufffd"),
    )
    kinds = [type(step).__name__ for step in steps]
    # No CloseEdges: the current edge is newer than this fact, which is stored closed at its time.
    assert kinds == ["Dequeue", "EnsureUser", "FindEntity", "InsertEntity", "FindEntity", "CurrentEdges", "InsertEdge"]
    inserted = steps[3]
    assert isinstance(inserted, gm.InsertEntity)
    # The type is cleaned with the backend's cleaner, as the name is.
    assert (inserted.name, inserted.key, inserted.type, inserted.provenance) == ("Paris", "paris", "city\ufffd", '["m1"]')
    edge = steps[-1]
    assert isinstance(edge, gm.InsertEdge)
    assert (edge.from_id, edge.type, edge.to_id, edge.valid_from, edge.invalid_at) == (
        "e-tom", "LIVES_IN", inserted.entity_id, AT, later)
    assert json.loads(edge.provenance) == ["m1"]
