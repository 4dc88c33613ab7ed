"""The write ops of one `SQLiteStore.apply` batch, run synchronously on the writer thread.

Each batch is one `BEGIN IMMEDIATE` transaction: a deferred transaction that reads before
it writes gets SQLITE_BUSY at once, ignoring busy_timeout (SQLite's rule). The whole
batch runs in one call on the writer thread, so a cancelled caller never leaves a
transaction half-applied or open: it commits or rolls back as a unit.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from proxy.ids import new_id
from proxy.models import Scope
from proxy.stores.base import (
    HOOK_CONTEXT_KEEP, TURN_OPS, DropHookContext, ExtractionFailed, FinishTurn, ItemVector, QueueHookContext,
    RecordFacts, RecordResponse, RecordToolCalls, SaveBlock, SaveHookStart, SetTurnStatus, StartTurn, StoreMemory,
    TurnOp, WriteOp, text_hash,
)
from proxy.stores.generations import deleted_keys, generation_key
from proxy.stores.sqlite.admin import store_memory
from proxy.stores.sqlite.facts import record_facts, record_failure
from proxy.stores.sqlite.rows import clean_text, now_ts, to_ts
from proxy.stores.sqlite.vectors import FLOAT32_BYTES
from proxy.stores.vector_sql import EMBED_CHARS
from proxy.stores.indexed_text import (
    CONTEXT_MESSAGES,
    context_terms,
    index_terms,
    reasoning_terms,
    steps_json,
)

# A turn still pending this long after its last write died with the process serving it (as on
# PostgreSQL); a younger one may be in flight on another process of the file.
STALE_PENDING_S = 600.0
INJECTION_LOG_KEEP = 20  # the memory API shows the injection log of the user's last 20 turns


def apply_batch(conn: sqlite3.Connection, ops: Sequence[WriteOp]) -> None:
    """Apply `ops` in one IMMEDIATE transaction; any error rolls all of them back."""
    transaction(conn, lambda: _apply_all(conn, ops))


def transaction(conn: sqlite3.Connection, body: Callable[[], None]) -> None:
    """Run `body` between BEGIN IMMEDIATE and COMMIT, rolling back if it raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        body()
        conn.execute("COMMIT")
    except BaseException:
        conn.rollback()
        raise


def _apply_all(conn: sqlite3.Connection, ops: Sequence[WriteOp]) -> None:
    batch = Batch(conn)
    for op in ops:
        batch.run(op)


def recover(conn: sqlite3.Connection, others_open: bool) -> None:
    """Turns left pending by a process that died are ended: all of them when no other process has
    the file open, else only those pending for longer than STALE_PENDING_S (the others' may be
    in flight)."""
    now = now_ts()
    before = now - STALE_PENDING_S if others_open else now + 1
    # A pending turn whose answer was saved did finish; only the status write was lost.
    conn.execute(
        "UPDATE turns SET status = 'complete', updated_at = ? WHERE status = 'pending' AND updated_at < ?"
        " AND EXISTS (SELECT 1 FROM messages m WHERE m.user_id = turns.user_id AND m.turn_key = turns.turn_key"
        " AND m.role = 'assistant')",
        (now, before),
    )
    conn.execute("UPDATE turns SET status = 'interrupted', updated_at = ? WHERE status = 'pending' AND updated_at < ?",
                 (now, before))


class Batch:
    """The ops of one `apply` call, inside its transaction on the write connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._users: set[str] = set()
        # Whether a deletion came after a turn's generation: fixed for the transaction, so asked once per turn.
        self._deleted: dict[tuple[str, str, int], bool] = {}

    def _run(self, sql: str, params: Sequence[Any]) -> list[Any]:
        return self._conn.execute(sql, params).fetchall()

    def run(self, op: WriteOp) -> None:
        """Apply one op; a turn's op is skipped when its user or conversation was deleted since the turn began."""
        if isinstance(op, TURN_OPS) and self._deleted_since(op):
            return
        if isinstance(op, StartTurn):
            self.start_turn(op)
        elif isinstance(op, FinishTurn):
            self.finish_turn(op)
        elif isinstance(op, RecordToolCalls):
            self.record_tool_calls(op)
        elif isinstance(op, SetTurnStatus):
            self.set_turn_status(op)
        elif isinstance(op, SaveBlock):
            self.save_block(op)
        elif isinstance(op, SaveHookStart):
            self._run("UPDATE turns SET prompt = coalesce(?, prompt), hook_context = coalesce(?, hook_context),"
                      " updated_at = ? WHERE user_id = ? AND turn_key = ? AND block IS NULL",
                      (clean_text(op.prompt) if op.prompt is not None else None,
                       clean_text(op.context) if op.context is not None else None, to_ts(op.at), op.scope.user,
                       op.turn_key))
        elif isinstance(op, StoreMemory):
            store_memory(self._conn, op)
        elif isinstance(op, QueueHookContext):
            self.queue_hook_context(op)
        elif isinstance(op, DropHookContext):
            self._run("DELETE FROM hook_context WHERE user_id = ? AND conversation_id = ? AND seq <= ?",
                      (op.scope.user, op.conversation_id, op.upto_seq))
        elif isinstance(op, RecordFacts):
            record_facts(self._conn, op)
        elif isinstance(op, ExtractionFailed):
            record_failure(self._conn, op)
        elif isinstance(op, RecordResponse):
            self.record_response(op)
        else:
            raise TypeError(f"unknown write op {type(op).__name__}")

    def _deleted_since(self, op: TurnOp) -> bool:
        """True when the op's user or conversation was deleted at a later generation than the turn's."""
        if op.generation is None:
            return False
        key = (op.scope.user, op.generation.conversation_id, op.generation.number)
        if key not in self._deleted:
            rows = deleted_keys(op.scope.user, op.generation.conversation_id)
            self._deleted[key] = bool(self._run(
                "SELECT 1 FROM generations WHERE id IN (?, ?) AND generation > ? LIMIT 1", (*rows, key[2])))
        return self._deleted[key]

    def _user(self, user: str, at: float) -> None:
        if user not in self._users:
            self._run("INSERT INTO users (id, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING", (user, at))
            self._users.add(user)

    def _conversation(self, scope: Scope, conversation_id: str, at: float) -> None:
        self._user(scope.user, at)
        self._run(
            "INSERT INTO conversations (user_id, id, agent_id, created_at, last_active_at) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (user_id, id) DO UPDATE SET last_active_at = max(last_active_at, excluded.last_active_at)",
            (scope.user, conversation_id, scope.agent, at, at),
        )

    def _message(self, scope: Scope, conversation_id: str, turn_key: str, role: str, text: str, at: float, *,
                 content_hash: str | None = None, message_id: str | None = None, due: float | None = None,
                 queued: bool = True, vector: ItemVector | None = None) -> None:
        """Insert unless this turn already holds the same text in this role; if new, enqueue it when
        `queued` (due at `due`, else at once) and save its `vector` when that is of its text."""
        content = clean_text(text)
        rows = self._run(
            "INSERT INTO messages (id, user_id, conversation_id, agent_id, turn_key, role, content, content_hash,"
            " terms, context, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
            " RETURNING id",
            (message_id or new_id(), scope.user, conversation_id, scope.agent, turn_key, role, content,
             content_hash or text_hash(text), index_terms(content), self._context(scope, conversation_id, at), at),
        )
        if not rows:
            return
        if queued:
            self._run(
                "INSERT INTO extraction_queue (user_id, message_id, next_attempt_at, created_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (scope.user, rows[0][0], at if due is None else due, at),
            )
        # Python's slice and SQLite's substr count the same characters in text clean_text made storable.
        if vector is not None and vector.text == content[:EMBED_CHARS]:
            self._run(
                "INSERT INTO embeddings (user_id, kind, item_id, model, dim, vector, created_at)"
                " VALUES (?, 'message', ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (scope.user, rows[0][0], vector.model, len(vector.vector) // FLOAT32_BYTES, vector.vector, now_ts()),
            )

    def _context(self, scope: Scope, conversation_id: str, at: float) -> str:
        """The index terms of the messages said just before, in order (the new message's context)."""
        before = self._run(
            "SELECT terms FROM messages WHERE user_id = ? AND conversation_id = ? AND created_at <= ?"
            " ORDER BY created_at DESC, seq DESC LIMIT ?",
            (scope.user, conversation_id, at, CONTEXT_MESSAGES),
        )
        return context_terms([row[0] for row in reversed(before)])

    def _turns_conversation(self, scope: Scope, turn_key: str, named: str) -> str:
        """The conversation the turn was saved in, else the one the op names.

        A turn stays where it began: a later write naming another conversation (a step
        identified while the store could not be asked) goes to the turn's own.
        """
        rows = self._run("SELECT conversation_id FROM turns WHERE user_id = ? AND turn_key = ?", (scope.user, turn_key))
        return str(rows[0][0]) if rows else named

    def start_turn(self, op: StartTurn) -> None:
        """Conversation, pending turn and (when persisted) the user's message."""
        at = to_ts(op.at)
        conversation = self._turns_conversation(op.scope, op.turn_key, op.conversation_id)
        self._conversation(op.scope, conversation, at)
        self._run(
            "INSERT INTO turns (user_id, turn_key, conversation_id, agent_id, history_hash, status, created_at,"
            " updated_at) VALUES (?, ?, ?, ?, ?, 'pending', ?, ?) ON CONFLICT DO NOTHING",
            (op.scope.user, op.turn_key, conversation, op.scope.agent, op.history_hash, at, at),
        )
        if op.user_text is not None and op.persist:
            self._message(op.scope, conversation, op.turn_key, "user", op.user_text, at, message_id=op.message_id,
                          due=None if op.extract_from is None else to_ts(op.extract_from), queued=op.queued,
                          vector=op.vector)

    def finish_turn(self, op: FinishTurn) -> None:
        """The answer (once per text), the trace (once per turn), status complete."""
        at = to_ts(op.at)
        conversation = self._turns_conversation(op.scope, op.turn_key, op.conversation_id)
        self._conversation(op.scope, conversation, at)
        # Upsert: the StartTurn batch may have been lost, the answer is still worth keeping.
        self._run(
            "INSERT INTO turns (user_id, turn_key, conversation_id, agent_id, history_hash, status, created_at,"
            " updated_at) VALUES (?, ?, ?, ?, '', 'complete', ?, ?)"
            " ON CONFLICT (user_id, turn_key) DO UPDATE SET status = 'complete', updated_at = excluded.updated_at",
            (op.scope.user, op.turn_key, conversation, op.scope.agent, at, at),
        )
        # Matched later by the hash of the text the client received (op.answer_hash), which
        # differs from the saved text when redaction changed it.
        self._message(op.scope, conversation, op.turn_key, "assistant", op.answer, at, content_hash=op.answer_hash,
                      queued=op.queued, vector=op.vector)
        if op.steps:
            task, answer = clean_text(op.task), clean_text(op.answer)
            self._run(
                "INSERT INTO reasoning (id, user_id, agent_id, conversation_id, turn_key, task, steps, answer, terms,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (new_id(), op.scope.user, op.scope.agent, conversation, op.turn_key, task,
                 steps_json(op.steps), answer, reasoning_terms(task, op.steps, answer), at),
            )

    def record_tool_calls(self, op: RecordToolCalls) -> None:
        """Remember the call ids of a step (skipped when the turn itself is unknown).

        Kept per turn: a provider that numbers its calls per response (`call_0`) reuses ids
        across the user's turns and conversations, and each turn keeps its own row. A later
        step of the same turn naming an id again (a retried step, or the provider's numbering
        starting over) replaces that turn's row.
        """
        at = to_ts(op.at)
        exchange = clean_text(op.exchange) if op.exchange is not None else None
        if exchange is not None and op.generation is not None and self._run(
                "SELECT 1 FROM generations WHERE id = ? AND generation > ?",
                (generation_key(op.scope.user), op.generation.number)):
            exchange = None  # something was deleted since the step began: the exchange may quote it
        self._conn.executemany(
            "INSERT INTO turn_tool_calls (user_id, call_id, turn_key, name, arguments, created_at, exchange)"
            " SELECT ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM turns WHERE user_id = ? AND turn_key = ?)"
            " ON CONFLICT (user_id, call_id, turn_key) DO UPDATE SET name = excluded.name,"
            " arguments = excluded.arguments, created_at = excluded.created_at, exchange = excluded.exchange",
            [(op.scope.user, cid, op.turn_key, clean_text(name), clean_text(args), at, exchange, op.scope.user,
              op.turn_key) for cid, name, args in op.calls],
        )

    def record_response(self, op: RecordResponse) -> None:
        """Remember a response id in its turn's conversation (skipped when the turn is unknown)."""
        self._run(
            "INSERT INTO responses (user_id, response_id, turn_key, conversation_id, parent_id, created_at,"
            " provider_id) SELECT user_id, ?, turn_key, conversation_id, ?, ?, ? FROM turns WHERE user_id = ?"
            " AND turn_key = ? ON CONFLICT DO NOTHING",
            (clean_text(op.response_id), op.parent_id and clean_text(op.parent_id), to_ts(op.at),
             op.provider_id and clean_text(op.provider_id), op.scope.user, op.turn_key),
        )

    def set_turn_status(self, op: SetTurnStatus) -> None:
        """A turn that completed stays complete."""
        self._run(
            "UPDATE turns SET status = ?, updated_at = ? WHERE user_id = ? AND turn_key = ? AND status != 'complete'",
            (op.status, to_ts(op.at), op.scope.user, op.turn_key),
        )

    def queue_hook_context(self, op: QueueHookContext) -> None:
        """Queued for the conversation's next turn; past HOOK_CONTEXT_KEEP the oldest go (none when
        the conversation is gone)."""
        if not self._run("INSERT INTO hook_context (user_id, conversation_id, text, created_at)"
                         " SELECT user_id, id, ?, ? FROM conversations WHERE user_id = ? AND id = ? RETURNING seq",
                         (clean_text(op.text), to_ts(op.at), op.scope.user, op.conversation_id)):
            return
        self._run("DELETE FROM hook_context WHERE user_id = ? AND conversation_id = ? AND seq NOT IN"
                  " (SELECT seq FROM hook_context WHERE user_id = ? AND conversation_id = ? ORDER BY seq DESC LIMIT ?)",
                  (op.scope.user, op.conversation_id, op.scope.user, op.conversation_id, HOOK_CONTEXT_KEEP))

    def save_block(self, op: SaveBlock) -> None:
        """First block wins, so every step of a tool loop carries the same bytes; log it.

        A block computed after a deletion replaces one cached before it (and its log entry). One
        computed before a deletion that committed first may hold the deleted items: its text is
        not kept (the turn's next step computes the block again), the rest is.
        """
        at = to_ts(op.at) if op.at else now_ts()
        user = op.scope.user
        generation = op.generation.number if op.generation else 0
        saved = self._run(
            "UPDATE turns SET block = CASE WHEN ? >= ifnull((SELECT generation FROM generations WHERE id = ?), 0)"
            " THEN ? END, injected = ?, block_generation = ?, prompt = coalesce(?, prompt),"
            " hook_context = coalesce(?, hook_context), updated_at = ?"
            " WHERE user_id = ? AND turn_key = ? AND (block IS NULL OR block_generation < ?) RETURNING seq",
            (generation, generation_key(user), clean_text(op.block), op.injected, generation,
             clean_text(op.prompt) if op.prompt is not None else None,
             clean_text(op.context) if op.context is not None else None, at, user, op.turn_key, generation),
        )
        if not saved:
            return
        self._run(
            "INSERT INTO injections (user_id, turn_key, log, created_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (user_id, turn_key) DO UPDATE SET log = excluded.log",
            (user, op.turn_key, json.dumps(op.log, default=str), at),
        )
        self._run(
            "DELETE FROM injections WHERE user_id = ? AND seq NOT IN"
            " (SELECT seq FROM injections WHERE user_id = ? ORDER BY seq DESC LIMIT ?)",
            (user, user, INJECTION_LOG_KEEP),
        )
