"""The memory API's parts the inspector reads: a user's counts, one memory, and the injection
log with each hit's text looked up when the log is read (the log itself keeps no text)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from proxy.api.injections import resolved
from proxy.api.jsonl import parse_lines
from proxy.models import Scope
from proxy.stores.sqlite.store import SQLiteStore
from tests.api_helpers import NDJSON, RECORDS, api_url, chat, jsonl
from tests.extraction_helpers import hits, wait_for

USER = "alice"
HEADERS = {"X-Memory-User": USER, "X-Memory-Conversation": "conv-c"}
QUESTION = "Is the staging host internal-hbr-2291.example up, and where does Alice Chen work?"


@pytest.fixture
def inspected(make_proxy: Any) -> Any:
    """The proxy, on SQLite here (test_api_inspector_postgres.py serves it from PostgreSQL). Nothing is
    extracted: the turn's own facts (written before its answer ends) would change the items it recalled."""
    return make_proxy(memory__commit_timeout_ms=5000, extraction__from_roles=[])


@pytest.fixture
def api(inspected: Any) -> Any:
    with inspected.http() as client:
        assert client.post(api_url(USER, "import"), headers=NDJSON, content=jsonl(RECORDS)).status_code == 200
        yield client


def test_a_user_is_counted_and_an_unknown_one_is_not_found(api: httpx.Client) -> None:
    assert api.get(api_url(USER)).json() == {"object": "user", "user": USER, "conversations": 2, "messages": 3,
                                             "entities": 2, "user_entity_id": None}
    missing = api.get(api_url("nobody"))
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "memproxy holds nothing for user nobody"
    assert api.get(api_url("bad*id")).status_code == 400
    assert api.get(api_url(USER), params={"limit": 5}).status_code == 400


def test_one_memory_is_an_entity_or_a_message(api: httpx.Client) -> None:
    entity = api.get(api_url(USER, "memories", "e-alice")).json()
    assert (entity["id"], entity["content"], entity["name"]) == (
        "e-alice", "staff engineer who works at Acme", "Alice Chen")
    message = api.get(api_url(USER, "memories", "m3")).json()
    assert message == {"id": "m3", "type": "interaction", "content": "I prefer Go for services.",
                       "conversation_id": "conv-b", "role": "user", "created_at": "2026-01-02T10:00:00+00:00"}
    assert api.get(api_url(USER, "memories", "m9")).status_code == 404
    assert api.get(api_url("bob", "memories", "m3")).status_code == 404  # another user's item is not found


def test_each_logged_hit_reads_as_the_line_the_turn_was_sent_until_its_item_goes(
        api: httpx.Client, fake: Any) -> None:
    assert chat(api, HEADERS, QUESTION).status_code == 200
    sent = hits(json.loads(fake.chat_requests()[-1].body)["messages"][-1]["content"])
    [entry] = api.get(api_url(USER, "injections")).json()["data"]
    logged = entry["log"]["hits"]
    assert {h["source"] for h in logged} >= {"long-term", "graph", "cross-session", "reasoning"}
    assert [f"[{h['source']}] {h['text']}" for h in logged] == sent
    assert {h["now"] for h in logged} == {"current"}

    # e-alice takes its edge r1 with it; conv-a its messages m1, m2 and the trace x1.
    assert api.delete(api_url(USER, "entities", "e-alice")).status_code == 200
    assert api.delete(api_url(USER, "conversations", "conv-a")).status_code == 200
    after = api.get(api_url(USER, "injections")).json()["data"][0]["log"]["hits"]
    gone = {"e-alice", "r1", "m1", "m2", "x1"}
    assert gone & {h["id"] for h in logged} == {h["id"] for h in after if h["now"] == "deleted"}
    assert [(h["id"], h["text"]) for h in after] == [
        (h["id"], None if h["id"] in gone else h["text"]) for h in logged]


def drained(api: httpx.Client) -> None:
    """Once extraction has read every saved message (it can add to an entity's description)."""
    wait_for(lambda: api.get("/readyz").json()["extraction_queue"]["pending"] == 0, what="extraction")


def test_a_corrected_entity_says_it_changed_since_the_turn(api: httpx.Client, fake: Any) -> None:
    chat(api, HEADERS, "who is our staff engineer?")  # names no entity: extraction leaves e-alice alone
    drained(api)
    entity_hit = next(h for h in api.get(api_url(USER, "injections")).json()["data"][0]["log"]["hits"]
                      if h["source"] == "long-term" and h["id"] == "e-alice")
    assert api.patch(api_url(USER, "memories", "e-alice"), json={"content": "principal engineer at Initech"}
                     ).status_code == 200
    now = next(h for h in api.get(api_url(USER, "injections")).json()["data"][0]["log"]["hits"]
               if h["id"] == "e-alice")
    assert (entity_hit["now"], now["now"]) == ("current", "changed")
    assert now["text"] == "Alice Chen — principal engineer at Initech"


def test_a_graph_hit_whose_entity_was_not_injected_is_found_in_the_users_edges(tmp_path: Any) -> None:
    async def run() -> list[dict[str, Any]]:
        store = SQLiteStore(str(tmp_path / "m.db"))
        await store.open()
        try:
            scope = Scope(user=USER)
            await store.import_records(scope, parse_lines(jsonl(RECORDS)))
            rows = [{"turn_id": "t1", "conversation_id": "conv-a", "created_at": datetime(2026, 2, 1, tzinfo=UTC),
                     "injected": 1, "log": {"hits": [{"source": "graph", "id": "r1", "reason": "graph expansion"},
                                                     {"source": "graph", "id": "r-gone", "reason": "graph expansion"}]}}]
            return await resolved(store, scope, rows)
        finally:
            await store.close()

    [entry] = asyncio.run(run())
    assert [(h["id"], h["text"], h["now"]) for h in entry["log"]["hits"]] == [
        ("r1", "(Alice Chen)-[WORKS_AT]->(Acme)", "current"), ("r-gone", None, "deleted")]
