"""The write ops of one `PostgresStore.apply` batch, inside its transaction.

The same writes as sqlite_batch.py, in PostgreSQL's dialect: every write is an
`INSERT ... ON CONFLICT` on the same per-user unique keys, so a retried batch, or the
same turn written by two replicas, saves once. Per-user ordering across replicas comes
from the transaction-scoped advisory locks `PostgresStore.apply` takes first.

Each op is one statement (its parts joined by data-modifying CTEs), and a run of ops of
the same kind goes to the server as one pipelined `executemany`: a round trip to the
database costs far more than the work of a write, so a batch costs a round trip per run
of ops, not one per row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from itertools import groupby
from typing import Any

import asyncpg

from proxy.stores.base import (
    ExtractionFailed,
    FinishTurn,
    RecordFacts,
    RecordToolCalls,
    SaveBlock,
    SetTurnStatus,
    StartTurn,
    StoreMemory,
    WriteOp,
    text_hash,
)
from proxy.stores.postgres_admin import store_memory
from proxy.stores.postgres_facts import record_facts
from proxy.stores.postgres_rows import clean_text, utc
from proxy.stores.sqlite_facts import ERROR_MAX_CHARS
from proxy.stores.sqlite_rows import index_terms, new_id, reasoning_terms, steps_json

INJECTION_LOG_KEEP = 20  # SPEC 8: the injection log of the user's last 20 turns
# A turn still pending this long after its last write died with the replica serving it.
# Younger pending turns may be in flight on another replica, so recovery leaves them be.
STALE_PENDING = timedelta(minutes=10)

# $1 user, $2 conversation, $3 agent, $4 time: the user and the conversation exist, and the
# conversation's last activity only ever moves forward.
_CONVERSATION = (
    "WITH u AS (INSERT INTO users (id, created_at) VALUES ($1, $4) ON CONFLICT DO NOTHING),"
    " c AS (INSERT INTO conversations AS c (user_id, id, agent_id, created_at, last_active_at)"
    " VALUES ($1, $2, $3, $4, $4) ON CONFLICT (user_id, id)"
    " DO UPDATE SET last_active_at = GREATEST(c.last_active_at, excluded.last_active_at)),"
)
# $5 turn key, $6 role, $7 message id, $8 content, $9 hash, $10 terms, $11 save it: the
# message unless the turn holds the same text in this role, queued for extraction if new.
_MESSAGE = (
    " m AS (INSERT INTO messages (id, user_id, conversation_id, agent_id, turn_key, role, content, content_hash,"
    " terms, created_at) SELECT $7, $1, $2, $3, $5, $6, $8, $9, $10, $4 WHERE $11"
    " ON CONFLICT DO NOTHING RETURNING id, user_id, created_at)"
    " INSERT INTO extraction_queue (user_id, message_id, next_attempt_at, created_at)"
    " SELECT user_id, id, created_at, created_at FROM m ON CONFLICT DO NOTHING"
)
START_TURN = (
    _CONVERSATION
    + " t AS (INSERT INTO turns (user_id, turn_key, conversation_id, agent_id, history_hash, status, created_at,"
    " updated_at) VALUES ($1, $5, $2, $3, $12, 'pending', $4, $4) ON CONFLICT DO NOTHING),"
    + _MESSAGE
)
FINISH_TURN = (
    _CONVERSATION
    # Upsert: the StartTurn batch may have been lost, the answer is still worth keeping.
    + " t AS (INSERT INTO turns (user_id, turn_key, conversation_id, agent_id, history_hash, status, created_at,"
    " updated_at) VALUES ($1, $5, $2, $3, '', 'complete', $4, $4)"
    " ON CONFLICT (user_id, turn_key) DO UPDATE SET status = 'complete', updated_at = excluded.updated_at),"
    # $12 trace id, $13 task, $14 steps, $15 terms, $16 has steps: the trace, once per turn.
    " x AS (INSERT INTO reasoning (id, user_id, agent_id, conversation_id, turn_key, task, steps, answer, terms,"
    " created_at) SELECT $12, $1, $3, $2, $5, $13, $14, $8, $15, $4 WHERE $16 ON CONFLICT DO NOTHING),"
    + _MESSAGE
)
RECORD_TOOL_CALLS = (
    "INSERT INTO turn_tool_calls (user_id, call_id, turn_key, name, arguments, created_at)"
    " SELECT $1, c.id, $2, c.name, c.arguments, $3 FROM unnest($4::text[], $5::text[], $6::text[])"
    " AS c(id, name, arguments) WHERE EXISTS (SELECT 1 FROM turns WHERE user_id = $1 AND turn_key = $2)"
    " ON CONFLICT DO NOTHING"
)
# Count the attempt; the item waits until the retry time, or is parked with its error.
EXTRACTION_FAILED = (
    "UPDATE extraction_queue SET attempts = attempts + 1, next_attempt_at = $1, last_error = $2, parked = $3,"
    " claimed_until = NULL WHERE id = $4 AND user_id = $5"
)
SET_TURN_STATUS = (
    "UPDATE turns SET status = $1, updated_at = $2 WHERE user_id = $3 AND turn_key = $4 AND status <> 'complete'"
)
# First block wins, so every step of a tool loop carries the same bytes; then it is logged
# and the log trimmed. The DELETE cannot see the row its own statement inserts, so it keeps
# one old row fewer when a row went in.
SAVE_BLOCK = (
    "WITH b AS (UPDATE turns SET block = $1, injected = $2, updated_at = coalesce($3, now())"
    " WHERE user_id = $4 AND turn_key = $5 AND block IS NULL RETURNING user_id, turn_key, updated_at),"
    " i AS (INSERT INTO injections (user_id, turn_key, log, created_at) SELECT user_id, turn_key, $6, updated_at"
    " FROM b ON CONFLICT DO NOTHING RETURNING seq)"
    " DELETE FROM injections WHERE user_id = $4 AND EXISTS (SELECT 1 FROM i) AND seq NOT IN"
    " (SELECT seq FROM injections WHERE user_id = $4 ORDER BY seq DESC LIMIT $7 - 1)"
)


async def recover(conn: asyncpg.Connection) -> None:
    """Turns pending for longer than STALE_PENDING died with the process that served them."""
    async with conn.transaction():
        # A pending turn whose answer was saved did finish; only the status write was lost.
        await conn.execute(
            "UPDATE turns t SET status = 'complete', updated_at = now() WHERE status = 'pending'"
            " AND updated_at < now() - $1::interval AND EXISTS (SELECT 1 FROM messages m"
            " WHERE m.user_id = t.user_id AND m.turn_key = t.turn_key AND m.role = 'assistant')",
            STALE_PENDING,
        )
        await conn.execute(
            "UPDATE turns SET status = 'interrupted', updated_at = now()"
            " WHERE status = 'pending' AND updated_at < now() - $1::interval",
            STALE_PENDING,
        )


async def apply_ops(conn: asyncpg.Connection, ops: Sequence[WriteOp]) -> None:
    """Apply `ops` in order on a connection inside a transaction, a run of one kind at a time."""
    for _, run in groupby(ops, key=lambda op: type(op)):
        group = list(run)
        if isinstance(group[0], RecordFacts):  # a merge reads the graph as it goes: one op at a time
            for op in group:
                await record_facts(conn, op)  # type: ignore[arg-type]
        elif isinstance(group[0], StoreMemory):
            for op in group:
                await store_memory(conn, op)  # type: ignore[arg-type]
        else:
            await _execute(conn, [statement(op) for op in group])


async def _execute(conn: asyncpg.Connection, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
    """Statements of one kind: one round trip, pipelined by executemany when there are several."""
    sql = statements[0][0]
    if len(statements) == 1:
        await conn.execute(sql, *statements[0][1])
    else:
        await conn.executemany(sql, [args for _, args in statements])


def statement(op: WriteOp) -> tuple[str, tuple[Any, ...]]:
    """The one SQL statement of a write op (all but RecordFacts and StoreMemory), with its arguments."""
    if isinstance(op, StartTurn):
        return START_TURN, _start_turn(op)
    if isinstance(op, FinishTurn):
        return FINISH_TURN, _finish_turn(op)
    if isinstance(op, RecordToolCalls):
        calls = [tuple(clean_text(part) for part in call) for call in op.calls]
        return RECORD_TOOL_CALLS, (op.scope.user, op.turn_key, utc(op.at), [c[0] for c in calls],
                                   [c[1] for c in calls], [c[2] for c in calls])
    if isinstance(op, SetTurnStatus):
        return SET_TURN_STATUS, (op.status, utc(op.at), op.scope.user, op.turn_key)
    if isinstance(op, ExtractionFailed):
        return EXTRACTION_FAILED, (utc(op.retry_at), clean_text(op.error)[:ERROR_MAX_CHARS], op.park, op.queue_id,
                                   op.scope.user)
    if isinstance(op, SaveBlock):
        return SAVE_BLOCK, (clean_text(op.block), op.injected, utc(op.at) if op.at else None, op.scope.user,
                            op.turn_key, json.dumps(op.log, default=str), INJECTION_LOG_KEEP)
    raise TypeError(f"unknown write op {type(op).__name__}")


def _message(text: str, content_hash: str | None = None) -> tuple[str, str, str, str]:
    """(id, stored content, hash, index terms) of a message about to be saved."""
    content = clean_text(text)
    return new_id(), content, content_hash or text_hash(text), index_terms(content)


def _start_turn(op: StartTurn) -> tuple[Any, ...]:
    """Conversation, pending turn and (when persisted) the user's message."""
    save = op.user_text is not None and op.persist
    message = _message(op.user_text or "") if save else (new_id(), "", "", "")
    return (op.scope.user, op.conversation_id, op.scope.agent, utc(op.at), op.turn_key, "user", *message, save,
            op.history_hash)


def _finish_turn(op: FinishTurn) -> tuple[Any, ...]:
    """The answer (once per text, matched later by the hash the client received), the trace, status complete."""
    message = _message(op.answer, op.answer_hash)
    task = clean_text(op.task)
    trace = (new_id(), task, steps_json(op.steps), reasoning_terms(task, op.steps, message[1]), bool(op.steps))
    return (op.scope.user, op.conversation_id, op.scope.agent, utc(op.at), op.turn_key, "assistant", *message, True,
            *trace)
