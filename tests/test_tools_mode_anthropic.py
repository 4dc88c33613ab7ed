"""Tools mode on the Messages wire, through the real proxy, the anthropic SDK and a scripted fake
model that, like the real API, refuses a history whose tool_use blocks lack their results."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from proxy.memory.tools import NOTHING_FOUND, ROUNDS_USED
from tests.api_helpers import api_url
from tests.fake_anthropic import model_round
from tests.proxy_db import eventually, rows

TOOLS = {"X-Memory-User": "alice", "X-Memory-Mode": "tools"}
HELIX = "My favourite editor is Helix"
WEATHER = {"name": "get_weather", "description": "weather", "input_schema": {"type": "object"}}


@pytest.fixture
def tproxy(make_proxy, fake):
    return make_proxy(upstream__anthropic_base_url=fake.url, memory__commit_timeout_ms=5000,
                      extraction__from_roles=[])


def client(proxy, **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-client", default_headers={**TOOLS, **headers},
                               max_retries=0)


def remember(proxy: Any, content: str, user: str = "alice") -> None:
    with proxy.http() as http:
        assert http.post(api_url(user, "memories"), json={"content": content, "type": "fact"}).status_code == 201


def use(use_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": use_id, "name": name, "input": arguments}


def sent(fake: Any) -> list[dict[str, Any]]:
    return [request.json() for request in fake.messages_requests()]


def saved(proxy: Any) -> list[tuple[str, str]]:
    return rows(proxy, "SELECT role, content FROM messages WHERE user_id = 'alice' AND role != 'tool' ORDER BY seq")


PROMPT = [{"role": "user", "content": "which editor do I like?"}]


def test_query_then_answer_json(tproxy, fake):
    remember(tproxy, HELIX)
    fake.queue(model_round("Let me check.", [use("toolu_q1", "query_memory", {"query": "favourite editor"})],
                           thinking="I should look it up", answer_id="msg_r1"),
               model_round("You like Helix.", answer_id="msg_r2",
                           usage={"input_tokens": 90, "output_tokens": 5}))
    raw = client(tproxy).messages.with_raw_response.create(model="claude-test", max_tokens=100, messages=PROMPT)
    answer = raw.parse()
    assert [b.type for b in answer.content] == ["thinking", "text", "text"]
    assert [b.text for b in answer.content if b.type == "text"] == ["Let me check.", "You like Helix."]
    assert answer.stop_reason == "end_turn" and answer.usage.input_tokens == 90
    assert raw.headers["x-memory-tool-calls"] == "1"
    first, second = sent(fake)
    assert [t["name"] for t in first["tools"]] == ["query_memory", "store_memory"]
    assert second["tools"] == first["tools"]
    assistant, results = second["messages"][1:]
    # The round as the model wrote it: signed thinking verbatim, its text, its memory call.
    assert assistant == {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "I should look it up", "signature": "sig-abc"},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_q1", "name": "query_memory", "input": {"query": "favourite editor"}}]}
    assert results["role"] == "user" and results["content"][0]["tool_use_id"] == "toolu_q1"
    assert HELIX in results["content"][0]["content"]
    assert eventually(lambda: saved(tproxy) == [("user", "which editor do I like?"),
                                                ("assistant", "Let me check.\nYou like Helix.")])


def test_query_then_answer_stream(tproxy, fake):
    remember(tproxy, HELIX)
    fake.queue(model_round("Let me check.", [use("toolu_q1", "query_memory", {"query": "favourite editor"})],
                           thinking="I should look it up", answer_id="msg_r1"),
               model_round("You like Helix.", answer_id="msg_r2", usage={"input_tokens": 90, "output_tokens": 5}))
    with client(tproxy).messages.stream(model="claude-test", max_tokens=100, messages=PROMPT) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds.count("message_start") == 1 and kinds.count("message_stop") == 1
    assert final.id == "msg_r1"
    assert [(b.type, getattr(b, "text", None)) for b in final.content] == [
        ("thinking", None), ("text", "Let me check."), ("text", "You like Helix.")]
    assert final.content[0].signature == "sig-abc"
    assert final.stop_reason == "end_turn"
    assert final.usage.input_tokens == 90 and final.usage.output_tokens == 5  # the last round's full usage
    starts = [e.index for e in events if e.type == "content_block_start"]
    assert starts == [0, 1, 2]
    assert not any(e.type == "content_block_start" and e.content_block.type == "tool_use" for e in events)
    assert HELIX in sent(fake)[1]["messages"][-1]["content"][0]["content"]
    assert sent(fake)[1]["messages"][1]["content"][0] == {
        "type": "thinking", "thinking": "I should look it up", "signature": "sig-abc"}
    assert eventually(lambda: ("assistant", "Let me check.\nYou like Helix.") in saved(tproxy))


def test_store_then_answer_shows_up_in_memories(tproxy, fake):
    fake.queue(model_round(None, [use("toolu_s1", "store_memory", {"content": "The user's cat is Miso",
                                                                   "type": "fact"})]),
               model_round("Noted."))
    answer = client(tproxy).messages.create(model="claude-test", max_tokens=100,
                                            messages=[{"role": "user", "content": "my cat is Miso"}])
    assert [b.text for b in answer.content if b.type == "text"] == ["Noted."]
    with tproxy.http() as http:
        memories = http.get(api_url("alice", "memories")).json()["data"]
    assert "The user's cat is Miso" in [m["content"] for m in memories]


def test_app_tool_loop_gets_its_exchange_back(tproxy, fake):
    fake.queue(model_round("Looking.", [use("toolu_app1", "get_weather", {"city": "Oslo"}),
                                        use("toolu_q1", "query_memory", {"query": "home city"})]),
               model_round("Found it.", [use("toolu_app2", "get_weather", {"city": "Bergen"})]))
    prompt = [{"role": "user", "content": "weather at home?"}]
    with client(tproxy).messages.stream(model="claude-test", max_tokens=100, messages=prompt,
                                        tools=[WEATHER]) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "text", "tool_use"]
    assert final.content[2].id == "toolu_app2" and final.stop_reason == "tool_use"
    # The mixed round's app call had no result: left out of what the model saw next.
    assert [b.get("id") for b in sent(fake)[1]["messages"][1]["content"] if b["type"] == "tool_use"] == ["toolu_q1"]
    fake.queue(model_round("Rain in Bergen."))
    echo = {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_app2", "content": "rain"}]}
    answer = client(tproxy).messages.create(model="claude-test", max_tokens=100, tools=[WEATHER],
                                            messages=[*prompt, echo, result])
    assert [b.text for b in answer.content if b.type == "text"] == ["Rain in Bergen."]
    round_two, next_step = (r.json()["messages"] for r in fake.messages_requests()[1:])
    assert next_step[:3] == round_two
    assert next_step[3] == {"role": "assistant", "content": [
        {"type": "text", "text": "Found it."},
        {"type": "tool_use", "id": "toolu_app2", "name": "get_weather", "input": {"city": "Bergen"}}]}
    assert json.dumps(round_two)[:-1] in json.dumps(next_step)


def test_rounds_are_capped_then_tool_use_is_forbidden(make_proxy, fake):
    proxy = make_proxy(upstream__anthropic_base_url=fake.url, memory__tool_rounds=1, extraction__from_roles=[])
    fake.queue(*[model_round(f"r{n}.", [use(f"toolu_q{n}", "query_memory", {"query": "x"})]) for n in range(3)],
               model_round("Final."))
    with client(proxy).messages.stream(model="claude-test", max_tokens=100, messages=PROMPT) as stream:
        final = stream.get_final_message()
    assert [b.text for b in final.content] == ["r0.", "r1.", "r2.", "Final."]
    assert [r.get("tool_choice") for r in sent(fake)] == [None, None, None, {"type": "none"}]
    results = [b for m in sent(fake)[3]["messages"] if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"]]
    assert [b["content"] for b in results] == [NOTHING_FOUND, f"Error: {ROUNDS_USED}", f"Error: {ROUNDS_USED}"]
    assert [b.get("is_error", False) for b in results] == [False, True, True]


def test_another_users_memory_is_never_returned(tproxy, fake):
    remember(tproxy, HELIX, user="alice")
    fake.queue(model_round(None, [use("toolu_q1", "query_memory", {"query": "favourite editor Helix"})]),
               model_round("I was not told."))
    client(tproxy, **{"X-Memory-User": "bob"}).messages.create(model="claude-test", max_tokens=100, messages=PROMPT)
    assert sent(fake)[1]["messages"][-1]["content"][0]["content"] == NOTHING_FOUND
