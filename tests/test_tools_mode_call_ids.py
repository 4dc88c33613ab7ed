"""Tools mode with a provider that numbers its calls per response (`call_0`, `call_1`: vLLM,
Ollama and other OpenAI-compatible servers): every conversation of the user has a `call_0`, and
each tool loop's next step still gets its own turn and its own memory exchange back, whichever
conversation called last. Through the real proxy, the openai SDK and the scripted fake models."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests import fake_responses
from tests.api_helpers import api_url
from tests.fake_upstream import model_round
from tests.proxy_db import eventually, rows
from tests.test_tools_mode_chat import TOOLS, call, messages_bytes

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
RESPONSES_WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


@pytest.fixture
def tproxy(make_proxy: Any) -> Any:
    return make_proxy(memory__commit_timeout_ms=5000, extraction__from_roles=[])


def conversations_saved(proxy: Any, user: str = "alice") -> list[list[tuple[str, str]]]:
    """Each conversation's saved (role, text), in any order of conversations."""
    with proxy.http() as http:
        listed = http.get(api_url(user, "conversations")).json()["data"]
        return sorted([(m["role"], m["content"]) for m in
                       http.get(api_url(user, "conversations", c["id"], "messages")).json()["data"]] for c in listed)


def test_each_chat_loop_s_next_step_gets_its_own_turn_and_exchange(tproxy, fake):
    client = tproxy.client(**TOOLS)
    loops = {}
    for city, question in (("Oslo", "weather at home?"), ("Bergen", "weather at work?")):
        fake.queue(model_round(None, [call("call_0", "query_memory", {"query": f"where is {city}"})]),
                   model_round(f"Checking {city}.", [call("call_0", "get_weather", {"city": city})]))
        prompt = [{"role": "user", "content": question}]
        raw = client.chat.completions.with_raw_response.create(model="m", messages=prompt, tools=[WEATHER])
        loops[city] = (prompt, raw.parse().choices[0].message, raw.headers["x-memory-turn"],
                       messages_bytes(fake.chat_requests()[-1].body))
    assert loops["Oslo"][2] != loops["Bergen"][2]
    for city, (prompt, message, turn, round_two) in loops.items():
        fake.queue(model_round(f"It is 4 degrees in {city}."))
        step = client.chat.completions.with_raw_response.create(model="m", tools=[WEATHER], messages=prompt + [
            message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": "call_0", "content": "4 C"}])
        assert step.headers["x-memory-turn"] == turn, city
        # The model sees its own loop's exchange, byte for byte, then the app's result.
        next_step = messages_bytes(fake.chat_requests()[-1].body)
        assert next_step.startswith(round_two[:-1] + b","), city
        assert json.loads(next_step)[-1] == {"role": "tool", "tool_call_id": "call_0", "content": "4 C"}
    assert eventually(lambda: conversations_saved(tproxy) == [
        [("user", "weather at home?"), ("assistant", "It is 4 degrees in Oslo.")],
        [("user", "weather at work?"), ("assistant", "It is 4 degrees in Bergen.")]])


def test_each_responses_loop_continued_by_previous_response_id_gets_its_own_turn(tproxy, fake):
    # Each client continues its own loop with previous_response_id and the call's output alone:
    # the step belongs to the turn of the response it names.
    client = tproxy.client(**TOOLS)
    loops = {}
    for city in ("Oslo", "Bergen"):
        query = fake_responses.call_item("call_0", "query_memory", json.dumps({"query": f"where is {city}"}))
        app = fake_responses.call_item("call_0", "get_weather", json.dumps({"city": city}))
        fake.queue(fake_responses.model_round([query], f"resp_{city}_1"),
                   fake_responses.model_round([app], f"resp_{city}_2"))
        raw = client.responses.with_raw_response.create(model="m", input=f"weather in {city}?",
                                                        tools=[RESPONSES_WEATHER])
        loops[city] = (raw.parse().id, raw.headers["x-memory-turn"])
    for city, (answer_id, turn) in loops.items():
        fake.queue(fake_responses.model_round([fake_responses.message_item(f"Rain in {city}.")], f"resp_{city}_3"))
        step = client.responses.with_raw_response.create(
            model="m", tools=[RESPONSES_WEATHER], previous_response_id=answer_id,
            input=[{"type": "function_call_output", "call_id": "call_0", "output": "rain"}])
        assert step.headers["x-memory-turn"] == turn, city
        assert step.parse().output_text == f"Rain in {city}."
        # The provider continues from the round it answered last.
        assert fake.responses_requests()[-1].json()["previous_response_id"] == f"resp_{city}_2"
    assert eventually(lambda: sorted(rows(tproxy, "SELECT role, content FROM messages WHERE user_id = 'alice'")) ==
                      sorted([("user", "weather in Oslo?"), ("assistant", "Rain in Oslo."),
                              ("user", "weather in Bergen?"), ("assistant", "Rain in Bergen.")]))
