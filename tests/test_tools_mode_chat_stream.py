"""Tools mode's Chat Completions stream in the shapes real providers send: text in a finish
chunk, OpenAI's `refusal: null` opening delta, DeepSeek's and vLLM's `reasoning_content`;
and a request for several choices, which tools mode refuses. The official openai SDK reads
the stream; the fake upstream records what each round was sent."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.fake_upstream import DONE, SSEReply, chunk, model_round
from tests.proxy_db import eventually, rows

TOOLS = {"X-Memory-User": "alice", "X-Memory-Mode": "tools"}
QUERY = {"id": "call_q1", "name": "query_memory", "arguments": json.dumps({"query": "favourite editor"})}


@pytest.fixture
def tproxy(make_proxy: Any) -> Any:
    return make_proxy(memory__commit_timeout_ms=5000, extraction__from_roles=[])


def query_deltas(call: dict[str, str]) -> list[bytes]:
    """A call's deltas as OpenAI streams them: its head, then its arguments in two pieces."""
    head = {"index": 0, "id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": ""}}
    half = len(call["arguments"]) // 2
    return [chunk({"tool_calls": [head]})] + [
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
        for part in (call["arguments"][:half], call["arguments"][half:])]


def streamed(proxy: Any, **body: Any) -> tuple[list[Any], Any]:
    """The chunks the SDK's stream parser read, and the completion it built from them."""
    client = proxy.client(**TOOLS)
    with client.chat.completions.stream(model="m", messages=[{"role": "user", "content": "which editor?"}],
                                        **body) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    return chunks, final


def test_text_in_finish_chunks_reaches_the_client(tproxy, fake):
    opening = {"role": "assistant", "content": ""}
    fake.queue(SSEReply([chunk(opening), chunk({"content": "Let me "}), *query_deltas(QUERY),
                         chunk({"content": "look."}, finish="tool_calls"), DONE]),
               SSEReply([chunk(opening), chunk({"content": "Helix."}, finish="stop"), DONE]))
    chunks, final = streamed(tproxy)
    # Every round's text, the finish chunks' too, with the separator before the later round's.
    assert final.choices[0].message.content == "Let me look.\n\nHelix."
    assert final.choices[0].finish_reason == "stop"
    assert [c.choices[0].delta.content for c in chunks] == ["", "Let me ", "look.", "\n\nHelix.", None]
    # The model's own text of the first round went back to it as it said it.
    second = [request.json() for request in fake.chat_requests()][1]
    assert second["messages"][1]["content"] == "Let me look."
    assert [c["id"] for c in second["messages"][1]["tool_calls"]] == ["call_q1"]
    assert eventually(lambda: rows(tproxy, "SELECT content FROM messages WHERE role = 'assistant'")
                      == [("Let me look.\n\nHelix.",)])


def test_a_later_round_s_opening_delta_does_not_reach_the_client(tproxy, fake):
    opening = {"role": "assistant", "content": "", "refusal": None}  # OpenAI's first delta of every answer
    fake.queue(SSEReply([chunk(opening), chunk({"content": "Let me look."}), *query_deltas(QUERY),
                         chunk({}, finish="tool_calls"), DONE]),
               SSEReply([chunk(opening), chunk({"content": "Helix."}), chunk({}, finish="stop"), DONE]))
    chunks, final = streamed(tproxy)
    assert final.choices[0].message.content == "Let me look.\n\nHelix."
    deltas = [(c.delta.role, c.delta.content, c.finish_reason) for chunk_ in chunks for c in chunk_.choices]
    assert deltas == [("assistant", "", None), (None, "Let me look.", None), (None, "\n\nHelix.", None),
                      (None, None, "stop")]


def test_streamed_reasoning_content_goes_back_to_the_model_with_its_calls(tproxy, fake):
    thought = "The user asks about an editor; memory may know."
    fake.queue(SSEReply([chunk({"role": "assistant", "content": None, "reasoning_content": ""}),
                         chunk({"reasoning_content": thought[:20]}), chunk({"reasoning_content": thought[20:]}),
                         *query_deltas(QUERY), chunk({}, finish="tool_calls"), DONE]),
               model_round("Helix."))
    _, final = streamed(tproxy)
    assert final.choices[0].message.content == "Helix."
    round_one = [request.json() for request in fake.chat_requests()][1]["messages"][1]
    assert round_one == {"role": "assistant", "content": None, "reasoning_content": thought, "tool_calls": [
        {"id": "call_q1", "type": "function", "function": {"name": "query_memory", "arguments": QUERY["arguments"]}}]}


@pytest.mark.parametrize("stream", [False, True])
def test_several_choices_are_refused_in_tools_mode(tproxy, fake, stream):
    client = tproxy.client(**TOOLS)
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="m", n=2, stream=stream,
                                       messages=[{"role": "user", "content": "which editor?"}])
    error = raised.value.body
    assert error["param"] == "n" and error["code"] == "unsupported_in_tools_mode"
    assert "n > 1" in error["message"] and "X-Memory-Mode: tools" in error["message"]
    assert fake.chat_requests() == []
    assert rows(tproxy, "SELECT turn_key FROM turns") == []  # refused before the turn started


def test_one_choice_asked_for_is_served(tproxy, fake):
    fake.queue(model_round("Helix."))
    answer = tproxy.client(**TOOLS).chat.completions.create(
        model="m", n=1, messages=[{"role": "user", "content": "which editor?"}])
    assert answer.choices[0].message.content == "Helix."
    assert fake.chat_requests()[0].json()["n"] == 1
