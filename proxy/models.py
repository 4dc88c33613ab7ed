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
