"""Deletion is final for turns in flight: a deleted user or conversation does not come back.

Streamed turns are still running (the upstream sends a chunk every 200 ms) when the user,
or one of its conversations, is deleted through the memory API. When the streams finish,
nothing of the deleted user or conversation is saved again; the user's later turns, an
import, and the turns of its other conversations save as usual. Every test runs on a SQLite
file and on a PostgreSQL schema.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.api_helpers import NDJSON, api_url, chat, jsonl, lines
from tests.conftest import RunningProxy
from tests.fake_upstream import FakeUpstream, JsonReply, Received, SSEReply, completion, stream_events

CHUNK_EVERY_S = 0.2
DELETE_AFTER_S = 0.7  # the streams' turns are started and saved; their answers are still coming


@pytest.fixture(params=["sqlite", "postgres"])
def replica(request: pytest.FixtureRequest, make_proxy: Callable[..., RunningProxy]) -> Callable[[], RunningProxy]:
    """Starts proxies sharing one store, on each store in turn; no fact extraction, so a user's
    export is its turns alone."""
    overrides: dict[str, Any] = {"memory__commit_timeout_ms": 5000, "extraction__from_roles": []}
    if request.param == "postgres":
        overrides["store__url"] = request.getfixturevalue("pg_url")
    return lambda: make_proxy(**overrides)


@pytest.fixture
def proxy(replica: Callable[[], RunningProxy]) -> RunningProxy:
    return replica()


class Stream(threading.Thread):
    """One streamed chat turn read to its end by the official client; when it ended and what it said."""

    def __init__(self, proxy: RunningProxy, headers: dict[str, str], question: str) -> None:
        super().__init__(daemon=True)
        self.client = proxy.client(**headers)
        self.question = question
        self.text = ""
        self.ended = 0.0

    def run(self) -> None:
        chunks = self.client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": self.question}], stream=True)
        self.text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        self.ended = time.monotonic()


def slow_answers(fake: FakeUpstream, texts: list[str]) -> None:
    fake.queue(*(SSEReply(stream_events(text), delay=CHUNK_EVERY_S) for text in texts))


def answers_by_question(fake: FakeUpstream, answers: dict[str, str]) -> None:
    """Slow answers chosen by the question each request asks, whatever order they arrive in."""
    def reply(request: Received) -> SSEReply:
        asked = request.json()["messages"][-1]["content"]  # a memory block may stand before the question
        text = next(answer for question, answer in answers.items() if asked.endswith(question))
        return SSEReply(stream_events(text), delay=CHUNK_EVERY_S)
    fake.queue(*(reply for _ in answers))


def run_streams(streams: list[Stream], during: Callable[[], object]) -> float:
    """Start the streams, call `during` DELETE_AFTER_S later, wait for the streams; when `during` was called."""
    for stream in streams:
        stream.start()
    time.sleep(DELETE_AFTER_S)
    called = time.monotonic()
    during()
    for stream in streams:
        stream.join(30)
    return called


def export(proxy: RunningProxy, user: str) -> list[dict[str, Any]]:
    with proxy.http() as http:
        response = http.get(api_url(user, "export"))
    assert response.status_code == 200
    return lines(response.content)


def kinds(records: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """The records as (kind, conversation, role, content), what a test compares."""
    return sorted((r["kind"], r.get("conversation_id") or r["id"], r.get("role", ""), r.get("content", ""))
                  for r in records)


def test_a_user_deleted_while_its_turns_stream_does_not_come_back(proxy: RunningProxy, fake: FakeUpstream) -> None:
    with proxy.http() as http:
        assert chat(http, {"X-Memory-User": "victim"}, "my locker code is 4417").status_code == 200
        slow_answers(fake, [f"slow answer {n}" for n in range(4)])
        streams = [Stream(proxy, {"X-Memory-User": "victim"}, f"streamed question {n}") for n in range(4)]
        deleted: list[int] = []
        asked = run_streams(streams, lambda: deleted.append(http.delete(api_url("victim")).status_code))
    assert deleted == [200]
    # The answers came whole, after the deletion was asked for: the turns were in flight then.
    assert sorted(stream.text for stream in streams) == [f"slow answer {n}" for n in range(4)]
    assert all(stream.ended > asked for stream in streams)
    assert export(proxy, "victim") == []
    # A later turn of the same user saves as usual.
    fake.queue(JsonReply(completion("later answer")))
    with proxy.http() as http:
        assert chat(http, {"X-Memory-User": "victim"}, "a later question").status_code == 200
    records = export(proxy, "victim")
    conversation = [r["id"] for r in records if r["kind"] == "conversation"]
    assert len(conversation) == 1
    assert kinds(records) == [("conversation", conversation[0], "", ""),
                              ("message", conversation[0], "assistant", "later answer"),
                              ("message", conversation[0], "user", "a later question")]


def test_a_user_deleted_through_another_replica_does_not_come_back(
        replica: Callable[[], RunningProxy], fake: FakeUpstream) -> None:
    serving, deleting = replica(), replica()
    slow_answers(fake, [f"slow answer {n}" for n in range(2)])
    streams = [Stream(serving, {"X-Memory-User": "victim"}, f"streamed question {n}") for n in range(2)]
    with deleting.http() as http:
        asked = run_streams(streams, lambda: http.delete(api_url("victim")).raise_for_status())
    assert sorted(stream.text for stream in streams) == ["slow answer 0", "slow answer 1"]
    assert all(stream.ended > asked for stream in streams)
    assert export(serving, "victim") == export(deleting, "victim") == []


def test_an_import_after_a_deletion_with_turns_in_flight_restores_the_records(
        proxy: RunningProxy, fake: FakeUpstream) -> None:
    records = [{"kind": "conversation", "id": "restored", "created_at": "2026-03-01T00:00:00+00:00",
                "last_active_at": "2026-03-01T00:00:00+00:00"},
               {"kind": "message", "id": "m1", "conversation_id": "restored", "role": "user",
                "content": "imported after the deletion", "created_at": "2026-03-01T00:00:00+00:00"}]
    slow_answers(fake, ["slow answer"])
    stream = Stream(proxy, {"X-Memory-User": "victim", "X-Memory-Conversation": "restored"}, "streamed question")
    with proxy.http() as http:
        run_streams([stream], lambda: http.delete(api_url("victim")).raise_for_status())
        imported = http.post(api_url("victim", "import"), headers=NDJSON, content=jsonl(records))
    assert imported.json() == {"imported": {"conversation": 1, "message": 1}, "skipped": {}}
    assert stream.text == "slow answer"
    # The turn in flight in the same conversation id saved nothing over the import.
    assert kinds(export(proxy, "victim")) == [("conversation", "restored", "", ""),
                                             ("message", "restored", "user", "imported after the deletion")]


def test_deleting_a_conversation_drops_only_its_turns_in_flight(proxy: RunningProxy, fake: FakeUpstream) -> None:
    answers_by_question(fake, {"question in doomed": "answer in doomed", "question in kept": "answer in kept"})
    streams = [Stream(proxy, {"X-Memory-User": "u1", "X-Memory-Conversation": "doomed"}, "question in doomed")]
    streams[0].start()
    streams.append(Stream(proxy, {"X-Memory-User": "u1", "X-Memory-Conversation": "kept"}, "question in kept"))
    with proxy.http() as http:
        deleted: list[int] = []
        run_streams(streams[1:], lambda: deleted.append(
            http.delete(api_url("u1", "conversations", "doomed")).status_code))
        streams[0].join(30)
    assert deleted == [200]
    assert [stream.text for stream in streams] == ["answer in doomed", "answer in kept"]
    assert kinds(export(proxy, "u1")) == [("conversation", "kept", "", ""),
                                          ("message", "kept", "assistant", "answer in kept"),
                                          ("message", "kept", "user", "question in kept")]
    # The deleted conversation's id is free again: a later turn in it saves.
    fake.queue(JsonReply(completion("a new start")))
    with proxy.http() as http:
        chat(http, {"X-Memory-User": "u1", "X-Memory-Conversation": "doomed"}, "starting over").raise_for_status()
    assert [r for r in kinds(export(proxy, "u1")) if r[1] == "doomed"] == [
        ("conversation", "doomed", "", ""), ("message", "doomed", "assistant", "a new start"),
        ("message", "doomed", "user", "starting over")]


def test_a_tool_loops_next_step_after_a_deletion_gets_a_block_without_the_deleted_items(
        proxy: RunningProxy, fake: FakeUpstream) -> None:
    user = {"X-Memory-User": "alice"}
    with proxy.http() as http:
        chat(http, {**user, "X-Memory-Conversation": "secrets"},
             "The deploy token lives in vault path secret/deploy/prod-7731.").raise_for_status()
        chat(http, {**user, "X-Memory-Conversation": "notes"},
             "The deploy token rotation runs every Monday.").raise_for_status()
    client = proxy.client(**user, **{"X-Memory-Conversation": "loop"})
    messages: Any = [{"role": "user", "content": "where does the deploy token live?"}]
    blocks = []
    for step in range(3):
        fake.queue(JsonReply(completion(None, tool_calls=[{"id": f"call_{step}", "name": "vault", "arguments": "{}"}])))
        client.chat.completions.create(model="m", messages=messages)
        blocks.append(json.loads(fake.chat_requests()[-1].body)["messages"][0]["content"])
        messages += [{"role": "assistant", "content": None, "tool_calls": [
                         {"id": f"call_{step}", "type": "function", "function": {"name": "vault", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": f"call_{step}", "content": "ok"}]
        if step == 0:
            with proxy.http() as http:
                http.delete(api_url("alice", "conversations", "secrets")).raise_for_status()
    assert "prod-7731" in blocks[0] and "every Monday" in blocks[0]
    # The step after the deletion recomputed the block without the deleted conversation; the
    # step after that reuses the new block byte for byte.
    assert "prod-7731" not in blocks[1] and "every Monday" in blocks[1]
    assert blocks[2] == blocks[1]
    with proxy.http() as http:
        injections = http.get(api_url("alice", "injections")).json()["data"]
    assert len([entry for entry in injections if entry["conversation_id"] == "loop"]) == 1
