"""Secrets a tool call's arguments spell through JSON escapes, on every wire, through the real proxy.

A loop's tool calls go into the turn's reasoning trace, which the store keeps (the SQLite
file), the export and the search read, and a later recall sends as a `[reasoning]` line.
Arguments are JSON text: `pass\\u200bword=`, fullwidth letters as `\\uff50...`, or code
holding JSON with its quotes escaped twice say a password as plainly as a user's message
does, and lose it the same way, while every other byte of the arguments stays as sent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api_helpers import api_url, lines
from tests.fake_anthropic import message
from tests.fake_responses import call_item, response
from tests.fake_upstream import JsonReply, completion, model_round
from tests.proxy_db import eventually, rows

MARK = "[REDACTED:password]"
TASK = "Set up the billing database"
ANSWER = "The billing database is set up."
# Each call's input, and the canary it must not keep; every one short enough that a
# `[reasoning]` line (60 chars of arguments) shows where the password was.
CALLS = [
    ({"cmd": "export pass\u200bword=Zw7kQ2xN"}, "Zw7kQ2xN"),  # a zero-width space: `\u200b` in JSON text
    ({"e": "\uff50\uff41\uff53\uff53=Fw4mT8rV"}, "Fw4mT8rV"),  # fullwidth letters: `\uff50\uff41...`
    ({"p": '"{\\"password\\":\\"Cd5nB3wL\\"}"'}, "Cd5nB3wL"),  # code holding JSON: quotes escaped twice
    ({"sh": "printf 'pass\\u200bword=Pf6hJ1sD'"}, "Pf6hJ1sD"),  # an escape the command spells: `\\u200b`
]
CANARIES = [canary for _, canary in CALLS]
ANTHROPIC = {"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01"}


def _files(proxy: Any) -> bytes:
    db = Path(proxy.settings.store.url.removeprefix("sqlite:///"))
    return b"".join(path.read_bytes() for path in db.parent.glob(db.name + "*"))


def _redacted(arguments: str) -> str:
    for canary in CANARIES:
        arguments = arguments.replace(canary, MARK)
    return arguments


def _chat_loop(http: httpx.Client, fake: Any, headers: dict[str, str], inputs: list[Any] = CALLS) -> list[str]:
    calls = [{"id": f"call_{n}", "name": "shell", "arguments": json.dumps(args)} for n, (args, _) in enumerate(inputs)]
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    fake.queue(JsonReply(completion(None, tool_calls=calls)), JsonReply(completion(ANSWER)))
    first = http.post("/v1/chat/completions", headers=headers, json={"model": "m", "messages": messages})
    messages.append(first.json()["choices"][0]["message"])
    messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
    assert http.post("/v1/chat/completions", headers=headers, json={"model": "m", "messages": messages}
                     ).status_code == 200
    return [c["arguments"] for c in calls]


def _responses_loop(http: httpx.Client, fake: Any, headers: dict[str, str], inputs: list[Any] = CALLS) -> list[str]:
    items = [call_item(f"call_{n}", "shell", json.dumps(args)) for n, (args, _) in enumerate(inputs)]
    history: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    fake.queue(JsonReply(response(items)), JsonReply(response([{
        "type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": ANSWER, "annotations": []}]}], "resp_2")))
    first = http.post("/v1/responses", headers=headers, json={"model": "m", "input": history})
    history += first.json()["output"]
    history += [{"type": "function_call_output", "call_id": item["call_id"], "output": "ok"} for item in items]
    assert http.post("/v1/responses", headers=headers, json={"model": "m", "input": history}).status_code == 200
    return [item["arguments"] for item in items]


def _messages_loop(http: httpx.Client, fake: Any, headers: dict[str, str], inputs: list[Any] = CALLS) -> list[str]:
    uses = [{"id": f"toolu_{n}", "name": "shell", "input": args} for n, (args, _) in enumerate(inputs)]
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    fake.queue(JsonReply(message(None, tool_uses=uses)), JsonReply(message(ANSWER)))
    body = {"model": "claude-test", "max_tokens": 100, "messages": messages}
    first = http.post("/v1/messages", headers={**headers, **ANTHROPIC}, json=body)
    messages += [{"role": "assistant", "content": first.json()["content"]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "ok"}
                                              for use in uses]}]
    assert http.post("/v1/messages", headers={**headers, **ANTHROPIC}, json=body).status_code == 200
    # The wire keeps a tool_use's input as JSON text written as the model's characters.
    return [json.dumps(use["input"], ensure_ascii=False) for use in uses]


def _ask_later(http: httpx.Client, fake: Any, wire: str, headers: dict[str, str]) -> str:
    """The prompt the provider gets for a later question that recalls the trace."""
    question = "How did we set up the billing database?"
    if wire == "chat":
        http.post("/v1/chat/completions", headers=headers, json={"model": "m", "messages": [
            {"role": "user", "content": question}]})
        return fake.chat_requests()[-1].json()["messages"][-1]["content"]
    if wire == "responses":
        http.post("/v1/responses", headers=headers, json={"model": "m", "input": question})
        return fake.responses_requests()[-1].json()["input"]  # string input stays a string
    http.post("/v1/messages", headers={**headers, **ANTHROPIC}, json={
        "model": "claude-test", "max_tokens": 100, "messages": [{"role": "user", "content": question}]})
    return fake.messages_requests()[-1].json()["messages"][-1]["content"]


LOOPS = {"chat": _chat_loop, "responses": _responses_loop, "messages": _messages_loop}


@pytest.mark.parametrize("wire", list(LOOPS))
def test_secrets_tool_call_arguments_spell_reach_no_file_export_search_or_later_prompt(make_proxy: Any, fake: Any,
                                                                                     wire: str) -> None:
    proxy = make_proxy(memory__commit_timeout_ms=5000, extraction__from_roles=[],
                       upstream__anthropic_base_url=fake.url)
    headers = {"X-Memory-User": "alice", "X-Memory-Conversation": "setup"}
    with proxy.http() as http:
        sent = LOOPS[wire](http, fake, headers)
        assert eventually(lambda: len(rows(proxy, "SELECT 1 FROM reasoning")) == 1)
        ((task, steps, answer),) = rows(proxy, "SELECT task, steps, answer FROM reasoning")
        exported = http.get(api_url("alice", "export")).content
        found = http.post(api_url("alice", "search"), json={"query": "billing database shell"})
        assert found.status_code == 200
        prompt = _ask_later(http, fake, wire, {"X-Memory-User": "alice", "X-Memory-Conversation": "later"})
    # Each call's arguments kept as sent but for the passwords they spell.
    assert (task, answer) == (TASK, ANSWER)
    assert [(s["name"], s["arguments"], s["result"]) for s in json.loads(steps)] == [
        ("shell", _redacted(arguments), "ok") for arguments in sent]
    assert [json.loads(s["arguments"]) for s in json.loads(steps)] == [
        json.loads(_redacted(json.dumps(args))) for args, _ in CALLS]
    assert [r["steps"] for r in lines(exported) if r["kind"] == "reasoning"] == [json.loads(steps)]
    assert any(hit["source"] == "reasoning" for hit in found.json()["hits"])
    [line] = [line for line in prompt.splitlines() if "[reasoning]" in line]
    assert line.endswith(f"[reasoning] {TASK} | tools: " + "; ".join(
        f"shell({_redacted(arguments).replace(chr(0x200b), '')}) → ok" for arguments in sent) + f" | answer: {ANSWER}")
    for canary in CANARIES:
        for where, content in (("database files", _files(proxy)), ("export", exported), ("search", found.content),
                               ("prompt", prompt.encode())):
            assert canary.encode() not in content, (canary, where)


# A password right after an escape (`\t`), and one ending where strings two and three levels
# down close (`\\\"]\"]`): the cut takes neither the escape's backslash nor the quotes'.
AT_ESCAPES = [
    ({"t": "password:\tTb5mR2cK"}, "Tb5mR2cK"),
    ({"c": json.dumps([json.dumps(["password=Vx7pN4qH"])])}, "Vx7pN4qH"),
]


@pytest.mark.parametrize("wire", list(LOOPS))
def test_a_password_next_to_an_escape_is_cut_and_every_level_stays_json(make_proxy: Any, fake: Any,
                                                                      wire: str) -> None:
    proxy = make_proxy(memory__commit_timeout_ms=5000, extraction__from_roles=[],
                       upstream__anthropic_base_url=fake.url)
    with proxy.http() as http:
        sent = LOOPS[wire](http, fake, {"X-Memory-User": "alice"}, AT_ESCAPES)
        assert eventually(lambda: len(rows(proxy, "SELECT 1 FROM reasoning")) == 1)
    ((steps,),) = rows(proxy, "SELECT steps FROM reasoning")
    saved = [step["arguments"] for step in json.loads(steps)]
    assert saved == [arguments.replace(canary, MARK) for arguments, (_, canary) in zip(sent, AT_ESCAPES, strict=True)]
    assert json.loads(saved[0]) == {"t": f"password:\t{MARK}"}
    assert json.loads(json.loads(json.loads(saved[1])["c"])[0]) == [f"password={MARK}"]
    assert b"Tb5mR2cK" not in _files(proxy) and b"Vx7pN4qH" not in _files(proxy)


def test_a_store_memory_call_spelling_a_password_keeps_it_out_of_the_trace(make_proxy: Any, fake: Any) -> None:
    """Tools mode: the model's own store_memory call goes into the trace with its arguments."""
    proxy = make_proxy(memory__commit_timeout_ms=5000, extraction__from_roles=[])
    arguments = json.dumps({"content": "The billing database pass\u200bword=Sm9kW2pQ", "type": "fact"})
    fake.queue(model_round(None, [{"id": "call_s1", "name": "store_memory", "arguments": arguments}]),
               model_round("Noted."))
    with proxy.http() as http:
        answer = http.post("/v1/chat/completions", headers={"X-Memory-User": "alice", "X-Memory-Mode": "tools"},
                           json={"model": "m", "messages": [{"role": "user", "content": "Remember the db login"}]})
        assert answer.status_code == 200
        assert eventually(lambda: len(rows(proxy, "SELECT 1 FROM reasoning")) == 1)
        exported = http.get(api_url("alice", "export")).content
    ((steps,),) = rows(proxy, "SELECT steps FROM reasoning")
    [step] = json.loads(steps)
    assert (step["name"], step["arguments"]) == (
        "store_memory", '{"content": "The billing database pass\\u200bword=[REDACTED:password]", "type": "fact"}')
    assert [r["name"] for r in lines(exported) if r["kind"] == "entity"] == [
        f"The billing database pass\u200bword={MARK}"]
    assert b"Sm9kW2pQ" not in _files(proxy) and b"Sm9kW2pQ" not in exported


def test_a_large_tool_call_is_recorded_without_the_password_it_spells(make_proxy: Any, fake: Any) -> None:
    """Arguments past 64 KiB (a file written out) are redacted off the event loop, as thoroughly."""
    proxy = make_proxy(memory__commit_timeout_ms=5000, extraction__from_roles=[])
    code = 'def f(x):\n    return "a\\tb" + x\n' * 4000 + "export pass\u200bword=Lg3xV8kQ\n"
    arguments = json.dumps({"path": "setup.sh", "content": code})
    fake.queue(JsonReply(completion(None, tool_calls=[{"id": "call_w", "name": "write", "arguments": arguments}])))
    with proxy.http() as http:
        answer = http.post("/v1/chat/completions", headers={"X-Memory-User": "alice"},
                           json={"model": "m", "messages": [{"role": "user", "content": TASK}]})
    assert answer.status_code == 200 and len(arguments) > 65_536
    assert eventually(lambda: len(rows(proxy, "SELECT 1 FROM turn_tool_calls")) == 1)
    assert rows(proxy, "SELECT call_id, name, arguments FROM turn_tool_calls") == [
        (proxy.app.state.parts.memory.hash_key.seal("call_w"), "write", arguments.replace("Lg3xV8kQ", MARK))]
    assert b"Lg3xV8kQ" not in _files(proxy)
