"""`graph`: the current relationships of the best entity hits, as `(From)-[TYPE]->(To)`.

The object carries the kind the user named for it when the relationship does not say it:
"my cat Biscuit" is `(User)-[HAS_PET]->(Biscuit, cat)`.

As in the NAMS provider, the `graph_expansion_limit` best entity hits are
expanded, at most 5 edges each so one hub node cannot crowd out the rest; an edge whose
target has no stored name is dropped rather than shown as a bare id; an entity that fails
to expand is logged and skipped. The user's own node, expanded for any first-person
question, shows only the relationships the question asks about: one whose type, subject or
object shares a word with it, or whose type a role noun of it names ("my dog": HAS_PET).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence

from proxy.memory.retrieval.block import triple_line
from proxy.memory.extraction.roles import PLURALS, ROLES, named_kind
from proxy.redaction.redact import redact
from proxy.memory.retrieval.sources import FILLER, SourceQuery
from proxy.memory.retrieval.sources.long_term import EntityMatches
from proxy.models import Entity, Hit, Relationship
from proxy.stores.base import RecallReads
from proxy.terms import terms

log = logging.getLogger("memproxy.retrieval")

SOURCE = "graph"
REASON = "graph expansion"
EDGES_PER_ENTITY = 5
# Edges read per entity, the newest: the EDGES_PER_ENTITY shown are the ones sharing most
# query terms among these, so a hub node with thousands of edges costs what fifty do.
EDGES_READ = 50
_WORD = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*")


async def expand(store: RecallReads, q: SourceQuery, matches: EntityMatches, limit: int) -> list[Hit]:
    """Edges of the entities to expand, most query terms shared first, then the newest."""
    entities = matches.to_expand(limit)
    results = await _edges(store, q, entities)
    shared_terms = SharedTerms(frozenset(q.terms))
    asked = asked_relationships(q.text)
    chosen: dict[str, tuple[Relationship, Entity, int]] = {}
    for entity, edges in zip(entities, results):
        if isinstance(edges, asyncio.CancelledError):
            raise edges
        if isinstance(edges, BaseException):
            log.warning("graph: entity %s failed to expand (%s: %s)", entity.id, type(edges).__name__,
                        redact(str(edges))[:200])
            continue
        shown = [(edge, shared_terms.of(edge)) for edge in edges if _shown(edge)]
        if matches.user_node is not None and entity.id == matches.user_node.id:
            # A first-person question reaches every fact of the user: only those it asks
            # about are lines ("my dog's name" asks for HAS_PET, not PREFERS Python).
            shown = [(edge, shared) for edge, shared in shown if shared or edge.type in asked]
        for edge, shared in sorted(shown, key=_rank)[:EDGES_PER_ENTITY]:
            chosen.setdefault(edge.id, (edge, entity, shared))
    # An edge of a weak entity hit is weak too: it fills only the slots the others leave.
    weak = {edge_id for edge_id, (_, entity, _) in chosen.items() if entity.id in matches.weak}
    ranked = sorted(((edge, shared) for edge, _, shared in chosen.values()),
                    key=lambda row: (row[0].id in weak, *_rank(row)))
    return [
        Hit(SOURCE, edge.id, edge_line(edge), float(shared), REASON,
            edge.valid_from, parts={"entity": chosen[edge.id][1].id, "shared_terms": shared, "rank": n,
                                    **({FILLER: True} if edge.id in weak else {})})
        for n, (edge, shared) in enumerate(ranked[:q.hits_wanted], start=1)
    ]


async def _edges(store: RecallReads, q: SourceQuery, entities: Sequence[Entity]
                 ) -> list[list[Relationship] | BaseException]:
    """Each entity's newest edges, or what its read raised."""
    if not store.lookups_on_loop:
        return await asyncio.gather(
            *(store.relationships(q.scope, e.id, current_only=True, limit=EDGES_READ) for e in entities),
            return_exceptions=True,
        )
    results: list[list[Relationship] | BaseException] = []
    for entity in entities:  # each answered at once: a task apiece would only add its scheduling
        try:
            results.append(await store.relationships(q.scope, entity.id, current_only=True, limit=EDGES_READ))
        except Exception as exc:
            results.append(exc)
    return results


def edge_line(edge: Relationship) -> str:
    """The edge as `(From)-[TYPE]->(To)`, with the kind of its object the user named: `(Biscuit, cat)`."""
    return triple_line(edge.from_name, edge.type, edge.to_name or "", _kind(edge))


def _kind(edge: Relationship) -> str:
    return named_kind(edge.to_type, edge.to_description, edge.type)


def asked_relationships(text: str) -> frozenset[str]:
    """The relationship types the role nouns of a question name: "my dog" HAS_PET, "my boss" HAS_MANAGER."""
    words = [word.casefold() for word in _WORD.findall(text)]
    found = set()
    for n, word in enumerate(words):
        for noun in (f"{word} {words[n + 1]}" if n + 1 < len(words) else "", word):
            role = PLURALS.get(noun, noun)
            if role in ROLES:
                found.add(ROLES[role][0])
    return frozenset(found)


def _shown(edge: Relationship) -> bool:
    return edge.invalid_at is None and bool(edge.to_name) and bool(edge.from_name)


class SharedTerms:
    """How many query terms a triple's text holds; each name's terms computed once per retrieval."""

    def __init__(self, wanted: frozenset[str]) -> None:
        self.wanted = wanted
        self._names: dict[str, frozenset[str]] = {}

    def of(self, edge: Relationship) -> int:
        found: set[str] = set()
        for part in (edge.from_name, edge.type, edge.to_name or "", _kind(edge)):
            if (part_terms := self._names.get(part)) is None:
                part_terms = self._names[part] = self.wanted.intersection(terms(part))
            found |= part_terms
        return len(found)


def _rank(row: tuple[Relationship, int]) -> tuple[int, float, str]:
    edge, shared = row
    return (-shared, -edge.valid_from.timestamp(), edge.id)
