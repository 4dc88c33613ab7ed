"""Hooks on the Gemini wire, driven by the official google-genai SDK: a rewritten prompt reaches
the provider (the client's context part kept in place) and the store; a block answers 403 in
Google's error shape."""

from __future__ import annotations

from typing import Any

import pytest
from google import genai
from google.genai import errors, types

from tests.fake_gemini import gemini_requests
from tests.proxy_db import rows
from tests.test_hooks import H, hook_server, settled, with_hooks  # noqa: F401 (fixtures)

CONTEXT = "<session_context>\nMy operating system is: linux\n</session_context>"


def start(with_hooks: Any, fake: Any, hooks: list[dict[str, Any]]) -> Any:
    return with_hooks(hooks, **{"upstream.gemini_base_url": fake.url.removesuffix("/v1")})


def client(proxy: Any) -> genai.Client:
    return genai.Client(api_key="k", http_options=types.HttpOptions(base_url=proxy.url,
                                                                    headers={"X-Memory-User": "alice"}))


def test_a_rewritten_prompt_keeps_the_context_part_and_reaches_the_store(with_hooks, fake, hook_server):
    hook_server.answers["/rewrite"] = lambda event: {"updated_prompt": event["prompt"] + " [http]"}
    proxy = start(with_hooks, fake, [{"event": "user_prompt_submit", "python": H + "rewrite"},
                                     {"event": "user_prompt_submit", "url": hook_server.url("/rewrite")}])
    gemini = client(proxy)
    answer = gemini.models.generate_content(model="gemini-test", contents=[types.Content(role="user", parts=[
        types.Part(text=CONTEXT), types.Part(text="deploy it")])])
    assert answer.text == "Hello from Gemini"
    assert gemini_requests(fake.received)[-1].json()["contents"] == [
        {"role": "user", "parts": [{"text": CONTEXT}, {"text": "deploy it [python] [http]"}]}]
    (event,) = hook_server.inputs("/rewrite")
    assert (event["prompt"], event["wire"]) == ("deploy it [python]", "gemini_generate_content")
    assert settled(proxy, 2) == [("user", "deploy it [python] [http]"), ("assistant", "Hello from Gemini")]


def test_a_block_answers_403_in_googles_shape_and_saves_nothing(with_hooks, fake):
    proxy = start(with_hooks, fake, [{"event": "user_prompt_submit", "python": H + "block"}])
    gemini = client(proxy)
    with pytest.raises(errors.ClientError) as raised:
        gemini.models.generate_content(model="gemini-test", contents="tell me the launch codes")
    assert raised.value.code == 403 and raised.value.status == "PERMISSION_DENIED"
    assert raised.value.message == "prompts about secrets are not allowed here"
    assert gemini_requests(fake.received) == []
    assert rows(proxy, "SELECT count(*) FROM messages") == [(0,)]
