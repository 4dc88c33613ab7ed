"""proxy.wires.openai_chat: request parsing, turn shape, block insertion."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest

from proxy.wires.base import WireRequest
from proxy.wires.openai_chat import (
    ChatRequest,
    OpenAIChat,
    assistant_texts,
    history_material,
    insert_block,
    is_context_length_error,
    last_user_index,
    message_text,
    parse_chat_request,
    text_hash,
    tool_call_ids_after_last_user,
    tool_results_after_last_user,
)

BLOCK = "Relevant long-term memory about this user (...):\n1. [long-term] Alice — prefers Go"


def parsed(body: dict[str, Any] | bytes) -> ChatRequest:
    raw = body if isinstance(body, bytes) else json.dumps({"model": "m", **body}).encode()
    request = parse_chat_request(raw)
    assert isinstance(request, ChatRequest), request
    return request


# --- parsing --------------------------------------------------------------------------

BAD_BODIES = [
    ("invalid JSON", b'{"messages": [', "invalid JSON: Expecting value"),
    ("trailing garbage", b'{"messages": []} x', "invalid JSON: Extra data"),
    ("empty", b"", "invalid JSON: Expecting value"),
    ("invalid UTF-8", b'{"messages": [], "x": "\xff"}', "body is not UTF-8"),
    ("BOM", b'\xef\xbb\xbf{"messages": []}', "invalid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig)"),
    ("huge int", b'{"messages": [], "n": ' + b"9" * 5000 + b"}", "invalid JSON: bad number"),
    ("list", b"[]", "body is not a JSON object"),
    ("string", b'"x"', "body is not a JSON object"),
    ("null", b"null", "body is not a JSON object"),
    ("deep list", b"[" * 100000 + b"]" * 100000, "JSON nested too deeply"),
    (
        "deep object",
        b'{"messages": [], "x": ' + b'{"a":' * 100000 + b"1" + b"}" * 100001,
        "JSON nested too deeply",
    ),
    ("no messages", b'{"model": "m"}', "messages is not a list"),
    ("messages null", b'{"messages": null}', "messages is not a list"),
    ("messages object", b'{"messages": {"role": "user"}}', "messages is not a list"),
    (
        "message not object",
        b'{"model": "m", "messages": [{"role": "user", "content": "a"}, "b"]}',
        "a message is not an object",
    ),
    ("stream string", b'{"model": "m", "messages": [], "stream": "true"}', "stream is not a boolean"),
    ("stream int", b'{"model": "m", "messages": [], "stream": 1}', "stream is not a boolean"),
    ("no model", b'{"messages": []}', "model is missing or not a string"),
    ("model not a string", b'{"model": ["m"], "messages": []}', "model is missing or not a string"),
    ("unknown role", b'{"model": "m", "messages": [{"role": "root", "content": "a"}]}', "a message has an unknown role"),
    ("no role", b'{"model": "m", "messages": [{"content": "a"}]}', "a message has an unknown role"),
    (
        "content a number",
        b'{"model": "m", "messages": [{"role": "user", "content": 5}]}',
        "a message's content is neither text nor a list of parts",
    ),
    (
        "content an object",
        b'{"model": "m", "messages": [{"role": "user", "content": {"text": "a"}}]}',
        "a message's content is neither text nor a list of parts",
    ),
]


@pytest.mark.parametrize(("body", "reason"), [c[1:] for c in BAD_BODIES], ids=[c[0] for c in BAD_BODIES])
def test_bad_bodies_give_a_reason(body: bytes, reason: str) -> None:
    assert parse_chat_request(body) == reason


@pytest.mark.parametrize(
    ("body", "stream"),
    [
        (b'{"model": "m", "messages": []}', False),
        (b'{"model": "m", "messages": [], "stream": true}', True),
        (b'{"model": "m", "messages": [], "stream": false}', False),
        (b'{"model": "m", "messages": [], "stream": null}', False),
    ],
)
def test_stream_flag(body: bytes, stream: bool) -> None:
    assert parsed(body).stream is stream


def test_parse_keeps_the_whole_body() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hé", "x_extra": [1]}],
        "vendor": {"a": 1},
    }
    request = parsed(json.dumps(body, ensure_ascii=False).encode())
    assert request == ChatRequest(body=body, stream=False, messages=body["messages"])
    assert request.messages is request.body["messages"]


# --- content text ---------------------------------------------------------------------

MESSAGE_TEXT_CASES = [
    ("string", "hello", "hello"),
    ("empty string", "", ""),
    ("none", None, ""),
    ("number", 5, ""),
    ("object", {"type": "text", "text": "x"}, ""),
    ("parts", [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "a\nb"),
    (
        "media parts noted",
        [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:..."}},
            {"type": "input_audio", "input_audio": {"data": "...", "format": "wav"}},
            {"type": "file", "file": {"file_id": "f"}},
        ],
        "look\n[image]\n[audio]\n[file]",
    ),
    ("refusal part", [{"type": "refusal", "refusal": "no"}], "no"),
    (
        "unknown and malformed parts ignored",
        [
            {"type": "video"},
            "x",
            None,
            {"text": "no type"},
            {"type": "text"},
            {"type": "text", "text": 3},
            {"type": 1},
            {"type": "text", "text": "kept"},
        ],
        "kept",
    ),
    ("empty list", [], ""),
]


@pytest.mark.parametrize(
    ("content", "expected"), [c[1:] for c in MESSAGE_TEXT_CASES], ids=[c[0] for c in MESSAGE_TEXT_CASES]
)
def test_message_text(content: Any, expected: str) -> None:
    assert message_text(content) == expected


# --- turn shape -----------------------------------------------------------------------


def tool_call(call_id: str, name: str = "f") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


TOOL_LOOP: list[dict[str, Any]] = [
    {"role": "system", "content": "You are helpful. Time: 12:00"},
    {"role": "user", "content": "first question"},
    {"role": "assistant", "content": "first answer"},
    {"role": "developer", "content": "be brief"},
    {
        "role": "user",
        "content": [{"type": "text", "text": "weather?"}, {"type": "image_url", "image_url": {"url": "u"}}],
    },
    {"role": "assistant", "content": None, "tool_calls": [tool_call("call_a"), tool_call("call_b", "g")]},
    {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "12:00"}]},
    {"role": "assistant", "content": "Let me check more.", "tool_calls": [tool_call("call_c")]},
    {"role": "tool", "tool_call_id": "call_c", "content": "done"},
]


def test_last_user_index() -> None:
    assert last_user_index(TOOL_LOOP) == 4
    assert last_user_index([{"role": "system", "content": "x"}]) is None
    assert last_user_index([]) is None


def test_tool_call_ids_after_last_user() -> None:
    assert tool_call_ids_after_last_user(TOOL_LOOP) == ["call_a", "call_b", "call_c"]
    assert tool_call_ids_after_last_user(TOOL_LOOP[:5]) == []


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        # calls before the last user message belong to an earlier turn
        ([{"role": "assistant", "tool_calls": [tool_call("old")]}, {"role": "user", "content": "new"}], []),
        # malformed calls, non-assistant roles and duplicates
        (
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "tool_calls": [tool_call("x"), {"id": ""}, {"id": 3}, "y", tool_call("x")],
                },
                {"role": "tool", "tool_calls": [tool_call("z")]},
                {"role": "assistant", "tool_calls": "nope"},
            ],
            ["x"],
        ),
        # no user message at all: everything counts as after it
        ([{"role": "assistant", "tool_calls": [tool_call("only")]}], ["only"]),
    ],
)
def test_tool_call_ids_edge_cases(messages: list[dict[str, Any]], expected: list[str]) -> None:
    assert tool_call_ids_after_last_user(messages) == expected


def test_tool_results_after_last_user() -> None:
    assert tool_results_after_last_user(TOOL_LOOP) == {"call_a": "sunny", "call_b": "12:00", "call_c": "done"}
    messages: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": "before", "content": "x"},
        {"role": "user", "content": "q"},
        {"role": "tool", "content": "no id"},
        {"role": "tool", "tool_call_id": "n", "content": None},
        {"role": "assistant", "tool_call_id": "not a tool", "content": "x"},
    ]
    assert tool_results_after_last_user(messages) == {"n": ""}


def test_assistant_texts() -> None:
    assert assistant_texts(TOOL_LOOP) == ["first answer", "Let me check more."]
    assert assistant_texts([{"role": "assistant", "content": [{"type": "text", "text": "a"}]}]) == ["a"]


def test_history_material_skips_system_and_developer() -> None:
    assert history_material(TOOL_LOOP) == [
        ("user", "first question"),
        ("assistant", "first answer"),
        ("user", "weather?\n[image]"),
    ]
    assert history_material([{"role": "system", "content": "s"}]) == []
    assert history_material([{"content": "no role"}, {"role": "user", "content": "q"}]) == [
        ("", "no role"),
        ("user", "q"),
    ]


def test_history_material_ignores_the_system_prompt_and_tool_steps() -> None:
    later = [{**TOOL_LOOP[0], "content": "Time: 12:05"}, *TOOL_LOOP[1:5]]
    assert history_material(later) == history_material(TOOL_LOOP)


# --- block insertion ------------------------------------------------------------------


def test_insert_block_string_content() -> None:
    request = parsed(
        {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hé?"}]}
    )
    assert (
        insert_block(request, "MEM")
        == (
            '{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"MEM\\n\\nhé?"}]}'
        ).encode()
    )


def test_insert_block_list_content() -> None:
    content = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "u", "detail": "low"}},
    ]
    request = parsed({"messages": [{"role": "user", "content": content, "name": "al"}], "stream": True})
    assert insert_block(request, "MEM") == (
        b'{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"MEM\\n\\n"},'
        b'{"type":"text","text":"what is this?"},'
        b'{"type":"image_url","image_url":{"url":"u","detail":"low"}}],'
        b'"name":"al"}],"stream":true}'
    )


def test_insert_block_goes_to_the_last_user_message_and_leaves_the_original_alone() -> None:
    body = {
        "model": "m",
        "messages": copy.deepcopy(TOOL_LOOP),
        "tools": [{"type": "function"}],
        "x_vendor": {"k": [1]},
    }
    request = parsed(body)
    before = copy.deepcopy(request.body)
    out = json.loads(insert_block(request, BLOCK))
    assert request.body == before
    expected = copy.deepcopy(before)
    expected["messages"][4]["content"].insert(0, {"type": "text", "text": BLOCK + "\n\n"})
    assert out == expected


def test_insert_block_is_byte_stable() -> None:
    request = parsed({"messages": [{"role": "user", "content": "q"}], "temperature": 0.1, "n": 1e3})
    assert insert_block(request, BLOCK) == insert_block(request, BLOCK)
    assert (
        insert_block(request, "B")
        == b'{"model":"m","messages":[{"role":"user","content":"B\\n\\nq"}],"temperature":0.1,"n":1000.0}'
    )


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([{"role": "system", "content": "s"}], [{"role": "system", "content": "s"}]),
        ([{"role": "user", "content": None}], [{"role": "user", "content": None}]),
        ([{"role": "user"}], [{"role": "user"}]),
    ],
)
def test_insert_block_without_text_to_prefix(
    messages: list[dict[str, Any]], expected: list[dict[str, Any]]
) -> None:
    assert json.loads(insert_block(parsed({"messages": messages}), BLOCK)) == {"model": "m", "messages": expected}


def test_insert_block_keeps_a_lone_surrogate_valid() -> None:
    request = parsed(b'{"model":"m","messages":[{"role":"user","content":"a\\ud800b"}]}')
    out = insert_block(request, "é")
    assert out == b'{"model":"m","messages":[{"role":"user","content":"\\u00e9\\n\\na\\ud800b"}]}'
    assert json.loads(out)["messages"][0]["content"] == "é\n\na\ud800b"


def test_insert_block_on_a_body_too_deep_to_serialise_raises_value_error() -> None:
    # Built in a loop, not parsed: how deep a parsed body may be before serialising it again fails
    # depends on the Python version (3.11 counts both against one limit, 3.13 has its own for C).
    nested: list[Any] = []
    for _ in range(200_000):
        nested = [nested]
    messages = [{"role": "user", "content": "q"}]
    request = ChatRequest({"model": "m", "messages": messages, "x": nested}, False, messages)
    with pytest.raises(ValueError, match="nested too deeply"):
        insert_block(request, "B")


# --- hashes and errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", hashlib.sha256(b"").hexdigest()),
        ("Café 🙂", hashlib.sha256("Café 🙂".encode()).hexdigest()),
        ("a\ud800", hashlib.sha256(b"a\xed\xa0\x80").hexdigest()),
    ],
)
def test_text_hash(text: str, expected: str) -> None:
    assert text_hash(text) == expected


CONTEXT_BODY = json.dumps(
    {
        "error": {
            "message": "This model's maximum context length is 8192 tokens.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
).encode()


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, CONTEXT_BODY, True),
        (413, CONTEXT_BODY, False),
        (200, CONTEXT_BODY, False),
        (400, b'{"error": {"code": "invalid_value"}}', False),
        (400, b'{"error": "context_length_exceeded"}', False),
        (400, b'{"code": "context_length_exceeded"}', False),
        (400, b"not json", False),
        (400, b"\xff", False),
        (400, b"[" * 100000, False),
    ],
)
def test_is_context_length_error(status: int, body: bytes, expected: bool) -> None:
    assert is_context_length_error(status, body) is expected


# Every char JSON escapes or UTF-8 writes in more than one byte, spread so that the 64 KiB
# pieces of a long text are cut next to each of them; repeated past LARGE_BODY_BYTES.
AWKWARD = 'q"\\\n\t\x01é€😀 ' * 100_000


@pytest.mark.parametrize("content", [AWKWARD, [{"type": "text", "text": AWKWARD}, {"type": "image_url"}]])
def test_a_large_body_is_written_in_pieces_as_one_call_writes_it(content: Any) -> None:
    body = {"model": "m", "z": "memproxy-long-text", "messages": [
        {"role": "user", "content": AWKWARD[:100]}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": content, "name": "u"}]}
    request = OpenAIChat().parse(json.dumps(body).encode())
    assert isinstance(request, WireRequest) and request.large
    with_block = copy.deepcopy(body)
    last = with_block["messages"][-1]
    last["content"] = ("BLOCK\n\n" + content if isinstance(content, str)
                       else [{"type": "text", "text": "BLOCK\n\n"}, *content])
    assert OpenAIChat().insert_block(request, "BLOCK") == json.dumps(with_block, ensure_ascii=False,
                                                                     separators=(",", ":")).encode()
