"""One extraction as the store's `RecordFacts`: the user's node named, noise dropped.

Dropped: empty names, a name that is just its own type ("company", "person"), and an
all-lowercase common noun ("meeting", "laptop") unless a relationship links it — "I prefer
dark mode" keeps `dark mode`, a bare mention does not make it a node. A relationship whose
end was dropped goes with it. First-person facts attach to the user's node: the stated
name when this message gives one, `User` otherwise (the store keeps an earlier stated name).
A name the user asks to be called ("call me Ally") goes to the store as the node's alias.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime

from proxy.extracted import SINGLE_VALUED, USER_NODE, ExtractedEntity, Extraction, canonical_name
from proxy.models import Scope
from proxy.stores.base import EntityFact, QueuedMessage, RecordFacts, RelationFact

MAX_ENTITIES = 50  # per message: a pasted document must not turn into a thousand nodes
MAX_RELATIONSHIPS = 50
NAME_MAX_CHARS = 200
DESCRIPTION_MAX_CHARS = 300
TYPE_MAX_CHARS = 40
# Letters, spaces, hyphens and apostrophes only: no capital, digit, dot or slash, so
# identifiers (`db-primary.prod.internal`) and proper names are never mistaken for one.
_COMMON_NOUN = re.compile(r"[a-z][a-z' \-]*")


def one_line(text: str, limit: int) -> str:
    """Whitespace folded to single spaces, cut at `limit` characters."""
    return " ".join(text.split())[:limit]


def skipped(entity: ExtractedEntity, linked: set[str]) -> bool:
    """True for a name not worth a node: empty, its own type, or an unlinked common noun."""
    name = one_line(entity.name, NAME_MAX_CHARS)
    key = canonical_name(name)
    if not key or key == canonical_name(entity.type):
        return True
    return _COMMON_NOUN.fullmatch(name) is not None and key not in linked


def no_facts(item: QueuedMessage, scope: Scope) -> RecordFacts:
    """Take an item off the queue without adding anything (a role not mined, say)."""
    return RecordFacts(scope, item.queue_id, item.message.id, (), (), item.message.created_at)


def to_record(item: QueuedMessage, scope: Scope, found: Extraction) -> RecordFacts:
    """The write that records `found` for the queued message and dequeues it."""
    return record_of(scope, item.queue_id, item.message.id, item.message.created_at, found)


def record_of(scope: Scope, queue_id: int | None, message_id: str, at: datetime, found: Extraction) -> RecordFacts:
    """The write that records `found` for a message said at `at` (its queue item: `queue_id`, or found
    by the message id when None)."""
    stated = one_line(found.user_name or "", NAME_MAX_CHARS) or None
    alias = one_line(found.user_alias or "", NAME_MAX_CHARS) or None
    own = {canonical_name(name) for name in (USER_NODE, stated, alias) if name}
    user_node = stated or USER_NODE
    linked = {canonical_name(n) for r in found.relationships for n in (r.from_name, r.to_name)}
    entities = _entities(found.entities, own, linked)
    relations: dict[tuple[str, str, str], RelationFact] = {}
    for relation in found.relationships:
        ends = [user_node if canonical_name(n) in own else one_line(n, NAME_MAX_CHARS)
                for n in (relation.from_name, relation.to_name)]
        kind = one_line(relation.type, TYPE_MAX_CHARS)
        key = (canonical_name(ends[0]), kind, canonical_name(ends[1]))
        if kind and key not in relations and all(end == user_node or canonical_name(end) in entities for end in ends):
            relations[key] = RelationFact(ends[0], kind, ends[1], kind in SINGLE_VALUED)
    kept = tuple(relations.values())[:MAX_RELATIONSHIPS]
    uses_node = stated is not None or any(user_node in (r.from_name, r.to_name) for r in kept)
    return RecordFacts(scope, queue_id, message_id, tuple(entities.values()), kept, at,
                       user_node if uses_node else None, alias)


def _entities(found: Iterable[ExtractedEntity], own: set[str], linked: set[str]) -> dict[str, EntityFact]:
    kept: dict[str, EntityFact] = {}
    for entity in found:
        key = canonical_name(one_line(entity.name, NAME_MAX_CHARS))
        if key in own or key in kept or skipped(entity, linked) or len(kept) >= MAX_ENTITIES:
            continue
        kept[key] = EntityFact(one_line(entity.name, NAME_MAX_CHARS), one_line(entity.type, TYPE_MAX_CHARS),
                               one_line(entity.description, DESCRIPTION_MAX_CHARS),
                               min(1.0, max(0.0, entity.confidence)))
    return kept
