"""Tools mode on the Responses wire, through the real proxy, the openai SDK and a scripted fake
model that, like the real API, refuses an input whose function calls lack their outputs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.memory.tools import NOTHING_FOUND
from tests.api_helpers import api_url
from tests.fake_responses import call_item, message_item, model_round, reasoning_item
from tests.proxy_db import eventually, rows

TOOLS = {"X-Memory-User": "alice", "X-Memory-Mode": "tools"}
HELIX = "My favourite editor is Helix"
WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


@pytest.fixture
def tproxy(make_proxy):
    return make_proxy(memory__commit_timeout_ms=5000, extraction__from_roles=[])


def remember(proxy: Any, content: str, user: str = "alice") -> None:
    with proxy.http() as http:
        assert http.post(api_url(user, "memories"), json={"content": content, "type": "fact"}).status_code == 201


def query(call_id: str, text: str = "favourite editor") -> dict[str, Any]:
    return call_item(call_id, "query_memory", json.dumps({"query": text}))


def sent(fake: Any) -> list[dict[str, Any]]:
    return [request.json() for request in fake.responses_requests()]


def saved(proxy: Any) -> list[tuple[str, str]]:
    return rows(proxy, "SELECT role, content FROM messages WHERE user_id = 'alice' ORDER BY seq")


def test_query_then_answer_json(tproxy, fake):
    remember(tproxy, HELIX)
    fake.queue(model_round([reasoning_item("look it up"), query("call_q1")], "resp_r1"),
               model_round([message_item("You like Helix.")], "resp_r2"))
    raw = tproxy.client(**TOOLS).responses.with_raw_response.create(model="m", input="which editor do I like?")
    answer = raw.parse()
    assert answer.output_text == "You like Helix."
    assert [item.type for item in answer.output] == ["reasoning", "message"]
    assert raw.headers["x-memory-tool-calls"] == "1"
    first, second = sent(fake)
    assert [t["name"] for t in first["tools"]] == ["query_memory", "store_memory"]
    assert second["input"][0] == {"role": "user", "content": "which editor do I like?"}
    assert [i["type"] for i in second["input"][1:]] == ["reasoning", "function_call", "function_call_output"]
    assert second["input"][1] == reasoning_item("look it up")  # verbatim
    assert HELIX in second["input"][3]["output"]
    assert eventually(lambda: ("assistant", "You like Helix.") in saved(tproxy))


def test_query_then_answer_stream(tproxy, fake):
    remember(tproxy, HELIX)
    fake.queue(model_round([message_item("Let me check."), query("call_q1")], "resp_r1"),
               model_round([message_item("You like Helix.", 1)], "resp_r2",
                           usage={"input_tokens": 90, "output_tokens": 4, "total_tokens": 94,
                                  "input_tokens_details": {"cached_tokens": 0},
                                  "output_tokens_details": {"reasoning_tokens": 0}}))
    with tproxy.client(**TOOLS).responses.stream(model="m", input="which editor do I like?") as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds.count("response.created") == 1 and kinds.count("response.completed") == 1
    assert kinds[-1] == "response.completed"
    assert final.id == "resp_r1"  # the first round's id throughout
    assert [i.type for i in final.output] == ["message", "message"]
    assert final.output_text == "Let me check.You like Helix."
    assert final.usage.input_tokens == 90
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert not any(getattr(e, "item", None) is not None and e.item.type == "function_call" for e in events)
    assert eventually(lambda: ("assistant", "Let me check.\nYou like Helix.") in saved(tproxy))


def test_previous_response_id_of_a_stream_names_the_last_round(tproxy, fake):
    fake.queue(model_round([query("call_q1")], "resp_r1"), model_round([message_item("Nothing known.")], "resp_r2"))
    client = tproxy.client(**TOOLS)
    with client.responses.stream(model="m", input="which editor do I like?") as stream:
        first = stream.get_final_response()
    assert first.id == "resp_r1"
    fake.queue(model_round([message_item("Still nothing.")], "resp_r3"))

    def next_turn() -> Any:
        return client.responses.create(model="m", input="and my shell?", previous_response_id="resp_r1")

    assert eventually(lambda: next_turn().output_text == "Still nothing.")
    # The provider continues from the round it answered last, not from the one with a pending call.
    assert sent(fake)[2]["previous_response_id"] == "resp_r2"


def test_app_tool_loop_gets_its_exchange_back(tproxy, fake):
    fake.queue(model_round([message_item("Looking."), call_item("call_app1", "get_weather", '{"city": "Oslo"}'),
                            query("call_q1", "home city")], "resp_r1"),
               model_round([call_item("call_app2", "get_weather", '{"city": "Bergen"}')], "resp_r2"))
    client = tproxy.client(**TOOLS)
    answer = client.responses.create(model="m", input="weather at home?", tools=[WEATHER])
    assert [(i.type, getattr(i, "call_id", None)) for i in answer.output] == [
        ("message", None), ("function_call", "call_app2")]
    assert [i.get("call_id") for i in sent(fake)[1]["input"] if i.get("type") == "function_call"] == ["call_q1"]
    fake.queue(model_round([message_item("Rain in Bergen.")], "resp_r3"))
    echo = [item.model_dump(exclude_none=True) for item in answer.output]
    result = {"type": "function_call_output", "call_id": "call_app2", "output": "rain"}
    last = client.responses.create(model="m", tools=[WEATHER],
                                   input=[{"role": "user", "content": "weather at home?"}, *echo, result])
    assert last.output_text == "Rain in Bergen."
    round_two, next_step = (r.json()["input"] for r in fake.responses_requests()[1:])
    assert next_step[:len(round_two)] == round_two  # the memory exchange, as the model saw it
    assert next_step[len(round_two):] == [call_item("call_app2", "get_weather", '{"city": "Bergen"}'), result]


def test_another_users_memory_is_never_returned(tproxy, fake):
    remember(tproxy, HELIX, user="alice")
    fake.queue(model_round([query("call_q1", "favourite editor Helix")]), model_round([message_item("Unknown.")]))
    tproxy.client(**{**TOOLS, "X-Memory-User": "bob"}).responses.create(model="m", input="which editor?")
    assert sent(fake)[1]["input"][-1]["output"] == NOTHING_FOUND


def test_store_false_asks_for_encrypted_reasoning(tproxy, fake):
    fake.queue(model_round([message_item("Hi.")]))
    tproxy.client(**TOOLS).responses.create(model="m", input="hi", store=False)
    assert sent(fake)[0]["include"] == ["reasoning.encrypted_content"]


def test_with_previous_response_id_the_rounds_are_chained_on_the_provider(tproxy, fake):
    fake.queue(model_round([query("call_q1")], "resp_r1"), model_round([message_item("Nothing known.")], "resp_r2"))
    answer = tproxy.client(**TOOLS).responses.create(model="m", input="which editor?", previous_response_id="resp_0")
    assert answer.output_text == "Nothing known." and answer.id == "resp_r2"
    first, second = sent(fake)
    assert first["previous_response_id"] == "resp_0"
    assert second["previous_response_id"] == "resp_r1"
    assert second["input"] == [{"type": "function_call_output", "call_id": "call_q1", "output": NOTHING_FOUND}]


@pytest.mark.parametrize("keep_ids", [True, False])
def test_the_whole_echo_is_replaced_when_the_last_round_has_text_before_its_call(tproxy, fake, keep_ids):
    fake.queue(model_round([message_item("Looking.", 0), query("call_q1", "home city")], "resp_r1"),
               model_round([message_item("Now the weather.", 1),
                            call_item("call_app2", "get_weather", '{"city": "Bergen"}')], "resp_r2"))
    client = tproxy.client(**TOOLS)
    answer = client.responses.create(model="m", input="weather at home?", tools=[WEATHER])
    echo = [item.model_dump(exclude_none=True) for item in answer.output]
    if not keep_ids:  # as clients that do not keep the provider's item ids send it
        echo = [{k: v for k, v in item.items() if k != "id"} for item in echo]
    fake.queue(model_round([message_item("Rain in Bergen.", 2)], "resp_r3"))
    result = {"type": "function_call_output", "call_id": "call_app2", "output": "rain"}
    client.responses.create(model="m", tools=[WEATHER],
                            input=[{"role": "user", "content": "weather at home?"}, *echo, result])
    round_two, next_step = (r.json()["input"] for r in fake.responses_requests()[1:])
    assert next_step == [*round_two, message_item("Now the weather.", 1),
                         call_item("call_app2", "get_weather", '{"city": "Bergen"}'), result]


def test_without_persisting_a_stream_s_id_still_names_the_last_round(tproxy, fake):
    fake.queue(model_round([query("call_q1")], "resp_r1"), model_round([message_item("Nothing known.")], "resp_r2"))
    client = tproxy.client(**TOOLS, **{"X-Memory-Persist": "false"})
    with client.responses.stream(model="m", input="which editor do I like?") as stream:
        assert stream.get_final_response().id == "resp_r1"
    fake.queue(model_round([message_item("Still nothing.")], "resp_r3"))
    answer = client.responses.create(model="m", input="and my shell?", previous_response_id="resp_r1")
    assert answer.output_text == "Still nothing."
    # Which round the provider continues from is routing, not memory: it is kept all the same.
    assert sent(fake)[2]["previous_response_id"] == "resp_r2"
    assert saved(tproxy) == []


def test_text_after_the_last_round_s_call_is_not_sent_twice(tproxy, fake):
    app = call_item("call_app2", "get_weather", '{"city": "Bergen"}')
    fake.queue(model_round([message_item("Looking.", 0), query("call_q1", "home city")], "resp_r1"),
               model_round([app, message_item("Asking the weather app.", 1)], "resp_r2"))
    client = tproxy.client(**TOOLS)
    answer = client.responses.create(model="m", input="weather at home?", tools=[WEATHER])
    echo = [item.model_dump(exclude_none=True) for item in answer.output]
    assert [i["type"] for i in echo] == ["message", "function_call", "message"]
    fake.queue(model_round([message_item("Rain in Bergen.", 2)], "resp_r3"))
    result = {"type": "function_call_output", "call_id": "call_app2", "output": "rain"}
    client.responses.create(model="m", tools=[WEATHER],
                            input=[{"role": "user", "content": "weather at home?"}, *echo, result])
    round_two, next_step = (r.json()["input"] for r in fake.responses_requests()[1:])
    assert next_step == [*round_two, app, message_item("Asking the weather app.", 1), result]
