"""The hooks around tools mode's memory calls, through the real proxy, the official SDKs and the
scripted fake model: pre_tool_use denies or rewrites a call, post_tool_use rewrites its result,
store_memory passes pre_memory_write, and a failing hook leaves the call running."""

from __future__ import annotations

import json
from typing import Any

import anthropic

from proxy.memory.tools import WRITE_BLOCKED
from tests.api_helpers import api_url
from tests.conftest import RunningProxy
from tests.fake_anthropic import model_round as messages_round
from tests.fake_responses import call_item, message_item
from tests.fake_responses import model_round as responses_round
from tests.fake_upstream import model_round
# The hook fixtures are test_hooks.py's: a real hook server, and proxies started with given hooks.
from tests.test_hooks import failures, hook_server, with_hooks  # noqa: F401

TOOLS = {"X-Memory-User": "alice", "X-Memory-Mode": "tools", "X-Memory-Conversation": "c1"}
HELIX = "My favourite editor is Helix"
EMACS = "My favourite editor is Emacs"  # bob's: no hook of alice's turn may see it
H = "tests.hook_handlers:"


def remember(proxy: RunningProxy, content: str, user: str = "alice") -> None:
    with proxy.http() as http:
        assert http.post(api_url(user, "memories"), json={"content": content, "type": "fact"}).status_code == 201


def memories(proxy: RunningProxy, user: str = "alice") -> list[str]:
    with proxy.http() as http:
        return [m["content"] for m in http.get(api_url(user, "memories")).json()["data"]]


def chat_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": json.dumps(arguments)}


def chat_results(fake: Any, n: int = 1) -> dict[str, str]:
    """The tool results the model got in the chat request `n`, by call id."""
    messages = fake.chat_requests()[n].json()["messages"]
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def ask_chat(proxy: RunningProxy, text: str = "which editor do I like?") -> Any:
    return proxy.client(**TOOLS).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": text}])


PREFERENCE = {"content": "prefers Go for services", "type": "user_preference"}


def test_a_denied_store_memory_reaches_the_model_as_its_result_and_stores_nothing(with_hooks, fake):
    proxy = with_hooks([{"event": "pre_tool_use", "matcher": "store_memory", "python": H + "deny_writes"}])
    remember(proxy, HELIX)
    fake.queue(model_round(None, [chat_call("call_s1", "store_memory", PREFERENCE),
                                  chat_call("call_q1", "query_memory", {"query": "favourite editor"})]),
               model_round("Noted."))
    raw = ask_chat(proxy, "remember that I prefer Go")
    assert raw.parse().choices[0].message.content == "Noted."
    assert raw.headers["x-memory-tool-calls"] == "2"
    results = chat_results(fake)
    assert results["call_s1"] == "store_memory is read-only for alice"  # the hook's reason, as the result
    assert HELIX in results["call_q1"]  # the matcher names store_memory: the query ran
    assert memories(proxy) == [HELIX]  # the denied write did not run


def test_an_updated_input_is_what_query_memory_searches_streamed(with_hooks, fake):
    proxy = with_hooks([{"event": "pre_tool_use", "matcher": "query_memory", "python": H + "search_the_editor"}])
    remember(proxy, HELIX)
    fake.queue(model_round("Checking.", [chat_call("call_q1", "query_memory", {"query": "zebra migration"})]),
               model_round("You like Helix."))
    client = proxy.client(**TOOLS)
    with client.chat.completions.stream(model="m", messages=[{"role": "user", "content": "which editor?"}]) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.content == "Checking.\n\nYou like Helix."
    second = fake.chat_requests()[1].json()["messages"]
    # The model's own call goes back as it wrote it; its result is what the rewritten query found.
    assert second[1]["tool_calls"][0]["function"]["arguments"] == '{"query": "zebra migration"}'
    assert HELIX in chat_results(fake)["call_q1"]
    with proxy.http() as http:
        logged = http.get(api_url("alice", "injections")).json()["data"]
    assert logged[0]["log"]["tool_queries"] == [{"query": "favourite editor", "hits": 1}]


def test_a_blocked_pre_memory_write_keeps_a_store_memory_out(with_hooks, fake):
    proxy = with_hooks([{"event": "pre_memory_write", "python": H + "block"}])
    fake.queue(model_round(None, [chat_call("call_s1", "store_memory", PREFERENCE)]), model_round("Noted."))
    raw = ask_chat(proxy, "remember that I prefer Go")
    assert raw.parse().choices[0].message.content == "Noted."
    assert chat_results(fake)["call_s1"] == WRITE_BLOCKED
    assert memories(proxy) == []


def test_post_tool_use_rewrites_the_result_in_a_chain_and_an_http_hook_sees_the_turn(with_hooks, fake,
                                                                                     hook_server):
    hook_server.answers["/post"] = lambda event: {"updated_output": event["output"] + "\n[checked by http]"}
    proxy = with_hooks([{"event": "post_tool_use", "python": H + "mark_output"},
                        {"event": "post_tool_use", "matcher": "query_memory|store_memory",
                         "url": hook_server.url("/post")}])
    remember(proxy, HELIX)
    remember(proxy, EMACS, user="bob")
    fake.queue(messages_round(None, [{"id": "toolu_q1", "name": "query_memory",
                                      "input": {"query": "favourite editor"}}]),
               messages_round("You like Helix."))
    client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-client", default_headers=TOOLS, max_retries=0)
    raw = client.messages.with_raw_response.create(
        model="claude-test", max_tokens=100, messages=[{"role": "user", "content": "which editor do I like?"}])
    assert [b.text for b in raw.parse().content if b.type == "text"] == ["You like Helix."]
    results = fake.messages_requests()[1].json()["messages"][2]["content"]
    assert results[0]["tool_use_id"] == "toolu_q1"
    content = results[0]["content"]
    content = content if isinstance(content, str) else "".join(part["text"] for part in content)
    assert content.endswith(HELIX + "\n[checked by python]\n[checked by http]")  # chained, in order
    [event] = hook_server.inputs("/post")
    assert event["output"].endswith(HELIX + "\n[checked by python]")  # the python hook's rewrite first
    assert (event["tool"], event["input"], event["wire"]) == (
        "query_memory", {"query": "favourite editor"}, "anthropic_messages")
    assert (event["user"], event["conversation"], event["turn"]) == ("alice", "c1", raw.headers["x-memory-turn"])
    assert EMACS not in json.dumps(hook_server.received)  # bob's memory: never in alice's hooks


def responses_query(call_id: str, text: str) -> dict[str, Any]:
    return call_item(call_id, "query_memory", json.dumps({"query": text}))


def test_an_http_pre_tool_use_hook_sees_the_wire_and_the_input_and_a_raising_one_is_skipped(with_hooks, fake,
                                                                                          hook_server):
    proxy = with_hooks([{"event": "pre_tool_use", "python": H + "raising"},
                        {"event": "pre_tool_use", "url": hook_server.url("/pre")}])
    remember(proxy, HELIX)
    fake.queue(responses_round([responses_query("call_q1", "favourite editor")], "resp_r1"),
               responses_round([message_item("You like Helix.")], "resp_r2"))
    raw = proxy.client(**TOOLS).responses.with_raw_response.create(model="m", input="which editor do I like?")
    assert raw.parse().output_text == "You like Helix."
    assert raw.headers["x-memory-tool-calls"] == "1"
    output = fake.responses_requests()[1].json()["input"][-1]
    assert output["type"] == "function_call_output" and HELIX in output["output"]  # the call still ran
    [event] = hook_server.inputs("/pre")
    assert (event["event"], event["tool"], event["input"], event["wire"]) == (
        "pre_tool_use", "query_memory", {"query": "favourite editor"}, "openai_responses")
    assert (event["user"], event["turn"]) == ("alice", raw.headers["x-memory-turn"])
    assert failures(proxy) == {("pre_tool_use", "error"): 1.0}
