"""A fast mock OpenAI, Anthropic and Gemini upstream for the benchmark: raw asyncio and httptools, no framework.

POST /v1/chat/completions answers a fixed completion, or, with `"stream": true`, an SSE
stream of `--events` chunk events plus `data: [DONE]`, each event its own chunked write,
`--delay-ms` apart. POST /v1/messages answers the same in Anthropic's Messages shape: a
`message`, or a stream of message_start, content_block_start, `--events` text_delta
events, content_block_stop, message_delta and message_stop, each its own write. POST
/v1/responses answers in the Responses shape: a `response`, or the stream Codex CLI gets
(response.created, response.in_progress, output_item.added, content_part.added, `--events`
output_text.delta events, output_text.done, content_part.done, output_item.done,
response.completed), each its own write. POST /v1beta/models/{model}:generateContent answers
in Gemini's shape, and :streamGenerateContent with `--events` text responses and a last one
carrying the finish reason (SSE, each its own write). The headers X-Mock-Events and X-Mock-Delay-Ms
override the stream's length and pace per request; `--answer-ms` holds every chat answer
back that long first, as a model's time to its first byte would. GET /_stats reports
connection and stream counters, for leak checks. Any other path answers a small JSON
object. It does so little per request that it is never the
bottleneck of a run (bench/README.md).

    python bench/harness/mock_upstream.py --port 9000 [--events 50] [--delay-ms 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import httptools

COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": "bench-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the mock upstream."},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15},
}, separators=(",", ":")).encode()
MESSAGE = json.dumps({
    "id": "msg_bench", "type": "message", "role": "assistant", "model": "bench-model",
    "content": [{"type": "text", "text": "Hello from the mock upstream."}],
    "stop_reason": "end_turn", "stop_sequence": None,
    "usage": {"input_tokens": 9, "output_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
}, separators=(",", ":")).encode()
# Events a Messages stream has besides its text deltas: message_start, content_block_start,
# content_block_stop, message_delta, message_stop.
MESSAGES_FRAMING_EVENTS = 5
_ANSWER_ITEM = {"type": "message", "id": "msg_bench", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": "Hello from the mock upstream.", "annotations": []}]}
_USAGE = {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 6,
          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}
RESPONSE = json.dumps({
    "id": "resp_bench", "object": "response", "created_at": 1700000000, "status": "completed",
    "model": "bench-model", "output": [_ANSWER_ITEM], "usage": _USAGE,
}, separators=(",", ":")).encode()
# Events a Responses stream has besides its text deltas: response.created, response.in_progress,
# output_item.added, content_part.added, output_text.done, content_part.done, output_item.done,
# response.completed.
RESPONSES_FRAMING_EVENTS = 8
# A Gemini stream's response carrying the finish reason and usage, after its text.
GEMINI_FRAMING_EVENTS = 1
GEMINI = json.dumps({
    "candidates": [{"content": {"role": "model", "parts": [{"text": "pong"}]}, "finishReason": "STOP", "index": 0}],
    "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 1, "totalTokenCount": 10},
    "modelVersion": "bench-model", "responseId": "resp-bench"}, separators=(",", ":")).encode()
WIRES = ("chat", "messages", "responses", "gemini")
SMALL = b'{"object":"list","data":[{"id":"bench-model","object":"model","owned_by":"bench"}]}'
_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}


@dataclass
class Counters:
    """What /_stats reports."""

    connections_open: int = 0
    connections_total: int = 0
    requests: int = 0
    streams_active: int = 0
    streams_done: int = 0
    streams_cut: int = 0  # the reader went away before [DONE]


@dataclass(frozen=True)
class StreamPlan:
    """How one streamed answer is paced."""

    events: int
    delay_s: float


def sse_frames(events: int) -> list[bytes]:
    """`events` chat.completion.chunk events then [DONE], each framed as one HTTP chunk."""
    frames = []
    for i in range(events):
        delta: dict[str, Any] = {"content": f"tok{i} "}
        if i == 0:
            delta["role"] = "assistant"
        chunk = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000,
                 "model": "bench-model",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": "stop" if i == events - 1 else None}]}
        frames.append(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
    frames.append(b"data: [DONE]\n\n")
    return [b"%x\r\n%s\r\n" % (len(f), f) for f in frames]


def messages_sse_frames(events: int) -> list[bytes]:
    """A streamed Messages answer with `events` text_delta events, each framed as one HTTP chunk."""
    def event(kind: str, payload: dict[str, Any]) -> bytes:
        data = json.dumps({"type": kind, **payload}, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()

    start = {**json.loads(MESSAGE), "content": [], "stop_reason": None,
             "usage": {"input_tokens": 9, "output_tokens": 1}}
    frames = [event("message_start", {"message": start}),
              event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})]
    frames += [event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": f"tok{i} "}})
               for i in range(events)]
    frames += [event("content_block_stop", {"index": 0}),
               event("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                       "usage": {"output_tokens": events}}),
               event("message_stop", {})]
    return [b"%x\r\n%s\r\n" % (len(f), f) for f in frames]


def responses_sse_frames(events: int) -> list[bytes]:
    """A streamed Responses answer with `events` output_text.delta events, each framed as one HTTP chunk."""
    frames: list[bytes] = []

    def event(kind: str, **payload: Any) -> None:
        data = json.dumps({"type": kind, "sequence_number": len(frames), **payload}, separators=(",", ":"))
        frames.append(f"event: {kind}\ndata: {data}\n\n".encode())

    text = "".join(f"tok{i} " for i in range(events))
    item = {**_ANSWER_ITEM, "content": [{**_ANSWER_ITEM["content"][0], "text": text}]}
    opening = {**json.loads(RESPONSE), "status": "in_progress", "output": [], "usage": None}
    where = {"output_index": 0, "item_id": "msg_bench", "content_index": 0}
    event("response.created", response=opening)
    event("response.in_progress", response=opening)
    event("response.output_item.added", output_index=0, item={**item, "status": "in_progress", "content": []})
    event("response.content_part.added", **where, part={"type": "output_text", "text": "", "annotations": []})
    for i in range(events):
        event("response.output_text.delta", **where, delta=f"tok{i} ")
    event("response.output_text.done", **where, text=text)
    event("response.content_part.done", **where, part=item["content"][0])
    event("response.output_item.done", output_index=0, item=item)
    event("response.completed", response={**json.loads(RESPONSE), "output": [item]})
    return [b"%x\r\n%s\r\n" % (len(f), f) for f in frames]


def gemini_sse_frames(events: int) -> list[bytes]:
    """A streamed Gemini answer: `events` text responses, then the finish reason, each one HTTP chunk."""
    def frame(parts: list[dict[str, Any]], finish: bool) -> bytes:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        body: dict[str, Any] = {"candidates": [candidate], "modelVersion": "bench-model"}
        if finish:
            candidate["finishReason"] = "STOP"
            body["usageMetadata"] = json.loads(GEMINI)["usageMetadata"]
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\r\n\r\n"

    frames = [frame([{"text": f"tok{i} "}], False) for i in range(events)] + [frame([], True)]
    return [b"%x\r\n%s\r\n" % (len(f), f) for f in frames]


_STREAMS = {"chat": sse_frames, "messages": messages_sse_frames, "responses": responses_sse_frames,
            "gemini": gemini_sse_frames}
_DOCUMENTS = {"chat": COMPLETION, "messages": MESSAGE, "responses": RESPONSE, "gemini": GEMINI}
_PATHS = {b"/chat/completions": "chat", b"/messages": "messages", b"/responses": "responses",
          b":generateContent": "gemini", b":streamGenerateContent": "gemini"}


def head(status: int, content_type: bytes, length: int | None) -> bytes:
    """A response head; without a length the body is chunked."""
    framing = b"content-length: %d" % length if length is not None else b"transfer-encoding: chunked"
    extra = b"cache-control: no-cache\r\n" if content_type == b"text/event-stream" else b""
    return b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\n%s%s\r\n\r\n" % (
        status, _REASONS.get(status, b"Status"), content_type, extra, framing)


class MockServer:
    """Shared state of all connections: the defaults, the frame cache and the counters."""

    def __init__(self, events: int, delay_ms: float, answer_ms: float = 0.0) -> None:
        self.default = StreamPlan(events, delay_ms / 1000)
        self.answer_s = answer_ms / 1000
        self.counters = Counters()
        self._frames: dict[tuple[str, int], list[bytes]] = {}

    def frames(self, events: int, wire: str = "chat") -> list[bytes]:
        """Cached SSE frames for a stream of `events` chunks on one of the WIRES."""
        key = (wire, events)
        if key not in self._frames:
            self._frames[key] = _STREAMS[wire](events)
        return self._frames[key]

    def plan(self, headers: dict[bytes, bytes]) -> StreamPlan:
        """The stream's pacing: the defaults unless the request's X-Mock-* headers say otherwise."""
        events = int(headers.get(b"x-mock-events", self.default.events))
        delay = headers.get(b"x-mock-delay-ms")
        return StreamPlan(max(1, events), float(delay) / 1000 if delay is not None else self.default.delay_s)


class MockConnection(asyncio.Protocol):
    """One client connection, HTTP/1.1 keep-alive, requests answered in order."""

    def __init__(self, server: MockServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.counters.connections_open += 1
        self.server.counters.connections_total += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.counters.connections_open -= 1

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.write(head(400, b"application/json", 2) + b"{}")
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.server.counters.requests += 1
        method, path = self.parser.get_method(), self.url.split(b"?", 1)[0]
        keep_alive = self.parser.should_keep_alive()
        body, headers = b"".join(self.body), self.headers
        self._reset()
        wire = next((name for suffix, name in _PATHS.items() if path.endswith(suffix)), None)
        if method == b"POST" and wire is not None:
            if _wants_stream(body) or path.endswith(b":streamGenerateContent"):
                self.transport.pause_reading()  # type: ignore[union-attr]
                plan = self.server.plan(headers)
                frames = self.server.frames(plan.events, wire)
                asyncio.get_running_loop().create_task(self._stream(plan, frames, keep_alive))
                return
            document = _DOCUMENTS[wire]
            answer = head(200, b"application/json", len(document)) + document
            if self.server.answer_s:
                asyncio.get_running_loop().call_later(self.server.answer_s, self._answer, answer, keep_alive)
            else:
                self._answer(answer, keep_alive)
        elif path == b"/_stats":
            stats = json.dumps(asdict(self.server.counters)).encode()
            self._answer(head(200, b"application/json", len(stats)) + stats, keep_alive)
        else:
            self._answer(head(200, b"application/json", len(SMALL)) + SMALL, keep_alive)

    def _answer(self, data: bytes, keep_alive: bool) -> None:
        assert self.transport is not None
        if self.closed:
            return
        self.transport.write(data)
        if not keep_alive:
            self.transport.close()

    async def _stream(self, plan: StreamPlan, frames: list[bytes], keep_alive: bool) -> None:
        """Write each event as its own chunk, paced on an absolute timeline (no drift)."""
        assert self.transport is not None
        counters = self.server.counters
        counters.streams_active += 1
        try:
            if self.server.answer_s:
                await asyncio.sleep(self.server.answer_s)
            self.transport.write(head(200, b"text/event-stream", None))
            started = time.perf_counter()
            for i, frame in enumerate(frames):
                if i and plan.delay_s:
                    await asyncio.sleep(max(0.0, started + i * plan.delay_s - time.perf_counter()))
                if self.closed:
                    counters.streams_cut += 1
                    return
                self.transport.write(frame)
            self.transport.write(b"0\r\n\r\n")
            counters.streams_done += 1
        finally:
            counters.streams_active -= 1
        if keep_alive:
            self.transport.resume_reading()
        else:
            self.transport.close()


def _wants_stream(body: bytes) -> bool:
    if b'"stream"' not in body:
        return False
    try:
        return json.loads(body).get("stream") is True
    except (ValueError, AttributeError):
        return False


async def serve(host: str, port: int, events: int, delay_ms: float, answer_ms: float = 0.0) -> None:
    """Serve until cancelled."""
    state = MockServer(events, delay_ms, answer_ms)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: MockConnection(state), host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def run(main: Any) -> None:
    """Run a coroutine on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--events", type=int, default=50, help="chunk events per stream, before [DONE]")
    parser.add_argument("--delay-ms", type=float, default=2.0, help="time between two events")
    parser.add_argument("--answer-ms", type=float, default=0.0, help="time before a chat completion's first byte")
    args = parser.parse_args()
    try:
        run(serve(args.host, args.port, args.events, args.delay_ms, args.answer_ms))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
