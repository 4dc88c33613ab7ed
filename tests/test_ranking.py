"""Ranking measured on LoCoMo (docs/evaluation.md): neighbouring-turn context, weak entity hits as fillers."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Coroutine
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from proxy.memory.retrieval.fusion import round_robin
from proxy.memory.retrieval.base import Query
from proxy.memory.retrieval.retriever import Retrieval
from proxy.memory.retrieval.sources import FILLER
from proxy.metrics import Metrics
from proxy.models import Hit, Scope
from proxy.settings import MemorySettings
from proxy.stores.base import FinishTurn, StartTurn
from proxy.stores.sqlite.store import SQLiteStore
from proxy.stores.indexed_text import CONTEXT_CHARS_PER_MESSAGE, context_terms, entity_terms
from proxy.stores.sqlite.schema import MIGRATIONS, statements
from proxy.terms import query_terms

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
ALICE = Scope("alice")


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def sql(path: Path, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as db, db:
        return db.execute(query, params).fetchall()


def said(n: int, text: str, *, conv: str = "c1", role: str = "user") -> StartTurn | FinishTurn:
    at = T0 + timedelta(minutes=n)
    if role == "user":
        return StartTurn(ALICE, f"t{n}", conv, f"h{n}", at, text)
    return FinishTurn(ALICE, f"t{n - 1}", conv, text, at)


def hit(source: str, id: str, **parts: object) -> Hit:
    return Hit(source, id, f"{source} {id}", parts=dict(parts))


# --- the merge: weak hits fill only what the others leave


def test_fillers_take_only_the_slots_left() -> None:
    messages = [hit("cross-session", f"m{n}") for n in range(3)]
    sources = {"long-term": [hit("long-term", "e1")], "cross-session": messages}
    fillers = {"long-term": [hit("long-term", "e2")], "graph": [hit("graph", "r1")]}
    assert [h.id for h in round_robin(sources, 4, fillers=fillers)] == ["e1", "m0", "m1", "m2"]
    assert [h.id for h in round_robin(sources, 6, fillers=fillers)] == ["e1", "m0", "m1", "m2", "e2", "r1"]
    # A filler repeating the text of a hit already taken is not shown again.
    same = {"long-term": [Hit("long-term", "e3", "cross-session m0")]}
    assert [h.id for h in round_robin(sources, 6, fillers=same)] == ["e1", "m0", "m1", "m2"]


# --- the index: each message with the words said just before it


def test_context_is_the_start_of_each_earlier_message() -> None:
    assert context_terms(["a b", "c"]) == "a b c"
    long = " ".join(["word"] * CONTEXT_CHARS_PER_MESSAGE)
    assert len(context_terms([long])) <= CONTEXT_CHARS_PER_MESSAGE
    assert context_terms([]) == ""


def test_an_answer_ranks_by_the_question_before_it(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> list[str]:
        store = SQLiteStore(str(path))
        await store.open()
        try:
            await store.apply([
                said(0, "which dentist did you book for the kids?", conv="c1"),
                said(1, "I booked Dr Rivera for Tuesday.", conv="c1", role="assistant"),
                said(2, "I booked the train for Tuesday.", conv="c2"),
                said(3, "nothing else to say", conv="c2"),
            ])
            hits = await store.search_messages(ALICE, query_terms("who did I book as the kids' dentist?"))
            return [m.content for m, _ in hits]
        finally:
            await store.close()

    found = run(body())
    # Both answers say "booked"; the one after the dentist question ranks first. A message
    # whose own words hold no query term is never found through its context alone.
    assert found.index("I booked Dr Rivera for Tuesday.") < found.index("I booked the train for Tuesday.")
    assert "nothing else to say" not in found
    contexts = dict(sql(path, "SELECT content, context FROM messages"))
    assert contexts["which dentist did you book for the kids?"] == ""
    assert contexts["nothing else to say"] == "i book the train for tuesday"
    assert contexts["I booked Dr Rivera for Tuesday."] == "which dentist did you book for the kid"


def test_a_version_1_database_is_migrated_and_its_messages_still_found(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
        for statement in statements(MIGRATIONS[0]):
            db.execute(statement)
        db.execute("INSERT INTO schema_version VALUES (1, 0)")
        db.execute("INSERT INTO users VALUES ('alice', 0)")
        db.execute("INSERT INTO conversations VALUES ('alice', 'c1', NULL, 0, 0)")
        db.execute("INSERT INTO messages (id, user_id, conversation_id, role, content, content_hash, terms,"
                   " created_at) VALUES ('m1', 'alice', 'c1', 'user', 'the quokka is fed', 'h', 'the quokka is fed',"
                   " 0)")
        db.commit()

    async def body() -> list[str]:
        store = SQLiteStore(str(path))
        await store.open()
        try:
            await store.apply([said(9, "and the quokka sleeps")])
            return [m.id for m, _ in await store.search_messages(ALICE, ["quokka"])]
        finally:
            await store.close()

    found = run(body())
    assert "m1" in found and len(found) == 2
    assert sql(path, "SELECT max(version) FROM schema_version") == [(len(MIGRATIONS),)]
    assert sql(path, "SELECT context FROM messages WHERE id = 'm1'") == [("",)]


# --- long-term: an entity sharing few of the query's terms is a filler


def add_entity(path: Path, name: str, type_: str, description: str) -> None:
    sql(path, "INSERT INTO users (id, created_at) VALUES ('alice', 0) ON CONFLICT DO NOTHING")
    sql(path, "INSERT INTO entities (id, user_id, name, canonical_name, type, description, name_terms, type_terms,"
              " description_terms, created_at, updated_at) VALUES (?, 'alice', ?, ?, ?, ?, ?, ?, ?, 0, 0)",
        (f"e-{name}", name, name.casefold(), type_, description, *entity_terms(name, type_, description)))


def test_a_weak_entity_hit_yields_its_turn_to_messages(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> tuple[list[tuple[str, bool]], list[str]]:
        store = SQLiteStore(str(path))
        await store.open()
        try:
            await store.apply([said(n, f"Maria's garden {n}: the roses need water", conv=f"k{n}") for n in range(4)])
            add_entity(path, "Maria", "person", "Maria: hello there")
            add_entity(path, "Rose garden", "place", "Maria waters the roses in her garden")
            retrieval = Retrieval(store, MemorySettings(retrieval_timeout_ms=5000), Metrics())  # not a timing test
            query = Query("Does Maria water the roses in her garden?", "new", (), 3)
            full = await retrieval.retrieve(ALICE, query)
            roomy = await retrieval.retrieve(ALICE, Query(query.text, "new", (), 12))
            hits = [(h["source"], h["score"].get(FILLER, False)) for h in full.log["hits"]]
            return hits, [h["id"] for h in roomy.log["hits"] if h["source"] == "long-term"]
        finally:
            await store.close()

    hits, roomy = run(body())
    # "Rose garden" shares maria, water, rose, garden: a full hit. "Maria" shares one term:
    # with three slots it yields to the messages; with twelve it fills one left over.
    assert hits == [("long-term", False), ("cross-session", False), ("cross-session", False)]
    assert roomy == ["e-Rose garden", "e-Maria"]
