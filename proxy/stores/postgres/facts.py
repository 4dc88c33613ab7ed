"""The graph's writes on PostgreSQL: one message's facts (RecordFacts).

The merge's rules are graph_merge.py's; this module runs each of its steps as PostgreSQL
SQL. It runs inside the batch's transaction, after the user's advisory lock, so two
replicas never merge into one user's graph at once.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from proxy.extracted import USER_TYPE
from proxy.stores.base import RecordFacts
from proxy.stores import graph_merge
from proxy.stores.graph_merge import Step, merge
from proxy.stores.postgres.rows import clean_text, utc


async def record_facts(conn: asyncpg.Connection, op: RecordFacts) -> None:
    """Dequeue the message and merge its entities and relationships into the user's graph."""
    graph = Graph(conn, op.scope.user, op.scope.agent if op.scope.agent_isolated else None)
    steps = merge(op, utc(op.at), clean_text)
    answer = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration:
            return
        answer = await graph.run(step)


# Another message the user said, no later than this one, that waits for the worker (due by the
# message's time: not the backup of a message mined as it was saved, due 30 s on), claimed by a
# replica or not. Answers are queued too, and the worker passes over them without facts.
_EARLIER_WAITING = (
    "SELECT 1 FROM extraction_queue mine JOIN extraction_queue e ON e.user_id = mine.user_id"
    " JOIN messages m ON m.user_id = e.user_id AND m.id = e.message_id AND m.role = 'user'"
    " WHERE mine.user_id = $1 AND mine.message_id = $2 AND e.id != mine.id AND NOT e.parked"
    " AND e.next_attempt_at <= $3 AND e.created_at <= mine.created_at LIMIT 1"
)


class Graph:
    """The user's graph (the agent's, under isolation) in the batch's transaction: runs merge steps."""

    def __init__(self, conn: asyncpg.Connection, user: str, agent: str | None) -> None:
        self._conn = conn
        self.user = user
        self.agent = agent

    async def run(self, step: Step) -> Any:
        """Run one step; what a read found."""
        conn, user, agent = self._conn, self.user, self.agent
        match step:
            case graph_merge.Dequeue(queue_id, message_id, at):
                if queue_id is None and await conn.fetchval(_EARLIER_WAITING, user, message_id, at):
                    await conn.execute("UPDATE extraction_queue SET next_attempt_at = $3 WHERE user_id = $1"
                                       " AND message_id = $2", user, message_id, at)
                    return False
                return await conn.fetchval("DELETE FROM extraction_queue WHERE ($1::bigint IS NULL OR id = $1)"
                                           " AND user_id = $2 AND message_id = $3 RETURNING id",
                                           queue_id, user, message_id) is not None
            case graph_merge.FindEntity(key):
                return await conn.fetchrow("SELECT * FROM entities WHERE user_id = $1 AND coalesce(agent_id, '') = $2"
                                           " AND canonical_name = $3", user, agent or "", key)
            case graph_merge.FindUserNode():
                return await conn.fetchrow("SELECT * FROM entities WHERE user_id = $1 AND coalesce(agent_id, '') = $2"
                                           " AND type = $3 ORDER BY seq LIMIT 1", user, agent or "", USER_TYPE)
            case graph_merge.AreRelated(one, other):
                return bool(await conn.fetchval("SELECT 1 FROM relationships WHERE user_id = $1 AND ((from_id = $2"
                                                " AND to_id = $3) OR (from_id = $3 AND to_id = $2)) LIMIT 1",
                                                user, one, other))
            case graph_merge.CurrentEdges(from_id, type_):
                return await conn.fetch("SELECT seq, to_id, valid_from, provenance FROM relationships"
                                        " WHERE user_id = $1 AND from_id = $2 AND type = $3 AND invalid_at IS NULL",
                                        user, from_id, type_)
            case graph_merge.EnsureUser(at):
                await conn.execute("INSERT INTO users (id, created_at) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                                   user, at)
            case _:
                await self._write(step)
        return None

    async def _write(self, step: Step) -> None:
        execute = self._conn.execute
        match step:
            case graph_merge.InsertEntity():
                await execute(
                    "INSERT INTO entities (id, user_id, agent_id, name, canonical_name, type, description, confidence,"
                    " provenance, name_terms, type_terms, description_terms, created_at, updated_at)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13)",
                    step.entity_id, self.user, self.agent, step.name, step.key, step.type, step.description,
                    step.confidence, step.provenance, *step.terms, step.at)
            case graph_merge.RewriteEntity():
                await execute(
                    "UPDATE entities SET name = $1, canonical_name = $2, type = $3, description = $4, aliases = $5,"
                    " name_terms = $6, type_terms = $7, description_terms = $8 WHERE seq = $9",
                    step.name, step.key, step.type, step.description, step.aliases, *step.terms, step.seq)
            case graph_merge.TouchEntity(seq, confidence, provenance, at):
                await execute("UPDATE entities SET confidence = GREATEST(confidence, $1), provenance = $2,"
                              " updated_at = $3 WHERE seq = $4", confidence, provenance, at, seq)
            case graph_merge.MakeUserNode(seq, type_terms):
                await execute("UPDATE entities SET type = $1, type_terms = $2 WHERE seq = $3",
                              USER_TYPE, type_terms, seq)
            case graph_merge.Absorb(node_id, other_id, other_seq):
                for column in ("from_id", "to_id"):
                    await execute(f"UPDATE relationships SET {column} = $1 WHERE user_id = $2 AND {column} = $3",
                                  node_id, self.user, other_id)
                await execute("DELETE FROM relationships WHERE user_id = $1 AND from_id = $2 AND to_id = $2",
                              self.user, node_id)
                await execute("DELETE FROM entities WHERE seq = $1", other_seq)
            case graph_merge.SetEdgeProvenance(seq, provenance):
                await execute("UPDATE relationships SET provenance = $1 WHERE seq = $2", provenance, seq)
            case graph_merge.CloseEdges(from_id, type_, at):
                await execute("UPDATE relationships SET invalid_at = $1 WHERE user_id = $2 AND from_id = $3"
                              " AND type = $4 AND invalid_at IS NULL", at, self.user, from_id, type_)
            case graph_merge.InsertEdge():
                await execute(
                    "INSERT INTO relationships (id, user_id, agent_id, from_id, type, to_id, valid_from, invalid_at,"
                    " provenance, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $7)",
                    step.edge_id, self.user, self.agent, step.from_id, step.type, step.to_id, step.valid_from,
                    step.invalid_at, step.provenance)
            case _:
                raise TypeError(f"unknown merge step {type(step).__name__}")
