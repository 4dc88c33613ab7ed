"""The graph's writes on the SQLite write connection: one message's facts, or its failure.

The merge's rules are graph_merge.py's; this module runs each of its steps as SQLite SQL,
inside the batch's transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from proxy.extracted import USER_TYPE
from proxy.stores.base import ERROR_MAX_CHARS, ExtractionFailed, RecordFacts
from proxy.stores import graph_merge
from proxy.stores.graph_merge import Step, merge
from proxy.stores.sqlite.rows import clean_text, to_ts

Run = Callable[[str, Sequence[Any]], list[sqlite3.Row]]


def runner(conn: sqlite3.Connection) -> Run:
    """Execute on `conn`, rows by column name (the write connection itself returns tuples)."""
    cursor = conn.cursor()
    cursor.row_factory = sqlite3.Row

    def run(sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
        return cursor.execute(sql, params).fetchall()

    return run


def record_failure(conn: sqlite3.Connection, op: ExtractionFailed) -> None:
    """Count the attempt and end the item's lease; it waits until `retry_at`, or is parked with its error."""
    conn.execute(
        "UPDATE extraction_queue SET attempts = attempts + 1, next_attempt_at = ?, last_error = ?, parked = ?,"
        " claimed_until = NULL, claimed_by = NULL WHERE id = ? AND user_id = ?",
        (to_ts(op.retry_at), clean_text(op.error)[:ERROR_MAX_CHARS], int(op.park), op.queue_id, op.scope.user),
    )


# Another message the user said, no later than this one, that waits for the worker (due by the
# message's time: not the backup of a message mined as it was saved, due 30 s on). Answers,
# queued when extraction mines them, are not the user's: they do not count.
# The unary plus keeps the due index out of the plan: through it SQLite read every user's due
# items to find this user's (0.25 ms a saved turn with a backlog of 1,000 of others'), where
# the user's own, by (user_id, message_id), are few.
_EARLIER_WAITING = (
    "SELECT 1 FROM extraction_queue mine JOIN extraction_queue e ON e.user_id = mine.user_id"
    " JOIN messages m ON m.user_id = e.user_id AND m.id = e.message_id AND m.role = 'user'"
    " WHERE mine.user_id = ? AND mine.message_id = ? AND e.id != mine.id AND +e.parked = 0"
    " AND +e.next_attempt_at <= ? AND e.created_at <= mine.created_at LIMIT 1"
)


def record_facts(conn: sqlite3.Connection, op: RecordFacts) -> None:
    """Dequeue the message and merge its entities and relationships into the user's graph."""
    graph = Graph(runner(conn), op.scope.user, op.scope.agent if op.scope.agent_isolated else None)
    steps = merge(op, to_ts(op.at), clean_text)
    answer = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration:
            return
        answer = graph.run(step)


class Graph:
    """The user's graph (the agent's, under isolation) on the write connection: runs merge steps."""

    def __init__(self, run: Run, user: str, agent: str | None) -> None:
        self._run = run
        self.user = user
        self.agent = agent

    def _first(self, sql: str, params: Sequence[Any]) -> sqlite3.Row | None:
        rows = self._run(sql, params)
        return rows[0] if rows else None

    def run(self, step: Step) -> Any:
        """Run one step; what a read found."""
        user, agent, run = self.user, self.agent, self._run
        match step:
            case graph_merge.Dequeue(queue_id, message_id, at):
                if queue_id is None and run(_EARLIER_WAITING, (user, message_id, at)):
                    run("UPDATE extraction_queue SET next_attempt_at = ? WHERE user_id = ? AND message_id = ?",
                        (at, user, message_id))
                    return False
                return bool(run("DELETE FROM extraction_queue WHERE user_id = ? AND message_id = ?"
                                " AND (? IS NULL OR id = ?) RETURNING id", (user, message_id, queue_id, queue_id)))
            case graph_merge.FindEntity(key):
                return self._first("SELECT * FROM entities WHERE user_id = ? AND ifnull(agent_id, '') = ?"
                                   " AND canonical_name = ?", (user, agent or "", key))
            case graph_merge.FindUserNode():
                return self._first("SELECT * FROM entities WHERE user_id = ? AND ifnull(agent_id, '') = ?"
                                   " AND type = ? ORDER BY seq LIMIT 1", (user, agent or "", USER_TYPE))
            case graph_merge.AreRelated(one, other):
                return bool(run("SELECT 1 FROM relationships WHERE user_id = ? AND ((from_id = ? AND to_id = ?)"
                                " OR (from_id = ? AND to_id = ?)) LIMIT 1", (user, one, other, other, one)))
            case graph_merge.CurrentEdges(from_id, type_):
                return run("SELECT seq, to_id, valid_from, provenance FROM relationships WHERE user_id = ?"
                           " AND from_id = ? AND type = ? AND invalid_at IS NULL", (user, from_id, type_))
            case graph_merge.EnsureUser(at):
                run("INSERT INTO users (id, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING", (user, at))
            case _:
                self._write(step)
        return None

    def _write(self, step: Step) -> None:
        run = self._run
        match step:
            case graph_merge.InsertEntity():
                run("INSERT INTO entities (id, user_id, agent_id, name, canonical_name, type, description, confidence,"
                    " provenance, name_terms, type_terms, description_terms, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (step.entity_id, self.user, self.agent, step.name, step.key, step.type, step.description,
                     step.confidence, step.provenance, *step.terms, step.at, step.at))
            case graph_merge.RewriteEntity():
                run("UPDATE entities SET name = ?, canonical_name = ?, type = ?, description = ?, aliases = ?,"
                    " name_terms = ?, type_terms = ?, description_terms = ? WHERE seq = ?",
                    (step.name, step.key, step.type, step.description, step.aliases, *step.terms, step.seq))
            case graph_merge.TouchEntity(seq, confidence, provenance, at):
                run("UPDATE entities SET confidence = max(confidence, ?), provenance = ?, updated_at = ? WHERE seq = ?",
                    (confidence, provenance, at, seq))
            case graph_merge.MakeUserNode(seq, type_terms):
                run("UPDATE entities SET type = ?, type_terms = ? WHERE seq = ?", (USER_TYPE, type_terms, seq))
            case graph_merge.Absorb(node_id, other_id, other_seq):
                for column in ("from_id", "to_id"):
                    run(f"UPDATE relationships SET {column} = ? WHERE user_id = ? AND {column} = ?",
                        (node_id, self.user, other_id))
                run("DELETE FROM relationships WHERE user_id = ? AND from_id = ? AND to_id = ?",
                    (self.user, node_id, node_id))
                run("DELETE FROM entities WHERE seq = ?", (other_seq,))
            case graph_merge.SetEdgeProvenance(seq, provenance):
                run("UPDATE relationships SET provenance = ? WHERE seq = ?", (provenance, seq))
            case graph_merge.CloseEdges(from_id, type_, at):
                run("UPDATE relationships SET invalid_at = ? WHERE user_id = ? AND from_id = ? AND type = ?"
                    " AND invalid_at IS NULL", (at, self.user, from_id, type_))
            case graph_merge.InsertEdge():
                run("INSERT INTO relationships (id, user_id, agent_id, from_id, type, to_id, valid_from, invalid_at,"
                    " provenance, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (step.edge_id, self.user, self.agent, step.from_id, step.type, step.to_id, step.valid_from,
                     step.invalid_at, step.provenance, step.valid_from))
            case _:
                raise TypeError(f"unknown merge step {type(step).__name__}")
