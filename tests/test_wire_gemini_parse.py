"""The Gemini wire's protocol code without a socket: which content is the prompt, where the block
goes, how a stream's responses and a JSON array read as one answer, and the key parameter."""

from __future__ import annotations

import json

import pytest

from proxy.http.upstream import without_key_parameter
from proxy.wires.gemini import GeminiGenerateContent, model_method
from proxy.wires.sse import SSEEvent

WIRE = GeminiGenerateContent(("session_context",))
CONTEXT = {"text": "<session_context>\nlinux\n</session_context>"}


def parsed(contents: list[dict]):
    request = WIRE.parse(json.dumps({"contents": contents}).encode())
    assert not isinstance(request, str)
    return request


def test_the_prompt_is_the_last_user_content_with_words_of_its_own():
    request = parsed([
        {"role": "user", "parts": [CONTEXT, {"text": "list the files"},
                                   {"inlineData": {"mimeType": "image/png", "data": "AA=="}}]},
        {"role": "model", "parts": [{"text": "hm", "thought": True}, {"text": "Looking."},
                                    {"functionCall": {"name": "ls", "args": {"dir": "."}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {"output": "a.txt"}}}]},
        {"role": "user", "parts": [CONTEXT]},
    ])
    assert request.prompt_index == 0
    transcript = request.transcript
    assert (transcript.prompt, transcript.query) == ("list the files\n[image]", "list the files")
    assert [(s.name, s.arguments, s.result) for s in transcript.tool_steps] == [
        ("ls", '{"dir": "."}', '{"output": "a.txt"}')]
    assert transcript.tool_call_ids == (transcript.tool_steps[0].call_id,)
    assert transcript.assistant_texts == ("Looking.",)
    assert transcript.history == (("user", "list the files\n[image]"),)


def test_the_block_goes_right_before_the_users_words():
    request = parsed([{"parts": [CONTEXT, {"text": "hi"}]}])
    body = json.loads(WIRE.insert_block(request, "MEMORY"))
    assert body["contents"][0]["parts"] == [CONTEXT, {"text": "MEMORY\n\n"}, {"text": "hi"}]


def test_results_without_ids_go_to_calls_of_their_name_in_order():
    request = parsed([
        {"role": "user", "parts": [{"text": "read both"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "read", "args": {"f": "a"}}},
                                    {"functionCall": {"name": "read", "args": {"f": "b"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "read", "response": {"r": "A"}}},
                                   {"functionResponse": {"name": "read", "response": {"r": "B"}}}]},
    ])
    assert [(json.loads(s.arguments)["f"], json.loads(s.result)["r"]) for s in request.transcript.tool_steps] == [
        ("a", "A"), ("b", "B")]


def test_a_stream_and_a_json_array_read_as_the_same_answer():
    chunks = [{"candidates": [{"content": {"parts": [{"text": "think", "thought": True}]}}]},
              {"candidates": [{"content": {"parts": [{"text": "Hel"}]}}]},
              {"candidates": [{"content": {"parts": [{"text": "lo"}, {"functionCall": {"name": "f", "args": {}}}]},
                               "finishReason": "STOP"}]}]
    reader = WIRE.answer_reader(keep_answer=True)
    for chunk in chunks[:-1]:
        reader.feed(SSEEvent(None, json.dumps(chunk)))
        assert not reader.done
    reader.feed(SSEEvent(None, json.dumps(chunks[-1])))
    assert reader.done
    whole = WIRE.parse_answer(("[" + ",\r\n".join(json.dumps(c) for c in chunks) + "]").encode())
    assert whole == reader.message()
    assert (whole.content, whole.reasoning, whole.finish_reason) == ("Hello", "think", "STOP")
    assert [call.name for call in whole.tool_calls] == ["f"]


@pytest.mark.parametrize("path, expected", [
    ("/models/gemini-2.5-flash:generateContent", ("gemini-2.5-flash", "generateContent")),
    ("/models/gemini-2.5-flash:streamGenerateContent", ("gemini-2.5-flash", "streamGenerateContent")),
    ("/models", None), ("/models/gemini-2.5-flash", None), ("/chat/completions", None),
    ("/models/a/b:generateContent", None), ("/models/gemini-2.5-flash:countTokens", ("gemini-2.5-flash", "countTokens")),
    ("/models/ft:custom", None),  # an OpenAI fine-tuned model's id, not a Gemini method
])
def test_model_method(path, expected):
    assert model_method(path) == expected


@pytest.mark.parametrize("query, expected", [
    (b"key=abc", b""), (b"alt=sse&key=abc", b"alt=sse"), (b"key=a&alt=sse&key=b", b"alt=sse"),
    (b"k%65y=abc&alt=sse", b"alt=sse"), (b"keys=1&monkey=2", b"keys=1&monkey=2"), (b"", b""),
    (b"$key=abc&alt=sse", b"alt=sse"), (b"%24key=abc", b""), (b"access_token=t&alt=sse", b"alt=sse"),
    (b"%24keys=1&token=2", b"%24keys=1&token=2"),
])
def test_the_key_parameter_is_removed_and_the_rest_kept_byte_for_byte(query, expected):
    assert without_key_parameter(query) == expected


def test_a_rounds_last_response_sends_its_text_and_holds_its_end():
    from proxy.wires.gemini_tools import GeminiStreamState, GeminiTools

    tools = GeminiTools()
    state = GeminiStreamState()
    first = tools.stream_round(state, frozenset({"query_memory"}), first=True)
    sent = first.feed(SSEEvent(None, json.dumps({"candidates": [{"content": {"parts": [
        {"text": "Checking."}, {"functionCall": {"name": "query_memory", "args": {"query": "x"}}}]},
        "finishReason": "STOP"}]})))
    assert json.loads(sent.removeprefix(b"data: "))["candidates"][0] == {"content": {"role": "model", "parts": [
        {"text": "Checking."}]}}
    assert first.ended and [c.name for c in first.finish().memory_calls] == ["query_memory"]
    last = tools.stream_round(state, frozenset({"query_memory"}), first=False)
    sent = last.feed(SSEEvent(None, json.dumps({"candidates": [{"content": {"parts": [
        {"text": "Done."}, {"functionCall": {"name": "app_tool", "args": {}}}]}, "finishReason": "STOP"}],
        "usageMetadata": {"totalTokenCount": 9}})))
    assert json.loads(sent.removeprefix(b"data: "))["candidates"][0]["content"]["parts"] == [
        {"text": "\n\n"}, {"text": "Done."}]
    end = json.loads(last.tail().removeprefix(b"data: "))
    assert end["candidates"][0]["content"]["parts"] == [{"functionCall": {"name": "app_tool", "args": {}}}]
    assert end["candidates"][0]["finishReason"] == "STOP" and end["usageMetadata"] == {"totalTokenCount": 9}
