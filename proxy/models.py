"""Plain data shared by every layer: who is asking, what was said, what was found."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

Role = Literal["user", "assistant", "system", "tool"]
TurnStatus = Literal[
    "pending", "complete", "upstream_failed", "truncated", "too_large", "client_aborted", "unparseable", "interrupted"
]


@dataclass(frozen=True)
class Scope:
    """Whose memory a request reads and writes; every store call takes one first."""

    user: str
    agent: str | None = None
    conversation: str | None = None  # only when the client named it in a header
    agent_isolated: bool = False  # scope.isolation: agent limits every source to `agent`


@dataclass(frozen=True)
class ToolCall:
    """One function call the model asked for."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class AssistantMessage:
    """The provider's answer of one step, as the client's SDK would rebuild it, on any wire."""

    content: str = ""
    refusal: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    reasoning: str = ""  # thinking text: kept for the reasoning trace, never saved as the answer
    continues: bool = False  # the provider paused the turn (Messages `pause_turn`): no answer yet
    response_id: str | None = None  # the Responses wire's id: a later `previous_response_id` names it


@dataclass(frozen=True)
class ToolStep:
    """A tool call after the turn's prompt, with its result's text where the request has it."""

    call_id: str
    name: str
    arguments: str
    result: str = ""


@dataclass(frozen=True)
class Transcript:
    """What memory needs of a chat request, whatever wire it came on.

    Each wire builds one from its own request; nothing after it knows the wire's format.
    """

    prompt: str  # the turn's prompt as it is saved: the user's own words, other parts noted ([image])
    query: str  # the prompt's text parts alone: what recall searches by
    shown: tuple[str, ...]  # texts of the request's other messages (never injected again)
    tool_call_ids: tuple[str, ...]  # calls after the prompt: a later step of a tool loop
    tool_steps: tuple[ToolStep, ...]  # those calls with their results, for the reasoning trace
    history: tuple[tuple[str, str], ...]  # (role, text) up to the prompt, system-level ones left out
    assistant_texts: tuple[str, ...]  # every assistant message's text, in order
    body_user: str | None = None  # the body's `user` field, where the wire has one
    # Responses wire: the request carries only new items after the response it names, or
    # after the items of a provider-side conversation (whose id names memproxy's).
    previous_response: str | None = None
    conversation_ref: str | None = None


@dataclass(frozen=True)
class ReasoningStep:
    """A tool call of a turn with a short form of its result."""

    name: str
    arguments: str
    result: str = ""


@dataclass(frozen=True)
class Turn:
    """A stored turn: the unit that is saved once, whatever retries and tool loops do."""

    key: str
    conversation_id: str
    status: TurnStatus
    created_at: datetime
    block: str | None = None  # the memory block computed on the turn's first step
    injected: int = 0
    prompt: str | None = None  # a hook's updated_prompt, applied again on every later step
    context: str | None = None  # the hooks' additional_context, added again to a block computed again


@dataclass(frozen=True)
class StoredMessage:
    """A saved message as the store returns it."""

    id: str
    conversation_id: str
    role: str
    content: str
    created_at: datetime


@dataclass(frozen=True)
class Entity:
    """A node of the user's graph."""

    id: str
    name: str
    type: str
    description: str = ""
    memory_type: str = "fact"
    confidence: float = 0.7
    tags: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    provenance: tuple[str, ...] = ()  # message ids it was extracted from


@dataclass(frozen=True)
class Relationship:
    """A typed edge between two entities of one user, with the time it held."""

    id: str
    from_id: str
    from_name: str
    type: str
    to_id: str
    to_name: str | None
    valid_from: datetime
    invalid_at: datetime | None = None
    provenance: tuple[str, ...] = ()
    to_type: str = ""  # the type of the entity it points to ("pet", "organization")
    to_description: str = ""  # the start of that entity's description ("cat; My cat Biscuit ...")


@dataclass(frozen=True)
class ReasoningTrace:
    """The tool calls a turn made, with the task and the final answer."""

    id: str
    conversation_id: str
    task: str
    steps: tuple[ReasoningStep, ...]
    answer: str
    created_at: datetime


@dataclass(frozen=True)
class Hit:
    """One retrieval candidate from a source, before the merge."""

    source: str  # long-term | graph | conversation | cross-session | reasoning
    id: str
    content: str  # the text as it will read in the block, before the budget
    score: float = 0.0
    reason: str = "rank"
    created_at: datetime | None = None
    conversation_id: str | None = None
    parts: dict[str, Any] = field(default_factory=dict)
