"""`long-term`: the user's entities (name, type, description), and the user's own node.

A question in the first person counts the node that stands for the user as an
entity hit, so "where do I work?" reaches the user's own relationships through `graph`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from proxy.memory.retrieval.block import SHORT_TEXT_CHARS, entity_line
from proxy.memory.retrieval.sources.hybrid import with_vectors
from proxy.memory.retrieval.sources import FILLER, Found, SourceQuery, lexical, to_hits
from proxy.models import Entity, Hit
from proxy.stores.base import RecallReads
from proxy.terms import terms

SOURCE = "long-term"
MIN_SHARED_TERMS = 3
_FIRST_PERSON = re.compile(r"\b(?:i|me|my|mine|myself)\b", re.IGNORECASE)


def first_person(text: str) -> bool:
    """True when the text speaks in the first person (I, me, my, mine, myself)."""
    return _FIRST_PERSON.search(text) is not None


@dataclass(frozen=True)
class EntityMatches:
    """The entity hits of a query, best first, and the user's own node when it counts."""

    ranked: list[Found[Entity]]  # those sharing enough of the query first, each group best first
    user_node: Entity | None = None
    weak: frozenset[str] = frozenset()  # ids of ranked entities sharing too few query terms

    def to_expand(self, limit: int) -> list[Entity]:
        """The entities `graph` expands: the user's node first, then the best hits."""
        entities = [] if self.user_node is None else [self.user_node]
        for found in self.ranked:
            if len(entities) >= limit:
                break
            if all(found.item.id != e.id for e in entities):
                entities.append(found.item)
        return entities[:max(0, limit)]


async def find(store: RecallReads, q: SourceQuery) -> EntityMatches:
    """The relevant entities of the query, with the user's node for a first-person question."""

    async def search(terms: Sequence[str], limit: int) -> list[tuple[Entity, float]]:
        return await store.search_entities(q.scope, terms, limit=limit)

    async def entities() -> list[Found[Entity]]:
        # The lexical search is made inside the task gather runs it in: a recall cancelled before
        # that task starts (its deadline passed while the event loop was busy) leaves no
        # coroutine behind that was never awaited.
        return await with_vectors(q, lexical(q, search, key=_id, text=_text, order=lambda e, score: (e.id,),
                                             retry=True), "entity", key=_id, text=_text)

    if not q.first_person:
        return by_strength(q, await entities())
    if store.lookups_on_loop:  # the user's node is answered at once: no task for it
        user_node = await store.user_node(q.scope)
        return by_strength(q, await entities(), user_node)
    ranked, user_node = await asyncio.gather(entities(), store.user_node(q.scope))
    return by_strength(q, ranked, user_node)


def by_strength(q: SourceQuery, found: list[Found[Entity]], user_node: Entity | None = None) -> EntityMatches:
    """The matches, those sharing at least MIN_SHARED_TERMS of the query's terms (all of a
    shorter query's) first; the others are weak: they only fill slots nobody else takes. A
    vector hit (a `cosine` part: it cleared the cosine floor) is close in meaning, not weak.

    A name the query mentions is in many descriptions ("Alice: ..."), so sharing it alone
    says little about which of the entity's facts the query is after.
    """
    wanted = frozenset(q.terms)
    need = min(MIN_SHARED_TERMS, len(wanted))
    weak = frozenset(f.item.id for f in found
                     if "cosine" not in f.parts and len(wanted.intersection(_terms(_text(f.item)))) < need)
    ranked = [f for f in found if f.item.id not in weak] + [f for f in found if f.item.id in weak]
    return EntityMatches(ranked, user_node, weak)


def hits(q: SourceQuery, matches: EntityMatches) -> list[Hit]:
    """The matched entities as `name — description` lines (a weak one marked FILLER)."""
    return to_hits(q, matches.ranked, lambda found: _hit(found, found.item.id in matches.weak))


def _hit(found: Found[Entity], weak: bool) -> Hit:
    entity = found.item
    parts = {**found.parts, "confidence": entity.confidence, **({FILLER: True} if weak else {})}
    return Hit(SOURCE, entity.id, entity_line(entity.name, entity.description), found.score, found.reason,
               parts=parts)


def _terms(text: str) -> frozenset[str]:
    """An entity's terms: the same entities answer a user's questions turn after turn, so
    they are cached, unless the text is long (a cache keeps its keys alive)."""
    return _cached_terms(text) if len(text) <= SHORT_TEXT_CHARS else frozenset(terms(text))


@lru_cache(maxsize=4096)
def _cached_terms(text: str) -> frozenset[str]:
    return frozenset(terms(text))


def _id(entity: Entity) -> str:
    return entity.id


def _text(entity: Entity) -> str:
    return f"{entity.name} {entity.type} {entity.description}"
