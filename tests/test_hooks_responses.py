"""Hooks on the Responses wire (`POST /v1/responses`), driven by the official openai SDK's
`responses.create`: a rewritten prompt reaches the provider, every later step and the store;
a block answers 403 in the wire's error shape."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.fake_responses import output, response
from tests.fake_upstream import JsonReply
from tests.proxy_db import rows
from tests.test_hooks import H, hook_server, settled, with_hooks  # noqa: F401 (fixtures)

ENVIRONMENT = "<environment_context>\n  <cwd>/home/alice/project</cwd>\n</environment_context>"


def client(proxy: Any, conversation: str = "c1") -> openai.OpenAI:
    return proxy.client(**{"X-Memory-User": "alice", "X-Memory-Conversation": conversation})


def sent_input(fake: Any, n: int = -1) -> Any:
    return fake.responses_requests()[n].json()["input"]


def test_a_rewritten_string_prompt_reaches_the_provider_and_the_store(with_hooks, fake, hook_server):
    hook_server.answers["/rewrite"] = lambda event: {"updated_prompt": event["prompt"] + " [http]"}
    proxy = with_hooks([{"event": "user_prompt_submit", "python": H + "rewrite"},
                        {"event": "user_prompt_submit", "url": hook_server.url("/rewrite")}])
    answer = client(proxy).responses.create(model="gpt-test", input="deploy it")
    assert answer.output_text == "Hello from Responses"
    assert sent_input(fake) == "deploy it [python] [http]"
    (event,) = hook_server.inputs("/rewrite")
    assert (event["prompt"], event["wire"]) == ("deploy it [python]", "openai_responses")
    assert settled(proxy, 2) == [("user", "deploy it [python] [http]"), ("assistant", "Hello from Responses")]


def test_a_rewritten_prompt_in_items_keeps_the_context_and_holds_on_every_later_step(with_hooks, fake):
    proxy = with_hooks([{"event": "user_prompt_submit", "python": H + "rewrite"}])
    image = {"type": "input_image", "image_url": "data:image/png;base64,AA=="}
    prompt = {"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": "deploy"}, image, {"type": "input_text", "text": "it"}]}
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ENVIRONMENT}]}, prompt]
    fake.queue(JsonReply(response(output(None, calls=["call_1"]))))
    first = client(proxy).responses.create(model="gpt-test", input=items)
    rewritten = [{"type": "input_text", "text": "deploy\n[image]\nit [python]"}, image]
    assert sent_input(fake)[0] == items[0]  # a client's context is not the user's words: untouched
    assert sent_input(fake)[1]["content"] == rewritten
    # The loop's next step: the client sends its own words again; the turn's rewrite goes instead.
    step = [*items, *(item.model_dump(exclude_none=True) for item in first.output),
            {"type": "function_call_output", "call_id": "call_1", "output": "deployed"}]
    client(proxy).responses.create(model="gpt-test", input=step)
    assert sent_input(fake)[1]["content"] == rewritten
    assert sent_input(fake)[2:] == step[2:]
    assert settled(proxy, 2) == [("user", "deploy\n[image]\nit [python]"), ("assistant", "Hello from Responses")]


def test_a_block_answers_403_in_the_responses_shape_and_saves_nothing(with_hooks, fake, hook_server):
    proxy = with_hooks([{"event": "user_prompt_submit", "python": H + "block"},
                        {"event": "user_prompt_submit", "url": hook_server.url("/after")}])
    with pytest.raises(openai.PermissionDeniedError) as raised:
        client(proxy).responses.create(model="gpt-test", input="tell me the launch codes")
    assert raised.value.status_code == 403
    assert raised.value.body == {"message": "prompts about secrets are not allowed here", "type": "permission_error",
                                 "param": None, "code": "blocked_by_policy"}
    assert fake.responses_requests() == []
    assert hook_server.received == []  # the first block wins: the hooks after it never run
    assert rows(proxy, "SELECT count(*) FROM turns") == [(0,)]
    assert rows(proxy, "SELECT count(*) FROM messages") == [(0,)]
