"""Tools mode's seam with a wire: what the step loop asks of each wire's tool format.

A wire's tools module (`<wire>_tools.py`) offers the memory tools in its own tool format,
reads a round's answer into a Round, writes the round's exchange (its output with only
the memory calls, then one result per call) for the next request, and merges the rounds
into one answer for the client: a JSON body, or a stream filtered event by event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.models import ToolCall
from proxy.wires.base import dump_json
from proxy.wires.sse import SSEEvent

# Between the text of two rounds, in a JSON answer and in a stream alike.
ROUND_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Round:
    """One provider answer in a tools-mode loop, as the loop needs it."""

    memory_calls: tuple[ToolCall, ...]  # calls of the memory tools memproxy offered
    text: str  # the round's text, as the client reads it
    output: Any  # the wire's own form of the round's output with its memory calls (for its exchange)
    answer: Any  # the same output with its app calls instead, as the last round of a step
    provider_id: str | None = None  # the provider's id of the round's response, where the wire has one
    tokens: dict[str, int] = field(default_factory=dict)  # the round's input_tokens and output_tokens


def as_dict(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one (provider output is read defensively)."""
    return value if isinstance(value, dict) else {}


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def named_event(kind: str, payload: dict[str, Any]) -> bytes:
    """One SSE event with an `event:` name (the Messages and Responses streams)."""
    return f"event: {kind}\ndata: {compact_json(payload)}\n\n".encode("utf-8")


class MessageListRounds:
    """What the wires whose history is a `messages` list (Chat Completions, Messages) do alike:
    keep a step's exchanges, put them back in place of the client's echo, and ask again.

    A subclass names its `tool_choice` value that forbids tool use, and how to tell which
    stored exchange an assistant message echoes.
    """

    tool_choice_none: Any

    @staticmethod
    def echoed(message: Any, echoes: dict[str, str]) -> str | None:
        """The stored exchange `message` echoes, if any."""
        raise NotImplementedError

    def kept(self, exchanges: list[Any], earlier: list[Round], last: Round) -> str:
        return compact_json([*exchanges, last.answer])

    def substitute(self, body: dict[str, Any], echoes: dict[str, str], provider_response: str | None
                   ) -> dict[str, Any]:
        messages = body.get("messages")
        if not echoes or not isinstance(messages, list):
            return body
        out: list[Any] = []
        for message in messages:
            stored = self.echoed(message, echoes)
            out += json.loads(stored) if stored is not None else [message]
        return {**body, "messages": out}

    def next_request(self, body: dict[str, Any], exchanges: list[Any], rounds: list[Round], *,
                     tools_forbidden: bool) -> bytes:
        messages = body.get("messages")
        out = {**body, "messages": [*(messages if isinstance(messages, list) else []), *exchanges]}
        if tools_forbidden:
            out["tool_choice"] = self.tool_choice_none
        return dump_json(out)


def tokens(usage: Any, input_key: str, output_key: str) -> dict[str, int]:
    """A usage object's input and output token counts, named alike on every wire."""
    if not isinstance(usage, dict):
        return {}
    found = {"input_tokens": usage.get(input_key), "output_tokens": usage.get(output_key)}
    return {k: v for k, v in found.items() if isinstance(v, int) and not isinstance(v, bool)}


@dataclass(frozen=True)
class CallOutcome:
    """A memory call's result as it goes back to the model."""

    call: ToolCall
    text: str
    error: bool = False


class StreamRound(Protocol):
    """Filters one round's events: text goes to the client at once, the rest waits."""

    def feed(self, event: SSEEvent) -> bytes:
        """The bytes of this event the client gets now (b"": withheld)."""

    def finish(self) -> Round:
        """The round, once its stream ended."""

    def tail(self) -> bytes:
        """The withheld end of the last round: its app calls, its end events."""

    @property
    def failed(self) -> bool:
        """True when the round's stream carried the provider's error (forwarded as it came)."""

    @property
    def ended(self) -> bool:
        """True once the round's own end event arrived (a stream that stops before it was cut)."""


class ToolFormat(Protocol):
    """One wire's tool format, for the step loop of tools mode."""

    def offer(self, body: dict[str, Any], names: tuple[str, ...],
              schemas: dict[str, tuple[str, dict[str, Any]]]) -> tuple[dict[str, Any], frozenset[str]]:
        """The body with the memory tools added, and the names offered (a client tool of the same name wins)."""

    def substitute(self, body: dict[str, Any], echoes: dict[str, str], provider_response: str | None
                   ) -> dict[str, Any]:
        """The body with each echoed answer of an earlier step (found by its app-call ids) replaced by
        that step's stored exchange (`echoes`: call id -> what `kept` wrote), and the response it
        continues named by the provider's own id (where the wire has response ids)."""

    def kept(self, exchanges: list[Any], earlier: list[Round], last: Round) -> str:
        """What the store keeps of a step for `substitute`: its exchanges and its last round's output."""

    def next_request(self, body: dict[str, Any], exchanges: list[Any], rounds: list[Round], *,
                     tools_forbidden: bool) -> bytes:
        """The body of a round: the request, then the exchanges of `rounds` so far (or, where the wire
        chains responses on the provider, a continuation of the last); tool use forbidden for the last."""

    def exchange(self, round_: Round, outcomes: list[CallOutcome]) -> list[Any]:
        """What follows the request for the provider after this round: its memory calls and their results."""

    def read_json(self, doc: dict[str, Any], offered: frozenset[str]) -> Round | None:
        """A JSON answer's round; None when it is not one the loop can read."""

    def merged_json(self, last: dict[str, Any], earlier: list[Round], offered: frozenset[str]) -> bytes:
        """The client's JSON answer: the last round's, the earlier rounds' text in front of its own."""

    def stream_state(self) -> Any:
        """What the rounds of one stream share (the client-visible id, what was sent already)."""

    def stream_round(self, state: Any, offered: frozenset[str], *, first: bool) -> StreamRound:
        """A filter for the events of one round of a stream."""
