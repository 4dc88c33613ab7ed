"""Tools mode on the Responses wire: `tools[]` of type `function`, `function_call_output` items,
event filtering.

A round's exchange is its output items as the provider wrote them (reasoning verbatim,
`encrypted_content` included) with only the memory `function_call` items, then one
`function_call_output` per call; the next round resends the request's input with the
exchanges after it (without the items' ids when the provider keeps none, `store: false`),
or, when the provider holds the earlier items itself (`previous_response_id`, a
`conversation`), sends the calls' outputs alone. An incomplete response is a last round,
like a completed one without memory calls. The client reads one stream: the first round's
`response.created` and `response.in_progress`, every round's items but the calls
renumbered in order, the last round's app calls, and one `response.completed` (or
`response.incomplete`) whose `output` holds the items it got (the first round's id, the
last round's usage); every event gets the next sequence number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.models import ToolCall
from proxy.wires.base import dump_json
from proxy.wires.openai_responses_answer import CLIENT_CALLS, output_text
from proxy.wires.sse import SSEEvent, json_object
from proxy.wires.tool_rounds import CallOutcome, Round, as_dict, named_event, tokens

# The ends of a round the loop reads: an incomplete response is an answer, cut short by the provider.
_ANSWERED = ("response.completed", "response.incomplete")
_OPENING = ("response.created", "response.in_progress", "response.queued")
# The output of an app call the provider holds in a chained round: the client runs only the
# calls of a round without memory calls, so the model is told to make it again.
NOT_RUN = ("Not run: this call came in the same turn as a memory lookup, so it has no result. "
           "Make it again if it is still needed.")
# App calls whose output is text (the others' outputs are screenshots or structured results).
_TEXT_CALLS = ("function_call", "custom_tool_call")


def _is_memory(item: Any, offered: frozenset[str]) -> bool:
    return isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") in offered


def _is_app_call(item: Any, offered: frozenset[str]) -> bool:
    return isinstance(item, dict) and item.get("type") in CLIENT_CALLS and not _is_memory(item, offered)


def _round(items: list[Any], offered: frozenset[str], provider_id: Any = None, usage: Any = None) -> Round:
    memory = [i for i in items if _is_memory(i, offered)]
    calls = tuple(ToolCall(str(i.get("call_id") or ""), str(i.get("name") or ""), str(i.get("arguments") or ""))
                  for i in memory)
    output = [i for i in items if not _is_app_call(i, offered)]
    answer = [i for i in items if not _is_memory(i, offered)]
    return Round(calls, output_text(items), output, answer, provider_id if isinstance(provider_id, str) else None,
                 tokens(usage, "input_tokens", "output_tokens"))


def _last_word(round_: Round) -> Round:
    """A round the provider cut short is the step's last: its memory calls (their arguments may be
    cut too) are not run."""
    return replace(round_, memory_calls=())


def _in_conversation(body: dict[str, Any]) -> bool:
    """True when the request names a provider-side conversation (its id, or `{"id": ...}`), which the
    provider extends with each response's input and output items."""
    conversation = body.get("conversation")
    return bool(conversation) and (isinstance(conversation, str) or bool(as_dict(conversation).get("id")))


def _not_run(round_: Round) -> list[Any]:
    """Outputs for the app calls of a round the provider holds: it goes on from a response only
    when every call in it has one."""
    return [{"type": f"{item['type']}_output", "call_id": item.get("call_id"), "output": NOT_RUN}
            for item in round_.answer if isinstance(item, dict) and item.get("type") in _TEXT_CALLS]


def _resent(items: list[Any], body: dict[str, Any]) -> list[Any]:
    """Output items as they go back to the provider. Without its store (`store: false`) the provider
    looks up an item sent with its id and refuses it as not found, so the ids go (reasoning stays
    whole through its `encrypted_content`, which `offer` asks for)."""
    if body.get("store") is not False:
        return items
    return [{k: v for k, v in item.items() if k != "id"} if isinstance(item, dict) else item for item in items]


def _shown_answer(round_: Round) -> list[Any]:
    """What of the last round the client gets besides the calls it runs."""
    return [i for i in round_.answer if isinstance(i, dict) and i.get("type") not in CLIENT_CALLS]


def _is_echo(item: Any) -> bool:
    """An output item a client sends back: the model's text or reasoning, or a reference to one."""
    return isinstance(item, dict) and (item.get("role") == "assistant"
                                       or item.get("type") in ("reasoning", "item_reference"))


def _shown(round_: Round) -> list[Any]:
    """What of an earlier round the client gets: its items but the calls it runs or memproxy ran."""
    return [i for i in round_.output if isinstance(i, dict) and i.get("type") not in CLIENT_CALLS]


@dataclass
class ResponsesStreamState:
    """What the rounds of one stream share."""

    id: str | None = None  # the first round's response id: the one the client sees
    next_index: int = 0  # the client's next output_index
    sequence: int = 0  # the client's next sequence_number
    shown: list[Any] = field(default_factory=list)  # the items the client got, for response.completed


@dataclass
class _ItemParts:
    kind: str  # shown | memory | app
    index: int | None = None
    held: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


class ResponsesStreamRound:
    """The event filter of one round."""

    def __init__(self, state: ResponsesStreamState, offered: frozenset[str], first: bool) -> None:
        self._state = state
        self._offered = offered
        self._first = first
        self._items: dict[int, _ItemParts] = {}
        self._done: dict[int, Any] = {}  # items seen done, by the provider's index
        self._end: dict[str, Any] | None = None  # the held response.completed or response.incomplete
        self._end_kind = "response.completed"
        self.failed = False
        self.ended = False

    def _out(self, kind: str, payload: dict[str, Any]) -> bytes:
        out = {**payload, "sequence_number": self._state.sequence}
        self._state.sequence += 1
        return named_event(kind, out)

    def feed(self, event: SSEEvent) -> bytes:
        payload = json_object(event.data)
        if payload is None:
            return f"data: {event.data}\n\n".encode("utf-8")  # the relay reads (and counts) it as it is
        kind = str(payload.get("type", event.event))
        if kind == "error":
            self.failed = True
            return self._out(kind, payload)
        if kind in _OPENING:
            response = as_dict(payload.get("response"))
            if self._state.id is None and isinstance(response.get("id"), str):
                self._state.id = response["id"]
            return self._out(kind, payload) if self._first else b""
        if kind in _ANSWERED:
            self._end = payload
            self._end_kind = kind
            self.ended = True
            return b""
        if kind == "response.failed":  # the provider's own end: it stands, over the items the client got
            self.failed = True
            response = as_dict(payload.get("response"))
            return self._out(kind, {**payload, "response": {**response, "id": self._state.id or response.get("id"),
                                                            "output": self._state.shown}})
        index = payload.get("output_index")
        if not isinstance(index, int):
            return self._out(kind, payload)
        if kind == "response.output_item.added":
            item = payload.get("item")
            role = "memory" if _is_memory(item, self._offered) else "app" if _is_app_call(item, self._offered) \
                else "shown"
            self._items[index] = _ItemParts(role)
            if role == "shown":
                self._items[index].index = self._state.next_index
                self._state.next_index += 1
        if kind == "response.output_item.done":
            self._done[index] = payload.get("item")
        parts = self._items.get(index)
        if parts is None or parts.kind == "memory":
            return b""
        if parts.kind == "app":
            parts.held.append((kind, payload))
            return b""
        if kind == "response.output_item.done":
            self._state.shown.append(payload.get("item"))
        return self._out(kind, {**payload, "output_index": parts.index})

    def finish(self) -> Round:
        response = as_dict(as_dict(self._end).get("response"))
        items = response.get("output")
        if not isinstance(items, list) or not items:
            items = [self._done[i] for i in sorted(self._done)]
        round_ = _round(items, self._offered, response.get("id"), response.get("usage"))
        return round_ if self._end_kind == "response.completed" else _last_word(round_)

    def tail(self) -> bytes:
        out = []
        for _, parts in sorted(self._items.items()):
            if parts.kind != "app":
                continue
            parts.index = self._state.next_index
            self._state.next_index += 1
            for kind, payload in parts.held:
                if kind == "response.output_item.done":
                    self._state.shown.append(payload.get("item"))
                out.append(self._out(kind, {**payload, "output_index": parts.index}))
        end = self._end or {"type": self._end_kind, "response": {}}
        response = {**as_dict(end.get("response")), "output": self._state.shown}
        if self._state.id is not None:
            response["id"] = self._state.id
        out.append(self._out(self._end_kind, {**end, "response": response}))
        return b"".join(out)


class ResponsesTools:
    """The Responses tool format."""

    def offer(self, body: dict[str, Any], names: tuple[str, ...],
              schemas: dict[str, tuple[str, dict[str, Any]]]) -> tuple[dict[str, Any], frozenset[str]]:
        tools = body.get("tools")
        tools = tools if isinstance(tools, list) else []
        taken = {as_dict(tool).get("name") for tool in tools}
        offered = tuple(name for name in names if name not in taken)
        added = [{"type": "function", "name": name, "description": schemas[name][0],
                  "parameters": schemas[name][1]} for name in offered]
        out = {**body, "tools": [*tools, *added]}
        include = body.get("include")
        include = include if isinstance(include, list) else []
        if body.get("store") is False and "reasoning.encrypted_content" not in include:
            # Reasoning items go back to the next round: without the provider's store, only encrypted.
            out["include"] = [*include, "reasoning.encrypted_content"]
        return out, frozenset(offered)

    def kept(self, exchanges: list[Any], earlier: list[Round], last: Round) -> str:
        # How many items the client got besides the calls it runs: its echo of them is replaced
        # whole, by position, as clients may drop or rewrite the item ids.
        shown = sum(len(_shown(round_)) for round_ in earlier) + len(_shown_answer(last))
        return json.dumps({"shown": shown, "items": [*exchanges, *last.answer]}, ensure_ascii=False,
                          separators=(",", ":"))

    def substitute(self, body: dict[str, Any], echoes: dict[str, str], provider_response: str | None
                   ) -> dict[str, Any]:
        if provider_response is not None:
            body = {**body, "previous_response_id": provider_response}
        items = body.get("input")
        if not echoes or not isinstance(items, list):
            return body
        out: list[Any] = []
        replaced: set[str] = set()
        echo_left = 0  # echo items of the step just replaced still to drop after its first call
        for item in items:
            call_id = as_dict(item).get("call_id")
            stored = echoes.get(call_id) if as_dict(item).get("type") in CLIENT_CALLS and isinstance(call_id, str) \
                else None
            if stored is None:
                if echo_left and _is_echo(item):
                    echo_left -= 1
                    continue
                echo_left = 0
                out.append(item)
                continue
            if stored in replaced:
                continue  # the step's other calls: already in its stored items
            replaced.add(stored)
            step = json.loads(stored)
            # The echo of the step's text comes right before its first call; any left after it
            # (a JSON answer keeps the provider's order) is dropped as it comes.
            echo_left = step["shown"]
            while echo_left and out and _is_echo(out[-1]):
                out.pop()
                echo_left -= 1
            out += _resent(step["items"], body)  # kept as the provider wrote them, sent as the round after them was
        return {**body, "input": out}

    def next_request(self, body: dict[str, Any], exchanges: list[Any], rounds: list[Round], *,
                     tools_forbidden: bool) -> bytes:
        last = rounds[-1] if rounds else None
        outputs = [*exchanges[len(exchanges) - len(last.memory_calls):], *_not_run(last)] if last is not None else []
        if last is not None and _in_conversation(body):
            # The provider added the round's input and output to the conversation: its calls'
            # outputs are all that is new (resent, the items would be refused as duplicates).
            out = {**body, "input": outputs}
        elif last is not None and last.provider_id is not None and body.get("previous_response_id"):
            # The client chains on the provider: so do the rounds, each continuing the one before
            # with its calls' outputs alone.
            out = {**body, "previous_response_id": last.provider_id, "input": outputs}
        else:
            items = body.get("input")
            items = [{"role": "user", "content": items}] if isinstance(items, str) else items
            out = {**body, "input": [*(items if isinstance(items, list) else []), *_resent(exchanges, body)]}
        if tools_forbidden:
            out["tool_choice"] = "none"
        return dump_json(out)

    def exchange(self, round_: Round, outcomes: list[CallOutcome]) -> list[Any]:
        results = [{"type": "function_call_output", "call_id": o.call.id, "output": o.text} for o in outcomes]
        return [*round_.output, *results]

    def read_json(self, doc: dict[str, Any], offered: frozenset[str]) -> Round | None:
        items = doc.get("output")
        status = doc.get("status")
        if doc.get("object") != "response" or status not in ("completed", "incomplete", "failed") \
                or not isinstance(items, list):
            return None
        round_ = _round(items, offered, doc.get("id"), doc.get("usage"))
        # Incomplete or failed, the response ends the step as it stands, the earlier rounds' items in front.
        return round_ if status == "completed" else _last_word(round_)

    def merged_json(self, last: dict[str, Any], earlier: list[Round], offered: frozenset[str]) -> bytes:
        items = [i for i in last.get("output") or [] if not _is_memory(i, offered)]
        shown = [item for round_ in earlier for item in _shown(round_)]
        return dump_json({**last, "output": [*shown, *items]})

    def stream_state(self) -> ResponsesStreamState:
        return ResponsesStreamState()

    def stream_round(self, state: ResponsesStreamState, offered: frozenset[str], *,
                     first: bool) -> ResponsesStreamRound:
        return ResponsesStreamRound(state, offered, first)
