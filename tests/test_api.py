"""The memory API (docs/memory-api.md): every endpoint against a real proxy and SQLite file, exact JSON."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from proxy.app import create_app
from proxy.settings import load_settings
from tests.api_helpers import NDJSON, RECORDS, api_url, chat, jsonl, lines, wait_for_vectors
from tests.fake_upstream import JsonReply, completion

USER = "alice"
ERROR_KEYS = {"message", "type", "param", "code"}
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def api(proxy: Any) -> Any:
    with proxy.http() as client:
        yield client


@pytest.fixture
def loaded(api: httpx.Client) -> httpx.Client:
    """The API over a user holding RECORDS."""
    response = api.post(api_url(USER, "import"), headers=NDJSON, content=jsonl(RECORDS))
    assert response.status_code == 200, response.text
    return api


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    """The OpenAI-shaped error body of a response with this status."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS
    return error


def without_kind(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "kind"}


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [without_kind(r) for r in RECORDS if r["kind"] == kind]


# --- memories ------------------------------------------------------------------------


def test_store_a_fact_list_it_and_correct_it(api: httpx.Client) -> None:
    stored = api.post(api_url(USER, "memories"),
                      json={"content": "Prefers  window seats\non trains", "type": "user_preference",
                            "confidence": 0.9, "tags": ["travel", "travel", "seats"]})
    assert stored.status_code == 201
    memory = stored.json()
    assert memory == {
        "id": memory["id"], "type": "user_preference", "content": "Prefers window seats on trains",
        "name": "Prefers window seats on trains", "entity_type": "user_preference", "description": "",
        "confidence": 0.9, "tags": ["travel", "seats"], "created_at": memory["created_at"],
        "updated_at": memory["created_at"], "stored_via": "memory_api",
    }
    assert api.get(api_url(USER, "memories")).json() == {"object": "list", "data": [memory], "next_cursor": None}

    corrected = api.patch(api_url(USER, "memories", memory["id"]), json={"content": "Prefers aisle seats on trains"})
    assert corrected.status_code == 200
    assert corrected.json()["content"] == "Prefers aisle seats on trains"
    assert corrected.json()["name"] == "Prefers aisle seats on trains"
    listed = api.get(api_url(USER, "memories")).json()["data"]
    assert [m["content"] for m in listed] == ["Prefers aisle seats on trains"]
    hits = api.post(api_url(USER, "search"), json={"query": "which seats on trains?"}).json()["hits"]
    assert [(h["source"], h["id"], h["content"]) for h in hits] == [
        ("long-term", memory["id"], "Prefers aisle seats on trains")]


def test_a_long_memory_in_any_script_is_stored_corrected_and_merged(api: httpx.Client) -> None:
    # PostgreSQL's index refused a merge key of over 2,704 bytes: 1,000 Chinese characters that
    # do not compress (a repeated one would).
    long = "".join(chr(0x4E00 + n * 7919 % 20000) for n in range(2000))
    first = api.post(api_url(USER, "memories"), json={"content": long, "type": "fact"})
    assert first.status_code == 201, first.text
    again = api.post(api_url(USER, "memories"), json={"content": long, "type": "fact"})
    assert again.json()["id"] == first.json()["id"]  # the same text: one memory
    other = api.post(api_url(USER, "memories"), json={"content": long[:-1] + "忆", "type": "fact"})
    assert other.json()["id"] != first.json()["id"]  # shares the key's head, not the key
    corrected = long[500:]
    fixed = api.patch(api_url(USER, "memories", first.json()["id"]), json={"content": corrected})
    assert fixed.status_code == 200, fixed.text
    assert fixed.json()["content"] == corrected


def test_the_same_text_stored_twice_is_one_memory(api: httpx.Client) -> None:
    first = api.post(api_url(USER, "memories"), json={"content": "Allergic to peanuts", "type": "fact",
                                                      "tags": ["health"]}).json()
    second = api.post(api_url(USER, "memories"), json={"content": "allergic  to PEANUTS", "type": "fact",
                                                       "confidence": 1, "tags": ["food"]}).json()
    assert second["id"] == first["id"]
    assert (second["confidence"], second["tags"]) == (1.0, ["health", "food"])
    assert len(api.get(api_url(USER, "memories")).json()["data"]) == 1


def test_an_interaction_becomes_a_message_of_the_latest_conversation(loaded: httpx.Client) -> None:
    stored = loaded.post(api_url(USER, "memories"), json={"content": "We agreed to ship on Friday.",
                                                          "type": "interaction"})
    assert stored.status_code == 201
    memory = stored.json()
    assert memory == {"id": memory["id"], "type": "interaction", "content": "We agreed to ship on Friday.",
                      "conversation_id": "conv-b", "role": "assistant", "created_at": memory["created_at"]}
    messages = loaded.get(api_url(USER, "conversations", "conv-b", "messages")).json()["data"]
    assert [(m["id"], m["role"], m["content"]) for m in messages] == [
        ("m3", "user", "I prefer Go for services."), (memory["id"], "assistant", "We agreed to ship on Friday.")]
    corrected = loaded.patch(api_url(USER, "memories", memory["id"]), json={"content": "We ship on Monday."})
    assert corrected.json()["content"] == "We ship on Monday."


def test_correcting_an_entity_with_a_description_changes_the_description(loaded: httpx.Client) -> None:
    corrected = loaded.patch(api_url(USER, "memories", "e-alice"), json={"content": "principal engineer"})
    assert corrected.status_code == 200
    body = corrected.json()
    assert (body["name"], body["description"], body["content"]) == ("Alice Chen", "principal engineer",
                                                                      "principal engineer")
    clash = loaded.patch(api_url(USER, "memories", "e-acme"), json={"content": "alice  chen"})
    assert error_of(clash, 409)["code"] == "conflict"


def test_a_correction_that_would_repeat_an_answer_of_its_turn_is_409(api: httpx.Client, fake: Any) -> None:
    # A retried turn whose answer came out different keeps both answers; making the
    # second say what the first says breaks the turn's one-copy rule: a conflict, not a 503.
    fake.queue(JsonReply(completion("Blue.")), JsonReply(completion("Green.")))
    headers = {"X-Memory-User": USER, "X-Memory-Conversation": "colours"}
    for _ in range(2):  # the same request twice: an SDK's retry of one turn
        assert chat(api, headers, "which colour did we pick?").status_code == 200
    messages = api.get(api_url(USER, "conversations", "colours", "messages")).json()["data"]
    answers = {m["content"]: m["id"] for m in messages if m["role"] == "assistant"}
    assert set(answers) == {"Blue.", "Green."}
    clash = api.patch(api_url(USER, "memories", answers["Green."]), json={"content": "Blue."})
    assert error_of(clash, 409)["code"] == "conflict"


def test_secrets_are_redacted_before_a_memory_is_saved(api: httpx.Client) -> None:
    key = "sk-proj-" + "Q7v2" * 10
    memory = api.post(api_url(USER, "memories"), json={"content": f"The deploy key is {key}", "type": "fact"}).json()
    assert key not in json.dumps(memory)
    assert memory["content"].startswith("The deploy key is [REDACTED:")


# --- reading what was saved ----------------------------------------------------------------


def test_conversations_and_messages(loaded: httpx.Client) -> None:
    assert loaded.get(api_url(USER, "conversations")).json() == {"object": "list", "next_cursor": None, "data": [
        {"id": "conv-b", "agent_id": None, "created_at": "2026-01-02T10:00:00+00:00",
         "last_active_at": "2026-01-02T10:00:00+00:00", "message_count": 1},
        {"id": "conv-a", "agent_id": None, "created_at": "2026-01-01T10:00:00+00:00",
         "last_active_at": "2026-01-01T10:06:00+00:00", "message_count": 2},
    ]}
    messages = loaded.get(api_url(USER, "conversations", "conv-a", "messages")).json()
    assert messages == {"object": "list", "next_cursor": None, "data": by_kind("message")[:2]}
    missing = loaded.get(api_url(USER, "conversations", "conv-z", "messages"))
    assert error_of(missing, 404)["message"] == "user alice has no conversation conv-z"


def test_entities_and_one_entity_with_its_relationships(loaded: httpx.Client) -> None:
    assert loaded.get(api_url(USER, "entities")).json() == {"object": "list", "next_cursor": None,
                                                             "data": by_kind("entity")}
    relationship = {k: v for k, v in without_kind(RECORDS[7]).items() if k != "created_at"}
    assert loaded.get(api_url(USER, "entities", "e-acme")).json() == {
        **by_kind("entity")[0], "relationships": [relationship]}
    assert loaded.get(api_url(USER, "entities", "e-alice")).json()["relationships"] == [relationship]
    assert error_of(loaded.get(api_url(USER, "entities", "e-bob")), 404)["message"] == "user alice has no entity e-bob"


def test_memories_are_the_entities_seen_as_memories(loaded: httpx.Client) -> None:
    assert loaded.get(api_url(USER, "memories")).json()["data"] == [
        {"id": "e-acme", "type": "fact", "content": "Acme", "name": "Acme", "entity_type": "organization",
         "description": "", "confidence": 0.8, "tags": [], "created_at": "2026-01-01T10:00:00+00:00",
         "updated_at": "2026-01-01T10:00:00+00:00", "stored_via": None},
        {"id": "e-alice", "type": "fact", "content": "staff engineer who works at Acme", "name": "Alice Chen",
         "entity_type": "person", "description": "staff engineer who works at Acme", "confidence": 0.9,
         "tags": ["work"],
         "created_at": "2026-01-01T10:00:00+00:00", "updated_at": "2026-01-01T10:01:00+00:00", "stored_via": None},
    ]


def test_reasoning_traces(loaded: httpx.Client) -> None:
    assert loaded.get(api_url(USER, "reasoning")).json() == {"object": "list", "next_cursor": None,
                                                              "data": by_kind("reasoning")}


def test_lists_are_paged_by_cursor(api: httpx.Client) -> None:
    records = [{"kind": "conversation", "id": f"c{i}", "created_at": f"2026-02-0{i}T00:00:00+00:00"}
               for i in range(1, 6)]
    records += [{"kind": "message", "id": f"m{i}", "conversation_id": "c1", "role": "user", "content": f"note {i}",
                 "created_at": f"2026-02-01T00:00:0{i}+00:00"} for i in range(1, 6)]
    records += [{"kind": "entity", "id": f"e{i}", "name": f"Thing {i}"} for i in range(1, 6)]
    records += [{"kind": "reasoning", "id": f"x{i}", "conversation_id": "c1", "task": f"task {i}",
                 "created_at": f"2026-02-01T00:00:0{i}+00:00"} for i in range(1, 6)]
    assert api.post(api_url(USER, "import"), headers=NDJSON, content=jsonl(records)).status_code == 200
    expected = {"conversations": ["c5", "c4", "c3", "c2", "c1"],
                "conversations/c1/messages": [f"m{i}" for i in range(1, 6)],
                "entities": [f"e{i}" for i in range(1, 6)], "memories": [f"e{i}" for i in range(1, 6)],
                "reasoning": ["x5", "x4", "x3", "x2", "x1"]}
    for path, ids in expected.items():
        seen, cursor, pages = [], None, 0
        while True:
            params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            body = api.get(api_url(USER, path), params=params).json()
            seen += [item["id"] for item in body["data"]]
            pages += 1
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert (seen, pages) == (ids, 3), path


def test_page_parameters_are_checked(api: httpx.Client) -> None:
    for params in ({"limit": "0"}, {"limit": "1001"}, {"limit": "x"}, {"limit": "-1"}, {"sort": "id"},
                   {"cursor": "../x"}, {"limit": "9" * 5000}, {"limit": "0" * 5000}):
        error = error_of(api.get(api_url(USER, "entities"), params=params), 400)
        assert error["code"] == "invalid_request"
    assert api.get(api_url(USER, "entities"), params={"limit": "0" * 5000 + "7"}).status_code == 200
    error = error_of(api.get(api_url(USER, "injections"), params={"limit": "5"}), 400)
    assert error["message"] == "the injection log takes no query parameters (it holds the last 20 turns)"


# --- search and the injection log -------------------------------------------------------------


def test_search_answers_what_the_proxy_injects(proxy: Any, fake: Any, loaded: httpx.Client) -> None:
    question = "Is the staging host internal-hbr-2291.example up? Where does Alice Chen work?"
    found = loaded.post(api_url(USER, "search"), json={"query": question})
    assert found.status_code == 200
    body = found.json()
    assert sorted(body) == ["block", "budget_cut", "errors", "hits", "object", "query", "sources_ms"]
    assert (body["object"], body["query"], body["budget_cut"], body["errors"]) == ("search", question, False, {})
    assert sorted(body["sources_ms"]) == ["conversation", "cross-session", "graph", "long-term", "reasoning"]
    hits = body["hits"]
    assert [h["rank"] for h in hits] == list(range(1, len(hits) + 1))
    assert {(h["source"], h["id"]) for h in hits} >= {("long-term", "e-alice"), ("graph", "r1"),
                                                       ("cross-session", "m1"), ("reasoning", "x1")}
    graph = next(h for h in hits if h["source"] == "graph")
    assert (graph["content"], graph["reason"]) == ("(Alice Chen)-[WORKS_AT]->(Acme)", "graph expansion")
    assert all(set(h) == {"rank", "source", "id", "content", "reason", "score", "tokens"} for h in hits)
    assert body["block"].split("\n")[1:1 + len(hits)] == [f"{h['rank']}. [{h['source']}] {h['content']}" for h in hits]

    response = chat(loaded, {"X-Memory-User": USER}, question)
    sent = fake.chat_requests()[-1].json()["messages"][-1]["content"]
    assert sent == body["block"] + "\n\n" + question
    assert response.headers["x-memory-injected"] == str(len(hits))


def test_search_limit_and_sources(loaded: httpx.Client) -> None:
    question = "Is the staging host internal-hbr-2291.example up? Where does Alice Chen work?"
    one = loaded.post(api_url(USER, "search"), json={"query": question, "limit": 1}).json()["hits"]
    assert len(one) == 1
    graph_only = loaded.post(api_url(USER, "search"), json={"query": question, "sources": ["graph"]}).json()
    assert [(h["rank"], h["source"], h["id"]) for h in graph_only["hits"]] == [(1, "graph", "r1")]
    for bad in ({"query": ""}, {"query": "  "}, {"query": "x", "limit": 13}, {"query": "x", "limit": True},
                {"query": "x", "sources": ["web"]}, {"query": 5}, {}, {"query": "x", "extra": 1}, [],
                {"query": "x", "conversation": "a b"}):
        assert error_of(loaded.post(api_url(USER, "search"), json=bad), 400)["code"] == "invalid_request"


def test_the_injection_log_of_a_turn(proxy: Any, loaded: httpx.Client) -> None:
    response = chat(loaded, {"X-Memory-User": USER, "X-Memory-Conversation": "conv-new"},
                    "Where does Alice Chen work?")
    turn = response.headers["x-memory-turn"]
    entries = loaded.get(api_url(USER, "injections")).json()
    assert (entries["object"], entries["next_cursor"], len(entries["data"])) == ("list", None, 1)
    entry = entries["data"][0]
    assert (entry["turn_id"], entry["conversation_id"], entry["injected"]) == (
        turn, "conv-new", int(response.headers["x-memory-injected"]))
    logged = [(h["source"], h["id"], h["reason"]) for h in entry["log"]["hits"]]
    assert ("long-term", "e-alice", "rank") in logged and ("graph", "r1", "graph expansion") in logged
    assert entry["log"]["budget_cut"] is False


# --- export and import -------------------------------------------------------------------


def test_export_is_the_imported_records(loaded: httpx.Client) -> None:
    exported = loaded.get(api_url(USER, "export"))
    assert exported.status_code == 200
    assert exported.headers["content-type"] == "application/x-ndjson"
    assert lines(exported.content) == RECORDS


def test_import_skips_ids_it_already_has(loaded: httpx.Client) -> None:
    again = loaded.post(api_url(USER, "import"), headers=NDJSON, content=jsonl(RECORDS))
    assert again.json() == {"imported": {}, "skipped": {"conversation": 2, "entity": 2, "message": 3,
                                                        "reasoning": 1, "relationship": 1}}
    renamed = [{**RECORDS[6], "id": "e-alice-2"}]  # same name, new id: names are unique per user
    assert loaded.post(api_url(USER, "import"), headers=NDJSON, content=jsonl(renamed)).json() == {
        "imported": {}, "skipped": {"entity": 1}}
    assert lines(loaded.get(api_url(USER, "export")).content) == RECORDS


def test_import_into_another_user_keeps_users_apart(loaded: httpx.Client) -> None:
    assert loaded.post(api_url("bob", "import"), headers=NDJSON, content=jsonl(RECORDS)).json()["imported"] == {
        "conversation": 2, "entity": 2, "message": 3, "reasoning": 1, "relationship": 1}
    loaded.delete(api_url("bob", "entities", "e-alice"))
    assert [e["id"] for e in loaded.get(api_url(USER, "entities")).json()["data"]] == ["e-acme", "e-alice"]
    assert [e["id"] for e in loaded.get(api_url("bob", "entities")).json()["data"]] == ["e-acme"]


@pytest.mark.parametrize(("line", "message"), [
    (b"{not json", "line 2: not a JSON value"),
    (b"[1, 2]", "line 2: a record must be a JSON object"),
    (b'{"kind": "note", "id": "n1"}', "line 2: `kind` must be one of conversation, message, entity, relationship,"
                                      " reasoning"),
    (b'{"kind": "conversation", "id": "a b"}', "line 2: `id` must be 1-256 characters of ASCII letters, digits"
                                               " and ._:@+-"),
    (b'{"kind": "message", "id": "m9", "conversation_id": "c", "role": "robot", "content": "x"}',
     "line 2: `role` must be one of user, assistant, system, tool"),
    (b'{"kind": "entity", "id": "e9", "name": "  "}', "line 2: `name` must be a non-empty string"),
    (b'{"kind": "entity", "id": "e9", "name": "X", "confidence": 2}', "line 2: `confidence` must be a number from"
                                                                      " 0 to 1"),
    (b'{"kind": "conversation", "id": "c9", "created_at": "yesterday"}', "line 2: `created_at` must be an ISO 8601"
                                                                         " time"),
    (b'{"kind": "relationship", "id": "r9", "type": "KNOWS", "to": "B"}', "line 2: `from_id` must be given (or"
                                                                          " `from`, the entity's name)"),
    (b'{"kind": "reasoning", "id": "x9", "conversation_id": "c", "steps": [{"name": 1}]}',
     "line 2: `steps` must be a list of {name, arguments, result} objects with string values"),
    (b"[" * 100000, "line 2: not a JSON value"),
    (b'{"kind": "conversation", "id": "c9", "created_at": "0001-01-01T00:00:00+01:00"}',
     "line 2: `created_at` must be a time from 1970 to 9999"),
    (b'{"kind": "message", "id": "m9", "conversation_id": "c", "role": "user", "content": "x",'
     b' "created_at": "9999-12-31T23:59:59-05:00"}', "line 2: `created_at` must be a time from 1970 to 9999"),
])
def test_a_bad_line_rejects_the_whole_import(api: httpx.Client, line: bytes, message: str) -> None:
    body = jsonl(RECORDS[:1]) + line + b"\n"
    error = error_of(api.post(api_url(USER, "import"), headers=NDJSON, content=body), 400)
    assert error["message"] == message
    assert api.get(api_url(USER, "export")).content == b""


def test_imported_text_is_redacted_before_it_is_saved(api: httpx.Client) -> None:
    # The redaction pass runs before anything is saved, an import's records included.
    key, aws, password = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX1234", "AKIAABCDEFGHIJKLMNOP", "password=Hunter2Secret!"
    records = [
        {"kind": "conversation", "id": "c1"},
        {"kind": "message", "id": "m1", "conversation_id": "c1", "role": "user", "content": f"my key is {key}"},
        {"kind": "entity", "id": "e1", "name": "Deploy box", "description": password, "tags": [aws],
         "aliases": [f"box {key}"]},
        {"kind": "reasoning", "id": "x1", "conversation_id": "c1", "task": f"use {key}",
         "steps": [{"name": "login", "arguments": password, "result": aws}], "answer": "done"},
        {"kind": "entity", "id": "e2", "name": "Vault \ud800x"},
        {"kind": "relationship", "id": "r1", "from": "Deploy box", "to": "Vault \ud800x", "type": "HOLDS"},
    ]
    body = b"".join(json.dumps(record).encode() + b"\n" for record in records)
    assert api.post(api_url(USER, "import"), headers=NDJSON, content=body).status_code == 200
    exported = api.get(api_url(USER, "export")).content
    for secret in (key, aws, "Hunter2Secret"):
        assert secret.encode() not in exported
    assert exported.count(b"[REDACTED:") == 7
    # A lone surrogate (valid JSON, unstorable) is kept as the stores keep one, names included.
    assert [(r["kind"], r["id"]) for r in map(json.loads, exported.splitlines()) if "Vault" in json.dumps(
        r, ensure_ascii=False) or r["kind"] == "relationship"] == [("entity", "e2"), ("relationship", "r1")]
    assert "Vault \ufffdx" in exported.decode()


# --- deletes -----------------------------------------------------------------------------


def test_delete_one_item_of_each_kind(proxy: Any, loaded: httpx.Client) -> None:
    wait_for_vectors(proxy, USER, 6)  # each imported message, entity and trace has its vector: it goes too
    cases = [
        ("relationships", "r1", {"relationships": 1}),
        ("messages", "m3", {"messages": 1, "embeddings": 1}),
        ("entities", "e-acme", {"entities": 1, "embeddings": 1}),
        ("memories", "e-alice", {"entities": 1, "embeddings": 1}),
        ("conversations", "conv-a", {"conversations": 1, "messages": 2, "reasoning": 1, "embeddings": 3}),
    ]
    for plural, item, counts in cases:
        response = loaded.delete(api_url(USER, plural, item))
        assert response.status_code == 200, response.text
        assert response.json() == {"id": item, "deleted": counts}
        again = loaded.delete(api_url(USER, plural, item))
        singular = {"memories": "memory", "entities": "entity"}.get(plural, plural[:-1])
        assert error_of(again, 404)["message"] == f"user {USER} has no {singular} {item}"
    assert lines(loaded.get(api_url(USER, "export")).content) == [RECORDS[1]]


def test_deleting_an_entity_takes_its_relationships(loaded: httpx.Client) -> None:
    response = loaded.delete(api_url(USER, "entities", "e-alice"))
    assert response.json() == {"id": "e-alice", "deleted": {"entities": 1, "relationships": 1}}


def test_delete_a_user(proxy: Any, loaded: httpx.Client) -> None:
    chat(loaded, {"X-Memory-User": USER}, "ok, thanks")
    # Every item has its vector from the embedded model (the imported ones from the background
    # worker): 5 messages, 2 entities, 1 reasoning trace; the deletion takes all 8.
    wait_for_vectors(proxy, USER, 8)
    response = loaded.delete(api_url(USER))
    assert response.status_code == 200
    deleted = response.json()["deleted"]
    # The background extractor may or may not have taken the new turn's two messages off its queue yet.
    assert deleted.pop("extraction_queue") in (0, 1, 2)
    assert response.json()["user"] == USER
    assert deleted == {"conversations": 3, "embeddings": 8, "entities": 2, "hook_context": 0, "injections": 1,
                       "messages": 5, "provider_objects": 0, "reasoning": 1, "relationships": 1, "responses": 0,
                       "turn_tool_calls": 0, "turns": 1, "users": 1}
    assert loaded.get(api_url(USER, "export")).content == b""
    assert loaded.post(api_url(USER, "search"), json={"query": "Where does Alice Chen work?"}).json()["hits"] == []
    assert loaded.delete(api_url(USER)).json() == {"user": USER, "deleted": {
        "conversations": 0, "embeddings": 0, "entities": 0, "extraction_queue": 0, "hook_context": 0, "injections": 0,
        "messages": 0, "provider_objects": 0, "reasoning": 0, "relationships": 0, "responses": 0,
        "turn_tool_calls": 0, "turns": 0, "users": 0}}


# --- errors, methods, limits ------------------------------------------------------------------


def test_errors_have_the_openai_shape(api: httpx.Client) -> None:
    assert error_of(api.get("/memory/v1/users/a%20b/memories"), 400)["param"] == "user"
    assert error_of(api.get("/memory/v1/users/../memories"), 404)["code"] == "not_found"
    assert error_of(api.get("/memory/v1/nothing"), 404)["message"] == "no such path"
    assert error_of(api.put(api_url(USER, "memories")), 405)["code"] == "method_not_allowed"
    assert error_of(api.post(api_url(USER, "memories"), content=b"{", headers=JSON), 400)["message"] == (
        "the body must be a JSON object")
    assert error_of(api.post(api_url(USER, "memories"), json={"content": "x"}), 400)["message"] == (
        "`type` is required")
    assert error_of(api.post(api_url(USER, "memories"), json={"content": "x", "type": "fact", "tags": ["t"] * 11}),
                    400)["param"] == "tags"
    assert error_of(api.post(api_url(USER, "memories"), json={"content": "x" * 2001, "type": "fact"}),
                    400)["param"] == "content"
    for unseen in (" \t ", "\x04", "\x00\x07 \x1b"):  # nothing a person could read: no name to merge by
        refused = error_of(api.post(api_url(USER, "memories"), json={"content": unseen, "type": "pattern"}), 400)
        assert refused["message"] == "`content` must be a string of 1-2000 characters, not only spaces or control characters"
    assert error_of(api.patch(api_url(USER, "memories", "nope"), json={"content": "y"}), 404)["message"] == (
        "user alice has no memory nope")
    big = api.post(api_url(USER, "search"), content=b" " * (1024 * 1024 + 1), headers=JSON)
    assert error_of(big, 413)["code"] == "request_too_large"


def test_import_is_limited_by_max_body_bytes(make_proxy: Any) -> None:
    proxy = make_proxy(server__max_body_bytes=1000)
    with proxy.http() as api:
        response = api.post(api_url(USER, "import"), headers=NDJSON, content=jsonl(RECORDS))
        assert error_of(response, 413)["message"] == "the body is larger than the limit of 1000 bytes"


def test_the_openapi_document_lists_every_endpoint(api: httpx.Client) -> None:
    document = api.get("/memory/v1/openapi.json").json()
    operations = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    assert operations == {
        ("POST", "/users/{user}/search"), ("POST", "/users/{user}/memories"), ("GET", "/users/{user}/memories"),
        ("PATCH", "/users/{user}/memories/{id}"), ("GET", "/users/{user}/conversations"),
        ("GET", "/users/{user}/conversations/{id}/messages"), ("GET", "/users/{user}/entities"),
        ("GET", "/users/{user}/entities/{id}"), ("GET", "/users/{user}/reasoning"),
        ("GET", "/users/{user}/injections"), ("GET", "/users/{user}/export"), ("POST", "/users/{user}/import"),
        ("DELETE", "/users/{user}/memories/{id}"), ("DELETE", "/users/{user}/messages/{id}"),
        ("DELETE", "/users/{user}/entities/{id}"), ("DELETE", "/users/{user}/relationships/{id}"),
        ("DELETE", "/users/{user}/conversations/{id}"), ("DELETE", "/users/{user}"),
        ("GET", "/users/{user}"), ("GET", "/users/{user}/memories/{id}"),
    }


# --- who may call it ---------------------------------------------------------------------------


def test_the_api_token_is_required_when_set(make_proxy: Any) -> None:
    proxy = make_proxy(memory_api__token="api-secret-1")
    with proxy.http() as api:
        assert error_of(api.get(api_url(USER, "memories")), 401)["message"] == (
            "the memory API needs Authorization: Bearer <memory_api.token>")
        wrong = api.get(api_url(USER, "memories"), headers={"Authorization": "Bearer api-secret-2"})
        assert error_of(wrong, 401)["message"] == "the memory API token is not valid"
        right = api.get(api_url(USER, "memories"), headers={"Authorization": "Bearer api-secret-1"})
        assert right.status_code == 200
        assert api.get("/memory/v1/openapi.json").status_code == 200
        twice = api.get(api_url(USER, "memories"), headers=[("Authorization", "Bearer api-secret-1"),
                                                            ("Authorization", "Bearer api-secret-2")])
        assert error_of(twice, 400)["message"] == "Authorization appears more than once"


async def _from_remote(settings: Any, requests: list[tuple[str, str, dict[str, str]]]) -> list[httpx.Response]:
    """Requests to a whole app from a non-loopback client address, through its ASGI interface."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("203.0.113.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://memproxy") as client:
            return [await client.request(method, url, headers=headers) for method, url, headers in requests]


def test_without_a_token_only_loopback_clients_are_answered(fake: Any, tmp_path: Any) -> None:
    base = {"upstream.base_url": fake.url, "store.url": f"sqlite:///{tmp_path}/m.db"}
    open_settings = load_settings(environ={}, overrides=base)
    (remote,) = asyncio.run(_from_remote(open_settings, [("GET", api_url(USER, "memories"), {})]))
    assert error_of(remote, 403)["message"] == (
        "the memory API answers only loopback clients when memory_api.token is not set")

    token_settings = load_settings(environ={}, overrides={**base, "memory_api.token": "api-secret-1"})
    good = {"Authorization": "Bearer api-secret-1"}
    without, with_token = asyncio.run(_from_remote(token_settings, [("GET", api_url(USER, "memories"), {}),
                                                                    ("GET", api_url(USER, "memories"), good)]))
    assert error_of(without, 401)["code"] == "invalid_memory_api_token"
    assert (with_token.status_code, with_token.json()) == (200, {"object": "list", "data": [], "next_cursor": None})
