"""Hooks on PostgreSQL: a rewritten prompt kept with the turn, stop context queued for the next turn."""

from __future__ import annotations

import json

from tests.proxy_db import eventually
from tests.test_hooks import H, called, hook_server, sent_prompt, with_hooks  # noqa: F401 (fixtures)
from tests.fake_upstream import JsonReply, completion


def test_a_rewritten_prompt_is_kept_with_the_turn(with_hooks, fake, pg_url):
    proxy = with_hooks([{"event": "user_prompt_submit", "python": H + "rewrite"}], **{"store.url": pg_url})
    call = {"id": "call_pg", "type": "function", "function": {"name": "grep", "arguments": "{}"}}
    fake.queue(JsonReply(completion(None, tool_calls=[called(call)])))
    client = proxy.client(**{"X-Memory-User": "alice", "X-Memory-Conversation": "c1"})
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "deploy it"}])
    client.chat.completions.create(model="m", messages=[
        {"role": "user", "content": "deploy it"}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_pg", "content": "found"}])
    assert [json.loads(r.body)["messages"][0]["content"] for r in fake.chat_requests()] == [
        "deploy it [python]", "deploy it [python]"]


def test_stop_context_reaches_the_next_turn(with_hooks, fake, hook_server, pg_url):
    hook_server.answers["/stop"] = lambda event: {"additional_context": "reminder from the last turn"}
    proxy = with_hooks([{"event": "stop", "url": hook_server.url("/stop")}], **{"store.url": pg_url})
    client = proxy.client(**{"X-Memory-User": "alice", "X-Memory-Conversation": "c1"})
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "first"}])
    assert eventually(lambda: len(hook_server.inputs("/stop")) == 1)
    found = []

    def next_turn_gets_it() -> bool:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"again {len(found)}"}])
        found.append(sent_prompt(fake))
        return "reminder from the last turn" in found[-1]
    assert eventually(next_turn_gets_it)
    assert found[-1].endswith(f"reminder from the last turn\n\nagain {len(found) - 1}")
