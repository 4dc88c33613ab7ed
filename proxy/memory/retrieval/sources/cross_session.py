"""`cross-session`: messages of the user's other conversations.

All of them by default, the N most recent with `cross_session_limit: N`, none with
0; ranked by relevance alone, ties broken by conversation recency. No cap on hits from
one conversation: an answer often sits in a few neighbouring turns of one earlier chat.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.memory.retrieval.sources import time_cues
from proxy.memory.retrieval.sources.hybrid import with_vectors
from proxy.memory.retrieval.sources import SourceQuery, lexical, to_hits
from proxy.memory.retrieval.sources.conversation import (
    candidate_limit, message_hit, message_id, message_text, says_something, with_answers,
)
from proxy.models import Hit, StoredMessage
from proxy.stores.base import RecallReads

SOURCE = "cross-session"


async def search(store: RecallReads, q: SourceQuery, conversations: int | None) -> list[Hit]:
    """Matching messages of other conversations, best first."""
    if conversations == 0:
        return []
    recency: dict[str, int] = {}
    if conversations is not None:
        recent = await store.recent_conversations(q.scope, conversations + 1)
        others = [c for c in recent if c != q.conversation_id][:conversations]
        if not others:
            return []
        recency = {c: n for n, c in enumerate(others)}

    async def search(terms: Sequence[str], limit: int) -> list[tuple[StoredMessage, float]]:
        if recency:
            return await store.search_messages(q.scope, terms, conversation_ids=list(recency), limit=limit)
        return await store.search_messages(q.scope, terms, exclude_conversation_id=q.conversation_id, limit=limit)

    def order(m: StoredMessage, score: float) -> tuple[object, ...]:
        # The conversation's rank among the most recent when known; with every conversation
        # searched the store does not say how recent each is, and the message's own time
        # stands for its conversation's.
        return (recency.get(m.conversation_id, 0), -m.created_at.timestamp(), m.id)

    def unseen(m: StoredMessage) -> bool:
        return says_something(m) and (not q.shows(m.content) or q.asks_again(m.content))

    found = await with_vectors(
        q, time_cues.ranked(q.text, lexical(q, search, key=message_id, text=message_text, keep=unseen, order=order,
                                            limit=candidate_limit(q) + q.candidates)),
        "message", key=message_id, text=message_text, keep=unseen, exclude=q.conversation_id,
        within=frozenset(recency) if recency else None)
    return to_hits(q, await with_answers(store, q, found), lambda f: message_hit(SOURCE, f))
