"""`conversation`: earlier messages of the current conversation the request does not show.

A message present in the request's own history is never injected again, and the
user's current message is not a memory of itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from proxy.memory.retrieval.sources import time_cues
from proxy.memory.retrieval.block import message_line
from proxy.memory.retrieval.sources.hybrid import with_vectors
from proxy.redaction.redact import redact
from proxy.memory.retrieval.sources import FILLER, Found, SourceQuery, lexical, normalised, to_hits
from proxy.memory.retrieval.sources.no_memory import carries_memory, non_answer
from proxy.models import Hit, StoredMessage
from proxy.stores.base import RecallReads, StoreError

log = logging.getLogger("memproxy.retrieval")

SOURCE = "conversation"
ANSWER_REASON = "answer to the question asked again"
# The request may show many of the best matches; asking for that many more keeps enough
# unseen ones in reach, up to this bound on one search.
MAX_CANDIDATES = 500
ERROR_CHARS = 200


def candidate_limit(q: SourceQuery) -> int:
    """Rows to ask for so that `q.candidates` survive dropping what the request shows."""
    return min(MAX_CANDIDATES, q.candidates + len(q.visible) + 1)


async def search(store: RecallReads, q: SourceQuery) -> list[Hit]:
    """Matching messages of `q.conversation_id` that the request does not already show."""
    if q.new_conversation:
        return []  # a conversation the store has nothing of: no search to make

    async def search(terms: Sequence[str], limit: int) -> list[tuple[StoredMessage, float]]:
        return await store.search_messages(q.scope, terms, conversation_ids=[q.conversation_id], limit=limit)

    def unseen(m: StoredMessage) -> bool:
        return says_something(m) and (not q.shows(m.content) or q.asks_again(m.content))

    found = await with_vectors(
        q, time_cues.ranked(q.text, lexical(q, search, key=message_id, text=message_text, keep=unseen,
                                            order=newest_first, retry=True, limit=candidate_limit(q))),
        "message", key=message_id, text=message_text, keep=unseen, conversation=q.conversation_id)
    return to_hits(q, await with_answers(store, q, found), lambda f: message_hit(SOURCE, f))


async def with_answers(store: RecallReads, q: SourceQuery, found: list[Found[StoredMessage]]
                       ) -> list[Found[StoredMessage]]:
    """The candidates, each bare question the query asks again replaced by the message said just
    after it, its answer, at the question's rank (no_memory.py); a question with no such answer goes.

    The answer may share no word with the query ("Biscuit, the tabby"): the question found it.
    """
    asked = {f.item.id for f in found[:q.hits_built] if f.item.role == "user" and q.asks_again(f.item.content)}
    if not asked:
        return found
    try:
        read = await store.neighbours(q.scope, sorted(asked))
    except StoreError as exc:  # the questions say nothing: the source's other hits still count
        log.warning("retrieval: answers not read (%s: %s)", type(exc).__name__, redact(str(exc))[:ERROR_CHARS])
        read = {}
    kept: list[Found[StoredMessage]] = []
    ids: set[str] = set()
    for f in found:
        if f.item.id in asked:
            # Its answer is the assistant's reply said next; a user's message said next (the
            # answer never saved, or deleted) is no answer to it.
            answer = read.get(f.item.id, (None, None))[1]
            if (answer is None or answer.role != "assistant" or q.says(answer.content)
                    or not says_something(answer)):
                continue
            f = Found(answer, f.score, ANSWER_REASON, {**f.parts, "question": f.item.id})
        if f.item.id not in ids:
            ids.add(f.item.id)
            kept.append(f)
    return kept


def message_hit(source: str, found: Found[StoredMessage]) -> Hit:
    """A message as `role (YYYY-MM-DD): text`; one that carries no memory only fills what is left."""
    m = found.item
    parts = dict(found.parts) if carries_memory(m.role, m.content) else {**found.parts, FILLER: True}
    return Hit(source, m.id, message_line(m.role, m.created_at, m.content), found.score, found.reason,
               m.created_at, m.conversation_id, parts)


def said(hit: Hit) -> str:
    """The words of a message hit, without its `role (date): ` prefix, for comparing copies."""
    return normalised(hit.content.split("): ", 1)[-1]).casefold()


def one_copy_each(conversation: list[Hit], cross_session: list[Hit]) -> tuple[list[Hit], list[Hit]]:
    """The same words said in two conversations are one memory: keep the copy the merge reaches first.

    Sources take turns, so the copy with the better rank in its own source comes first; on
    equal ranks, `conversation` takes its turn before `cross-session`.
    """
    best: dict[str, tuple[int, int]] = {}
    words = [[said(hit) for hit in hits] for hits in (conversation, cross_session)]
    for order, hits_said in enumerate(words):
        for rank, hit_said in enumerate(hits_said):
            best[hit_said] = min(best.get(hit_said, (rank, order)), (rank, order))
    return ([hit for rank, (hit, hit_said) in enumerate(zip(conversation, words[0])) if best[hit_said] == (rank, 0)],
            [hit for rank, (hit, hit_said) in enumerate(zip(cross_session, words[1])) if best[hit_said] == (rank, 1)])


def newest_first(m: StoredMessage, score: float) -> tuple[object, ...]:
    """Tie-break of equal scores: the newer message, then the id."""
    return (-m.created_at.timestamp(), m.id)


def says_something(m: StoredMessage) -> bool:
    """False for an assistant's non-answer ("I don't know your daughter's name"): never a memory."""
    return not (m.role == "assistant" and non_answer(m.content))


def message_id(m: StoredMessage) -> str:
    """A message's id (the key candidates are told apart by)."""
    return m.id


def message_text(m: StoredMessage) -> str:
    """A message's text (what the keyword retry ranks by)."""
    return m.content
