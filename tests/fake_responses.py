"""OpenAI Responses payloads for the scripted upstream (tests/fake_upstream.py).

JSON `response` objects and SSE streams with the real event sequence (as Codex CLI
receives it): response.created, response.in_progress, per output item
response.output_item.added, its parts and deltas (output_text, function-call arguments,
reasoning summary), response.output_item.done, then response.completed with usage, or
response.failed / response.incomplete. Errors in OpenAI's shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.fake_upstream import JsonReply, Received, Reply, SSEReply

USAGE = {"input_tokens": 40, "input_tokens_details": {"cached_tokens": 32}, "output_tokens": 9,
         "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 49}


def message_item(text: str, n: int = 0) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{n}", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def call_item(call_id: str, name: str = "lookup", arguments: str = '{"q": "host"}') -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": "completed"}


def reasoning_item(summary: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": "rs_0", "summary": [{"type": "summary_text", "text": summary}]}


def response(output: list[dict[str, Any]], response_id: str = "resp_1", status: str = "completed",
             usage: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "created_at": 1700000000, "status": status, "model": "gpt-test",
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "error": None,
            "incomplete_details": None, "usage": (usage or USAGE) if status == "completed" else None, **extra}


def output(text: str | None = "Hello from Responses", calls: list[str] | None = None,
           summary: str | None = None) -> list[dict[str, Any]]:
    """Output items: an optional reasoning summary, the text, then function calls by call_id."""
    items = [reasoning_item(summary)] if summary is not None else []
    if text is not None:
        items.append(message_item(text, len(items)))
    return items + [call_item(call_id) for call_id in calls or []]


class _Events:
    def __init__(self) -> None:
        self.events: list[bytes] = []

    def add(self, kind: str, **payload: Any) -> None:
        data = {"type": kind, "sequence_number": len(self.events), **payload}
        self.events.append(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())


def stream(items: list[dict[str, Any]] | None = None, response_id: str = "resp_1", end: str = "completed",
           pieces: int = 3, error: dict[str, Any] | None = None,
           usage: dict[str, Any] | None = None) -> list[bytes]:
    """The events of a streamed response; `end` is completed, failed, incomplete or none."""
    items = output() if items is None else items
    out = _Events()
    out.add("response.created", response=response([], response_id, "in_progress"))
    out.add("response.in_progress", response=response([], response_id, "in_progress"))
    for index, item in enumerate(items):
        base = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            out.add("response.output_item.added", output_index=index, item={**item, "content": [],
                                                                            "status": "in_progress"})
            out.add("response.content_part.added", **base, content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []})
            size = max(1, -(-len(text) // pieces))
            for i in range(0, len(text), size):
                out.add("response.output_text.delta", **base, content_index=0, delta=text[i:i + size], logprobs=[])
            out.add("response.output_text.done", **base, content_index=0, text=text, logprobs=[])
            out.add("response.content_part.done", **base, content_index=0, part=item["content"][0])
        elif item["type"] == "function_call":
            out.add("response.output_item.added", output_index=index, item={**item, "arguments": "",
                                                                            "status": "in_progress"})
            half = len(item["arguments"]) // 2
            for part in (item["arguments"][:half], item["arguments"][half:]):
                out.add("response.function_call_arguments.delta", **base, delta=part)
            out.add("response.function_call_arguments.done", **base, arguments=item["arguments"])
        elif item["type"] == "reasoning":
            text = item["summary"][0]["text"]
            out.add("response.output_item.added", output_index=index, item={**item, "summary": []})
            out.add("response.reasoning_summary_part.added", **base, summary_index=0,
                    part={"type": "summary_text", "text": ""})
            out.add("response.reasoning_summary_text.delta", **base, summary_index=0, delta=text)
            out.add("response.reasoning_summary_text.done", **base, summary_index=0, text=text)
            out.add("response.reasoning_summary_part.done", **base, summary_index=0,
                    part={"type": "summary_text", "text": text})
        out.add("response.output_item.done", output_index=index, item=item)
    if end == "completed":
        out.add("response.completed", response=response(items, response_id, usage=usage))
    elif end in ("failed", "incomplete"):
        failure = error or {"code": "server_error", "message": "The model failed"}
        out.add(f"response.{end}", response=response(items, response_id, end, error=failure if end == "failed"
                                                      else None))
    return out.events


def failed_early(code: str = "context_length_exceeded", response_id: str = "resp_f") -> list[bytes]:
    """A stream that fails before any output item (as a context-length failure comes)."""
    out = _Events()
    out.add("response.created", response=response([], response_id, "in_progress"))
    out.add("response.in_progress", response=response([], response_id, "in_progress"))
    out.add("response.failed", response=response([], response_id, "failed",
                                                 error={"code": code, "message": "Your input exceeds the context "
                                                        "window of this model."}))
    return out.events


def error(status: int, code: str | None, text: str, kind: str = "invalid_request_error") -> JsonReply:
    return JsonReply({"error": {"message": text, "type": kind, "param": None, "code": code}}, status=status)


def too_long() -> JsonReply:
    return error(400, "context_length_exceeded", "Your input exceeds the context window of this model.")


def missing_call_outputs(items: Any) -> list[str]:
    """call_ids of function_call items the input carries without their output (the real API's 400)."""
    if not isinstance(items, list):
        return []
    called = [i.get("call_id") for i in items if isinstance(i, dict) and i.get("type") == "function_call"]
    answered = {i.get("call_id") for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"}
    return [call_id for call_id in called if call_id not in answered]


def unknown_ids(body: dict[str, Any]) -> list[str]:
    """Ids of input items the real API would look up, with `store: false`, and not find (its 404)."""
    items = body.get("input")
    if body.get("store") is not False or not isinstance(items, list):
        return []
    return [i["id"] for i in items if isinstance(i, dict) and isinstance(i.get("id"), str)]


class ProviderItems:
    """What a provider keeps, as the real API does: a request naming a conversation, or a previous
    response, is read after the items held there; an input item with the id of one held is refused
    as a duplicate; a completed response keeps its context (the held items, its input and its
    output) and appends its input and output to the conversation it names."""

    def __init__(self) -> None:
        self.conversations: dict[str, list[dict[str, Any]]] = {}
        self.responses: dict[str, list[dict[str, Any]]] = {}

    @staticmethod
    def conversation(body: dict[str, Any]) -> str | None:
        named = body.get("conversation")
        return named.get("id") if isinstance(named, dict) else named

    def held(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        conversation = self.conversation(body)
        if conversation:
            return list(self.conversations.get(conversation, []))
        return list(self.responses.get(body.get("previous_response_id") or "", []))

    def duplicates(self, body: dict[str, Any]) -> list[str]:
        items = body.get("input")
        seen = {i["id"] for i in self.held(body) if isinstance(i.get("id"), str)}
        return [i["id"] for i in items if isinstance(i, dict) and i.get("id") in seen] \
            if isinstance(items, list) else []

    def add(self, body: dict[str, Any], response_id: str, output: list[dict[str, Any]]) -> None:
        items = body.get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        context = [*self.held(body), *items, *output]
        self.responses[response_id] = context
        conversation = self.conversation(body)
        if conversation:
            self.conversations[conversation] = context


def model_round(items: list[dict[str, Any]], response_id: str = "resp_1",
                usage: dict[str, Any] | None = None,
                provider: ProviderItems | None = None) -> Callable[[Received], Reply]:
    """A scripted response for one round, JSON or streamed as the request asks; like the real API,
    a 400 for an input whose function calls lack their outputs, a 404 for an item sent with its id
    when `store` is false, and, given what the `provider` keeps, a 400 for an item it holds already
    (the items of the conversation or previous response named count as input)."""
    def reply(request: Received) -> Reply:
        body = request.json()
        unknown = unknown_ids(body)
        if unknown:
            return error(404, None, f"Item with id '{unknown[0]}' not found. Items are not persisted when `store` "
                         "is set to false. Try again with `store` set to true, or remove this item from your input.")
        held = provider.held(body) if provider is not None else []
        duplicate = provider.duplicates(body) if provider is not None else []
        if duplicate:
            return error(400, None, f"Duplicate item found with id {duplicate[0]}. Remove duplicate items from "
                         "your input and try again.")
        inputs = body.get("input")
        missing = missing_call_outputs([*held, *(inputs if isinstance(inputs, list) else [])])
        if missing:
            return error(400, None, "No tool output found for function call " + ", ".join(missing))
        if provider is not None:
            provider.add(body, response_id, items)
        if body.get("stream"):
            events = stream(items, response_id)
            if usage is not None:
                events[-1] = events[-1].replace(json.dumps(USAGE).encode(), json.dumps(usage).encode())
            return SSEReply(events)
        return JsonReply(response(items, response_id, **({"usage": usage} if usage else {})))
    return reply


def default_reply(request: Received) -> Reply:
    """What the upstream answers on POST /responses when no script is queued."""
    try:
        streamed = bool(json.loads(request.body).get("stream"))
    except (ValueError, AttributeError, RecursionError):
        return error(400, None, "bad json")
    return SSEReply(stream()) if streamed else JsonReply(response(output()))
