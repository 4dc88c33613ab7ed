"""Request options and roles through the proxy with memory on (roles,
`n`, stream options): what is saved for `n: 3`, streamed with `include_usage`, and for a stream request
answered with an error in JSON; every role passed untouched around the block."""

from __future__ import annotations

import json
from typing import Any

from proxy.memory.retrieval.block import GRAPH_NOTE
from tests.fake_upstream import DONE, JsonReply, SSEReply
from tests.proxy_db import rows, settled_turns

USER = {"X-Memory-User": "alice"}


def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
    payload = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices, **extra}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def test_with_n_3_every_choice_reaches_the_client_and_choice_0_is_the_answer_saved(make_proxy, fake):
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    client = proxy.client(**USER)
    fake.queue(JsonReply({"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [
        {"index": i, "message": {"role": "assistant", "content": f"choice {i}"}, "finish_reason": "stop"}
        for i in range(3)]}))
    answer = client.chat.completions.create(model="m", n=3, messages=[{"role": "user", "content": "three, please"}])
    assert [c.message.content for c in answer.choices] == ["choice 0", "choice 1", "choice 2"]
    streamed = [event([{"index": i, "delta": {"role": "assistant", "content": f"streamed {i}"}, "finish_reason": None}])
                for i in range(3)]
    streamed += [event([{"index": i, "delta": {}, "finish_reason": "stop"}]) for i in range(3)]
    streamed += [event([], usage={"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}), DONE]
    fake.queue(SSEReply(streamed))
    chunks = list(client.chat.completions.create(model="m", n=3, stream=True, stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": "three, streamed"}]))
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 4
    assert settled_turns(proxy, 2) == [("complete",), ("complete",)]
    assert rows(proxy, "SELECT role, content FROM messages ORDER BY seq") == [
        ("user", "three, please"), ("assistant", "choice 0"), ("user", "three, streamed"), ("assistant", "streamed 0")]


def test_a_stream_request_answered_with_an_error_in_json_passes_it_on_and_saves_no_answer(make_proxy, fake):
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    error = {"error": {"message": "no such model", "type": "invalid_request_error", "param": None,
                       "code": "model_not_found"}}
    fake.queue(JsonReply(error, status=404))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", headers={k.lower(): v for k, v in USER.items()},
                             json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "oops"}]})
    assert (response.status_code, response.headers["content-type"], response.json()) == (404, "application/json", error)
    assert settled_turns(proxy, 1) == [("upstream_failed",)]
    assert rows(proxy, "SELECT role, content FROM messages") == [("user", "oops")]


def test_every_role_passes_untouched_and_the_block_goes_to_the_last_user_message(make_proxy, fake):
    # B9: several system messages, developer, legacy function calls, a refusal part.
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    client = proxy.client(**USER)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "my favourite colour is teal"}])
    messages = [
        {"role": "system", "content": "sys one"}, {"role": "developer", "content": "dev note"},
        {"role": "system", "content": "sys two"}, {"role": "user", "content": "call it"},
        {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
        {"role": "function", "name": "f", "content": "function result"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot"}]},
        {"role": "user", "content": "what is my favourite colour?"},
    ]
    raw = client.chat.completions.with_raw_response.create(model="m", messages=messages)
    # The fact of the turn before is already extracted: its entity and graph line come too.
    assert (raw.headers["x-memory-status"], raw.headers["x-memory-injected"]) == ("ok", "3")
    sent = fake.chat_requests()[-1].json()["messages"]
    assert sent[:-1] == messages[:-1]
    assert "\n2. [graph] (User)-[PREFERS]->(teal)\n" in sent[-1]["content"]
    assert sent[-1]["content"].endswith(f"{GRAPH_NOTE}\n\nwhat is my favourite colour?")
