"""proxy.wires.anthropic_messages and anthropic_answer: the turn's prompt, placement, answers, errors."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from proxy.errors import BadScope, UpstreamTimeout
from proxy.models import ToolCall, ToolStep
from proxy.wires.anthropic_answer import MessagesStreamReader
from proxy.wires.anthropic_messages import AnthropicMessages
from proxy.wires.base import WireRequest
from proxy.wires.sse import SSEDecoder
from tests.fake_anthropic import message, stream

WIRE = AnthropicMessages()
BLOCK = "Relevant long-term memory about this user (...):\n1. [long-term] Alice — prefers Go"
REMINDER = {"type": "text", "text": "<system-reminder>\nThe date is today.\n</system-reminder>"}


def parsed(messages: list[Any], **fields: Any) -> WireRequest:
    request = WIRE.parse(json.dumps({"model": "m", "max_tokens": 5, "messages": messages, **fields}).encode())
    assert isinstance(request, WireRequest), request
    return request


def inserted(request: WireRequest) -> dict[str, Any]:
    return json.loads(WIRE.insert_block(request, BLOCK))


@pytest.mark.parametrize("body, reason", [
    (b'{"model": "m", "messages": [', "invalid JSON: Expecting value"),
    (b"[]", "body is not a JSON object"),
    (b'{"model": "m"}', "messages is not a list"),
    (b'{"messages": []}', "model is missing or not a string"),
    (b'{"model": "m", "messages": [], "stream": "yes"}', "stream is not a boolean"),
    (b'{"model": "m", "messages": [1]}', "a message is not an object"),
    (b'{"model": "m", "messages": [{"content": "x"}]}', "a message has no role"),
    (b'{"model": "m", "messages": [{"role": "user", "content": 42}]}',
     "a message's content is neither text nor a list of blocks"),
    (b'{"model": "m", "messages": [{"role": "user", "content": ["x"]}]}', "a content block is not an object"),
])
def test_requests_memory_skips_say_why(body, reason):
    assert WIRE.parse(body) == reason


def test_the_prompt_is_the_last_user_message_with_the_users_own_words():
    messages = [
        {"role": "user", "content": "Where do I deploy?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                          {"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "grep", "input": {"q": "d"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "deploy.sh"},
                                     {"type": "text", "text": "the user typed this meanwhile"}]},
        {"role": "user", "content": [REMINDER]},
        {"role": "system", "content": "client note"},
    ]
    request = parsed(messages, system="sys")
    transcript = request.transcript
    assert request.prompt_index == 0
    assert transcript.prompt == transcript.query == "Where do I deploy?"
    assert transcript.tool_call_ids == ("toolu_1",)
    assert transcript.tool_steps == (ToolStep("toolu_1", "grep", '{"q": "d"}', "deploy.sh"),)
    assert transcript.history == (("user", "Where do I deploy?"),)
    assert transcript.assistant_texts == ("Let me look.",)
    assert transcript.body_user is None


def test_context_blocks_are_neither_query_nor_saved():
    prompt = [REMINDER, {"type": "text", "text": "fix the bug"},
              {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
              {"type": "text", "text": "<environment_context>cwd</environment_context>\n<user_instructions>x"
                                       "</user_instructions>"}]
    transcript = parsed([{"role": "user", "content": prompt}]).transcript
    assert transcript.prompt == "fix the bug\n[image]"
    assert transcript.query == "fix the bug"


@pytest.mark.parametrize("text", ["<system-reminder>a</system-reminder> and my words",
                                  "<other-tag>a</other-tag>", "<system-reminder>never closed"])
def test_text_that_is_not_wholly_context_is_the_users(text):
    assert parsed([{"role": "user", "content": text}]).transcript.prompt == text


def test_context_tags_come_from_settings():
    wire = AnthropicMessages(["mine"])
    request = wire.parse(json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "real words"}, {"role": "user", "content": "<mine>x</mine>"}]}).encode())
    assert isinstance(request, WireRequest) and request.prompt_index == 0


def test_no_prompt_means_no_block():
    request = parsed([{"role": "user", "content": [REMINDER]}])
    assert request.prompt_index is None and request.transcript.prompt == ""
    assert inserted(request)["messages"][0]["content"] == [REMINDER]


def test_string_content_gets_the_block_and_a_blank_line_in_front():
    request = parsed([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                      {"role": "user", "content": "and now?"}])
    out = inserted(request)
    assert out["messages"][2]["content"] == f"{BLOCK}\n\nand now?"
    assert out["messages"][:2] == request.body["messages"][:2]


def test_blocks_without_cache_control_get_a_new_first_text_block():
    content = [REMINDER, {"type": "text", "text": "hi"}]
    out = inserted(parsed([{"role": "user", "content": content}]))
    assert out["messages"][0]["content"] == [{"type": "text", "text": BLOCK + "\n\n"}, *content]


def test_the_block_follows_the_last_block_with_cache_control():
    mark = {"type": "ephemeral"}
    content = [{"type": "text", "text": "a", "cache_control": mark}, {"type": "text", "text": "b"},
               {"type": "text", "text": "c", "cache_control": mark}, {"type": "text", "text": "d"}]
    request = parsed([{"role": "user", "content": content}])
    out = inserted(request)
    assert out["messages"][0]["content"] == [*content[:3], {"type": "text", "text": BLOCK + "\n\n"}, content[3]]
    assert request.body["messages"][0]["content"] == content  # the client's request is not changed in place


def test_top_level_cache_control_moves_to_the_prompts_last_block():
    mark = {"type": "ephemeral", "ttl": "1h"}
    out = inserted(parsed([{"role": "user", "content": "hi"}], cache_control=mark))
    assert "cache_control" not in out
    assert out["messages"][0]["content"] == [{"type": "text", "text": "hi", "cache_control": mark},
                                             {"type": "text", "text": BLOCK + "\n\n"}]


def test_top_level_cache_control_stays_when_the_conversation_goes_on_after_the_prompt():
    mark = {"type": "ephemeral"}
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]}]
    out = inserted(parsed(messages, cache_control=mark))
    assert out["cache_control"] == mark
    # Where the first step put memory (after the prompt), so the prefix it cached is read again.
    assert out["messages"][0]["content"] == [{"type": "text", "text": "hi"}, {"type": "text", "text": BLOCK + "\n\n"}]


def test_a_later_step_keeps_memory_after_the_prompt_when_the_client_moved_its_breakpoint():
    mark = {"type": "ephemeral"}
    prompt = [REMINDER, {"type": "text", "text": "run it"}]
    first = inserted(parsed([{"role": "user", "content": [prompt[0], {**prompt[1], "cache_control": mark}]}]))
    later = inserted(parsed([
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r", "cache_control": mark}]},
    ]))
    memory = {"type": "text", "text": BLOCK + "\n\n"}
    assert first["messages"][0]["content"] == [prompt[0], {**prompt[1], "cache_control": mark}, memory]
    assert later["messages"][0]["content"] == [*prompt, memory]


def events(chunks: list[bytes]) -> MessagesStreamReader:
    reader = MessagesStreamReader(keep_answer=True)
    decoder = SSEDecoder()
    for chunk in chunks:
        for event in decoder.feed(chunk):
            reader.feed(event)
    return reader


def test_a_stream_is_read_into_one_answer_with_thinking_apart():
    uses = [{"id": "toolu_9", "name": "lookup", "input": {"q": "x"}}]
    reader = events(stream("Hello there", tool_uses=uses, thinking="I should look it up"))
    assert reader.done and reader.error is None and reader.malformed == 0
    answer = reader.message()
    assert answer.content == "Hello there" and answer.reasoning == "I should look it up"
    assert answer.tool_calls == (ToolCall("toolu_9", "lookup", '{"q": "x"}'),)
    assert answer.finish_reason == "tool_use" and not answer.continues


def test_a_stream_without_message_stop_is_not_done():
    reader = events(stream("cut", end=False))
    assert not reader.done and reader.message().content == "cut"


def test_pause_turn_is_no_answer_yet():
    assert events(stream("searching", stop_reason="pause_turn")).message().continues
    assert WIRE.parse_answer(json.dumps(message("x", stop_reason="pause_turn")).encode()).continues


def test_an_error_event_is_the_providers_own_ending():
    reader = events([b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", '
                     b'"message": "Overloaded"}}\n\n'])
    assert reader.error == {"type": "overloaded_error", "message": "Overloaded"} and not reader.done


def test_watching_only_parses_no_answer_event():
    reader = MessagesStreamReader(keep_answer=False)
    decoder = SSEDecoder()
    for chunk in stream("abc"):
        for event in decoder.feed(chunk):
            reader.feed(event)
    assert reader.done and reader.message().content == ""


def test_a_json_answer():
    answer = WIRE.parse_answer(json.dumps(message("Hi", thinking="hmm")).encode())
    assert answer is not None and (answer.content, answer.reasoning, answer.finish_reason) == ("Hi", "hmm", "end_turn")
    assert WIRE.parse_answer(b'{"type": "error"}') is None and WIRE.parse_answer(b"nope") is None


@pytest.mark.parametrize("status, message_text, expected", [
    (400, "prompt is too long: 210000 tokens > 200000 maximum", True),
    (400, "input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000", True),
    (400, "messages: Field required", False),
    (413, "prompt is too long", False),
])
def test_context_length_errors(status, message_text, expected):
    body = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": message_text}})
    assert WIRE.is_context_length_error(status, body.encode()) is expected


def test_errors_have_the_anthropic_shape():
    assert json.loads(WIRE.error_body(BadScope("X-Memory-User is bad"))) == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "X-Memory-User is bad"}}
    assert json.loads(WIRE.error_body(UpstreamTimeout("slow")))["error"]["type"] == "timeout_error"
    assert WIRE.stream_error("cut", "stream_truncated") == (
        b'event: error\ndata: {"type": "error", "error": {"type": "api_error", "message": "cut"}}\n\n')


# Every char JSON escapes or UTF-8 writes in more than one byte, spread so that the 64 KiB
# pieces of a long text are cut next to each of them; repeated past LARGE_BODY_BYTES.
AWKWARD = 'q"\\\n\t\x01é€😀 ' * 100_000


def test_a_large_body_is_written_in_pieces_as_one_call_writes_it():
    call = {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": AWKWARD[:70_000]}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": AWKWARD}]}
    request = parsed([{"role": "user", "content": [{"type": "text", "text": AWKWARD}]},
                      {"role": "assistant", "content": [call]}, {"role": "user", "content": [result]},
                      {"role": "assistant", "content": "read"}, {"role": "user", "content": "and the plan?"}],
                     system=AWKWARD, metadata={"note": "memproxy-long-text"})
    assert request.large
    written = WIRE.insert_block(request, BLOCK)
    assert written == WIRE.insert_block(replace(request, size=0), BLOCK)  # one json.dumps call
    assert json.loads(written)["messages"][-1]["content"] == f"{BLOCK}\n\nand the plan?"
