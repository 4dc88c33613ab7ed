"""`reasoning`: traces of earlier turns (the task, its tool calls, the answer).

Per agent where an agent is set (the store scopes it). No keyword retry here.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.memory.retrieval.block import reasoning_line
from proxy.memory.retrieval.sources.hybrid import with_vectors
from proxy.memory.retrieval.sources import Found, SourceQuery, lexical, to_hits
from proxy.models import Hit, ReasoningTrace
from proxy.stores.base import RecallReads

SOURCE = "reasoning"


async def search(store: RecallReads, q: SourceQuery) -> list[Hit]:
    """Traces matching the query, best first."""

    async def search(terms: Sequence[str], limit: int) -> list[tuple[ReasoningTrace, float]]:
        return await store.search_reasoning(q.scope, terms, limit=limit)

    found = await with_vectors(
        q, lexical(q, search, key=_id, text=_text, order=lambda t, score: (-t.created_at.timestamp(), t.id)),
        "reasoning", key=_id, text=_text)
    return to_hits(q, found, _hit)


def _hit(found: Found[ReasoningTrace]) -> Hit:
    trace = found.item
    return Hit(SOURCE, trace.id, reasoning_line(trace.task, trace.steps, trace.answer), found.score, found.reason,
               trace.created_at, trace.conversation_id, dict(found.parts))


def _id(trace: ReasoningTrace) -> str:
    return trace.id


def _text(trace: ReasoningTrace) -> str:
    return trace.task + " " + trace.answer
