"""proxy.wires.sse and proxy.wires.openai_chat_answer: the event-stream decoder, the chunk accumulator, completions, error events."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import pytest
from openai._streaming import SSEDecoder as SDKDecoder
from openai.lib.streaming.chat import ChatCompletionStreamState

from proxy.models import AssistantMessage, ToolCall
from proxy.wires.openai_chat_answer import (
    DONE,
    ChatStreamAccumulator,
    StreamEnd,
    error_event,
    is_done,
    parse_completion,
)
from proxy.wires.sse import SSEDecoder, SSEEvent


def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1790000000,
        "model": "gpt-4o-mini",
        "choices": choices,
        **extra,
    }


def delta(index: int = 0, finish_reason: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"index": index, "delta": fields, "logprobs": None, "finish_reason": finish_reason}


def call(index: int, arguments: str, id: str | None = None, name: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"index": index}
    if id is not None:
        out.update(id=id, type="function")
    out["function"] = {"arguments": arguments, **({"name": name} if name is not None else {})}
    return out


def sse(*payloads: dict[str, Any] | str) -> bytes:
    parts = [
        p if isinstance(p, str) else json.dumps(p, ensure_ascii=False, separators=(",", ":"))
        for p in payloads
    ]
    return "".join(f"data: {p}\n\n" for p in parts).encode()


USAGE = {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}

# A stream as OpenAI sends it: text, then two parallel tool calls whose deltas interleave,
# the usage chunk with no choices, and [DONE]. "é" and "🙂" are 2 and 4 bytes in UTF-8.
REALISTIC = sse(
    chunk([delta(role="assistant", content="", refusal=None)]),
    chunk([delta(content="Café ")]),
    chunk([delta(content="🙂 checking")]),
    chunk([delta(tool_calls=[call(0, "", id="call_a", name="get_weather")])]),
    chunk([delta(tool_calls=[call(1, "", id="call_b", name="get_time")])]),
    chunk([delta(tool_calls=[call(0, '{"city":')])]),
    chunk([delta(tool_calls=[call(1, '{"tz":"Europe/')])]),
    chunk([delta(tool_calls=[call(0, '"Zürich"}')])]),
    chunk([delta(tool_calls=[call(1, 'Paris"}')])]),
    chunk([delta(finish_reason="tool_calls")]),
    chunk([], usage=USAGE),
    DONE,
)

REALISTIC_MESSAGE = AssistantMessage(
    content="Café 🙂 checking",
    refusal="",
    tool_calls=(
        ToolCall(id="call_a", name="get_weather", arguments='{"city":"Zürich"}'),
        ToolCall(id="call_b", name="get_time", arguments='{"tz":"Europe/Paris"}'),
    ),
    finish_reason="tool_calls",
)


def decode(chunks: list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events = [event for c in chunks for event in decoder.feed(c)]
    return events + decoder.flush()


def sdk_decode(chunks: list[bytes]) -> list[tuple[str | None, str, str | None]]:
    return [(e.event, e.data, e.id) for e in SDKDecoder().iter_bytes(iter(chunks))]


def accumulate(events: list[SSEEvent], **kwargs: Any) -> ChatStreamAccumulator:
    acc = ChatStreamAccumulator(**kwargs)
    for event in events:
        acc.feed(event)
    return acc


def ev(data: str, event: str | None = None, id: str | None = None) -> SSEEvent:
    return SSEEvent(event=event, data=data, id=id)


# --- decoder -------------------------------------------------------------------------

DECODER_CASES = [
    ("lf", [b"data: a\n\ndata: b\n\n"], [ev("a"), ev("b")]),
    ("crlf", [b"data: a\r\n\r\ndata: b\r\n\r\n"], [ev("a"), ev("b")]),
    ("cr only", [b"data: a\r\rdata: b\r\r"], [ev("a"), ev("b")]),
    ("mixed endings", [b"data: a\r\ndata: b\rdata: c\n\r\n"], [ev("a\nb\nc")]),
    ("crlf split over chunks", [b"data: a\r", b"\n\r", b"\n"], [ev("a")]),
    ("cr then cr over chunks", [b"data: a\r", b"\rdata: b\n\n"], [ev("a"), ev("b")]),
    ("cr then lf then lf", [b"data: a\r", b"\n", b"\n"], [ev("a")]),
    ("multi data lines", [b'data: {\ndata: "x": 1\ndata: }\n\n'], [ev('{\n"x": 1\n}')]),
    ("comment", [b": ping\n\n: keep-alive\ndata: a\n\n"], [ev("a")]),
    ("colon without space", [b"data:a\n\n"], [ev("a")]),
    ("only one space stripped", [b"data:  a \n\n"], [ev(" a ")]),
    ("field name alone", [b"data\n\n"], [ev("")]),
    ("empty data value", [b"data:\ndata:\n\n"], [ev("\n")]),
    ("event field", [b"event: delta\ndata: a\n\ndata: b\n\n"], [ev("a", event="delta"), ev("b")]),
    ("event without data is dropped", [b"event: ping\n\ndata: a\n\n"], [ev("a")]),
    ("id persists", [b"id: 7\ndata: a\n\ndata: b\n\n"], [ev("a", id="7"), ev("b", id="7")]),
    ("id with nul ignored", [b"id: 1\x002\ndata: a\n\n"], [ev("a")]),
    ("unknown field and retry ignored", [b"foo: bar\nretry: 10\ndata: a\n\n"], [ev("a")]),
    ("bom skipped", [b"\xef\xbb\xbfdata: a\n\n"], [ev("a")]),
    ("bom split over chunks", [b"\xef", b"\xbb", b"\xbfdata: a\n\n"], [ev("a")]),
    ("bom only at start", [b"data: \xef\xbb\xbfa\n\n"], [ev("\ufeffa")]),
    ("multibyte split", [b"data: caf\xc3", b"\xa9 \xf0\x9f", b"\x99\x82\n\n"], [ev("café 🙂")]),
    ("invalid utf-8 replaced", [b"data: \xff\n\n"], [ev("\ufffd")]),
    ("unfinished event discarded", [b"data: a\n"], []),
    ("unfinished line discarded", [b"data: a"], []),
    ("empty chunks", [b"", b"data: a\n", b"", b"\n"], [ev("a")]),
    ("blank lines alone", [b"\n\n\r\n"], []),
]


@pytest.mark.parametrize(
    ("chunks", "expected"), [c[1:] for c in DECODER_CASES], ids=[c[0] for c in DECODER_CASES]
)
def test_decoder_cases(chunks: list[bytes], expected: list[SSEEvent]) -> None:
    assert decode(chunks) == expected


@pytest.mark.parametrize(
    ("chunks", "expected"), [c[1:] for c in DECODER_CASES], ids=[c[0] for c in DECODER_CASES]
)
def test_decoder_cases_byte_by_byte(chunks: list[bytes], expected: list[SSEEvent]) -> None:
    raw = b"".join(chunks)
    assert decode([raw[i : i + 1] for i in range(len(raw))]) == expected


# Streams on which WHATWG and the SDK agree: no BOM, no bad UTF-8, no event without data.
SDK_AGREES = [
    c
    for c in DECODER_CASES
    if c[0]
    not in {
        "event without data is dropped",
        "bom skipped",
        "bom split over chunks",
        "invalid utf-8 replaced",
    }
]


@pytest.mark.parametrize("chunks", [c[1] for c in SDK_AGREES], ids=[c[0] for c in SDK_AGREES])
def test_decoder_matches_openai_sdk(chunks: list[bytes]) -> None:
    ours = [(e.event, e.data, e.id) for e in decode(chunks)]
    assert ours == sdk_decode(chunks)


def test_realistic_stream_matches_openai_sdk() -> None:
    ours = [(e.event, e.data, e.id) for e in decode([REALISTIC])]
    assert ours == sdk_decode([REALISTIC])
    assert len(ours) == 12
    assert ours[-1] == (None, "[DONE]", None)


def test_where_the_sdk_differs_from_whatwg() -> None:
    # The SDK dispatches an event with no data line when `event`/`id` is set (and then
    # fails on json.loads("")); WHATWG, and memproxy, drop it.
    raw = [b"event: ping\n\nid: 3\ndata: a\n\n\n"]
    assert sdk_decode(raw) == [("ping", "", None), (None, "a", "3"), (None, "", "3")]
    assert decode(raw) == [ev("a", id="3")]


def test_realistic_stream_split_at_every_byte_boundary() -> None:
    whole = decode([REALISTIC])
    for cut in range(len(REALISTIC) + 1):
        assert decode([REALISTIC[:cut], REALISTIC[cut:]]) == whole, cut


def test_realistic_stream_one_byte_at_a_time() -> None:
    raw = [REALISTIC[i : i + 1] for i in range(len(REALISTIC))]
    assert decode(raw) == decode([REALISTIC])
    assert [(e.event, e.data, e.id) for e in decode(raw)] == sdk_decode(raw)


def test_realistic_stream_with_crlf_split_everywhere() -> None:
    crlf = REALISTIC.replace(b"\n", b"\r\n")
    for cut in range(len(crlf) + 1):
        assert decode([crlf[:cut], crlf[cut:]]) == decode([REALISTIC]), cut


def test_flush_resets_for_a_new_stream() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"id: 1\nevent: x\ndata: half") == []
    assert decoder.flush() == []
    assert decoder.feed(b"\xef\xbb\xbfdata: b\n\n") == [ev("b")]


OVERSIZED_CASES = [
    ("one long line over many chunks", [b"data: ", *[b"x" * 4] * 5, b"\n\ndata: ok\n\n"], [ev("ok")], 1),
    (
        "long line ending at a chunk start",
        [b"data: " + b"x" * 20, b"\ndata: y\n\ndata: ok\n\n"],
        [ev("ok")],
        1,
    ),
    ("long line in one chunk", [b"data: " + b"x" * 20 + b"\n\ndata: ok\n\n"], [ev("ok")], 1),
    ("many short data lines", [b"data: aaaa\n" * 5 + b"\ndata: ok\n\n"], [ev("ok")], 1),
    ("within the limit", [b"data: 0123456789\n\n"], [ev("0123456789")], 0),
    ("two oversized events", [b"data: " + b"x" * 11 + b"\n\n", b"data: " + b"y" * 11 + b"\n\n"], [], 2),
]


@pytest.mark.parametrize(
    ("chunks", "expected", "oversized"), [c[1:] for c in OVERSIZED_CASES], ids=[c[0] for c in OVERSIZED_CASES]
)
def test_events_past_the_size_limit_are_dropped(
    chunks: list[bytes], expected: list[SSEEvent], oversized: int
) -> None:
    decoder = SSEDecoder(max_event_chars=10)
    events = [event for c in chunks for event in decoder.feed(c)]
    assert (events, decoder.oversized) == (expected, oversized)


# --- done -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [("[DONE]", True), ("[DONE] ", True), ("[DONE]x", True), (" [DONE]", False), ("{}", False), ("", False)],
)
def test_is_done(data: str, expected: bool) -> None:
    assert is_done(ev(data)) is expected


# --- accumulator ----------------------------------------------------------------------


def test_realistic_stream_accumulates() -> None:
    acc = accumulate(decode([REALISTIC]))
    assert acc.message() == REALISTIC_MESSAGE
    assert acc.message(0) == REALISTIC_MESSAGE
    assert acc.done is True
    assert acc.error is None
    assert acc.malformed == 0
    assert acc.usage == USAGE
    assert acc.too_large is False


def test_realistic_stream_accumulates_the_same_at_every_split() -> None:
    for cut in range(len(REALISTIC) + 1):
        acc = accumulate(decode([REALISTIC[:cut], REALISTIC[cut:]]))
        assert (acc.message(), acc.usage, acc.done) == (REALISTIC_MESSAGE, USAGE, True), cut


def sdk_final_message(raw: bytes) -> Any:
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    for event in SDKDecoder().iter_bytes(iter([raw])):
        if event.data.startswith(DONE):
            break
        state.handle_chunk(openai.types.chat.ChatCompletionChunk.model_validate(event.json()))
    return state.get_final_completion().choices[0]


def test_accumulator_agrees_with_the_sdk_stream_state() -> None:
    choice = sdk_final_message(REALISTIC)
    sdk_calls = tuple(
        ToolCall(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls
    )
    assert AssistantMessage(choice.message.content, "", sdk_calls, choice.finish_reason) == REALISTIC_MESSAGE


def test_n_2_choices_interleaved() -> None:
    raw = sse(
        chunk([delta(0, role="assistant", content=""), delta(1, role="assistant", content="")]),
        chunk([delta(1, content="Bon")]),
        chunk([delta(0, content="Hel")]),
        chunk([delta(0, content="lo")]),
        chunk([delta(1, content="jour")]),
        chunk([delta(0, finish_reason="stop"), delta(1, finish_reason="length")]),
        DONE,
    )
    acc = accumulate(decode([raw]))
    assert acc.message(0) == AssistantMessage("Hello", "", (), "stop")
    assert acc.message(1) == AssistantMessage("Bonjour", "", (), "length")
    assert acc.message(2) == AssistantMessage()


ACCUMULATOR_CASES = [
    (
        "content null and missing",
        sse(
            chunk([delta(role="assistant", content=None)]),
            chunk([delta(content="a")]),
            chunk([delta()]),
            DONE,
        ),
        AssistantMessage("a"),
    ),
    (
        "refusal",
        sse(chunk([delta(refusal="I can")]), chunk([delta(refusal="not.", finish_reason="stop")])),
        AssistantMessage("", "I cannot.", (), "stop"),
    ),
    (
        "id and name repeated on every delta",
        sse(
            chunk([delta(tool_calls=[call(0, '{"a"', id="c1", name="f")])]),
            chunk([delta(tool_calls=[call(0, ":1}", id="c1", name="f")])]),
        ),
        AssistantMessage("", "", (ToolCall("c1", "f", '{"a":1}'),)),
    ),
    (
        "several fragments of one call in one chunk",
        sse(chunk([delta(tool_calls=[call(0, "{", id="c1", name="f"), call(0, "}")])])),
        AssistantMessage("", "", (ToolCall("c1", "f", "{}"),)),
    ),
    (
        "tool calls ordered by index, not arrival",
        sse(
            chunk([delta(tool_calls=[call(1, "B", id="c2", name="g")])]),
            chunk([delta(tool_calls=[call(0, "A", id="c1", name="f")])]),
        ),
        AssistantMessage("", "", (ToolCall("c1", "f", "A"), ToolCall("c2", "g", "B"))),
    ),
    (
        "odd shapes skipped",
        sse(
            {"choices": "x"},
            {"choices": [1, None, {"index": 0, "delta": "x"}, {"index": 0, "delta": {"content": 5}}]},
            {"choices": [{"index": 0, "delta": {"tool_calls": [7, {"index": 0, "function": "x"}]}}]},
            chunk([delta(content="ok")]),
        ),
        AssistantMessage("ok", "", (ToolCall("", "", ""),)),
    ),
    (
        "events after [DONE] ignored",
        sse(chunk([delta(content="a")]), DONE, chunk([delta(content="b")])),
        AssistantMessage("a"),
    ),
]


@pytest.mark.parametrize(
    ("raw", "expected"), [c[1:] for c in ACCUMULATOR_CASES], ids=[c[0] for c in ACCUMULATOR_CASES]
)
def test_accumulator_cases(raw: bytes, expected: AssistantMessage) -> None:
    assert accumulate(decode([raw])).message() == expected


def test_malformed_payloads_are_counted_and_skipped() -> None:
    raw = sse(
        chunk([delta(content="one ")]),
        "{not json",
        "[1, 2]",
        '"text"',
        "null",
        "[" * 100000,
        chunk([delta(content="two", finish_reason="stop")]),
        DONE,
    )
    acc = accumulate(decode([raw]))
    assert acc.malformed == 5
    assert acc.message() == AssistantMessage("one two", "", (), "stop")
    assert acc.done is True


def test_error_event() -> None:
    raw = sse(chunk([delta(content="par")])) + error_event(
        "upstream stream ended before completion", "stream_truncated"
    )
    acc = accumulate(decode([raw]))
    assert acc.error == {
        "message": "upstream stream ended before completion",
        "type": "upstream_error",
        "param": None,
        "code": "stream_truncated",
    }
    assert acc.done is False
    assert acc.message() == AssistantMessage("par")


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ('{"error": "boom"}', {"message": "boom"}),
        ('{"error": null, "choices": []}', None),
        ('{"error": {}}', None),
    ],
)
def test_error_key_forms(payload: str, expected: dict[str, Any] | None) -> None:
    acc = accumulate([ev(payload)])
    assert (acc.error, acc.malformed) == (expected, 0)


def test_text_past_the_cap_stops_accumulating() -> None:
    raw = sse(chunk([delta(content="abc")]), chunk([delta(content="def")]), chunk([delta(content="g")]))
    acc = accumulate(decode([raw]), max_chars=5)
    assert acc.message() == AssistantMessage("abc")
    assert acc.too_large is True


def test_usage_keeps_the_last_object() -> None:
    acc = accumulate(
        [ev(json.dumps(chunk([delta(content="a")], usage=None))), ev(json.dumps(chunk([], usage=USAGE)))]
    )
    assert acc.usage == USAGE
    assert acc.message() == AssistantMessage("a")


# --- non-streamed completions ---------------------------------------------------------


def completion(*choices: dict[str, Any]) -> bytes:
    body = {"id": "chatcmpl-2", "object": "chat.completion", "choices": list(choices), "usage": USAGE}
    return json.dumps(body, ensure_ascii=False).encode()


def choice(index: int = 0, finish_reason: str | None = "stop", **message: Any) -> dict[str, Any]:
    return {"index": index, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}


TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x":"é"}'}}

COMPLETION_CASES = [
    ("text", completion(choice(content="Hi 🙂", refusal=None)), AssistantMessage("Hi 🙂", "", (), "stop")),
    (
        "tool calls, content null",
        completion(choice(content=None, tool_calls=[TOOL_CALL], finish_reason="tool_calls")),
        AssistantMessage("", "", (ToolCall("call_1", "f", '{"x":"é"}'),), "tool_calls"),
    ),
    ("refusal", completion(choice(content=None, refusal="No.")), AssistantMessage("", "No.", (), "stop")),
    (
        "n=2 picks index 0",
        completion(choice(1, content="B"), choice(0, content="A")),
        AssistantMessage("A", "", (), "stop"),
    ),
    (
        "malformed tool call parts",
        completion(choice(content="a", tool_calls=[1, {"id": 2}])),
        AssistantMessage("a", "", (ToolCall("", "", ""),), "stop"),
    ),
    ("no choices", completion(), None),
    ("message not an object", completion({"index": 0, "message": "x"}), None),
    ("error body", b'{"error": {"message": "bad", "code": null}}', None),
    ("invalid JSON", b'{"choices": [', None),
    ("invalid UTF-8", b'{"choices": "\xff"}', None),
    ("not an object", b"[]", None),
    ("empty", b"", None),
    ("deep", b"[" * 100000, None),
]


@pytest.mark.parametrize(
    ("body", "expected"), [c[1:] for c in COMPLETION_CASES], ids=[c[0] for c in COMPLETION_CASES]
)
def test_parse_completion(body: bytes, expected: AssistantMessage | None) -> None:
    assert parse_completion(body) == expected


# --- error events ---------------------------------------------------------------------


def test_error_event_bytes() -> None:
    assert error_event("upstream stream ended before completion", "stream_truncated") == (
        b'data: {"error":{"message":"upstream stream ended before completion",'
        b'"type":"upstream_error","param":null,"code":"stream_truncated"}}\n\n'
    )
    assert (
        error_event("x", "c", type_="t")
        == b'data: {"error":{"message":"x","type":"t","param":null,"code":"c"}}\n\n'
    )


def test_the_sdk_raises_on_the_error_event() -> None:
    body = sse(chunk([delta(content="par")])) + error_event(
        "upstream stream ended before completion", "stream_truncated"
    )
    transport = httpx2.MockTransport(
        lambda request: httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)
    )
    client = openai.OpenAI(
        api_key="k", base_url="http://upstream.test/v1", http_client=httpx2.Client(transport=transport)
    )
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    with pytest.raises(openai.APIError, match="upstream stream ended before completion"):
        for _ in stream:
            pass
    client.close()


@pytest.mark.parametrize("data,done,error", [
    ("[DONE]", True, None),
    ('{"choices": [{"delta": {"content": "say \\"error\\" please"}}]}', False, None),
    ('{"error": {"message": "overloaded", "type": "server_error"}}', False,
     {"message": "overloaded", "type": "server_error"}),
    ('{"error": "plain text"}', False, {"message": "plain text"}),
    ('{"error": {}}', False, None),
    ('not json but "error"', False, None),
])
def test_stream_end_watches_only_the_end(data, done, error):
    end = StreamEnd()
    end.feed(SSEEvent(None, data))
    assert (end.done, end.error) == (done, error)
