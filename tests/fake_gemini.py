"""Gemini API payloads for the scripted upstream (tests/fake_upstream.py).

`GenerateContentResponse` bodies as Google writes them: `candidates[0].content.parts`
(text, thought and `functionCall` parts), `finishReason` on the last response, and
`usageMetadata`. A stream is either server-sent events (`alt=sse`: `data: {...}` lines
ended by CRLF CRLF) or, without `alt=sse`, one JSON array written a response at a time.
Errors in Google's shape: `{"error": {"code", "message", "status"}}`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from tests.fake_upstream import JsonReply, Received, Reply, SSEReply, _head

USAGE = {"promptTokenCount": 12, "candidatesTokenCount": 7, "totalTokenCount": 19}


def part_text(text: str, thought: bool = False) -> dict[str, Any]:
    return {"text": text, **({"thought": True} if thought else {})}


def function_call(name: str, args: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"name": name, "args": args}
    if call_id is not None:
        call["id"] = call_id
    return {"functionCall": call}


def response(parts: list[dict[str, Any]], finish: str | None = "STOP", usage: bool = True) -> dict[str, Any]:
    """One GenerateContentResponse: the parts of candidate 0, its finish reason (None: more follow)."""
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    body: dict[str, Any] = {"candidates": [candidate], "modelVersion": "gemini-test", "responseId": "resp-1"}
    if usage:
        body["usageMetadata"] = USAGE
    return body


def answer(text: str | None = "Hello from Gemini", calls: list[dict[str, Any]] | None = None,
           thought: str | None = None) -> dict[str, Any]:
    """A whole answer: an optional thought, the text, then function calls."""
    parts = ([part_text(thought, thought=True)] if thought else []) + ([part_text(text)] if text else [])
    return response(parts + list(calls or []))


def pieces(text: str = "Hello from Gemini", calls: list[dict[str, Any]] | None = None,
           thought: str | None = None, parts: int = 3, end: bool = True) -> list[dict[str, Any]]:
    """The responses of a streamed answer: the thought, the text in `parts` pieces, then the calls
    with the finish reason (`end=False`: the last response never comes)."""
    out = [response([part_text(thought, thought=True)], None, usage=False)] if thought else []
    size = max(1, -(-len(text) // parts)) if text else 1
    out += [response([part_text(text[i:i + size])], None, usage=False) for i in range(0, len(text), size)]
    if end:
        out.append(response(list(calls or []), "STOP"))
    return out


def sse(chunks: list[dict[str, Any]]) -> list[bytes]:
    """The events of an `alt=sse` stream."""
    return [b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n" for chunk in chunks]


def error(code: int, message: str, status: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status}}


def too_long() -> JsonReply:
    return JsonReply(error(400, "The input token count (1200000) exceeds the maximum number of tokens allowed "
                                "(1048576).", "INVALID_ARGUMENT"), status=400)


@dataclass
class ArrayReply(Reply):
    """`streamGenerateContent` without `alt=sse`: one JSON array, a response per chunk, as Google
    writes it (`[{...}` then `,\\r\\n{...}` then `]`); `cut_after` closes the connection mid-array."""

    chunks: list[dict[str, Any]]
    cut_after: int | None = None
    delay: float = 0.0
    written: list[bytes] = field(default_factory=list)

    async def write(self, request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(_head(200, [("content-type", "application/json; charset=UTF-8"),
                                 ("transfer-encoding", "chunked")]))
        await writer.drain()
        for i, chunk in enumerate(self.chunks):
            if i == self.cut_after:
                writer.close()
                return False
            piece = (b"[" if i == 0 else b"\n,\r\n") + json.dumps(chunk, indent=2).encode()
            if self.delay:
                await asyncio.sleep(self.delay)
            self.written.append(piece)
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"3\r\n\n]\n\r\n0\r\n\r\n")
        await writer.drain()
        return True


def default_reply(request: Received) -> Reply:
    """What the upstream answers a Gemini path when no script is queued."""
    path, _, query = request.target.partition("?")
    if path.endswith(":countTokens"):
        return JsonReply({"totalTokens": 31})
    if path.endswith(":streamGenerateContent"):
        return SSEReply(sse(pieces())) if "alt=sse" in query else ArrayReply(pieces())
    return JsonReply(answer())


def gemini_requests(received: list[Received]) -> list[Received]:
    """The generateContent and streamGenerateContent requests (countTokens and the rest left out)."""
    return [r for r in received if r.target.split("?")[0].endswith(("GenerateContent", ":generateContent"))]


def user_texts(body: dict[str, Any]) -> list[str]:
    """The text parts of a request's user contents, in order."""
    return [part["text"] for content in body["contents"] if content.get("role", "user") == "user"
            for part in content["parts"] if "text" in part]


def model_round(text: str | None = "Hello from Gemini", calls: list[dict[str, Any]] | None = None,
                thought: str | None = None) -> Any:
    """A scripted answer for one round, JSON or an `alt=sse` stream as the request asks; like the real
    API, a 400 for a history whose function calls lack their responses."""
    def reply(request: Received) -> Reply:
        contents = request.json()["contents"]
        for i, content in enumerate(contents):
            called = [p["functionCall"]["name"] for p in content["parts"] if "functionCall" in p]
            answered = [p["functionResponse"]["name"] for p in (contents[i + 1]["parts"] if i + 1 < len(contents)
                                                                else []) if "functionResponse" in p]
            if content.get("role") == "model" and called and sorted(called) != sorted(answered):
                return JsonReply(error(400, "Please ensure that the number of function response parts is equal "
                                            "to the number of function call parts of the function call turn.",
                                       "INVALID_ARGUMENT"), status=400)
        if "alt=sse" in request.target:
            return SSEReply(sse(pieces(text or "", calls=calls, thought=thought)))
        return JsonReply(answer(text, calls=calls, thought=thought))
    return reply
