"""The long-term memory graph end to end: facts said through the proxy come back as [graph] lines.

A real proxy (uvicorn, the official openai client) in front of the scripted upstream; the
background worker drains the store's extraction queue, and each test waits for it by
polling /readyz (never a fixed sleep). Retries and parking run the real worker, writer and
SQLite store, with a database trigger refusing one entity as the fault.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

from proxy.memory.retrieval.block import DEFAULT_HEADER, GRAPH_NOTE
from proxy.memory.learning.worker import ExtractionWorker, WorkerLimits
from proxy.memory.writer import Writer
from proxy.metrics import Metrics
from proxy.models import Scope
from proxy.stores.base import StartTurn
from proxy.stores.sqlite.store import SQLiteStore
from tests.extraction_helpers import (
    block_lines,
    db_rows,
    export,
    extracted,
    graph_lines,
    hits,
    said_on,
    say,
    wait_for,
)
from tests.fake_upstream import JsonReply, SlowHeaders, completion

QUESTION = "Where do I work?"


def test_a_new_job_replaces_the_old_edge_which_export_keeps(make_proxy, fake):
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    say(proxy, fake, "I work at Northwind Traders.", "c1")
    assert extracted(proxy)["extraction_queue"] == {"pending": 0, "parked": 0}
    sent = say(proxy, fake, QUESTION, "c2")
    lines = block_lines(sent)
    assert lines[:3] == [
        DEFAULT_HEADER,
        "1. [long-term] Northwind Traders — I work at Northwind Traders.",
        "2. [graph] (User)-[WORKS_AT]->(Northwind Traders)",
    ]
    said = said_on(proxy, "I work at Northwind Traders.")
    assert f"[cross-session] user ({said}): I work at Northwind Traders. | assistant: Hello from upstream" in hits(sent)
    assert lines[-1] == GRAPH_NOTE and graph_lines(sent) == ["(User)-[WORKS_AT]->(Northwind Traders)"]

    say(proxy, fake, "I now work at Contoso Pharma.", "c3")
    extracted(proxy)
    sent = say(proxy, fake, QUESTION, "c4")
    assert graph_lines(sent) == ["(User)-[WORKS_AT]->(Contoso Pharma)"]
    assert block_lines(sent)[-1] == GRAPH_NOTE
    assert not [hit for hit in hits(sent) if "WORKS_AT" in hit and "Northwind" in hit]

    edges = {r["to"]: r for r in export(proxy) if r["kind"] == "relationship"}
    assert sorted(edges) == ["Contoso Pharma", "Northwind Traders"]
    assert edges["Northwind Traders"]["invalid_at"] == edges["Contoso Pharma"]["valid_from"]
    assert edges["Contoso Pharma"]["invalid_at"] is None
    assert edges["Northwind Traders"]["from"] == edges["Contoso Pharma"]["from"] == "User"
    messages = {r["content"]: r["id"] for r in export(proxy) if r["kind"] == "message"}
    assert edges["Northwind Traders"]["provenance"] == [messages["I work at Northwind Traders."]]


def test_the_stated_name_renames_the_users_node_and_keeps_its_edges(make_proxy, fake):
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    say(proxy, fake, "I work at Northwind Traders.", "c1")
    extracted(proxy)
    say(proxy, fake, "By the way, my name is Dana Reyes.", "c2")
    extracted(proxy)
    assert graph_lines(say(proxy, fake, QUESTION, "c3")) == ["(Dana Reyes)-[WORKS_AT]->(Northwind Traders)"]
    say(proxy, fake, "I live in Lisbon.", "c4")
    extracted(proxy)
    # Only the relationship the question asks about: where Dana works is no answer to it.
    assert graph_lines(say(proxy, fake, "Where do I live?", "c5")) == ["(Dana Reyes)-[LIVES_IN]->(Lisbon)"]
    nodes = [(r["name"], r["type"]) for r in export(proxy) if r["kind"] == "entity" and r["type"] == "user"]
    assert nodes == [("Dana Reyes", "user")]


def test_a_name_to_be_called_by_is_an_alias_of_the_users_node(make_proxy, fake):
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    say(proxy, fake, "My name is Alice. Call me Ally.", "c1")
    say(proxy, fake, "I work at Northwind Traders.", "c2")
    extracted(proxy)
    say(proxy, fake, "Actually, call me Al.", "c3")
    extracted(proxy)
    assert graph_lines(say(proxy, fake, QUESTION, "c4")) == ["(Alice)-[WORKS_AT]->(Northwind Traders)"]
    # Sorted: two entities made in the same millisecond export in either order (ids are time-first).
    entities = sorted((r["name"], r["type"], r["aliases"]) for r in export(proxy) if r["kind"] == "entity")
    assert entities == [("Alice", "user", ["Ally", "Al"]), ("Northwind Traders", "organization", [])]


def test_a_relative_clause_states_a_fact_about_its_own_subject(make_proxy, fake):
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    say(proxy, fake, "My sister, who lives in Paris, works at Google.", "c1")
    extracted(proxy)
    sister = "the user's sister"
    assert graph_lines(say(proxy, fake, "Where does my sister work?", "c2")) == [
        f"({sister})-[WORKS_AT]->(Google)", f"({sister})-[LIVES_IN]->(Paris)"]
    records = export(proxy)
    assert sorted((r["name"], r["type"]) for r in records if r["kind"] == "entity") == [
        ("Google", "organization"), ("Paris", "place"), (sister, "person")]
    assert sorted((r["from"], r["type"], r["to"], r["invalid_at"]) for r in records if r["kind"] == "relationship") == [
        (sister, "LIVES_IN", "Paris", None), (sister, "WORKS_AT", "Google", None)]


def test_assistant_statements_stay_conversation_memory(make_proxy, fake):
    answer = "You work at Globex Corporation, and Priya Raman from Initech called."
    fake.queue(JsonReply(completion(answer)))
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    say(proxy, fake, "Hello there.", "c1")
    extracted(proxy)
    assert db_rows(proxy, "SELECT role FROM messages ORDER BY seq") == [("user",), ("assistant",)]
    assert db_rows(proxy, "SELECT count(*) FROM entities") == [(0,)]
    proxy.stop()

    fake.queue(JsonReply(completion(answer)))
    mining = make_proxy(memory__commit_timeout_ms=5000, extraction__from_roles=["user", "assistant"])
    say(mining, fake, "Hello again.", "c2")
    extracted(mining)
    names = {name for (name,) in db_rows(mining, "SELECT name FROM entities")}
    assert {"Priya Raman", "Initech"} <= names
    assert "User" not in names and db_rows(mining, "SELECT count(*) FROM relationships") == [(0,)]


def test_a_restart_loses_no_queued_extraction(make_proxy, fake):
    # The first proxy's model call hangs, so it is stopped with the item still queued.
    fake.queue(JsonReply(completion("Noted.")), SlowHeaders(60))
    first = make_proxy(memory__commit_timeout_ms=5000, extraction__mode="llm", extraction__model="extract-model",
                       extraction__api_key="sk-memproxy-own")
    say(first, fake, "I work at Northwind Traders.", "c1")
    wait_for(lambda: any(b"response_format" in r.body for r in fake.chat_requests()), what="the model call")
    first.stop()
    # The question only: extraction mines no answer, so none is queued.
    assert db_rows(first, "SELECT attempts, parked FROM extraction_queue") == [(0, 0)]
    assert db_rows(first, "SELECT count(*) FROM entities") == [(0,)]

    second = make_proxy(memory__commit_timeout_ms=5000)
    extracted(second)
    assert graph_lines(say(second, fake, QUESTION, "c2")) == ["(User)-[WORKS_AT]->(Northwind Traders)"]


def test_readyz_and_metrics_show_the_queue(proxy, fake):
    say(proxy, fake, "I work at Northwind Traders.", "c1")
    assert extracted(proxy)["extraction_queue"] == {"pending": 0, "parked": 0}
    with proxy.http() as http:
        def gauge() -> bool:
            return 'memproxy_queue_depth{queue="extraction"} 0.0' in http.get("/metrics").text
        wait_for(gauge, what="the queue gauge")
        assert "memproxy_extraction_failures_total 0.0" in http.get("/metrics").text


# --- retries and parking, on the real worker, writer and store --------------------------

POISON = ("CREATE TRIGGER poison BEFORE INSERT ON entities WHEN new.name = 'Poison Corp'"
          " BEGIN SELECT RAISE(ABORT, 'poisoned entity'); END")
FAST = WorkerLimits(batch=8, idle_poll_s=0.01, max_attempts=5, retry_first_s=0.01, retry_factor=2.0,
                    depth_every_s=0.0)


async def drained(store: SQLiteStore, timeout: float = 15.0) -> dict[str, int]:
    """The queue depth once nothing is pending."""
    deadline = time.monotonic() + timeout
    while (depth := await store.queue_depth())["pending"] and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return depth


def test_a_failing_item_is_retried_then_parked_with_its_error(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    alice = Scope("alice")

    async def body() -> tuple[dict[str, int], Metrics]:
        store, metrics = SQLiteStore(str(path)), Metrics()
        await store.open()
        writer = Writer(store, metrics, 100)
        worker = ExtractionWorker(store, writer, metrics, from_roles=["user"], isolate_agents=False, limits=FAST)
        writer.start()
        texts = ["I work at Poison Corp.", "I live in Lisbon.", "My sister Ana lives in Porto."]
        await store.apply([StartTurn(alice, f"t{i}", "c1", f"h{i}", datetime.now(UTC), text)
                           for i, text in enumerate(texts)])
        with closing(sqlite3.connect(path)) as db:
            db.execute(POISON)
        worker.start()
        try:
            return await drained(store), metrics
        finally:
            await worker.stop()
            await writer.close()
            await store.close()

    depth, metrics = asyncio.run(body())
    assert depth == {"pending": 0, "parked": 1}
    with closing(sqlite3.connect(path)) as db:
        parked = db.execute("SELECT m.content, q.attempts, q.parked, q.last_error FROM extraction_queue q"
                            " JOIN messages m ON m.id = q.message_id").fetchall()
        names = sorted(name for (name,) in db.execute("SELECT name FROM entities"))
    assert parked == [("I work at Poison Corp.", 5, 1,
                       "store refused the facts: SQLITE_CONSTRAINT_TRIGGER: poisoned entity")]
    assert names == ["Ana", "Lisbon", "Porto", "User"]  # the good items around it were recorded
    assert metrics.registry.get_sample_value("memproxy_extraction_failures_total") == 5


def test_one_users_facts_land_in_the_order_they_were_said(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    alice = Scope("alice")
    places = ["Oslo", "Porto", "Lisbon", "Tallinn", "Kyoto", "Denver", "Accra", "Quito", "Hanoi", "Bergen"]

    async def body() -> tuple[list[tuple[str, bool]], list[str], list[str]]:
        store, metrics = SQLiteStore(str(path)), Metrics()
        await store.open()
        writer = Writer(store, metrics, 100)
        worker = ExtractionWorker(store, writer, metrics, from_roles=["user"], isolate_agents=False, limits=FAST)
        writer.start()
        await store.apply([StartTurn(alice, f"t{i}", "c1", f"h{i}", datetime(2026, 1, 1 + i, tzinfo=UTC),
                                     f"I live in {place}.") for i, place in enumerate(places)])
        worker.start()
        try:
            await drained(store)
            (node,) = [e for e in await store.entities(alice) if e.type == "user"]
            edges = await store.relationships(alice, node.id, current_only=False)
            said = [m.id for m in await store.messages(alice, "c1")]
            return [(r.to_name or "", r.invalid_at is None) for r in edges], list(node.provenance), said
        finally:
            await worker.stop()
            await writer.close()
            await store.close()

    edges, provenance, said = asyncio.run(body())
    assert edges == [(place, place == "Bergen") for place in reversed(places)]
    assert provenance == said  # the user's node saw the messages in the order they were said


class ClaimCountingStore(SQLiteStore):
    """The real SQLite store, recording how many items each extraction claim returned."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.claims: list[int] = []

    async def claim_extraction(self, limit, now, *, max_chars=None):  # type: ignore[no-untyped-def]
        items = await super().claim_extraction(limit, now, max_chars=max_chars)
        self.claims.append(len(items))
        return items


def test_full_batches_are_claimed_back_to_back_and_a_part_batch_waits_for_more(tmp_path: Path) -> None:
    alice = Scope("alice")

    async def body() -> list[int]:
        store, metrics = ClaimCountingStore(str(tmp_path / "memory.db")), Metrics()
        await store.open()
        writer = Writer(store, metrics, 100)
        limits = WorkerLimits(batch=4, idle_poll_s=60.0, depth_every_s=0.0)
        worker = ExtractionWorker(store, writer, metrics, from_roles=["user"], isolate_agents=False, limits=limits)
        writer.start()
        await store.apply([StartTurn(alice, f"t{i}", "c1", f"h{i}", datetime.now(UTC), f"I live in Place{i}.")
                           for i in range(10)])
        worker.start()
        try:
            await drained(store)
            await asyncio.sleep(0.2)  # a worker that did not pause would claim again at once
            return store.claims
        finally:
            await worker.stop()
            await writer.close()
            await store.close()

    assert asyncio.run(body()) == [4, 4, 2]


def test_an_idle_worker_looks_at_the_queue_less_and_less_often(tmp_path: Path) -> None:
    """Nothing due: each empty claim doubles the wait (idle_poll_s up to idle_max_s), so a worker
    beside another process's long backlog does not read the queue 20 times a second."""

    async def body() -> list[int]:
        store, metrics = ClaimCountingStore(str(tmp_path / "memory.db")), Metrics()
        await store.open()
        writer = Writer(store, metrics, 100)
        limits = WorkerLimits(idle_poll_s=0.05, idle_max_s=1.0, depth_every_s=60.0)
        worker = ExtractionWorker(store, writer, metrics, from_roles=["user"], isolate_agents=False, limits=limits)
        writer.start()
        worker.start()
        try:
            await asyncio.sleep(2.0)  # at a steady 0.05 s that is 40 claims; doubling, 6
            return store.claims
        finally:
            await worker.stop()
            await writer.close()
            await store.close()

    claims = asyncio.run(body())
    assert set(claims) == {0}
    assert 2 <= len(claims) <= 7, claims


def test_a_graph_line_names_the_kind_the_user_gave_its_object(make_proxy, fake):
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    say(proxy, fake, "My cats are called Biscuit and Mochi.", "c1")
    say(proxy, fake, "My pet Rex is old.", "c2")
    say(proxy, fake, "My wife Ana loves tea.", "c3")
    extracted(proxy)
    # The two cats share the question's "cat": they come before Rex, each as said ("pet" is what
    # HAS_PET says already). Said in one sentence, the two tie: their order is the edges' ids'.
    cats = graph_lines(say(proxy, fake, "What are my cats called?", "c4"))
    assert sorted(cats[:2]) == ["(User)-[HAS_PET]->(Biscuit, cat)", "(User)-[HAS_PET]->(Mochi, cat)"]
    assert cats[2:] == ["(User)-[HAS_PET]->(Rex)"]
    # A person's role is the relationship's own word: nothing to add.
    assert graph_lines(say(proxy, fake, "Who is my wife?", "c5")) == ["(User)-[HAS_SPOUSE]->(Ana)"]
    # The inspector shows the line as the block had it.
    with proxy.http() as http:
        logged = http.get("/memory/v1/users/dana/injections").json()["data"][1]["log"]["hits"]
    assert sorted(hit["text"] for hit in logged if hit["source"] == "graph") == sorted(cats)
