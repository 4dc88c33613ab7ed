"""Tools mode on the Chat Completions wire, through the real proxy, the openai SDK and a
scripted fake model that, like the real provider, refuses a history whose tool calls lack
their results."""

from __future__ import annotations

import concurrent.futures
import gzip
import json
import sqlite3
import time
from typing import Any

import httpx
import openai
import pytest

from proxy.memory.tools import NOTHING_FOUND, REFUSED, ROUNDS_USED, STORED, STORING
from tests.api_helpers import api_url
from tests.fake_upstream import JsonReply, SSEReply, SlowHeaders, model_round, stream_events
from tests.proxy_db import eventually, rows, sqlite_file, store_path

TOOLS = {"X-Memory-User": "alice", "X-Memory-Mode": "tools"}
HELIX = "My favourite editor is Helix"


@pytest.fixture
def tproxy(make_proxy: Any) -> Any:
    return make_proxy(memory__commit_timeout_ms=5000, extraction__from_roles=[])


def remember(proxy: Any, content: str, user: str = "alice") -> str:
    with proxy.http() as http:
        response = http.post(api_url(user, "memories"), json={"content": content, "type": "fact"})
    assert response.status_code == 201
    return response.json()["id"]


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": json.dumps(arguments)}


def sent(fake: Any) -> list[dict[str, Any]]:
    return [request.json() for request in fake.chat_requests()]


def ask(proxy: Any, text: str = "which editor do I like?", **headers: str) -> Any:
    return proxy.client(**{**TOOLS, **headers}).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": text}])


def streamed(proxy: Any, messages: list[dict[str, Any]], **body: Any) -> tuple[list[Any], Any]:
    """The chunks the SDK's own stream parser read, and the completion it built from them."""
    client = proxy.client(**TOOLS)
    with client.chat.completions.stream(model="m", messages=messages, **body) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    return chunks, final


def raw_stream(proxy: Any, messages: list[dict[str, Any]]) -> bytes:
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", headers=TOOLS,
                             json={"model": "m", "stream": True, "messages": messages})
    assert response.status_code == 200
    return response.content


def messages_bytes(body: bytes) -> bytes:
    """The `messages` array of a request body, as the bytes sent."""
    text = body.decode("utf-8")
    start = text.index('"messages":') + len('"messages":')
    _, end = json.JSONDecoder().raw_decode(text, start)
    return text[start:end].encode("utf-8")


def saved_messages(proxy: Any, user: str = "alice") -> list[tuple[str, str]]:
    with proxy.http() as http:
        conversations = http.get(api_url(user, "conversations")).json()["data"]
        found = []
        for conversation in conversations:
            listed = http.get(api_url(user, "conversations", conversation["id"], "messages")).json()["data"]
            found += [(m["role"], m["content"]) for m in listed]
    return found


def test_query_then_answer_json(tproxy, fake):
    remember(tproxy, HELIX)
    fake.queue(model_round(None, [call("call_q1", "query_memory", {"query": "favourite editor"})],
                           answer_id="chatcmpl-r1"),
               model_round("You like Helix.", answer_id="chatcmpl-r2",
                           usage={"prompt_tokens": 70, "completion_tokens": 4, "total_tokens": 74}))
    raw = ask(tproxy)
    answer = raw.parse()
    assert answer.choices[0].message.content == "You like Helix."
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage.prompt_tokens == 70  # the last round's usage
    assert raw.headers["x-memory-tool-calls"] == "1"
    first, second = sent(fake)
    assert [t["function"]["name"] for t in first["tools"]] == ["query_memory", "store_memory"]
    assert second["tools"] == first["tools"]  # every round offers the same tools
    assert second["messages"][:1] == first["messages"]
    assistant, result = second["messages"][1:]
    assert assistant["tool_calls"] == [{"id": "call_q1", "type": "function", "function": {
        "name": "query_memory", "arguments": '{"query": "favourite editor"}'}}]
    assert result["role"] == "tool" and result["tool_call_id"] == "call_q1"
    assert HELIX in result["content"]
    assert eventually(lambda: saved_messages(tproxy) == [("user", "which editor do I like?"),
                                                         ("assistant", "You like Helix.")])
    # The query's hits are in the injection log, under the turn, as inject mode's block's would be.
    with tproxy.http() as http:
        logged = http.get(api_url("alice", "injections")).json()["data"]
    assert [(e["turn_id"], e["injected"]) for e in logged] == [(raw.headers["x-memory-turn"], 1)]
    assert logged[0]["log"]["tool_queries"] == [{"query": "favourite editor", "hits": 1}]
    assert logged[0]["log"]["hits"][0]["source"] == "long-term"
    # Token totals over the rounds go to the log only; the client's usage is the last round's.
    assert logged[0]["log"]["tokens"] == {"input_tokens": 75, "output_tokens": 9, "rounds": 2}


def test_the_memory_calls_go_into_the_turn_s_reasoning_trace(tproxy, fake):
    remember(tproxy, HELIX)
    fake.queue(model_round(None, [call("call_q1", "query_memory", {"query": "editor sk-proj-" + "a" * 40})]),
               model_round("You like Helix."))
    ask(tproxy)
    assert eventually(lambda: len(rows(tproxy, "SELECT 1 FROM reasoning")) == 1)
    [(task, steps, answer)] = rows(tproxy, "SELECT task, steps, answer FROM reasoning")
    assert (task, answer) == ("which editor do I like?", "You like Helix.")
    [step] = json.loads(steps)
    assert (step["name"], step["arguments"]) == ("query_memory", '{"query": "editor [REDACTED:openai_key]"}')
    assert HELIX in step["result"] and len(step["result"]) <= 200
    # Not into the conversation: it holds the question and the answer only.
    assert saved_messages(tproxy) == [("user", "which editor do I like?"), ("assistant", "You like Helix.")]


def test_query_then_answer_stream(tproxy, fake):
    remember(tproxy, HELIX)
    fake.queue(model_round("Let me look.", [call("call_q1", "query_memory", {"query": "favourite editor"})],
                           answer_id="chatcmpl-r1",
                           usage={"prompt_tokens": 50, "completion_tokens": 9, "total_tokens": 59}),
               model_round("You like Helix.", answer_id="chatcmpl-r2",
                           usage={"prompt_tokens": 80, "completion_tokens": 4, "total_tokens": 84}))
    chunks, final = streamed(tproxy, [{"role": "user", "content": "which editor do I like?"}],
                             stream_options={"include_usage": True})
    assert final.choices[0].message.content == "Let me look.\n\nYou like Helix."
    assert not final.choices[0].message.tool_calls
    assert {chunk.id for chunk in chunks} == {"chatcmpl-r1"}  # the first round's id throughout
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert [c.usage.prompt_tokens for c in chunks if c.usage] == [80]  # the last round's usage, once
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.role) == 1
    assert HELIX in sent(fake)[1]["messages"][-1]["content"]
    assert eventually(lambda: ("assistant", "Let me look.\n\nYou like Helix.") in saved_messages(tproxy))


def test_the_stream_has_one_done_and_no_memory_call(tproxy, fake):
    fake.queue(model_round("Checking.", [call("call_q1", "query_memory", {"query": "editor"})]),
               model_round("Nothing known."))
    body = raw_stream(tproxy, [{"role": "user", "content": "which editor do I like?"}])
    assert body.count(b"data: [DONE]") == 1 and body.endswith(b"data: [DONE]\n\n")
    assert b"query_memory" not in body and b"tool_calls" not in body
    assert NOTHING_FOUND in sent(fake)[1]["messages"][-1]["content"]


def test_store_then_answer_is_stored_and_injected_later(tproxy, fake):
    fake.queue(model_round(None, [call("call_s1", "store_memory", {
        "content": "The user's dog is called Biscuit", "type": "fact", "tags": ["pets"]})]),
               model_round("Noted: Biscuit."))
    raw = ask(tproxy, "remember that my dog is called Biscuit")
    assert raw.parse().choices[0].message.content == "Noted: Biscuit."
    assert raw.headers["x-memory-tool-calls"] == "1"
    assert sent(fake)[1]["messages"][-1]["content"] == STORED
    with tproxy.http() as http:
        memories = http.get(api_url("alice", "memories")).json()["data"]
    assert [m["content"] for m in memories if "Biscuit" in m["content"]] == ["The user's dog is called Biscuit"]
    tproxy.client(**{"X-Memory-User": "alice", "X-Memory-Conversation": "later"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "what is my dog called?"}])
    assert "The user's dog is called Biscuit" in sent(fake)[-1]["messages"][-1]["content"]


@pytest.mark.parametrize("deleted", ["user", "conversation"])
def test_a_memory_stored_after_its_user_or_conversation_was_deleted_does_not_bring_it_back(tproxy, fake, deleted):
    """The model's round with store_memory comes 1.5 s after the turn began; the user (or the
    conversation) is deleted meanwhile: neither the fact nor the interaction is saved."""
    calls = [call("call_s1", "store_memory", {"content": "The user's passport is in the desk", "type": "fact"}),
             call("call_s2", "store_memory", {"content": "Asked where the passport is", "type": "interaction"})]
    fake.queue(lambda request: SlowHeaders(1.5, model_round(None, calls)(request)), model_round("Noted."))
    path = api_url("alice") if deleted == "user" else api_url("alice", "conversations/doomed")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(ask, tproxy, "remember where my passport is", **{"X-Memory-Conversation": "doomed"})
        eventually(lambda: len(fake.chat_requests()) == 1)
        time.sleep(0.3)
        with tproxy.http() as http:
            assert http.delete(path).status_code == 200
        assert answer.result(10).parse().choices[0].message.content == "Noted."
    assert sent(fake)[1]["messages"][-1]["content"] == STORED
    assert rows(tproxy, "SELECT count(*) FROM entities WHERE user_id = 'alice'") == [(0,)]
    assert rows(tproxy, "SELECT count(*) FROM messages WHERE conversation_id = 'doomed'") == [(0,)]


def test_store_memory_is_redacted_like_the_api(tproxy, fake):
    secret = "sk-proj-" + "a1B2c3D4e5F6g7H8i9J0" * 2
    fake.queue(model_round(None, [call("call_s1", "store_memory", {
        "content": f"The user's deploy key is {secret}", "type": "fact"})]), model_round("Done."))
    ask(tproxy, "keep my deploy key")
    with tproxy.http() as http:
        contents = [m["content"] for m in http.get(api_url("alice", "memories")).json()["data"]]
    assert any(c.startswith("The user's deploy key is") for c in contents)
    assert not any(secret in c for c in contents)


def test_query_and_store_in_one_round(tproxy, fake):
    remember(tproxy, HELIX)
    fake.queue(model_round("One moment.", [call("call_q1", "query_memory", {"query": "favourite editor"}),
                                           call("call_s1", "store_memory", {"content": "The user asked about "
                                                                            "editors", "type": "pattern"})]),
               model_round("Helix."))
    raw = ask(tproxy)
    assert raw.parse().choices[0].message.content == "One moment.\n\nHelix."
    assert raw.headers["x-memory-tool-calls"] == "2"
    messages = sent(fake)[1]["messages"]
    assert messages[1]["content"] == "One moment."
    assert [m["tool_call_id"] for m in messages[2:]] == ["call_q1", "call_s1"]


def test_app_tool_and_memory_tool_in_one_round(tproxy, fake):
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    fake.queue(model_round(None, [call("call_app1", "get_weather", {"city": "Oslo"}),
                                  call("call_q1", "query_memory", {"query": "home city"})]),
               model_round(None, [call("call_app2", "get_weather", {"city": "Oslo"})]))
    client = tproxy.client(**TOOLS)
    prompt = [{"role": "user", "content": "weather at home?"}]
    raw = client.chat.completions.with_raw_response.create(model="m", messages=prompt, tools=[weather])
    message = raw.parse().choices[0].message
    assert [(c.id, c.function.name) for c in message.tool_calls] == [("call_app2", "get_weather")]
    assert raw.parse().choices[0].finish_reason == "tool_calls"
    # The app call of the mixed round has no result yet: it is left out of what the model sees.
    second = sent(fake)[1]["messages"]
    assert [c["id"] for c in second[1]["tool_calls"]] == ["call_q1"]
    # The app runs its tool; the next step belongs to the same turn and saves the answer once.
    fake.queue(model_round("It is 4 degrees in Oslo."))
    step = client.chat.completions.with_raw_response.create(model="m", tools=[weather], messages=prompt + [
        message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": "call_app2", "content": "4 C"}])
    assert step.headers["x-memory-turn"] == raw.headers["x-memory-turn"]
    assert step.parse().choices[0].message.content == "It is 4 degrees in Oslo."
    # In place of the echoed answer the model sees what it saw: the memory exchange, byte for byte,
    # then its own last output, then the app's result.
    round_two, next_step = (messages_bytes(r.body) for r in fake.chat_requests()[1:])
    assert next_step.startswith(round_two[:-1] + b",")
    assert json.loads(next_step)[3:] == [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_app2", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_app2", "content": "4 C"}]
    assert eventually(lambda: saved_messages(tproxy) == [("user", "weather at home?"),
                                                         ("assistant", "It is 4 degrees in Oslo.")])


def test_a_memory_deleted_between_steps_is_not_replayed_to_the_model(tproxy, fake):
    bergen = remember(tproxy, "My home city is Bergen")
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    fake.queue(model_round(None, [call("call_q1", "query_memory", {"query": "home city"})]),
               model_round(None, [call("call_app1", "get_weather", {"city": "Bergen"})]))
    client = tproxy.client(**TOOLS)
    prompt = [{"role": "user", "content": "weather at home?"}]
    raw = client.chat.completions.with_raw_response.create(model="m", messages=prompt, tools=[weather])
    message = raw.parse().choices[0].message
    assert "My home city is Bergen" in sent(fake)[1]["messages"][-1]["content"]
    with tproxy.http() as http:
        assert http.delete(api_url("alice", "memories", bergen)).status_code in (200, 204)
    fake.queue(model_round("It is 9 degrees."))
    step = client.chat.completions.with_raw_response.create(model="m", tools=[weather], messages=prompt + [
        message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": "call_app1", "content": "9 C"}])
    assert step.headers["x-memory-turn"] == raw.headers["x-memory-turn"]
    # Deletion wins over replaying the loop's bytes: the model gets the client's history as sent.
    assert "My home city is Bergen" not in json.dumps(sent(fake)[-1]["messages"])
    assert sent(fake)[-1]["messages"][1:] == [
        {"role": "assistant", "tool_calls": [{"id": "call_app1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Bergen"}'}}]},
        {"role": "tool", "tool_call_id": "call_app1", "content": "9 C"}]


def test_app_tool_and_memory_tool_stream(tproxy, fake):
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    fake.queue(model_round("Looking.", [call("call_app1", "get_weather", {"city": "Oslo"}),
                                        call("call_q1", "query_memory", {"query": "home city"})]),
               model_round(None, [call("call_app2", "get_weather", {"city": "Bergen"})]))
    chunks, final = streamed(tproxy, [{"role": "user", "content": "weather at home?"}], tools=[weather])
    message = final.choices[0].message
    assert message.content == "Looking."
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("call_app2", "get_weather", '{"city": "Bergen"}')]
    assert final.choices[0].finish_reason == "tool_calls"


def test_next_step_after_a_streamed_step_carries_its_exchange(tproxy, fake):
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    fake.queue(model_round("Looking.", [call("call_q1", "query_memory", {"query": "home city"})]),
               model_round("Found it.", [call("call_app2", "get_weather", {"city": "Bergen"})]))
    prompt = [{"role": "user", "content": "weather at home?"}]
    _, final = streamed(tproxy, prompt, tools=[weather])
    echo = final.choices[0].message.model_dump(exclude_none=True, exclude={"parsed", "refusal"})
    assert echo["content"] == "Looking.\n\nFound it."
    fake.queue(model_round("Rain in Bergen."))
    _, last = streamed(tproxy, prompt + [echo, {"role": "tool", "tool_call_id": "call_app2", "content": "rain"}],
                       tools=[weather])
    assert last.choices[0].message.content == "Rain in Bergen."
    round_two, next_step = (messages_bytes(r.body) for r in fake.chat_requests()[1:])
    assert next_step.startswith(round_two[:-1] + b",")
    assert [m.get("content") for m in json.loads(next_step)[3:]] == ["Found it.", "rain"]
    assert eventually(lambda: saved_messages(tproxy) == [("user", "weather at home?"),
                                                         ("assistant", "Rain in Bergen.")])


def test_rounds_are_capped_then_tool_use_is_forbidden(make_proxy, fake):
    proxy = make_proxy(memory__tool_rounds=2, extraction__from_roles=[])
    rounds = [model_round(None, [call(f"call_q{n}", "query_memory", {"query": f"try {n}"})]) for n in range(4)]
    fake.queue(*rounds, model_round("I could not find it."))
    raw = ask(proxy)
    assert raw.parse().choices[0].message.content == "I could not find it."
    assert raw.headers["x-memory-tool-calls"] == "2"
    requests = sent(fake)
    assert len(requests) == 5
    assert [r.get("tool_choice") for r in requests] == [None, None, None, None, "none"]
    results = [m["content"] for m in requests[4]["messages"] if m["role"] == "tool"]
    assert results[:2] == [NOTHING_FOUND, NOTHING_FOUND]
    assert results[2:] == [f"Error: {ROUNDS_USED}"] * 2


def test_never_ending_memory_calls_stream(make_proxy, fake):
    proxy = make_proxy(memory__tool_rounds=1, extraction__from_roles=[])
    rounds = [model_round(f"r{n}.", [call(f"call_q{n}", "query_memory", {"query": "x"})]) for n in range(3)]
    fake.queue(*rounds, model_round("Final."))
    _, final = streamed(proxy, [{"role": "user", "content": "which editor do I like?"}])
    assert final.choices[0].message.content == "r0.\n\nr1.\n\nr2.\n\nFinal."
    assert [r.get("tool_choice") for r in sent(fake)] == [None, None, None, "none"]


def test_another_users_memory_is_never_returned(tproxy, fake):
    remember(tproxy, HELIX, user="alice")
    fake.queue(model_round(None, [call("call_q1", "query_memory", {"query": "favourite editor Helix"})]),
               model_round("I was not told."))
    ask(tproxy, **{"X-Memory-User": "bob"})
    assert sent(fake)[1]["messages"][-1]["content"] == NOTHING_FOUND


def test_a_client_tool_of_the_same_name_wins(tproxy, fake):
    own = {"type": "function", "function": {"name": "query_memory", "parameters": {"type": "object"}}}
    fake.queue(model_round(None, [call("call_x", "query_memory", {"q": "mine"})]))
    answer = tproxy.client(**TOOLS).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], tools=[own])
    assert [c.id for c in answer.choices[0].message.tool_calls] == ["call_x"]  # the client's own call
    assert [t["function"]["name"] for t in sent(fake)[0]["tools"]] == ["query_memory", "store_memory"]
    assert sent(fake)[0]["tools"][0] == own and len(sent(fake)) == 1


def test_a_failing_store_gives_the_model_an_error_and_the_client_its_answer(tproxy, fake):
    with sqlite_file(store_path(tproxy)) as db:  # the store refuses every new entity
        db.execute("CREATE TRIGGER no_entities BEFORE INSERT ON entities BEGIN SELECT RAISE(ABORT, 'refused'); END")
    fake.queue(model_round(None, [call("call_s1", "store_memory", {"content": "a note", "type": "fact"})]),
               model_round("I could not save that."))
    raw = ask(tproxy, "remember my note")
    assert raw.parse().choices[0].message.content == "I could not save that."
    assert sent(fake)[1]["messages"][-1]["content"] == REFUSED
    assert raw.headers["x-memory-status"] == "ok"


def test_a_store_memory_past_its_bound_is_told_the_truth_and_lands_once(make_proxy, fake):
    # The store is locked for a moment: the round waits out the commit bound, no longer. The
    # writer holds the write and commits it once the lock goes, so the model is told it is
    # being stored, not that it failed (it would store it again, or tell the user it could not).
    proxy = make_proxy(memory__commit_timeout_ms=300, extraction__from_roles=[])
    fake.queue(model_round("Hi."))
    ask(proxy, "warm up")  # the store exists and is warm
    note = "The user's locker code is kept in the red notebook"
    locker = sqlite3.connect(store_path(proxy), timeout=1, check_same_thread=False)
    locker.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
    try:
        fake.queue(model_round(None, [call("call_s1", "store_memory", {"content": note, "type": "fact"})]),
                   model_round("I will remember that."))
        started = time.monotonic()
        raw = proxy.client(**TOOLS).with_options(timeout=20).chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "remember where my locker code is"}])
        waited = time.monotonic() - started
        assert sent(fake)[-1]["messages"][-1]["content"] == STORING
    finally:
        locker.rollback()
        locker.close()
    assert raw.parse().choices[0].message.content == "I will remember that."
    assert waited < 3  # the bound, not the lock's (the store's busy timeout is 5 s)

    def stored() -> list[str]:
        with proxy.http() as http:
            return [m["content"] for m in http.get(api_url("alice", "memories")).json()["data"]]

    assert eventually(lambda: note in stored())
    assert stored().count(note) == 1
    with proxy.http() as http:
        metrics = http.get("/metrics").text
    assert 'reason="store_memory timeout"' not in metrics  # nothing degraded: the write is the writer's


def test_bad_arguments_get_an_error_result(tproxy, fake):
    fake.queue(model_round(None, [call("call_s1", "store_memory", {"content": "x", "type": "rumour"})]),
               model_round("Sorry."))
    ask(tproxy)
    assert sent(fake)[1]["messages"][-1]["content"].startswith("Error: `type` must be one of fact")


def test_a_later_round_refused_ends_the_stream_with_the_wire_error(tproxy, fake):
    fake.queue(model_round("Checking.", [call("call_q1", "query_memory", {"query": "x"})]),
               JsonReply({"error": {"message": "overloaded", "type": "server_error", "code": None}}, status=503))
    client = tproxy.client(**TOOLS)
    with pytest.raises(openai.APIError) as raised:
        with client.chat.completions.stream(model="m", messages=[{"role": "user", "content": "hi"}]) as stream:
            for _ in stream:
                pass
    assert "overloaded" in str(raised.value)


def test_a_later_round_cut_short_ends_the_stream_with_the_wire_error(tproxy, fake):
    fake.queue(model_round("Checking.", [call("call_q1", "query_memory", {"query": "x"})]),
               SSEReply(stream_events("half an answ", done=False)))
    body = raw_stream(tproxy, [{"role": "user", "content": "hi"}])
    assert b"[DONE]" not in body
    assert body.endswith(b'data: {"error":{"message":"upstream stream ended before completion","type":'
                         b'"upstream_error","param":null,"code":"stream_truncated"}}\n\n')
    assert eventually(lambda: rows(tproxy, "SELECT status FROM turns") == [("truncated",)])


def test_a_provider_error_event_in_a_later_round_is_the_end(tproxy, fake):
    error = b'data: {"error": {"message": "overloaded", "type": "server_error", "code": null}}\n\n'
    fake.queue(model_round("Checking.", [call("call_q1", "query_memory", {"query": "x"})]),
               SSEReply(stream_events("par", done=False)[:2] + [error]))
    body = raw_stream(tproxy, [{"role": "user", "content": "hi"}])
    assert b"[DONE]" not in body and body.endswith(error)


def test_memory_mode_tools_in_config(make_proxy, fake):
    proxy = make_proxy(memory__mode="tools", extraction__from_roles=[])
    fake.queue(model_round("Hi."))
    proxy.client(**{"X-Memory-User": "alice"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}])
    assert [t["function"]["name"] for t in sent(fake)[0]["tools"]] == ["query_memory", "store_memory"]
    fake.queue(model_round("Hi."))
    proxy.client(**{"X-Memory-User": "alice", "X-Memory-Mode": "inject"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi again"}])
    assert "tools" not in sent(fake)[1]


def test_an_unknown_mode_is_400(tproxy, fake):
    with httpx.Client(base_url=tproxy.url) as http:
        response = http.post("/v1/chat/completions", json={"model": "m", "messages": []},
                             headers={"x-memory-user": "alice", "x-memory-mode": "agentic"})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "X-Memory-Mode must be inject, tools or off"


def test_a_client_that_leaves_cancels_the_round_in_flight(tproxy, fake):
    fake.queue(model_round("Checking.", [call("call_q1", "query_memory", {"query": "x"})]),
               SSEReply(stream_events("never finished", pieces=2), stall_after=2))
    with tproxy.http() as http:
        with http.stream("POST", "/v1/chat/completions", headers=TOOLS, json={
                "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as response:
            seen = b""
            for chunk in response.iter_raw():
                seen += chunk
                if b"never" in seen:
                    break
    assert len(fake.chat_requests()) == 2
    assert fake.wait_closed()  # the second round's upstream request was cancelled
    assert eventually(lambda: rows(tproxy, "SELECT status FROM turns") == [("client_aborted",)])


def test_memory_that_cannot_be_read_sends_the_request_on_without_tools(make_proxy, fake, tmp_path):
    # The writes that cannot land hold the shutdown for its grace period: 1 s, not the default 10.
    proxy = make_proxy(store__url=f"sqlite:///{tmp_path}/missing-dir/x.db", extraction__from_roles=[],
                       server__grace_period_s=1)
    fake.queue(model_round("Hi."))
    raw = ask(proxy)
    assert raw.parse().choices[0].message.content == "Hi."
    assert raw.headers["x-memory-status"] == "degraded: store unavailable"
    assert "tools" not in sent(fake)[0] and "x-memory-tool-calls" not in raw.headers


def test_a_retried_request_stores_its_memory_once(tproxy, fake):
    store = call("call_s1", "store_memory", {"content": "The user's dog is called Biscuit", "type": "fact"})
    for _ in range(2):  # the SDK's retry: the same history again, the model calls store_memory again
        fake.queue(model_round(None, [store]), model_round("Noted."))
        raw = ask(tproxy, "remember that my dog is called Biscuit")
    with tproxy.http() as http:
        memories = http.get(api_url("alice", "memories")).json()["data"]
    assert [m["content"] for m in memories if "Biscuit" in m["content"]] == ["The user's dog is called Biscuit"]
    assert eventually(lambda: saved_messages(tproxy) == [("user", "remember that my dog is called Biscuit"),
                                                         ("assistant", "Noted.")])
    assert raw.headers["x-memory-tool-calls"] == "1"


def test_without_persisting_the_next_step_still_gets_its_exchange_back(tproxy, fake):
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    fake.queue(model_round(None, [call("call_q1", "query_memory", {"query": "home city"})]),
               model_round(None, [call("call_app2", "get_weather", {"city": "Bergen"})]))
    client = tproxy.client(**TOOLS, **{"X-Memory-Persist": "false"})
    prompt = [{"role": "user", "content": "weather at home?"}]
    message = client.chat.completions.create(model="m", messages=prompt, tools=[weather]).choices[0].message
    fake.queue(model_round("Rain in Bergen."))
    client.chat.completions.create(model="m", tools=[weather], messages=prompt + [
        message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": "call_app2", "content": "rain"}])
    round_two, next_step = (messages_bytes(r.body) for r in fake.chat_requests()[1:])
    assert next_step.startswith(round_two[:-1] + b",")
    assert saved_messages(tproxy) == []
    # The step's exchange alone: its memory calls are kept only for a trace that is saved.
    [(kept,)] = rows(tproxy, "SELECT exchange FROM turn_tool_calls")
    assert [m.get("tool_call_id") for m in json.loads(kept)] == [None, "call_q1", None]


def test_an_interaction_is_stored_once_on_a_retry_in_the_turn_s_conversation(tproxy, fake):
    store = call("call_s1", "store_memory", {"content": "We discussed the dog Biscuit", "type": "interaction"})
    for _ in range(2):  # the user's first turn, then the SDK's retry of it
        fake.queue(model_round(None, [store]), model_round("Noted."))
        raw = ask(tproxy, "remember our talk")
    assert raw.parse().choices[0].message.content == "Noted."

    def messages() -> list[tuple[str, str, str]]:
        return rows(tproxy, "SELECT conversation_id, role, content FROM messages WHERE user_id = 'alice'")

    assert eventually(lambda: ("assistant", "Noted.") in [m[1:] for m in messages()])
    got = messages()
    assert sorted(m[1:] for m in got) == [("assistant", "Noted."), ("assistant", "We discussed the dog Biscuit"),
                                          ("user", "remember our talk")]
    assert len({m[0] for m in got}) == 1  # the turn's own conversation


def test_a_compressed_stream_is_read_and_the_client_gets_it_plain(tproxy, fake):
    def gzipped(events: list[bytes]) -> SSEReply:
        packed = gzip.compress(b"".join(events))
        return SSEReply([packed[:40], packed[40:]], headers=[("content-encoding", "gzip")])

    query = call("call_q1", "query_memory", {"query": "editor"})
    fake.queue(gzipped(stream_events("Checking.", tool_calls=[query])), gzipped(stream_events("Final.")))
    with tproxy.http() as http:
        response = http.post("/v1/chat/completions", headers=TOOLS, json={
            "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert "content-encoding" not in response.headers
    assert b"query_memory" not in response.content and response.content.count(b"data: [DONE]") == 1
    chunks = [json.loads(line[6:]) for line in response.text.splitlines()
              if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == \
        "Checking.\n\nFinal."
    assert sent(fake)[1]["messages"][-1]["content"] == NOTHING_FOUND


def test_a_client_custom_tool_of_the_same_name_wins(tproxy, fake):
    own = {"type": "custom", "custom": {"name": "query_memory", "description": "the app's own notes"}}
    fake.queue(model_round("Hi."))
    answer = tproxy.client(**TOOLS).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], tools=[own])
    assert answer.choices[0].message.content == "Hi."
    # One tool of each name: the client's custom one, and memproxy's store_memory alone.
    assert [(t["type"], t[t["type"]]["name"]) for t in sent(fake)[0]["tools"]] == [
        ("custom", "query_memory"), ("function", "store_memory")]
    assert sent(fake)[0]["tools"][0] == own


def test_query_limit_as_a_model_writes_it(tproxy, fake):
    remember(tproxy, HELIX)
    remember(tproxy, "My second favourite editor is Vim")
    limits = ["1", 2.0, " 2 ", 2.5, "two", 0, 21, True, None]
    fake.queue(model_round(None, [call(f"call_q{n}", "query_memory", {"query": "favourite editor", "limit": limit})
                                  for n, limit in enumerate(limits)]),
               model_round("Helix, then Vim."))
    raw = ask(tproxy)
    assert raw.parse().choices[0].message.content == "Helix, then Vim."
    results = [m["content"] for m in sent(fake)[1]["messages"] if m["role"] == "tool"]
    found = [sum(1 for line in text.splitlines() if line[:3] in ("1. ", "2. ")) for text in results[:3]]
    assert found == [1, 2, 2]  # an integral float or a numeric string is the number it says
    assert results[3:] == ["Error: `limit` must be a whole number from 1 to 20"] * 6


def test_the_trace_holds_every_step_s_memory_calls_once_in_order(tproxy, fake):
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    forecast = {"type": "function", "function": {"name": "get_forecast", "parameters": {"type": "object"}}}
    client = tproxy.client(**TOOLS)
    history: list[dict[str, Any]] = [{"role": "user", "content": "weather at home, and tomorrow?"}]

    def step(*rounds: Any) -> Any:
        fake.queue(*rounds)
        return client.chat.completions.create(model="m", messages=history, tools=[weather, forecast])

    # Step 1: a query, then the app's call.
    first = step(model_round(None, [call("call_q1", "query_memory", {"query": "home city"})]),
                 model_round(None, [call("call_app1", "get_weather", {"city": "Bergen"})]))
    history += [first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": "call_app1", "content": "9 C"}]
    # Step 2, retried (the client never got the first answer): each attempt stores, then calls the app.
    store = call("call_s1", "store_memory", {"content": "The user lives in Bergen", "type": "fact"})
    step(model_round(None, [store]), model_round(None, [call("call_app2", "get_forecast", {"city": "Bergen"})]))
    second = step(model_round(None, [store]),
                  model_round(None, [call("call_app2b", "get_forecast", {"city": "Bergen"})]))
    history += [second.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": "call_app2b", "content": "rain"}]
    # Step 3: another query, then the answer.
    final = step(model_round(None, [call("call_q3", "query_memory", {"query": "umbrella"})]),
                 model_round("9 C now, rain tomorrow."))
    assert final.choices[0].message.content == "9 C now, rain tomorrow."

    def traces() -> list[Any]:
        with tproxy.http() as http:
            return http.get(api_url("alice", "reasoning")).json()["data"]

    assert eventually(lambda: len(traces()) == 1)
    [trace] = traces()
    assert trace["answer"] == "9 C now, rain tomorrow."
    assert [(s["name"], json.loads(s["arguments"])) for s in trace["steps"]] == [
        ("query_memory", {"query": "home city"}), ("get_weather", {"city": "Bergen"}),
        ("store_memory", {"content": "The user lives in Bergen", "type": "fact"}),
        ("get_forecast", {"city": "Bergen"}), ("query_memory", {"query": "umbrella"})]
    results = [s["result"] for s in trace["steps"]]
    assert results[0] == NOTHING_FOUND[:200] and results[1] == "9 C" and results[3] == "rain"
    assert results[2].startswith("Stored as memory ") and results[4] == NOTHING_FOUND[:200]
