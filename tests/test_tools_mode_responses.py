"""Tools mode on the Responses wire, through the real proxy, the openai SDK and a scripted fake
model that, like the real API, refuses an input whose function calls lack their outputs."""

from __future__ import annotations

import json
import sqlite3
import threading
from typing import Any

import openai
import pytest

from proxy.memory.tools import NOTHING_FOUND
from proxy.wires.openai_responses_tools import NOT_RUN
from tests.api_helpers import api_url
from tests.fake_responses import (USAGE, ProviderItems, call_item, message_item, model_round, reasoning_item, response,
                                  stream)
from tests.fake_upstream import JsonReply, SSEReply
from tests.proxy_db import eventually, rows, store_path

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


def output_of(call_id: str, text: str = NOTHING_FOUND) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def without_id(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k != "id"}


def input_bytes(body: bytes) -> bytes:
    """The `input` array of a request body, as the bytes sent."""
    text = body.decode("utf-8")
    start = text.index('"input":') + len('"input":')
    _, end = json.JSONDecoder().raw_decode(text, start)
    return text[start:end].encode("utf-8")


def logged(proxy: Any) -> list[dict[str, Any]]:
    """The injection log's entries: in tools mode, the queries and token totals of each request."""
    with proxy.http() as http:
        return [entry["log"] for entry in http.get(api_url("alice", "injections")).json()["data"]]


def ends_incomplete(items: list[dict[str, Any]], response_id: str, streamed: bool) -> JsonReply | SSEReply:
    """A round the provider cut short at max_output_tokens (usage included, as the real API sends it)."""
    cut = {**response(items, response_id, "incomplete", incomplete_details={"reason": "max_output_tokens"}),
           "usage": USAGE}
    if not streamed:
        return JsonReply(cut)
    events = stream(items, response_id, end="incomplete")
    end = json.loads(events[-1].split(b"data: ", 1)[1])
    events[-1] = b"event: response.incomplete\ndata: " + json.dumps({**end, "response": cut}).encode() + b"\n\n"
    return SSEReply(events)


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
    # The token totals over both rounds go to the injection log once the stream is closed.
    assert eventually(lambda: [e["tokens"] for e in logged(tproxy)] == [
        {"input_tokens": 130, "output_tokens": 13, "rounds": 2}])


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


@pytest.mark.parametrize(("conversation", "streamed"), [("conv_1", False), ({"id": "conv_1"}, True)])
def test_with_a_conversation_a_later_round_sends_only_its_calls_outputs(tproxy, fake, conversation, streamed):
    held = ProviderItems()  # like the real API, refuses an item the conversation holds already
    fake.queue(model_round([reasoning_item("look it up"), query("call_q1")], "resp_r1", provider=held),
               model_round([message_item("Nothing known.", 1)], "resp_r2", provider=held))
    client = tproxy.client(**TOOLS)
    if streamed:
        with client.responses.stream(model="m", input="which editor?", conversation=conversation) as live:
            answer = live.get_final_response()
    else:
        answer = client.responses.create(model="m", input="which editor?", conversation=conversation)
    assert answer.output_text == "Nothing known."
    first, second = sent(fake)
    assert first["conversation"] == second["conversation"] == conversation
    assert "previous_response_id" not in second
    assert second["input"] == [output_of("call_q1")]
    assert second["tools"] == first["tools"]
    # The conversation holds each item once, the memory exchange included (the provider keeps it).
    assert held.conversations["conv_1"] == [{"role": "user", "content": "which editor?"}, reasoning_item("look it up"),
                                    query("call_q1"), output_of("call_q1"), message_item("Nothing known.", 1)]


def test_with_store_false_output_items_go_back_without_their_ids(tproxy, fake):
    app = call_item("call_app2", "get_weather", '{"city": "Bergen"}')
    thought = {**reasoning_item("look it up"), "encrypted_content": "gAAAA-sealed"}
    # Like the real API with store false, the fake refuses (404) any input item sent with an id.
    fake.queue(model_round([thought, message_item("Looking.", 1), query("call_q1", "home city")], "resp_r1"),
               model_round([message_item("Now the weather.", 2), app], "resp_r2"))
    client = tproxy.client(**TOOLS)
    answer = client.responses.create(model="m", input="weather at home?", tools=[WEATHER], store=False)
    assert [(i.type, getattr(i, "call_id", None)) for i in answer.output] == [
        ("reasoning", None), ("message", None), ("message", None), ("function_call", "call_app2")]
    round_two = sent(fake)[1]
    assert round_two["include"] == ["reasoning.encrypted_content"]
    assert round_two["input"] == [{"role": "user", "content": "weather at home?"}, without_id(thought),
                                  without_id(message_item("Looking.", 1)),
                                  without_id(query("call_q1", "home city")), output_of("call_q1")]
    # The next step (its echo without ids, as Codex sends it with store false) gets the stored
    # exchange back, byte for byte what round two sent, and the last round's items without ids.
    fake.queue(model_round([message_item("Rain in Bergen.", 3)], "resp_r3"))
    echo = [without_id(item.model_dump(exclude_none=True)) for item in answer.output]
    result = output_of("call_app2", "rain")
    last = client.responses.create(model="m", tools=[WEATHER], store=False,
                                   input=[{"role": "user", "content": "weather at home?"}, *echo, result])
    assert last.output_text == "Rain in Bergen."
    before, after = (input_bytes(r.body) for r in fake.responses_requests()[1:])
    assert after.startswith(before[:-1] + b",")
    assert sent(fake)[2]["input"][len(round_two["input"]):] == [
        without_id(message_item("Now the weather.", 2)), without_id(app), result]


@pytest.mark.parametrize("streamed", [False, True])
def test_an_incomplete_last_round_carries_the_earlier_rounds_items(tproxy, fake, streamed):
    remember(tproxy, HELIX)
    # The last round is cut at max_output_tokens in the middle of another memory call: not run.
    fake.queue(model_round([message_item("Let me check.", 0), query("call_q1")], "resp_r1"),
               ends_incomplete([message_item("You like", 1), query("call_q2", "edit")], "resp_r2", streamed))
    client = tproxy.client(**TOOLS)
    if streamed:
        events = list(client.responses.create(model="m", input="which editor do I like?", stream=True))
        assert [e.type for e in events].count("response.created") == 1
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[-1].type == "response.incomplete"
        answer = events[-1].response
        assert answer.id == "resp_r1"  # the first round's, as the stream began
    else:
        raw = client.responses.with_raw_response.create(model="m", input="which editor do I like?")
        assert raw.headers["x-memory-tool-calls"] == "1"
        answer = raw.parse()
        assert answer.id == "resp_r2"
    assert answer.status == "incomplete" and answer.incomplete_details.reason == "max_output_tokens"
    assert [i.type for i in answer.output] == ["message", "message"]
    assert answer.output_text == "Let me check.You like"
    assert len(sent(fake)) == 2
    assert eventually(lambda: [(e["tool_queries"], e["tokens"]) for e in logged(tproxy)] == [
        ([{"query": "favourite editor", "hits": 1}], {"input_tokens": 80, "output_tokens": 18, "rounds": 2})])


def test_a_later_round_refused_reaches_a_json_client_as_the_provider_s_error(tproxy, fake):
    fake.queue(model_round([message_item("Let me check."), query("call_q1")], "resp_r1"),
               JsonReply({"error": {"message": "overloaded", "type": "server_error", "param": None, "code": None}},
                         status=503))
    with pytest.raises(openai.InternalServerError) as raised:
        tproxy.client(**TOOLS).responses.create(model="m", input="which editor do I like?")
    assert raised.value.status_code == 503 and "overloaded" in str(raised.value)
    # The rounds that did run are in the injection log all the same.
    assert eventually(lambda: [(e["tool_queries"], e["tokens"]) for e in logged(tproxy)] == [
        ([{"query": "favourite editor", "hits": 0}], {"input_tokens": 40, "output_tokens": 9, "rounds": 1})])


def test_a_failed_json_round_is_the_answer_over_the_earlier_rounds_items(tproxy, fake):
    failure = {"code": "server_error", "message": "The model failed"}
    fake.queue(model_round([message_item("Let me check."), query("call_q1")], "resp_r1"),
               JsonReply(response([query("call_q2")], "resp_r2", "failed", error=failure)))
    answer = tproxy.client(**TOOLS).responses.create(model="m", input="which editor do I like?")
    assert answer.status == "failed" and answer.error.message == "The model failed"
    assert [(i.type, i.content[0].text) for i in answer.output] == [("message", "Let me check.")]
    assert len(sent(fake)) == 2


def test_a_later_round_that_is_no_response_is_a_502(tproxy, fake):
    fake.queue(model_round([query("call_q1")], "resp_r1"), JsonReply(b"<html>gateway</html>"))
    with tproxy.http() as http:
        answer = http.post("/v1/responses", headers=TOOLS, json={"model": "m", "input": "which editor?"})
    assert answer.status_code == 502
    assert answer.headers["x-memory-proxy-error"] == "upstream_protocol_error"
    assert answer.json()["error"]["message"] == "the provider's answer to a later round could not be read"
    assert eventually(lambda: [e["tokens"] for e in logged(tproxy)] == [
        {"input_tokens": 40, "output_tokens": 9, "rounds": 1}])


def test_a_later_round_cut_short_ends_the_stream_and_the_rounds_are_logged(tproxy, fake):
    fake.queue(model_round([message_item("Let me check."), query("call_q1")], "resp_r1"),
               SSEReply(stream([message_item("You li", 1)], "resp_r2", end="none")))
    client = tproxy.client(**TOOLS)
    with pytest.raises(openai.APIError, match="upstream stream ended before completion"):
        for _ in client.responses.create(model="m", input="which editor do I like?", stream=True):
            pass
    assert eventually(lambda: [e["tokens"] for e in logged(tproxy)] == [
        {"input_tokens": 40, "output_tokens": 9, "rounds": 1}])


def test_a_later_round_failed_ends_the_stream_over_the_items_the_client_got(tproxy, fake):
    fake.queue(model_round([message_item("Let me check."), query("call_q1")], "resp_r1"),
               SSEReply(stream([message_item("You li", 1), query("call_q2")], "resp_r2", end="failed")))
    events = list(tproxy.client(**TOOLS).responses.create(model="m", input="which editor do I like?", stream=True))
    end = events[-1]
    assert end.type == "response.failed" and end.response.error.message == "The model failed"
    assert end.response.id == "resp_r1"
    assert [(i.type, i.content[0].text) for i in end.response.output] == [
        ("message", "Let me check."), ("message", "You li")]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert eventually(lambda: [e["tokens"] for e in logged(tproxy)] == [
        {"input_tokens": 40, "output_tokens": 9, "rounds": 1}])


def test_a_stream_s_id_is_found_by_a_request_made_at_once_while_the_store_is_slow(tproxy, fake):
    fake.queue(model_round([message_item("Warm.")], "resp_w"))
    tproxy.client(**TOOLS).responses.create(model="m", input="warm up")  # the store exists and is warm
    fake.queue(model_round([query("call_q1")], "resp_r1"), model_round([message_item("Nothing known.")], "resp_r2"),
               model_round([message_item("Still nothing.")], "resp_r3"))
    client = tproxy.client(**TOOLS, **{"X-Memory-Persist": "false"})
    locker = sqlite3.connect(store_path(tproxy), timeout=1, check_same_thread=False)
    locker.execute("BEGIN EXCLUSIVE")  # the store takes its writes late
    release = threading.Timer(1.0, locker.rollback)
    release.start()
    try:
        with client.responses.stream(model="m", input="which editor do I like?") as live:
            assert live.get_final_response().id == "resp_r1"
        # The stream ended only once the id it showed was recorded: the next request finds it.
        client.responses.create(model="m", input="and my shell?", previous_response_id="resp_r1")
    finally:
        release.join()
        locker.close()
    assert sent(fake)[-1]["previous_response_id"] == "resp_r2"


@pytest.mark.parametrize("chained", [{"conversation": "conv_1"}, {"previous_response_id": "resp_0"}])
def test_a_chained_round_with_an_app_call_gives_it_a_not_run_output(tproxy, fake, chained):
    held = ProviderItems()  # like the real API, refuses to go on from a call that has no output
    app1 = call_item("call_app1", "get_weather", '{"city": "Oslo"}')
    app2 = call_item("call_app2", "get_weather", '{"city": "Bergen"}')
    fake.queue(model_round([app1, query("call_q1", "home city")], "resp_r1", provider=held),
               model_round([app2], "resp_r2", provider=held))
    answer = tproxy.client(**TOOLS).responses.create(model="m", input="weather at home?", tools=[WEATHER],
                                                     **chained)
    assert [(i.type, i.call_id) for i in answer.output] == [("function_call", "call_app2")]
    second = sent(fake)[1]
    assert second["input"] == [output_of("call_q1"), output_of("call_app1", NOT_RUN)]
    assert held.responses["resp_r2"][-3:] == [output_of("call_q1"), output_of("call_app1", NOT_RUN), app2]
