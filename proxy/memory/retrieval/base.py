"""What a recall is asked (`Query`) and what it answers (`Retrieved`), and the `Retriever` that
answers it (proxy.memory.retrieval.retriever): the pipeline, the memory API's search and the
evaluation all ask through these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.models import Hit, Scope

# Recall reads a prompt by its first and last this many chars (each message the request
# shows, too): a 30 MB paste costs the event loop what 8,000 chars cost.
QUERY_EDGE_CHARS = 4000


@dataclass(frozen=True)
class Query:
    """What retrieval is asked: the last user message, in the context of its request."""

    text: str
    conversation_id: str
    visible: tuple[str, ...]  # texts of the request's other messages (never injected again)
    max_memories: int
    new_conversation: bool = False  # nothing of this conversation is stored yet
    answer_by: float | None = None  # event-loop time by which the recall must have its block


@dataclass
class Retrieved:
    """The block for one turn, with the injection log entry that explains it."""

    block: str = ""
    injected: int = 0
    log: dict[str, Any] = field(default_factory=dict)
    hits: tuple[Hit, ...] = ()  # those the block shows, in its order (a post_retrieval hook picks from them)


class Retriever(Protocol):
    """Finds the memories that matter to a query (proxy.memory.retrieval.retriever)."""

    async def retrieve(self, scope: Scope, query: Query) -> Retrieved: ...

    def forget(self, user: str) -> None:
        """Drop whatever the retriever holds in memory about a deleted user."""
