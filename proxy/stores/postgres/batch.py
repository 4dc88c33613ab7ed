"""The write ops of one `PostgresStore.apply` batch, inside its transaction.

The same writes as sqlite/batch.py, in PostgreSQL's dialect: every write is an
`INSERT ... ON CONFLICT` on the same per-user unique keys, so a retried batch, or the
same turn written by two replicas, saves once. Per-user ordering across replicas comes
from the transaction-scoped advisory locks `PostgresStore.apply` takes first.

Each op but the graph's is one execution of the APPLY statement (its parts joined by
data-modifying CTEs and guarded by the op's kind), so a run of them goes to the server as
one pipelined `executemany`: a round trip to the database costs far more than the work of
a write, so a batch costs a round trip, not one per op. Under load a round trip costs more
still: its reply waits for the event loop's next pass among hundreds of streams. A graph
merge (RecordFacts with facts, StoreMemory) reads as it writes and runs op by op
(postgres/facts.py, postgres/admin.py); a RecordFacts with nothing to merge (most messages
state no fact) only dequeues, as one more kind of APPLY. A turn's message embedded before the
commit (memory/vectors/filler.py) is saved with its vector by the same APPLY: no read of it
back and no second transaction for the vector.

Ops of different users touch different rows, so a batch need not run in submission order,
only each user's ops in theirs: `runs` groups the batch so that each statement runs once for
as many users' ops as it can (a graph merge or a response id between two turns' writes of one
user no longer splits every other user's run of APPLY in two).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import asyncpg
import numpy as np

from proxy.ids import new_id
from proxy.stores.base import (
    ERROR_MAX_CHARS,
    HOOK_CONTEXT_KEEP,
    TURN_OPS,
    DropHookContext,
    ExtractionFailed,
    FinishTurn,
    ItemVector,
    QueueHookContext,
    RecordFacts,
    RecordResponse,
    RecordToolCalls,
    SaveBlock,
    SaveHookStart,
    SetTurnStatus,
    StartTurn,
    StoreMemory,
    WriteOp,
    text_hash,
)
from proxy.stores.generations import deleted_keys, generation_key
from proxy.stores.postgres.admin import store_memory
from proxy.stores.postgres.facts import record_facts
from proxy.stores.postgres.rows import clean_text, utc
from proxy.stores.postgres.schema import CONTEXT_SQL
from proxy.stores.indexed_text import index_terms, reasoning_terms, steps_json
from proxy.stores.vector_sql import EMBED_CHARS

INJECTION_LOG_KEEP = 20  # the memory API shows the injection log of the user's last 20 turns
# A turn still pending this long after its last write died with the replica serving it.
# Younger pending turns may be in flight on another replica, so recovery leaves them be.
STALE_PENDING = timedelta(minutes=10)

# Every op but the graph's is one statement: one SQL text for all of them, each part
# guarded by the op's kind, so a whole batch goes to the server as one pipelined
# executemany, in order, whatever kinds it mixes (a round trip costs far more than a write).
_PARAMETERS = (
    "kind", "user", "conversation", "agent", "at", "turn_key",
    "role", "message_id", "content", "hash", "terms", "save",  # the message of a start or a finish
    "due",  # when the extraction worker may take a start's message (NULL: at once)
    "queued",  # whether the message goes on the extraction queue at all
    "vector_model", "vector",  # the message's vector, saved with it (NULL: the filler's, after the commit)
    "history",  # start
    "trace_id", "task", "steps", "trace_terms", "has_steps",  # finish: the reasoning trace
    "call_ids", "call_names", "call_args", "exchange",  # tool calls
    "status",  # status
    "block", "injected", "log", "keep", "prompt", "hook_context",  # block
    "queue_id", "error", "park",  # extraction failed (and dequeue: queue_id, message_id)
    "deleted_keys", "generation",  # a turn's op: skipped once its user or conversation was deleted since it began
    "user_generation_key",  # tool calls, block: their text is dropped once anything of the user was deleted since
)
_APPLY_TEMPLATE = """
WITH live AS (SELECT NOT EXISTS (SELECT 1 FROM generations WHERE id = ANY({deleted_keys}::text[])
    AND generation > {generation}) AS ok),
u AS (INSERT INTO users (id, created_at) SELECT {user}, {at} WHERE {kind} IN ('start', 'finish') AND {live}
    ON CONFLICT DO NOTHING),
c AS (INSERT INTO conversations AS c (user_id, id, agent_id, created_at, last_active_at)
    SELECT {user}, {conversation}, {agent}, {at}, {at} WHERE {kind} IN ('start', 'finish') AND {live}
    ON CONFLICT (user_id, id) DO UPDATE SET last_active_at = GREATEST(c.last_active_at, excluded.last_active_at)),
started AS (INSERT INTO turns (user_id, turn_key, conversation_id, agent_id, history_hash, status, created_at,
    updated_at) SELECT {user}, {turn_key}, {conversation}, {agent}, {history}, 'pending', {at}, {at}
    WHERE {kind} = 'start' AND {live} ON CONFLICT DO NOTHING),
-- An upsert: the start's batch may have been lost, the answer is still worth keeping.
finished AS (INSERT INTO turns (user_id, turn_key, conversation_id, agent_id, history_hash, status, created_at,
    updated_at) SELECT {user}, {turn_key}, {conversation}, {agent}, '', 'complete', {at}, {at}
    WHERE {kind} = 'finish' AND {live}
    ON CONFLICT (user_id, turn_key) DO UPDATE SET status = 'complete', updated_at = excluded.updated_at),
trace AS (INSERT INTO reasoning (id, user_id, agent_id, conversation_id, turn_key, task, steps, answer, terms,
    created_at) SELECT {trace_id}, {user}, {agent}, {conversation}, {turn_key}, {task}, {steps}, {content},
    {trace_terms}, {at} WHERE {kind} = 'finish' AND {has_steps} AND {live} ON CONFLICT DO NOTHING),
calls AS (INSERT INTO turn_tool_calls (user_id, call_id, turn_key, name, arguments, created_at, exchange)
    -- An exchange is kept only if nothing was deleted since its step began: it may quote what was.
    SELECT {user}, c.id, {turn_key}, c.name, c.arguments, {at}, CASE WHEN EXISTS (SELECT 1 FROM generations
        WHERE id = {user_generation_key}::text AND generation > {generation}) THEN NULL ELSE {exchange}::text END
    FROM unnest({call_ids}::text[], {call_names}::text[], {call_args}::text[]) AS c(id, name, arguments)
    WHERE {kind} = 'calls' AND {live} AND EXISTS (SELECT 1 FROM turns WHERE user_id = {user} AND turn_key = {turn_key})
    ON CONFLICT (user_id, call_id, turn_key) DO UPDATE SET name = excluded.name,
        arguments = excluded.arguments, created_at = excluded.created_at, exchange = excluded.exchange),
-- A turn that completed stays complete.
status AS (UPDATE turns SET status = {status}, updated_at = {at}
    WHERE {kind} = 'status' AND {live} AND user_id = {user} AND turn_key = {turn_key} AND status <> 'complete'),
-- The first block wins, so every step of a tool loop carries the same bytes, unless it was
-- computed before a deletion; it is logged and the log trimmed. A block computed before a
-- deletion that committed first may hold the deleted items: its text is not kept (the turn's
-- next step computes it again). A hook's rewritten prompt and context stay with the turn
-- when a block computed again carries none. The DELETE cannot see the
-- row its own statement inserts, so it keeps one old row fewer when a row went in.
block AS (UPDATE turns SET block = CASE WHEN EXISTS (SELECT 1 FROM generations
        WHERE id = {user_generation_key}::text AND generation > {generation}) THEN NULL ELSE {block} END,
    injected = {injected}, block_generation = {generation},
    prompt = coalesce({prompt}, prompt), hook_context = coalesce({hook_context}, hook_context),
    updated_at = coalesce({at}, now())
    WHERE {kind} = 'block' AND {live} AND user_id = {user} AND turn_key = {turn_key}
    AND (block IS NULL OR block_generation < {generation})
    RETURNING user_id, turn_key, updated_at),
logged AS (INSERT INTO injections (user_id, turn_key, log, created_at)
    SELECT user_id, turn_key, {log}, updated_at FROM block
    ON CONFLICT (user_id, turn_key) DO UPDATE SET log = excluded.log RETURNING seq),
trimmed AS (DELETE FROM injections WHERE user_id = {user} AND EXISTS (SELECT 1 FROM logged)
    AND seq NOT IN (SELECT seq FROM injections WHERE user_id = {user} ORDER BY seq DESC LIMIT {keep} - 1)),
-- An extraction attempt failed: count it; the item waits until {at}, or is parked.
failed AS (UPDATE extraction_queue SET attempts = attempts + 1, next_attempt_at = {at}, last_error = {error},
    parked = {park}, claimed_until = NULL, claimed_by = NULL
    WHERE {kind} = 'failed' AND id = {queue_id} AND user_id = {user}),
-- A RecordFacts with nothing to merge: graph_merge.Dequeue, then EnsureUser (postgres/facts.py does the
-- same for one with facts). Facts extracted as the message was saved wait while an earlier message of the
-- user waits for the worker: its item is made due now, and the worker applies the two in order.
waits AS (SELECT EXISTS (SELECT 1 FROM extraction_queue mine JOIN extraction_queue e ON e.user_id = mine.user_id
    JOIN messages em ON em.user_id = e.user_id AND em.id = e.message_id AND em.role = 'user'
    WHERE mine.user_id = {user} AND mine.message_id = {message_id} AND e.id != mine.id AND NOT e.parked
    AND e.next_attempt_at <= {at} AND e.created_at <= mine.created_at) AS yes
    WHERE {kind} = 'dequeue' AND {queue_id}::bigint IS NULL),
postponed AS (UPDATE extraction_queue SET next_attempt_at = {at}
    WHERE {kind} = 'dequeue' AND coalesce((SELECT yes FROM waits), false)
    AND user_id = {user} AND message_id = {message_id}),
dequeued AS (DELETE FROM extraction_queue WHERE {kind} = 'dequeue' AND NOT coalesce((SELECT yes FROM waits), false)
    AND ({queue_id}::bigint IS NULL OR id = {queue_id}) AND user_id = {user} AND message_id = {message_id}
    RETURNING id),
known AS (INSERT INTO users (id, created_at) SELECT {user}, {at} WHERE EXISTS (SELECT 1 FROM dequeued)
    ON CONFLICT DO NOTHING),
-- The message unless its turn holds the same text in this role, queued for extraction if new and its
-- role is mined.
m AS (INSERT INTO messages (id, user_id, conversation_id, agent_id, turn_key, role, content, content_hash, terms,
    context, created_at) SELECT {message_id}, {user}, {conversation}, {agent}, {turn_key}, {role}, {content}, {hash},
    {terms}, {context}, {at}
    WHERE {kind} IN ('start', 'finish') AND {save} AND {live}
    ON CONFLICT DO NOTHING RETURNING id, user_id, created_at),
-- Its vector, when the message is new (so of exactly the text the vector was computed from).
embedded AS (INSERT INTO embeddings (user_id, kind, item_id, model, dim, vector, created_at)
    SELECT user_id, 'message', id, {vector_model}::text, cardinality({vector}::real[]), {vector}::real[], now()
    FROM m WHERE {vector}::real[] IS NOT NULL ON CONFLICT DO NOTHING)
INSERT INTO extraction_queue (user_id, message_id, next_attempt_at, created_at)
    SELECT user_id, id, coalesce({due}::timestamptz, created_at), created_at FROM m WHERE {queued}
    ON CONFLICT DO NOTHING
"""
_NUMBERED = {name: f"${n}" for n, name in enumerate(_PARAMETERS, start=1)}
# A turn stays in the conversation it was saved in: a later write naming another (a step
# identified while the store could not be asked) goes to the turn's own (sqlite/batch.py).
_TURNS_CONVERSATION = (f"coalesce((SELECT t.conversation_id FROM turns t WHERE t.user_id = {_NUMBERED['user']}"
                       f" AND t.turn_key = {_NUMBERED['turn_key']}), {_NUMBERED['conversation']}::text)")
APPLY = _APPLY_TEMPLATE.format(**{**_NUMBERED, "conversation": _TURNS_CONVERSATION,
                                   "live": "(SELECT ok FROM live)"},
                               context=CONTEXT_SQL.format(_NUMBERED["user"], _TURNS_CONVERSATION, _NUMBERED["at"]))


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
    """Apply `ops`, each user's in order, on a connection inside a transaction."""
    for kind, group in runs(ops):
        if kind is RecordResponse and len(group) > 1:
            await conn.executemany(RECORD_RESPONSE, [_response_arguments(op) for op in group])  # type: ignore[arg-type]
        elif kind is not _APPLIED:  # a merge reads the graph as it goes: one op at a time
            for op in group:
                await _apply_one(conn, op)
        elif len(group) == 1:
            await conn.execute(APPLY, *arguments(group[0]))
        else:
            await conn.executemany(APPLY, [arguments(op) for op in group])


# A graph merge reads the graph as it goes; a response id and hook context are rare: one op at a time.
_ONE_AT_A_TIME = (RecordFacts, StoreMemory, RecordResponse, QueueHookContext, DropHookContext, SaveHookStart)
_APPLIED = object()  # the statement kind of the ops APPLY runs


def _statement(op: WriteOp) -> object:
    """Which statement runs the op: APPLY's (_APPLIED), or the op's own (its type)."""
    if isinstance(op, RecordFacts) and _only_dequeues(op):
        return _APPLIED
    return type(op) if isinstance(op, _ONE_AT_A_TIME) else _APPLIED


def _only_dequeues(op: RecordFacts) -> bool:
    """A RecordFacts with nothing to merge: graph_merge.merge would only dequeue and ensure the user."""
    return not (op.entities or op.relationships or op.user_node or op.user_alias)


def runs(ops: Sequence[WriteOp]) -> Iterator[tuple[object, list[WriteOp]]]:
    """The batch as runs of one statement kind each, every user's ops in their order.

    Each run takes, from every user, the ops of the kind at the head of that user's line: the kind
    of the earliest op not yet run. Ops of different users commute (every row is one user's), so
    only each user's order is kept; within a run the ops keep the batch's order.
    """
    lines: dict[str, deque[tuple[int, WriteOp, object]]] = {}
    for index, op in enumerate(ops):
        lines.setdefault(op.scope.user, deque()).append((index, op, _statement(op)))
    while lines:
        kind = min((line[0] for line in lines.values()), key=lambda head: head[0])[2]
        taken: list[tuple[int, WriteOp]] = []
        for user in list(lines):
            line = lines[user]
            while line and line[0][2] is kind:
                index, op, _ = line.popleft()
                taken.append((index, op))
            if not line:
                del lines[user]
        yield kind, [op for _, op in sorted(taken, key=lambda item: item[0])]


async def _apply_one(conn: asyncpg.Connection, op: WriteOp) -> None:
    if isinstance(op, RecordResponse):
        await record_response(conn, op)
    elif isinstance(op, RecordFacts):
        await record_facts(conn, op)
    elif isinstance(op, StoreMemory):
        if not await _deleted_since(conn, op):
            await store_memory(conn, op)
    elif isinstance(op, QueueHookContext):
        await queue_hook_context(conn, op)
    elif isinstance(op, DropHookContext):
        await conn.execute("DELETE FROM hook_context WHERE user_id = $1 AND conversation_id = $2 AND seq <= $3",
                           op.scope.user, op.conversation_id, op.upto_seq)
    elif isinstance(op, SaveHookStart):
        await save_hook_start(conn, op)


async def _deleted_since(conn: asyncpg.Connection, op: StoreMemory) -> bool:
    """True when a turn's memory's user or conversation was deleted after the turn began."""
    if op.generation is None:
        return False
    return bool(await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM generations WHERE id = ANY($1::text[]) AND generation > $2)",
        deleted_keys(op.scope.user, op.generation.conversation_id), op.generation.number))


RECORD_RESPONSE = (
    "INSERT INTO responses (user_id, response_id, turn_key, conversation_id, parent_id, created_at, provider_id)"
    " SELECT user_id, $1, turn_key, conversation_id, $2, $3, $6 FROM turns WHERE user_id = $4 AND turn_key = $5"
    " ON CONFLICT DO NOTHING")


async def record_response(conn: asyncpg.Connection, op: RecordResponse) -> None:
    """Remember a response id in its turn's conversation (skipped when the turn is unknown)."""
    await conn.execute(RECORD_RESPONSE, *_response_arguments(op))


def _response_arguments(op: RecordResponse) -> tuple[Any, ...]:
    return (clean_text(op.response_id), op.parent_id and clean_text(op.parent_id), utc(op.at), op.scope.user,
            op.turn_key, op.provider_id and clean_text(op.provider_id))


async def queue_hook_context(conn: asyncpg.Connection, op: QueueHookContext) -> None:
    """Queue a stop hook's context for the conversation's next turn; past HOOK_CONTEXT_KEEP the oldest go.

    Skipped when the conversation is gone, or its user or it was deleted after the turn began.
    """
    keys, generation = ((deleted_keys(op.scope.user, op.generation.conversation_id), op.generation.number)
                        if op.generation is not None else ([], 0))
    inserted = await conn.fetchval(
        "INSERT INTO hook_context (user_id, conversation_id, text, created_at)"
        " SELECT user_id, id, $3, $4 FROM conversations WHERE user_id = $1 AND id = $2"
        " AND NOT EXISTS (SELECT 1 FROM generations WHERE id = ANY($5::text[]) AND generation > $6)"
        " RETURNING seq",
        op.scope.user, op.conversation_id, clean_text(op.text), utc(op.at), keys, generation)
    if inserted is not None:
        await conn.execute("DELETE FROM hook_context WHERE user_id = $1 AND conversation_id = $2 AND seq NOT IN"
                           " (SELECT seq FROM hook_context WHERE user_id = $1 AND conversation_id = $2"
                           " ORDER BY seq DESC LIMIT $3)", op.scope.user, op.conversation_id, HOOK_CONTEXT_KEEP)


async def save_hook_start(conn: asyncpg.Connection, op: SaveHookStart) -> None:
    """Keep a turn's hook rewrite and context while it has no block (skipped when its user or
    conversation was deleted after the turn began)."""
    keys, generation = ((deleted_keys(op.scope.user, op.generation.conversation_id), op.generation.number)
                        if op.generation is not None else ([], 0))
    await conn.execute(
        "UPDATE turns SET prompt = coalesce($3, prompt), hook_context = coalesce($4, hook_context), updated_at = $5"
        " WHERE user_id = $1 AND turn_key = $2 AND block IS NULL"
        " AND NOT EXISTS (SELECT 1 FROM generations WHERE id = ANY($6::text[]) AND generation > $7)",
        op.scope.user, op.turn_key, clean_text(op.prompt) if op.prompt is not None else None,
        clean_text(op.context) if op.context is not None else None, utc(op.at), keys, generation)


def arguments(op: WriteOp) -> tuple[Any, ...]:
    """The APPLY arguments of an op (all but StoreMemory and a RecordFacts with facts), in _PARAMETERS order."""
    values: dict[str, Any] = {"user": op.scope.user, "agent": op.scope.agent, "deleted_keys": [], "generation": 0}
    if isinstance(op, TURN_OPS) and op.generation is not None:
        values.update(deleted_keys=deleted_keys(op.scope.user, op.generation.conversation_id),
                      generation=op.generation.number)
    if isinstance(op, StartTurn):
        save = op.user_text is not None and op.persist
        values.update(kind="start", conversation=op.conversation_id, at=utc(op.at), turn_key=op.turn_key,
                      history=op.history_hash, due=None if op.extract_from is None else utc(op.extract_from),
                      queued=op.queued,
                      **_message("user", op.user_text or "", save, message_id=op.message_id, vector=op.vector))
    elif isinstance(op, FinishTurn):
        values.update(kind="finish", conversation=op.conversation_id, at=utc(op.at), turn_key=op.turn_key,
                      queued=op.queued, **_message("assistant", op.answer, True, op.answer_hash, vector=op.vector),
                      **_trace(op))
    elif isinstance(op, RecordToolCalls):
        # Each id once (the last): an upsert may not touch one row twice in a statement.
        calls = list({call[0]: call for call in ([clean_text(part) for part in c] for c in op.calls)}.values())
        values.update(kind="calls", at=utc(op.at), turn_key=op.turn_key, call_ids=[c[0] for c in calls],
                      call_names=[c[1] for c in calls], call_args=[c[2] for c in calls],
                      exchange=clean_text(op.exchange) if op.exchange is not None else None,
                      user_generation_key=generation_key(op.scope.user) if op.generation is not None else None)
    elif isinstance(op, SetTurnStatus):
        values.update(kind="status", at=utc(op.at), turn_key=op.turn_key, status=op.status)
    elif isinstance(op, SaveBlock):
        values.update(kind="block", at=utc(op.at) if op.at else None, turn_key=op.turn_key,
                      block=clean_text(op.block), injected=op.injected, log=json.dumps(op.log, default=str),
                      keep=INJECTION_LOG_KEEP, prompt=clean_text(op.prompt) if op.prompt is not None else None,
                      hook_context=clean_text(op.context) if op.context is not None else None,
                      user_generation_key=generation_key(op.scope.user))
    elif isinstance(op, RecordFacts):  # one with nothing to merge (_only_dequeues)
        values.update(kind="dequeue", at=utc(op.at), queue_id=op.queue_id, message_id=op.message_id)
    elif isinstance(op, ExtractionFailed):
        values.update(kind="failed", at=utc(op.retry_at), queue_id=op.queue_id,
                      error=clean_text(op.error)[:ERROR_MAX_CHARS], park=op.park)
    else:
        raise TypeError(f"unknown write op {type(op).__name__}")
    return tuple(values.get(name) for name in _PARAMETERS)


def _message(role: str, text: str, save: bool, content_hash: str | None = None,
             message_id: str | None = None, vector: ItemVector | None = None) -> dict[str, Any]:
    """The message part of a start or a finish, with its `vector` when that is of the text saved."""
    content = clean_text(text) if save else ""
    part = {"role": role, "message_id": message_id or new_id(), "content": content, "save": save,
            "hash": (content_hash or text_hash(text)) if save else "", "terms": index_terms(content)}
    # Python's slice and PostgreSQL's substr count the same characters (vector_sql.py's embedding text).
    if save and vector is not None and vector.text == content[:EMBED_CHARS]:
        part.update(vector_model=vector.model, vector=np.frombuffer(vector.vector, dtype="<f4").tolist())
    return part


def _trace(op: FinishTurn) -> dict[str, Any]:
    """The reasoning trace of a finish: saved once per turn, when the turn called tools."""
    task, answer = clean_text(op.task), clean_text(op.answer)
    return {"trace_id": new_id(), "task": task, "steps": steps_json(op.steps),
            "trace_terms": reasoning_terms(task, op.steps, answer), "has_steps": bool(op.steps)}
