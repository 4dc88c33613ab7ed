"""A scripted OpenAI-compatible upstream on a real socket, for tests.

Raw asyncio HTTP/1.1 rather than a framework, so a script controls every byte: chunked
SSE events written one by one, a stream cut with FIN, a connection reset (RST), headers
that never come. It records every request it receives and when connections open and close.
"""

from __future__ import annotations

import asyncio
import ctypes
import gzip
import hashlib
import json
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from proxy.terms import STOP_WORDS, terms


@dataclass
class Received:
    """One request as the upstream saw it."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    at: float = field(default_factory=time.monotonic)  # when it had come whole

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name.lower()]
        return values[0] if values else None

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Connection:
    opened: float
    closed: float | None = None
    busy: bool = False  # in the middle of writing a response


class Reply:
    """Writes a response for a request; subclasses are the scripts."""

    async def write(self, request: Received, writer: asyncio.StreamWriter) -> bool:
        """Write the response; return False when the connection must not be reused."""
        raise NotImplementedError


async def _idle(writer: asyncio.StreamWriter, seconds: float) -> None:
    """Sleep, but stop as soon as the peer closes the connection (as a real server notices)."""
    reader: asyncio.StreamReader = writer._peer_reader  # type: ignore[attr-defined]
    try:
        await asyncio.wait_for(reader.read(1), seconds)
    except TimeoutError:
        return
    raise ConnectionResetError("peer closed while the server was idle")


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests",
            500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass
class JsonReply(Reply):
    body: Any = None
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: str = "application/json"
    compress: bool = False

    async def write(self, request: Received, writer: asyncio.StreamWriter) -> bool:
        payload = self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()
        headers = [("content-type", self.content_type)] + self.headers
        if self.compress:
            payload = gzip.compress(payload)
            headers.append(("content-encoding", "gzip"))
        writer.write(_head(self.status, headers + [("content-length", str(len(payload)))]) + payload)
        await writer.drain()
        return True


@dataclass
class SSEReply(Reply):
    """Events written as separate chunks, optionally slow, cut, reset or stalled."""

    events: list[bytes]
    delay: float = 0.0
    cut_after: int | None = None  # close (FIN) after this many events, mid-body
    reset_after: int | None = None  # abort (RST) after this many events
    stall_after: int | None = None  # stop writing (keep the socket open) after this many
    headers: list[tuple[str, str]] = field(default_factory=list)
    written: list[float] = field(default_factory=list)  # when each event was written (time.monotonic())

    async def write(self, request: Received, writer: asyncio.StreamWriter) -> bool:
        head = [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")] + self.headers
        writer.write(_head(200, head))
        await writer.drain()
        for i, event in enumerate(self.events):
            if i == self.cut_after:
                writer.close()
                return False
            if i == self.reset_after:
                _reset(writer)
                return False
            if i == self.stall_after:
                await _idle(writer, 3600)
            if self.delay:
                await asyncio.sleep(self.delay)
            self.written.append(time.monotonic())
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


@dataclass
class SlowHeaders(Reply):
    """Headers only after `seconds` (past the proxy's first-byte timeout)."""

    seconds: float
    then: Reply = field(default_factory=lambda: JsonReply({"ok": True}))

    async def write(self, request: Received, writer: asyncio.StreamWriter) -> bool:
        await _idle(writer, self.seconds)
        return await self.then.write(request, writer)


@dataclass
class RawReply(Reply):
    """Exactly these bytes, then close."""

    data: bytes

    async def write(self, request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(self.data)
        await writer.drain()
        return False


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# --- OpenAI-shaped payloads -------------------------------------------------------------

def completion(text: str | None = "Hello from upstream", tool_calls: list[dict[str, Any]] | None = None,
               model: str = "gpt-test") -> dict[str, Any]:
    """A chat.completion body."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in tool_calls
        ]
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if tool_calls else "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}}


def chunk(delta: dict[str, Any], finish: str | None = None, model: str = "gpt-test") -> bytes:
    """One chat.completion.chunk SSE event."""
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def stream_events(text: str = "Hello from upstream", pieces: int = 3,
                  tool_calls: list[dict[str, Any]] | None = None, done: bool = True) -> list[bytes]:
    """The events of a streamed answer: role, text pieces, tool-call deltas, finish, [DONE]."""
    events = [chunk({"role": "assistant", "content": ""})]
    size = max(1, -(-len(text) // pieces)) if text else 1
    events += [chunk({"content": text[i:i + size]}) for i in range(0, len(text), size)]
    for index, call in enumerate(tool_calls or []):
        head = {"index": index, "id": call["id"], "type": "function",
                "function": {"name": call["name"], "arguments": ""}}
        events.append(chunk({"tool_calls": [head]}))
        half = len(call["arguments"]) // 2
        for part in (call["arguments"][:half], call["arguments"][half:]):
            events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]}))
    events.append(chunk({}, finish="tool_calls" if tool_calls else "stop"))
    return events + ([DONE] if done else [])


def missing_tool_results(messages: list[dict[str, Any]]) -> list[str]:
    """Ids of assistant tool calls with no `tool` message after them, and of results with no call:
    a history the real provider refuses."""
    called: list[str] = []
    answered: set[str] = set()
    for message in messages:
        if message.get("role") == "assistant":
            called += [c.get("id") for c in message.get("tool_calls") or []]
        elif message.get("role") == "tool":
            if message.get("tool_call_id") not in called:
                return [str(message.get("tool_call_id"))]
            answered.add(message["tool_call_id"])
    return [call_id for call_id in called if call_id not in answered]


def model_round(text: str | None = "Hello from upstream", tool_calls: list[dict[str, Any]] | None = None,
                usage: dict[str, int] | None = None, answer_id: str = "chatcmpl-1") -> Callable[[Received], Reply]:
    """A scripted model answer for one chat round, JSON or streamed as the request asks; like the
    real provider, a 400 for a history whose tool calls lack their results."""
    def reply(request: Received) -> Reply:
        body = request.json()
        missing = missing_tool_results(body.get("messages", []))
        if missing:
            return JsonReply({"error": {"message": "An assistant message with 'tool_calls' must be followed by "
                                        "tool messages responding to each 'tool_call_id'. Missing: "
                                        + ", ".join(missing), "type": "invalid_request_error",
                                        "param": "messages", "code": None}}, status=400)
        if body.get("stream"):
            events = stream_events(text or "", tool_calls=tool_calls, done=False)
            if usage is not None:
                events.append(b"data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                                                      "created": 1, "model": "gpt-test", "choices": [],
                                                      "usage": usage}).encode() + b"\n\n")
            return SSEReply([e.replace(b'"chatcmpl-1"', json.dumps(answer_id).encode()) for e in events] + [DONE])
        doc = completion(text, tool_calls)
        doc["id"] = answer_id
        if usage is not None:
            doc["usage"] = usage
        return JsonReply(doc)
    return reply


# --- a deterministic embedding model ---------------------------------------------------

EMBEDDING_DIM = 1024
# Stems that mean the same thing share a dimension, so a paraphrase with no word in common
# is still near; every other stem gets a dimension (and sign) of its own by hash.
SYNONYMS = {
    "boat": "BOAT", "sail": "BOAT", "catamaran": "BOAT", "yacht": "BOAT", "vessel": "BOAT", "sailboat": "BOAT",
    "ador": "LIKE", "enjoy": "LIKE", "love": "LIKE", "like": "LIKE", "fond": "LIKE",
    "sister": "SIBLING", "brother": "SIBLING", "sibl": "SIBLING",
    "physician": "DOCTOR", "doctor": "DOCTOR", "medic": "DOCTOR",
}
_WORD = re.compile(r"[a-z0-9]+")


def fake_embedding(text: str) -> list[float]:
    """A hashed bag of stemmed words, synonyms folded together (the same text, the same vector)."""
    vector = [0.0] * EMBEDDING_DIM
    for word in _WORD.findall(text.lower()):
        if word in STOP_WORDS:
            continue
        for stem in terms(word):
            concept = SYNONYMS.get(stem, stem)
            digest = hashlib.sha256(concept.encode()).digest()
            vector[int.from_bytes(digest[:4], "big") % EMBEDDING_DIM] += 1.0 if digest[4] & 1 else -1.0
    return vector


@dataclass
class EmbeddingsReply(Reply):
    """An /embeddings answer computed by fake_embedding for each input."""

    async def write(self, request: Received, writer: asyncio.StreamWriter) -> bool:
        try:
            body = json.loads(request.body)
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            data = [{"object": "embedding", "index": i, "embedding": fake_embedding(str(text))}
                    for i, text in enumerate(inputs)]
        except (ValueError, KeyError, TypeError):
            return await JsonReply({"error": {"message": "bad embeddings request", "type": "invalid_request_error",
                                              "param": None, "code": None}}, status=400).write(request, writer)
        answer = {"object": "list", "data": data, "model": body.get("model"),
                  "usage": {"prompt_tokens": 1, "total_tokens": 1}}
        return await JsonReply(answer).write(request, writer)


def default_reply(request: Received) -> Reply:
    """What the upstream answers when no script is queued."""
    if "/models/" in request.target and ":" in request.target.split("/models/", 1)[1]:
        from tests.fake_gemini import default_reply as gemini_reply  # it builds on this module

        return gemini_reply(request)
    if "/messages" in request.target and request.method == "POST":
        from tests.fake_anthropic import default_reply as anthropic_reply  # it builds on this module

        return anthropic_reply(request)
    if request.target.endswith("/responses") and request.method == "POST":
        from tests.fake_responses import default_reply as responses_reply  # it builds on this module

        return responses_reply(request)
    if request.target.endswith("/embeddings") and request.method == "POST":
        return EmbeddingsReply()
    if request.target.endswith("/chat/completions") and request.method == "POST":
        try:
            stream = bool(json.loads(request.body).get("stream"))
        except (ValueError, AttributeError, RecursionError):
            return JsonReply({"error": {"message": "bad json", "type": "invalid_request_error",
                                        "param": None, "code": None}}, status=400)
        return SSEReply(stream_events()) if stream else JsonReply(completion())
    return JsonReply({"object": "echo", "method": request.method, "target": request.target})


class FakeUpstream:
    """The server, run on its own event loop in a thread."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.connections: list[Connection] = []
        self._scripts: list[Reply | Callable[[Received], Reply]] = []
        # Answers every /embeddings request while set (the queue is left to the chat requests,
        # since background embedding calls come at any time).
        self.embeddings: Reply | None = None
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def queue(self, *replies: Reply | Callable[[Received], Reply]) -> None:
        """Answer the next requests with these, in order (then the default again)."""
        with self._lock:
            self._scripts.extend(replies)

    def clear_queue(self) -> None:
        """Drop the replies still queued (a client made fewer requests than were scripted)."""
        with self._lock:
            self._scripts.clear()

    def reset(self) -> None:
        with self._lock:
            self._scripts.clear()
            self.received.clear()
            self.connections.clear()
            self.embeddings = None

    def chat_requests(self) -> list[Received]:
        return [r for r in self.received if r.target.endswith("/chat/completions")]

    def messages_requests(self) -> list[Received]:
        """Requests to the Anthropic Messages path (count_tokens left out)."""
        return [r for r in self.received if r.target.split("?")[0].endswith("/messages")]

    def responses_requests(self) -> list[Received]:
        """Requests to POST /responses (compact and the GET paths left out)."""
        return [r for r in self.received if r.target.split("?")[0].endswith("/responses") and r.method == "POST"]

    def embedding_requests(self) -> list[Received]:
        return [r for r in self.received if r.target.endswith("/embeddings")]

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """True once every connection seen so far has closed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(c.closed is not None for c in self.connections):
                return True
            time.sleep(0.01)
        return False

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """True once no connection is in the middle of a response (closed or back in a pool)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(c.busy and c.closed is None for c in self.connections):
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    async def _shutdown(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def _next_reply(self, request: Received) -> Reply:
        with self._lock:
            if self.embeddings is not None and request.target.endswith("/embeddings"):
                return self.embeddings
            script = self._scripts.pop(0) if self._scripts else None
        if script is None:
            return default_reply(request)
        return script if isinstance(script, Reply) else script(request)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer._peer_reader = reader  # type: ignore[attr-defined]
        connection = Connection(opened=time.monotonic())
        self.connections.append(connection)
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                self.received.append(request)
                connection.busy = True
                if not await self._next_reply(request).write(request, writer):
                    break
                connection.busy = False
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            connection.closed = time.monotonic()
            if not writer.is_closing():
                writer.close()


class RefusingPort:
    """A local port where nothing listens, counting the connection attempts made to it.

    A refused connect never reaches user space, so the attempts are seen on the wire: a raw
    socket (CAP_NET_RAW) gets a copy of every TCP segment on loopback, and each SYN to the
    port is one attempt, each RST back one refusal.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.syns = 0
        self.resets = 0
        self.accepted = 0  # SYN-ACKs: a connection something accepted (never, on a refusing port)

    @contextmanager
    def watching(self) -> Iterator[RefusingPort]:
        """Count segments while the block runs (and a moment after, for the last ones)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
        program = _port_filter(self.port)  # kept alive while the socket uses it
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER,
                        struct.pack("HL", len(program) // 8, ctypes.addressof(program)))
        sock.setblocking(False)
        try:  # what came before the filter was attached
            while sock.recv(65535):
                pass
        except BlockingIOError:
            pass
        sock.settimeout(0.05)
        stop = threading.Event()
        thread = threading.Thread(target=self._sniff, args=(sock, stop), daemon=True)
        thread.start()
        try:
            yield self
        finally:
            time.sleep(0.2)
            stop.set()
            thread.join(5)
            sock.close()

    def _sniff(self, sock: socket.socket, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                packet = sock.recv(65535)
            except TimeoutError:
                continue
            offset = (packet[0] & 0x0F) * 4  # past the IPv4 header
            source, target = struct.unpack("!HH", packet[offset:offset + 4])
            flags = packet[offset + 13]
            syn, rst, ack = flags & 0x02, flags & 0x04, flags & 0x10
            if target == self.port and syn and not ack:
                self.syns += 1
            elif source == self.port and syn and ack:
                self.accepted += 1
            elif source == self.port and rst:
                self.resets += 1


_SO_ATTACH_FILTER = 26


def _port_filter(port: int) -> ctypes.Array[ctypes.c_char]:
    """A classic BPF program keeping the TCP segments from or to `port` (the kernel drops the
    rest, so a busy loopback cannot fill the raw socket's buffer)."""
    code = [
        (0xB1, 0, 0, 0),  # ldxb 4*([0]&0xf): X = the IPv4 header's length
        (0x48, 0, 0, 0),  # ldh [x+0]: the source port
        (0x15, 3, 0, port),  # jeq port: keep
        (0x48, 0, 0, 2),  # ldh [x+2]: the destination port
        (0x15, 1, 0, port),  # jeq port: keep
        (0x06, 0, 0, 0),  # ret 0: drop
        (0x06, 0, 0, 0xFFFF),  # ret 65535: keep
    ]
    return ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in code))


def raw_sockets_allowed() -> bool:
    """Whether this process may open a raw socket (RefusingPort needs one)."""
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP).close()
    except PermissionError:
        return False
    return True


async def _read_request(reader: asyncio.StreamReader) -> Received | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:] if line]
    lookup = {k.lower(): v for k, v in headers}
    if "content-length" in lookup:
        body = await reader.readexactly(int(lookup["content-length"]))
    elif lookup.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader)
    else:
        body = b""
    return Received(method, target, headers, body)  # type: ignore[arg-type]


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
