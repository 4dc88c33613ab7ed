"""Tools mode on the Gemini wire, through the real proxy, the google-genai SDK and a scripted fake
model that, like the real API, refuses a history whose function calls lack their responses."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import types

from tests.api_helpers import api_url
from tests.fake_gemini import answer, error, function_call, gemini_requests, model_round, pieces, sse
from tests.fake_upstream import JsonReply, Received, SSEReply
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


def events(raw: bytes) -> list[dict[str, Any]]:
    """The responses of an `alt=sse` stream, as the client got them."""
    return [json.loads(line[len(b"data: "):]) for line in raw.split(b"\r\n\r\n") if line.startswith(b"data: ")]


def round_with_id(response_id: str, text: str, calls: list[dict[str, Any]] | None = None) -> SSEReply:
    """One streamed round whose responses carry `response_id`: Google gives each call its own."""
    chunks = pieces(text, calls=calls)
    return SSEReply(sse([{**chunk, "responseId": response_id} for chunk in chunks]))


def test_a_stream_keeps_the_first_rounds_response_id_throughout(tproxy, fake):
    remember(tproxy, HELIX)
    fake.queue(round_with_id("resp-round-1", "Let me check.",
                             [function_call("query_memory", {"query": "favourite editor"})]),
               round_with_id("resp-round-2", "You like Helix."))
    with httpx.Client(base_url=tproxy.url, timeout=30) as http:
        got = http.post(f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse", headers={**TOOLS, "x-goog-api-key": "k"},
                        json={"contents": [{"role": "user", "parts": [{"text": QUESTION}]}]})
    assert got.status_code == 200 and len(gemini_requests(fake.received)) == 2
    seen = events(got.content)
    assert "".join(p.get("text", "") for e in seen for p in e["candidates"][0]["content"]["parts"]) == (
        "Let me check.\n\nYou like Helix.")
    # One answer, one id: the first round's, on every event up to the last (the SDK reads each one's).
    assert [e["responseId"] for e in seen] == ["resp-round-1"] * len(seen)
    assert seen[-1]["candidates"][0]["finishReason"] == "STOP"


BLOCKED = {"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
           "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9}, "modelVersion": "gemini-test",
           "responseId": "resp-blocked"}


def test_a_prompt_google_blocks_reaches_a_stream_as_google_sent_it(tproxy, fake):
    # Google answers a prompt it refuses with one response: promptFeedback.blockReason, no candidate.
    fake.queue(SSEReply(sse([BLOCKED])), SSEReply(sse([BLOCKED])))
    with httpx.Client(base_url=tproxy.url, timeout=30) as http:
        got = http.post(f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse", headers={**TOOLS, "x-goog-api-key": "k"},
                        json={"contents": [{"role": "user", "parts": [{"text": "something refused"}]}]})
    assert got.status_code == 200 and events(got.content) == [BLOCKED]  # forwarded, nothing added
    gemini = client(tproxy)
    chunks = list(gemini.models.generate_content_stream(model=MODEL, contents="something refused"))
    assert [chunk.prompt_feedback.block_reason for chunk in chunks] == ["PROHIBITED_CONTENT"]
    assert len(gemini_requests(fake.received)) == 2  # one round each: nothing to run
    fake.queue(JsonReply(BLOCKED))
    assert gemini.models.generate_content(model=MODEL, contents="something refused").prompt_feedback.block_reason == (
        "PROHIBITED_CONTENT")


@pytest.mark.parametrize("streamed", [False, True])
def test_a_later_round_google_blocks_ends_the_answer_after_the_earlier_rounds_text(tproxy, fake, streamed):
    # The memory call's result is part of the next round's prompt: Google may block that one.
    remember(tproxy, HELIX)
    fake.queue(model_round("Let me check.", [function_call("query_memory", {"query": "favourite editor"})]),
               SSEReply(sse([BLOCKED])) if streamed else JsonReply(BLOCKED))
    path = f"/v1beta/models/{MODEL}:{'streamGenerateContent?alt=sse' if streamed else 'generateContent'}"
    with httpx.Client(base_url=tproxy.url, timeout=30) as http:
        got = http.post(path, headers={**TOOLS, "x-goog-api-key": "k"},
                        json={"contents": [{"role": "user", "parts": [{"text": QUESTION}]}]})
    assert got.status_code == 200 and len(gemini_requests(fake.received)) == 2
    seen = events(got.content) if streamed else [got.json()]
    assert "".join(p["text"] for e in seen for c in e.get("candidates", []) for p in c["content"]["parts"]) == (
        "Let me check.")
    assert seen[-1]["promptFeedback"] == {"blockReason": "PROHIBITED_CONTENT"}
    assert "finishReason" not in json.dumps(seen)  # no round's end made up


@pytest.mark.parametrize("path", [f"/v1beta/models/{MODEL}:generateContent",
                                  f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"])
@pytest.mark.parametrize("config", [{"generationConfig": {"candidateCount": 2}},
                                    {"generation_config": {"candidate_count": "3"}}])  # as Google's JSON reads it too
def test_several_candidates_are_refused_before_the_provider_is_asked(tproxy, fake, path, config):
    # The rounds follow one candidate's memory calls: another's would reach the client unrun.
    with httpx.Client(base_url=tproxy.url, timeout=30) as http:
        got = http.post(path, headers={**TOOLS, "x-goog-api-key": "k"},
                        json={**config, "contents": [{"role": "user", "parts": [{"text": QUESTION}]}]})
    assert got.status_code == 400 and got.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert "candidateCount > 1 is not supported in tools mode" in got.json()["error"]["message"]
    assert got.headers["x-memory-proxy-error"] == "unsupported_in_tools_mode"
    assert gemini_requests(fake.received) == []
    assert saved(tproxy) == []


def test_a_streamed_chats_echo_is_replaced_whole_by_the_stored_rounds(tproxy, fake):
    # google-genai's chat keeps a streamed answer in its history as one model content per chunk.
    weather = types.Tool(function_declarations=[types.FunctionDeclaration(
        name="get_weather", description="weather", parameters_json_schema={"type": "object"})])
    config = types.GenerateContentConfig(tools=[weather], automatic_function_calling=types.
                                         AutomaticFunctionCallingConfig(disable=True))
    fake.queue(model_round("Looking.", [function_call("query_memory", {"query": "home city"})]),
               model_round("Found it.", [function_call("get_weather", {"city": "Bergen"})]),
               model_round("Rain in Bergen."))
    gemini = client(tproxy)
    chat = gemini.chats.create(model=MODEL, config=config)
    list(chat.send_message_stream("weather at home?"))
    answer_chunks = list(chat.send_message_stream(types.Part.from_function_response(name="get_weather",
                                                                                   response={"r": "rain"})))
    assert "".join(chunk.text or "" for chunk in answer_chunks) == "Rain in Bergen."
    round_two, next_step = sent(fake)[1:]
    # The rounds the model really had, byte for byte, then the client's result: its echo is not there.
    assert next_step["contents"][:3] == round_two["contents"]
    assert next_step["contents"][3] == {"role": "model", "parts": [  # the last round as it was streamed
        {"text": "Fou"}, {"text": "nd "}, {"text": "it."}, function_call("get_weather", {"city": "Bergen"})]}
    assert [c["role"] for c in next_step["contents"]] == ["user", "model", "user", "model", "user"]
    assert next_step["contents"][4]["parts"][0]["functionResponse"]["response"] == {"r": "rain"}


def refusing_google(request: Received) -> JsonReply:
    """Google's refusals of function declarations beside a cached content, structured output, or a
    built-in tool (Gemini 2.5); the request on its own is answered."""
    body = request.json()
    tools = body.get("tools", [])
    declared = any("functionDeclarations" in tool for tool in tools)
    if "cachedContent" in body and {"tools", "toolConfig", "systemInstruction"} & set(body):
        return JsonReply(error(400, "CachedContent can not be used with GenerateContent request setting "
                                    "system_instruction, tools or tool_config.", "INVALID_ARGUMENT"), status=400)
    if declared and (body.get("generationConfig", {}).get("responseMimeType") == "application/json"
                     or body.get("generation_config", {}).get("response_mime_type") == "application/json"):
        return JsonReply(error(400, "Function calling with a response mime type: 'application/json' is "
                                    "unsupported", "INVALID_ARGUMENT"), status=400)
    if declared and any("googleSearch" in tool for tool in tools):
        return JsonReply(error(400, "Tool use with function calling is unsupported", "INVALID_ARGUMENT"), status=400)
    return JsonReply(answer('{"films": []}'))


@pytest.mark.parametrize("extra, status", [
    ({"cachedContent": "cachedContents/abc123"}, "degraded: no memory tools with cachedContent"),
    ({"generationConfig": {"responseMimeType": "application/json"}},
     "degraded: no memory tools with structured output (responseMimeType)"),
    ({"generation_config": {"response_mime_type": "application/json"}},
     "degraded: no memory tools with structured output (responseMimeType)"),
    ({"tools": [{"googleSearch": {}}]}, "degraded: no memory tools beside a built-in tool"),
])
def test_a_request_google_refuses_function_declarations_on_goes_on_without_the_memory_tools(
        tproxy, fake, extra, status):
    remember(tproxy, HELIX)
    fake.queue(refusing_google)
    request = {**extra, "contents": [{"role": "user", "parts": [{"text": "list my films"}]}]}
    with httpx.Client(base_url=tproxy.url, timeout=30) as http:
        got = http.post(f"/v1beta/models/{MODEL}:generateContent", headers={**TOOLS, "x-goog-api-key": "k"},
                        json=request)
    assert got.status_code == 200, got.text
    assert got.json()["candidates"][0]["content"]["parts"] == [{"text": '{"films": []}'}]
    assert got.headers["x-memory-status"] == status
    assert sent(fake) == [request]  # the client's request as it sent it: no tools, no block
    assert eventually(lambda: saved(tproxy) == [("user", "list my films"), ("assistant", '{"films": []}')])
