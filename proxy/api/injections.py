"""GET /injections: the injection log with each hit's text looked up when the log is read.

The log keeps ids and scores, never memory text (a deleted memory must not live on in it),
so the text a turn was given is found again from the item itself, written as the block
line writes it. Each hit says what became of its item since the turn: `current` (there,
with no sign of change), `changed` (an entity corrected or re-described after the turn, a
relationship superseded after it) or `deleted`. A corrected message carries no time of
correction, so its text is always today's.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from proxy.memory.retrieval.block import DATE_END, entity_line, message_line, reasoning_line
from proxy.memory.retrieval.exchange import SEPARATOR
from proxy.memory.retrieval.sources.graph import edge_line
from proxy.models import ReasoningStep, Relationship, Scope
from proxy.stores.base import Store

REASONING_PAGE = 100
MESSAGE_SOURCES = ("conversation", "cross-session")


class Lookup:
    """The items a set of log entries names, fetched once each."""

    def __init__(self, store: Store, scope: Scope) -> None:
        self.store = store
        self.scope = scope
        self.entities: dict[str, dict[str, Any] | None] = {}
        self.messages: dict[str, dict[str, Any] | None] = {}
        self.edges: dict[str, Relationship] = {}
        self.traces: dict[str, dict[str, Any]] = {}
        self._edges_of: set[str] = set()

    async def entity(self, entity_id: str) -> dict[str, Any] | None:
        if entity_id not in self.entities:
            self.entities[entity_id] = await self.store.entity_record(self.scope, entity_id)
        return self.entities[entity_id]

    async def message(self, message_id: str) -> dict[str, Any] | None:
        if message_id not in self.messages:
            self.messages[message_id] = await self.store.message_record(self.scope, message_id)
        return self.messages[message_id]

    async def edges_of(self, entity_ids: Iterable[str]) -> None:
        """Every edge, past ones included, from or to these entities (a graph hit hangs off one of them)."""
        for entity_id in entity_ids:
            if entity_id not in self._edges_of:
                self._edges_of.add(entity_id)
                for edge in await self.store.relationships(self.scope, entity_id, current_only=False):
                    self.edges[edge.id] = edge

    async def all_edges(self) -> None:
        """Every edge of the user: for a graph hit logged without the entity it came from. Read as the
        graph source reads them (the object's kind included), so the line is the block's."""
        subjects = {record["from_id"] async for record in self.store.export(self.scope)
                    if record["kind"] == "relationship"}
        await self.edges_of(sorted(subjects))

    async def traces_named(self, wanted: set[str]) -> None:
        """Reasoning traces by id, newest first, until every wanted one is found or none are left."""
        after = None
        while wanted - set(self.traces):
            rows = await self.store.reasoning_page(self.scope, limit=REASONING_PAGE, after=after)
            for _, record in rows:
                self.traces[record["id"]] = record
            if len(rows) < REASONING_PAGE:
                return
            after = rows[-1][0]


async def resolved(store: Store, scope: Scope, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The log entries, each hit with `text` (its block line today, None when deleted) and `now`."""
    lookup = Lookup(store, scope)
    await _fetch_structure(lookup, rows)
    return [{**row, "log": {**row["log"], "hits": [await _hit(lookup, hit, row["created_at"])
                                                   for hit in _hits(row)]}} for row in rows]


def _hits(row: dict[str, Any]) -> list[dict[str, Any]]:
    hits = row["log"].get("hits", [])
    return [hit for hit in hits if isinstance(hit, dict)] if isinstance(hits, list) else []


async def _fetch_structure(lookup: Lookup, rows: list[dict[str, Any]]) -> None:
    """The edges and traces the hits name: an edge through the entity its graph hit expanded
    (its score names it), then the user's own node, and only then every edge of the user."""
    graph_ids: set[str] = set()
    trace_ids: set[str] = set()
    expanded: set[str] = set()
    for row in rows:
        for hit in _hits(row):
            if hit.get("source") == "graph":
                graph_ids.add(str(hit.get("id")))
                score = hit.get("score")
                if isinstance(score, dict) and isinstance(score.get("entity"), str):
                    expanded.add(score["entity"])
            elif hit.get("source") == "reasoning":
                trace_ids.add(str(hit.get("id")))
    await lookup.edges_of(sorted(expanded))
    if graph_ids - set(lookup.edges):
        user_node = await lookup.store.user_node(lookup.scope)
        if user_node is not None:
            await lookup.edges_of([user_node.id])
    if graph_ids - set(lookup.edges):
        await lookup.all_edges()
    if trace_ids:
        await lookup.traces_named(trace_ids)


async def _hit(lookup: Lookup, hit: dict[str, Any], turn_at: datetime) -> dict[str, Any]:
    source, item_id = hit.get("source"), str(hit.get("id"))
    text, changed = None, False
    if source == "long-term":
        entity = await lookup.entity(item_id)
        if entity is not None:
            text = entity_line(entity["name"], entity["description"])
            changed = _time(entity["updated_at"]) >= turn_at
    elif source in MESSAGE_SOURCES:
        message = await lookup.message(item_id)
        if message is not None:
            text, changed = await _exchange_line(lookup, message, hit.get("exchange"))
    elif source == "graph":
        edge = lookup.edges.get(item_id)
        if edge is not None:
            text = edge_line(edge)
            changed = edge.invalid_at is not None and edge.invalid_at >= turn_at
    elif source == "reasoning":
        trace = lookup.traces.get(item_id)
        if trace is not None:
            steps = [ReasoningStep(s["name"], s["arguments"], s.get("result", "")) for s in trace["steps"]]
            text = reasoning_line(trace["task"], steps, trace["answer"])
    now = "deleted" if text is None else "changed" if changed else "current"
    return {**hit, "text": text, "now": now}


async def _exchange_line(lookup: Lookup, message: dict[str, Any], carried: Any) -> tuple[str, bool]:
    """A message hit's line with the neighbours it carried (in the order said, under the hit's
    date), as the block wrote it; changed when a neighbour has since been deleted."""
    ids = [str(i) for i in carried] if isinstance(carried, list) else []
    found = [await lookup.message(i) for i in ids]
    neighbours = [m for m in found if m is not None]
    said = sorted([message, *neighbours], key=lambda m: (_time(m["created_at"]), m["id"] != message["id"]))
    head, _, _ = message_line(message["role"], _time(message["created_at"]), "").partition(DATE_END)
    date = head.rpartition(" (")[2]
    pieces = []
    for item in said:
        role_and_date, _, text = message_line(item["role"], _time(item["created_at"]), item["content"]).partition(DATE_END)
        pieces.append((role_and_date.rsplit(" (", 1)[0], text))
    first_role, first_text = pieces[0]
    line = f"{first_role} ({date}{DATE_END}{first_text}"
    line += "".join(f"{SEPARATOR}{role}: {text}" for role, text in pieces[1:])
    return line, len(neighbours) < len(ids)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)
