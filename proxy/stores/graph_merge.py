"""The graph merge of one message's facts (RecordFacts): the rules once, for every backend, with no I/O.

The op first takes its item off the extraction queue; when the item is already gone
(applied before, by this or another replica, or its message or user deleted meanwhile)
nothing is written, so a repeated op is harmless and a late one never brings a deleted user back.

Entities merge by canonical name per user (per agent under isolation): the first name
stays the name, other spellings become aliases, descriptions accumulate, every message
that mentioned the entity is kept as provenance. The user's own node is the one entity
of type `user`; it keeps its id and edges when renamed to the user's stated name. A name
the user asks to be called joins its aliases, or names it while it has no stated name.
Relationships start at the message's time; a new fact of a single-valued type closes the
current edge of the same subject and type (`invalid_at`) instead of deleting it, so the past stays known.

`merge` is a generator of steps: it yields each read and write it needs as a small
dataclass and is sent back what a read found. A backend runs each step on its connection,
inside the batch's transaction, as its own SQL (sqlite/facts.py, postgres/facts.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, Union

from proxy.extracted import USER_NODE, USER_TYPE, canonical_name  # the one merge key
from proxy.ids import new_id
from proxy.stores.base import EntityFact, RecordFacts, RelationFact
from proxy.stores.indexed_text import entity_terms

PROVENANCE_KEEP = 200  # message ids kept per entity or edge, the most recent
ALIASES_KEEP = 20
DESCRIPTION_MAX_CHARS = 600
DESCRIPTION_SEPARATOR = " | "
NAME_MAX_CHARS = 200


class Row(Protocol):
    """A stored row read by column name (sqlite3.Row, asyncpg.Record)."""

    def __getitem__(self, column: str, /) -> Any: ...


# --- the steps: reads (answered with what they found) ---------------------------------


@dataclass(frozen=True)
class Dequeue:
    """Take the item off the extraction queue; answered True when it was still there.

    The message id is matched too: SQLite hands a deleted item's queue id to the next item queued.
    Without a queue id (facts extracted as the message was saved) the message id alone finds it:
    whichever of that write and the worker's comes second finds nothing, and applies nothing.
    Nor does it while an earlier message of the user waits for the worker (due by `at`, the
    message's time; a long one said on another replica): its item is then made due at `at`,
    and the worker applies the two in the order they were said.
    """

    queue_id: int | None
    message_id: str
    at: Any = None  # the message's time as the backend stores it (read without a queue id)


@dataclass(frozen=True)
class FindEntity:
    """The entity of this canonical name; answered with its row or None."""

    key: str


@dataclass(frozen=True)
class FindUserNode:
    """The user's own node (type `user`, the first made); answered with its row or None."""


@dataclass(frozen=True)
class AreRelated:
    """Whether an edge joins the two entities either way; answered True or False."""

    one: str
    other: str


@dataclass(frozen=True)
class CurrentEdges:
    """The current (not invalidated) edges of this subject and type; answered with their rows
    (seq, to_id, valid_from, provenance)."""

    from_id: str
    type: str


# --- the steps: writes (answered with None) -------------------------------------------


@dataclass(frozen=True)
class EnsureUser:
    """The user's row, created at `at` if new."""

    at: Any


@dataclass(frozen=True)
class InsertEntity:
    entity_id: str
    name: str
    key: str
    type: str
    description: str
    confidence: float
    provenance: str  # JSON list of message ids
    terms: tuple[str, str, str]  # name, type, description index terms
    at: Any


@dataclass(frozen=True)
class RewriteEntity:
    """An entity's indexed text changed: name, canonical name, type, description, aliases, terms."""

    seq: int
    name: str
    key: str
    type: str
    description: str
    aliases: str  # JSON list
    terms: tuple[str, str, str]


@dataclass(frozen=True)
class TouchEntity:
    """An entity seen again: the higher confidence, the provenance list, the update time."""

    seq: int
    confidence: float
    provenance: str  # JSON list of message ids
    at: Any


@dataclass(frozen=True)
class MakeUserNode:
    """An entity becomes the user's node: type `user`, with its type terms."""

    seq: int
    type_terms: str


@dataclass(frozen=True)
class Absorb:
    """Move another entity's edges onto the user's node (dropping any self-edge), then delete it."""

    node_id: str
    other_id: str
    other_seq: int


@dataclass(frozen=True)
class SetEdgeProvenance:
    seq: int
    provenance: str  # JSON list of message ids


@dataclass(frozen=True)
class CloseEdges:
    """Invalidate at `at` the current edges of this subject and type."""

    from_id: str
    type: str
    at: Any


@dataclass(frozen=True)
class InsertEdge:
    edge_id: str
    from_id: str
    type: str
    to_id: str
    valid_from: Any
    invalid_at: Any
    provenance: str  # JSON list of message ids


Step = Union[Dequeue, FindEntity, FindUserNode, AreRelated, CurrentEdges, EnsureUser, InsertEntity, RewriteEntity,
             TouchEntity, MakeUserNode, Absorb, SetEdgeProvenance, CloseEdges, InsertEdge]
T = TypeVar("T")
Steps = Generator[Step, Any, T]


def merge(op: RecordFacts, at: Any, clean: Callable[[str], str]) -> Steps[None]:
    """The steps of applying `op`: dequeue, then merge its entities and relationships.

    `at` is the op's time as the backend stores it, `clean` the backend's text cleaner.
    """
    if not (yield Dequeue(op.queue_id, op.message_id, at)):
        return
    graph = _Merge(op, at, clean)
    yield EnsureUser(at)
    ids: dict[str, str] = {}
    user_key, alias_key = canonical_name(op.user_node or ""), canonical_name(op.user_alias or "")
    if user_key:
        ids[user_key] = yield from graph.user_node(op.user_node or "")
    if alias_key:
        ids[alias_key] = yield from graph.user_alias(op.user_alias or "")
    for fact in op.entities:
        key = canonical_name(fact.name)
        if key and key not in (user_key, alias_key):
            ids[key] = yield from graph.entity(fact, key)
    for relation in op.relationships:
        yield from graph.relate(relation, ids)


def merged_list(held: str, new: Sequence[str], keep: int) -> str:
    """A JSON list with `new` items appended once each, the most recent `keep` kept."""
    items = list(json.loads(held))
    items += [item for item in dict.fromkeys(new) if item not in items]
    return json.dumps(items[-keep:])


def merged_description(held: str, new: str) -> str:
    """Descriptions of one entity, each once, the newest kept when they grow past the cap."""
    new = " ".join(new.split())
    if not new or new in held:
        return held
    parts = [*(held.split(DESCRIPTION_SEPARATOR) if held else []), new]
    while len(parts) > 1 and len(DESCRIPTION_SEPARATOR.join(parts)) > DESCRIPTION_MAX_CHARS:
        parts.pop(0)
    return DESCRIPTION_SEPARATOR.join(parts)[:DESCRIPTION_MAX_CHARS]


class _Merge:
    """One RecordFacts op's merge into the user's graph, as steps."""

    def __init__(self, op: RecordFacts, at: Any, clean: Callable[[str], str]) -> None:
        self.message_id = op.message_id
        self.at = at
        self.clean = clean

    def _name(self, text: str) -> str:
        return self.clean(" ".join(text.split()))[:NAME_MAX_CHARS]

    def _insert(self, name: str, key: str, type_: str, description: str, confidence: float) -> Steps[str]:
        entity_id = new_id()
        yield InsertEntity(entity_id, name, key, type_, description, confidence, json.dumps([self.message_id]),
                           entity_terms(name, type_, description), self.at)
        return entity_id

    def _update(self, row: Row, *, name: str | None = None, key: str | None = None, type_: str = "",
                description: str = "", aliases: Sequence[str] = (), confidence: float = 0.0,
                provenance: Sequence[str] = ()) -> Steps[None]:
        """Merge into an entity row; the indexed text is rewritten only when it changed."""
        name, key = name or row["name"], key or row["canonical_name"]
        new_type = row["type"] or self.clean(type_)
        held_aliases = json.loads(row["aliases"])
        alias_list = [a for a in json.loads(merged_list(row["aliases"], aliases, ALIASES_KEEP)) if a != name]
        text = (name, new_type, merged_description(row["description"], description), alias_list)
        if text != (row["name"], row["type"], row["description"], held_aliases) or key != row["canonical_name"]:
            yield RewriteEntity(row["seq"], name, key, new_type, text[2], json.dumps(alias_list),
                                entity_terms(name, new_type, text[2], alias_list))
        yield TouchEntity(row["seq"], confidence,
                          merged_list(row["provenance"], [*provenance, self.message_id], PROVENANCE_KEEP), self.at)

    def entity(self, fact: EntityFact, key: str) -> Steps[str]:
        """The id of the entity `fact` names, created or merged into."""
        name = self._name(fact.name)
        description = self.clean(" ".join(fact.description.split()))
        row = yield FindEntity(key)
        if row is None:
            return (yield from self._insert(name, key, self.clean(fact.type), merged_description("", description),
                                            fact.confidence))
        yield from self._update(row, type_=fact.type, description=description, aliases=[name],
                                confidence=fact.confidence)
        return str(row["id"])

    def user_node(self, name: str) -> Steps[str]:
        """The user's own node, created, or renamed to a stated name (keeping its id and edges)."""
        name = self._name(name)
        key = canonical_name(name)
        node = yield FindUserNode()
        named = yield FindEntity(key)
        if node is None:
            if named is None:
                return (yield from self._insert(name, key, USER_TYPE, "", 1.0))
            # An entity already carries the user's stated name: it becomes the user's node.
            yield MakeUserNode(named["seq"], entity_terms("", USER_TYPE, "")[1])
            yield from self._update((yield FindEntity(key)) or named)
            return str(named["id"])
        if key == canonical_name(USER_NODE) or key == node["canonical_name"]:
            yield from self._update(node)
            return str(node["id"])
        if named is not None and named["id"] != node["id"] and (yield AreRelated(node["id"], named["id"])):
            # Someone the user has an edge to is someone else who shares the name ("my friend
            # Tom", then "my name is Tom"): left alone, the name is an alias of the user's node.
            yield from self._update(node, aliases=[name])
            return str(node["id"])
        old_name = node["name"]
        if named is not None and named["id"] != node["id"]:
            yield from self._absorb(node, named)
        renamed = (yield FindEntity(node["canonical_name"])) or node
        keep_old = [] if canonical_name(old_name) == canonical_name(USER_NODE) else [old_name]
        yield from self._update(renamed, name=name, key=key, aliases=keep_old)
        return str(node["id"])

    def user_alias(self, alias: str) -> Steps[str]:
        """The user's node with `alias` among its aliases; named `alias` while it has no stated name.

        An entity already called `alias` is left alone: unlike a stated name, a nickname is
        often someone else's name too ("my friend Ally").
        """
        alias = self._name(alias)
        key = canonical_name(alias)
        node = yield FindUserNode()
        if node is None and (yield FindEntity(key)) is not None:
            yield from self.user_node(USER_NODE)  # someone else is called `alias`: a "User" node takes it as an alias
            node = yield FindUserNode()
        if node is None or (node["canonical_name"] == canonical_name(USER_NODE) and (yield FindEntity(key)) is None):
            return (yield from self.user_node(alias))
        yield from self._update(node, aliases=[alias] if key != node["canonical_name"] else [])
        return str(node["id"])

    def _absorb(self, node: Row, other: Row) -> Steps[None]:
        """Fold another entity into the user's node: its edges, aliases, description, provenance."""
        yield Absorb(node["id"], other["id"], other["seq"])
        current = (yield FindEntity(node["canonical_name"])) or node
        yield from self._update(current, description=other["description"],
                                aliases=[other["name"], *json.loads(other["aliases"])],
                                confidence=other["confidence"], provenance=json.loads(other["provenance"]))

    def relate(self, relation: RelationFact, ids: dict[str, str]) -> Steps[None]:
        """Add one edge between entities of this op (or already stored), closing what it replaces."""
        from_id = yield from self._resolve(relation.from_name, ids)
        to_id = yield from self._resolve(relation.to_name, ids)
        type_ = self.clean(relation.type.strip())
        if from_id is None or to_id is None or from_id == to_id or not type_:
            return
        current = yield CurrentEdges(from_id, type_)
        same = [row for row in current if row["to_id"] == to_id]
        if same:
            yield SetEdgeProvenance(same[0]["seq"],
                                    merged_list(same[0]["provenance"], [self.message_id], PROVENANCE_KEEP))
            return
        invalid_at = None
        if relation.single_valued:
            # A fact older than the current one (an item retried late) arrives already replaced.
            newer = [row["valid_from"] for row in current if row["valid_from"] > self.at]
            invalid_at = min(newer) if newer else None
            if invalid_at is None:
                yield CloseEdges(from_id, type_, self.at)
        yield InsertEdge(new_id(), from_id, type_, to_id, self.at, invalid_at, json.dumps([self.message_id]))

    def _resolve(self, name: str, ids: dict[str, str]) -> Steps[str | None]:
        key = canonical_name(name)
        if key in ids:
            return ids[key]
        row = (yield FindEntity(key)) if key else None
        return None if row is None else str(row["id"])
