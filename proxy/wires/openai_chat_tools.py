"""Tools mode on the Chat Completions wire: `tools[].function`, `tool` results, chunk filtering.

A round's exchange is the assistant message with only its memory calls (app calls have no
results yet; the model makes them again), then one `tool` message per call. The client's
stream keeps the first round's chunk id, one role delta, and one finish chunk, usage
chunk and `[DONE]` (the last round's); memory calls' deltas never reach it, and app calls'
deltas wait for the end of their round (a round with memory calls drops them). The rounds
serve one choice: a request for several (`n` > 1) is refused before it starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from proxy.errors import UnsupportedInToolsMode
from proxy.models import ToolCall
from proxy.wires.base import dump_json
from proxy.wires.openai_chat_answer import is_done
from proxy.wires.sse import SSEEvent, json_object
from proxy.wires.tool_rounds import ROUND_SEPARATOR, CallOutcome, MessageListRounds, Round, as_dict, tokens


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


def _function_name(tool: Any) -> str | None:
    function = tool.get("function") if isinstance(tool, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def _tool_name(tool: Any) -> str | None:
    """A tool's name whatever its type (`function`, `custom`): the provider refuses two of one name."""
    kind = tool.get("type", "function") if isinstance(tool, dict) else None
    spec = tool.get(kind) if isinstance(kind, str) else None
    name = spec.get("name") if isinstance(spec, dict) else None
    return name if isinstance(name, str) else None


def _call(call: dict[str, Any]) -> ToolCall:
    function = as_dict(call.get("function"))
    name, arguments = function.get("name"), function.get("arguments")
    return ToolCall(str(call.get("id") or ""), name if isinstance(name, str) else "",
                    arguments if isinstance(arguments, str) else "")


def _call_dict(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


@dataclass
class ChatStreamState:
    """What the rounds of one stream share."""

    id: str | None = None  # the first round's chunk id: every chunk the client gets carries it
    role_sent: bool = False
    text_sent: bool = False  # an earlier round's text went out: the next round's starts with a separator


@dataclass
class _CallParts:
    memory: bool
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    deltas: list[dict[str, Any]] = field(default_factory=list)  # an app call's deltas, held


class ChatStreamRound:
    """The chunk filter of one round."""

    def __init__(self, state: ChatStreamState, offered: frozenset[str], first: bool) -> None:
        self._state = state
        self._offered = offered
        self._first = first
        self._calls: dict[int, _CallParts] = {}
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._end: list[dict[str, Any]] = []  # the finish and usage chunks, held
        self.failed = False
        self.ended = False

    def feed(self, event: SSEEvent) -> bytes:
        if is_done(event):
            self.ended = True
            return b""  # the last round's [DONE] goes out with its tail
        chunk = json_object(event.data)
        if chunk is None or chunk.get("error"):
            self.failed = self.failed or chunk is not None
            return f"data: {event.data}\n\n".encode("utf-8")  # the relay reads (and counts) it as it is
        if self._state.id is None and isinstance(chunk.get("id"), str):
            self._state.id = chunk["id"]
        choices = chunk.get("choices")
        choices = choices if isinstance(choices, list) else []
        kept = [kept for choice in choices if isinstance(choice, dict) and (kept := self._choice(choice)) is not None]
        ends = any(isinstance(c, dict) and c.get("finish_reason") for c in choices)
        if ends or (not choices and chunk.get("usage")):
            # The finish and usage wait for the last round; text the finish chunk carries goes now.
            self._end.append(chunk)
            if not kept:
                return b""
            return _event({k: v for k, v in self._as_client(chunk, kept).items() if k != "usage"})
        if not kept:
            return b""
        return _event(self._as_client(chunk, kept))

    def _choice(self, choice: dict[str, Any]) -> dict[str, Any] | None:
        """The part of a choice the client gets now; None when nothing of it goes out now."""
        if choice.get("index", 0) != 0:
            return None  # tools mode serves one choice: a request for more is refused (`unsupported`)
        delta = as_dict(choice.get("delta"))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for position, call in enumerate(calls):
                if isinstance(call, dict):
                    self._take_call(position, call)
        out = {k: v for k, v in delta.items() if k != "tool_calls"}
        if "role" in out:
            if self._state.role_sent:
                del out["role"]
            self._state.role_sent = True
        text = out.get("content")
        if isinstance(text, str) and text:
            if not self._text and self._state.text_sent:
                out["content"] = ROUND_SEPARATOR + text
            self._text.append(text)
        reasoning = out.get("reasoning_content")  # DeepSeek's and vLLM's streamed thinking
        if isinstance(reasoning, str):
            self._reasoning.append(reasoning)
        # A later round's opening delta (`{"content": "", "refusal": null}` once its role is
        # dropped) says nothing the client has not read already.
        if not out or not self._first and all(value in ("", None) for value in out.values()):
            return None
        return {**choice, "delta": out, "finish_reason": None}

    def _take_call(self, position: int, call: dict[str, Any]) -> None:
        index = call.get("index", position)
        function = as_dict(call.get("function"))
        parts = self._calls.get(index)
        if parts is None:
            parts = self._calls[index] = _CallParts(memory=function.get("name") in self._offered)
        if isinstance(call.get("id"), str) and not parts.id:
            parts.id = call["id"]
        if isinstance(function.get("name"), str) and not parts.name:
            parts.name = function["name"]
        if isinstance(function.get("arguments"), str):
            parts.arguments.append(function["arguments"])
        if not parts.memory:
            parts.deltas.append(call)

    def _as_client(self, chunk: dict[str, Any], choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {**chunk, "id": self._state.id if self._state.id is not None else chunk.get("id"), "choices": choices}

    def finish(self) -> Round:
        memory = tuple(ToolCall(p.id, p.name, "".join(p.arguments)) for _, p in sorted(self._calls.items())
                       if p.memory)
        text = "".join(self._text)
        if text:
            self._state.text_sent = True
        app = tuple(ToolCall(p.id, p.name, "".join(p.arguments)) for _, p in sorted(self._calls.items())
                    if not p.memory)
        # As the JSON path keeps the provider's message: its reasoning goes back to the model with its calls.
        said: dict[str, Any] = {"role": "assistant", "content": text or None}
        if self._reasoning:
            said["reasoning_content"] = "".join(self._reasoning)
        output = {**said, "tool_calls": [_call_dict(c) for c in memory]}
        answer = {**said, "tool_calls": [_call_dict(c) for c in app]}
        usage = next((chunk["usage"] for chunk in reversed(self._end) if isinstance(chunk.get("usage"), dict)), None)
        return Round(memory, text, output, answer, None, tokens(usage, "prompt_tokens", "completion_tokens"))

    def tail(self) -> bytes:
        app = [p for _, p in sorted(self._calls.items()) if not p.memory]
        out = [self._with_call(delta) for p in app for delta in p.deltas]
        for chunk in self._end:
            out.append(self._as_client(chunk, [self._ending(c) for c in chunk.get("choices") or []
                                               if isinstance(c, dict) and c.get("index", 0) == 0]))
        return b"".join(_event(chunk) for chunk in out) + b"data: [DONE]\n\n"

    def _with_call(self, delta: dict[str, Any]) -> dict[str, Any]:
        base = self._end[0] if self._end else {"object": "chat.completion.chunk"}
        merged = {k: v for k, v in base.items() if k not in ("choices", "usage")}
        return {**merged, "id": self._state.id, "choices": [
            {"index": 0, "delta": {"tool_calls": [delta]}, "logprobs": None, "finish_reason": None}]}

    def _ending(self, choice: dict[str, Any]) -> dict[str, Any]:
        """A finish chunk's choice with an empty delta: its text went out as it came, its calls with
        the app's calls (a memory call of a final round never goes out)."""
        reason = choice.get("finish_reason")
        if reason == "tool_calls" and all(p.memory for p in self._calls.values()):
            reason = "stop"  # its only calls were memory calls, which the client never sees
        return {**choice, "delta": {}, "finish_reason": reason}


def unsupported(body: dict[str, Any]) -> UnsupportedInToolsMode | None:
    """Why tools mode cannot serve a request, if it cannot.

    Several choices (`n` > 1) are refused: the rounds run on one answer's memory calls, so every
    other choice would answer a conversation it did not have (or end in memory calls no one runs).
    """
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        return UnsupportedInToolsMode(
            "n > 1 is not supported in tools mode (X-Memory-Mode: tools, or memory.mode: tools): the memory "
            "calls run on one answer; send n: 1, or X-Memory-Mode: inject for several choices", param="n")
    return None


def _echoed(message: Any, echoes: dict[str, str]) -> str | None:
    """The stored exchange an assistant message echoes (by its calls' ids), if any."""
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return None
    calls = message.get("tool_calls")
    ids = [c.get("id") for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    return next((echoes[i] for i in ids if isinstance(i, str) and i in echoes), None)


class ChatTools(MessageListRounds):
    """The Chat Completions tool format."""

    tool_choice_none = "none"
    echoed = staticmethod(_echoed)

    def offer(self, body: dict[str, Any], names: tuple[str, ...],
              schemas: dict[str, tuple[str, dict[str, Any]]]) -> tuple[dict[str, Any], frozenset[str]]:
        tools = body.get("tools")
        tools = tools if isinstance(tools, list) else []
        taken = {_tool_name(tool) for tool in tools}
        offered = tuple(name for name in names if name not in taken)
        added = [{"type": "function", "function": {"name": name, "description": schemas[name][0],
                                                   "parameters": schemas[name][1]}} for name in offered]
        return {**body, "tools": [*tools, *added]}, frozenset(offered)

    def exchange(self, round_: Round, outcomes: list[CallOutcome]) -> list[Any]:
        results = [{"role": "tool", "tool_call_id": o.call.id, "content": o.text} for o in outcomes]
        return [round_.output, *results]

    def read_json(self, doc: dict[str, Any], offered: frozenset[str]) -> Round | None:
        message = _message(doc)
        if message is None:
            return None
        calls = message.get("tool_calls")
        calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
        memory = [c for c in calls if _function_name(c) in offered]
        content = message.get("content")
        text = content if isinstance(content, str) else ""
        # The provider's own message, only its memory calls kept (or only its app calls, as the
        # step's last round): what the model said, as it said it.
        output = {**message, "tool_calls": memory}
        answer = {**message, "tool_calls": [c for c in calls if c not in memory]}
        return Round(tuple(_call(c) for c in memory), text, output, answer, None,
                     tokens(doc.get("usage"), "prompt_tokens", "completion_tokens"))

    def merged_json(self, last: dict[str, Any], earlier: list[Round], offered: frozenset[str]) -> bytes:
        texts = [round_.text for round_ in earlier]
        choices = last.get("choices")
        choices = choices if isinstance(choices, list) else []
        merged = [_merged_choice(c, texts, offered) if isinstance(c, dict) and c.get("index", 0) == 0 else c
                  for c in choices]
        return dump_json({**last, "choices": merged})

    def stream_state(self) -> ChatStreamState:
        return ChatStreamState()

    def stream_round(self, state: ChatStreamState, offered: frozenset[str], *, first: bool) -> ChatStreamRound:
        return ChatStreamRound(state, offered, first)


def _message(doc: dict[str, Any]) -> dict[str, Any] | None:
    choices = doc.get("choices")
    if not isinstance(choices, list):
        return None
    choice = next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), None)
    message = choice.get("message") if choice is not None else None
    return message if isinstance(message, dict) else None


def _merged_choice(choice: dict[str, Any], texts: list[str], offered: frozenset[str]) -> dict[str, Any]:
    message = as_dict(choice.get("message"))
    own = message.get("content") if isinstance(message.get("content"), str) else ""
    content = ROUND_SEPARATOR.join(text for text in [*texts, own] if text)
    merged = {**message, "content": content or message.get("content")}
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        app = [c for c in calls if _function_name(c) not in offered]
        if app:
            merged["tool_calls"] = app
        else:
            merged.pop("tool_calls", None)
    reason = choice.get("finish_reason")
    if reason == "tool_calls" and not merged.get("tool_calls"):
        reason = "stop"
    return {**choice, "message": merged, "finish_reason": reason}
