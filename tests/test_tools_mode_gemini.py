"""Tools mode on the Gemini wire, through the real proxy, the google-genai SDK and a scripted fake
model that, like the real API, refuses a history whose function calls lack their responses."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google import genai
from google.genai import types

from tests.api_helpers import api_url
from tests.fake_gemini import function_call, gemini_requests, model_round
from tests.proxy_db import eventually, rows

TOOLS = {"X-Memory-User": "alice", "X-Memory-Mode": "tools"}
HELIX = "My favourite editor is Helix"
MODEL = "gemini-test"
QUESTION = "which editor do I like?"


@pytest.fixture
def tproxy(make_proxy, fake):
    return make_proxy(upstream__gemini_base_url=fake.url.removesuffix("/v1"), memory__commit_timeout_ms=5000,
                      extraction__from_roles=[])


def client(proxy) -> genai.Client:
    return genai.Client(api_key="client-gemini-key", http_options=types.HttpOptions(base_url=proxy.url,
                                                                                    headers=TOOLS))


def remember(proxy: Any, content: str, user: str = "alice") -> None:
    with proxy.http() as http:
        assert http.post(api_url(user, "memories"), json={"content": content, "type": "fact"}).status_code == 201


def sent(fake: Any) -> list[dict[str, Any]]:
    return [request.json() for request in gemini_requests(fake.received)]


def saved(proxy: Any) -> list[tuple[str, str]]:
    return rows(proxy, "SELECT role, content FROM messages WHERE user_id = 'alice' AND role != 'tool' ORDER BY seq")


@pytest.mark.parametrize("streamed", [False, True])
def test_query_then_answer(tproxy, fake, streamed):
    remember(tproxy, HELIX)
    fake.queue(model_round("Let me check.", [function_call("query_memory", {"query": "favourite editor"})],
                           thought="I should look it up"),
               model_round("You like Helix."))
    gemini = client(tproxy)
    if streamed:
        chunks = list(gemini.models.generate_content_stream(model=MODEL, contents=QUESTION))
        parts = [part for chunk in chunks for part in chunk.candidates[0].content.parts or []]
        assert chunks[-1].candidates[0].finish_reason == "STOP"
        assert sum(1 for c in chunks if c.candidates[0].finish_reason) == 1
    else:
        parts = gemini.models.generate_content(model=MODEL, contents=QUESTION).candidates[0].content.parts
    assert not any(part.function_call for part in parts)  # memproxy's calls never reach the client
    assert "".join(p.text for p in parts if p.thought) == "I should look it up"
    assert "".join(p.text for p in parts if not p.thought) == "Let me check.\n\nYou like Helix."
    assert parts[0].thought  # the thought comes first, as the model wrote it
    first, second = sent(fake)
    assert [d["name"] for t in first["tools"] for d in t["functionDeclarations"]] == ["query_memory",
                                                                                      "store_memory"]
    model, results = second["contents"][1:]
    # The round as the model wrote it: its thought, its text, its memory call.
    assert model["role"] == "model" and model["parts"][0] == {"text": "I should look it up", "thought": True}
    assert "".join(p.get("text", "") for p in model["parts"][1:]) == "Let me check."
    assert model["parts"][-1] == function_call("query_memory", {"query": "favourite editor"})
    (response,) = results["parts"]
    assert results["role"] == "user" and response["functionResponse"]["name"] == "query_memory"
    assert HELIX in response["functionResponse"]["response"]["result"]
    assert eventually(lambda: saved(tproxy) == [("user", QUESTION),
                                                ("assistant", "Let me check.\n\nYou like Helix.")])


def test_app_call_in_the_last_round_reaches_the_client_and_the_loop_is_saved_once(tproxy, fake):
    weather = types.Tool(function_declarations=[types.FunctionDeclaration(
        name="get_weather", description="weather", parameters_json_schema={"type": "object"})])
    config = types.GenerateContentConfig(tools=[weather], automatic_function_calling=types.
                                         AutomaticFunctionCallingConfig(disable=True))
    fake.queue(model_round("Looking.", [function_call("query_memory", {"query": "home city"})]),
               model_round("Found it.", [function_call("get_weather", {"city": "Bergen"})]))
    gemini = client(tproxy)
    first = gemini.models.generate_content(model=MODEL, contents="weather at home?", config=config)
    assert [c.name for c in first.function_calls] == ["get_weather"]
    assert [d["name"] for t in sent(fake)[0]["tools"] for d in t["functionDeclarations"]] == [
        "get_weather", "query_memory", "store_memory"]
    fake.queue(model_round("Rain in Bergen."))
    history = [types.Content(role="user", parts=[types.Part(text="weather at home?")]), first.candidates[0].content,
               types.Content(role="user", parts=[types.Part.from_function_response(
                   name="get_weather", response={"result": "rain"})])]
    answer = gemini.models.generate_content(model=MODEL, contents=history, config=config)
    assert answer.text == "Rain in Bergen."
    # The client's echo of the merged answer is replaced by the rounds the model really saw.
    round_two, next_step = sent(fake)[1:]
    assert next_step["contents"][:3] == round_two["contents"]
    assert next_step["contents"][3]["parts"] == [{"text": "Found it."}, function_call("get_weather",
                                                                                      {"city": "Bergen"})]
    assert eventually(lambda: saved(tproxy) == [("user", "weather at home?"), ("assistant", "Rain in Bergen.")])
    ((trace,),) = rows(tproxy, "SELECT steps FROM reasoning")
    assert [s["name"] for s in json.loads(trace)] == ["query_memory", "get_weather"]


def test_a_json_array_stream_is_refused_in_tools_mode_before_the_provider_is_asked(tproxy, fake):
    with tproxy.http() as http:
        got = http.post("/v1beta/models/gemini-test:streamGenerateContent", headers={**TOOLS, "x-goog-api-key": "k"},
                        json={"contents": [{"parts": [{"text": QUESTION}]}]})
    assert got.status_code == 400 and got.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert "alt=sse" in got.json()["error"]["message"]
    assert got.headers["x-memory-proxy-error"] == "unsupported_in_tools_mode"
    assert gemini_requests(fake.received) == []


@pytest.mark.parametrize("alt", ["$alt=sse", "%24alt=sse"])
def test_every_spelling_of_alt_sse_is_a_stream_tools_mode_serves(tproxy, fake, alt):
    """Google reads the response format from `alt` or its system-parameter spelling `$alt`."""
    remember(tproxy, HELIX)
    fake.queue(model_round("Let me check.", [function_call("query_memory", {"query": "favourite editor"})]),
               model_round("You like Helix."))
    with tproxy.http() as http:
        got = http.post(f"/v1beta/models/gemini-test:streamGenerateContent?{alt}",
                        headers={**TOOLS, "x-goog-api-key": "k"}, json={"contents": [{"parts": [{"text": QUESTION}]}]})
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in got.text.splitlines() if line.startswith("data: ")]
    text = "".join(part.get("text", "") for event in events for part in event["candidates"][0]["content"]["parts"])
    assert text.endswith("You like Helix.") and "query_memory" not in got.text
    assert eventually(lambda: saved(tproxy) == [("user", QUESTION), ("assistant", "Let me check.\n\nYou like Helix.")])
