"""The write ops of one `SQLiteStore.apply` batch, run inside its transaction."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import aiosqlite

from proxy.models import Scope
from proxy.stores.base import FinishTurn, RecordToolCalls, SaveBlock, SetTurnStatus, StartTurn, WriteOp, text_hash
from proxy.stores.sqlite_rows import clean_text, new_id, now_ts, reasoning_terms, steps_json, to_ts
from proxy.terms import index_text

INJECTION_LOG_KEEP = 20  # SPEC 8: the injection log of the user's last 20 turns


class Batch:
    """The ops of one `apply` call, run inside its transaction on the write connection."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn
        self._users: set[str] = set()

    async def _run(self, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
        return list(await self._conn.execute_fetchall(sql, params))

    async def run(self, op: WriteOp) -> None:
        """Apply one op."""
        if isinstance(op, StartTurn):
            await self.start_turn(op)
        elif isinstance(op, FinishTurn):
            await self.finish_turn(op)
        elif isinstance(op, RecordToolCalls):
            await self.record_tool_calls(op)
        elif isinstance(op, SetTurnStatus):
            await self.set_turn_status(op)
        elif isinstance(op, SaveBlock):
            await self.save_block(op)
        else:
            raise TypeError(f"unknown write op {type(op).__name__}")

    async def _user(self, user: str, at: float) -> None:
        if user not in self._users:
            await self._run("INSERT INTO users (id, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING", (user, at))
            self._users.add(user)

    async def _conversation(self, scope: Scope, conversation_id: str, at: float) -> None:
        await self._user(scope.user, at)
        await self._run(
            "INSERT INTO conversations (user_id, id, agent_id, created_at, last_active_at) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (user_id, id) DO UPDATE SET last_active_at = max(last_active_at, excluded.last_active_at)",
            (scope.user, conversation_id, scope.agent, at, at),
        )

    async def _message(self, scope: Scope, conversation_id: str, turn_key: str, role: str, text: str, at: float) -> None:
        """Insert unless this turn already holds the same text in this role; enqueue it if new."""
        content = clean_text(text)
        rows = await self._run(
            "INSERT INTO messages (id, user_id, conversation_id, agent_id, turn_key, role, content, content_hash,"
            " terms, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING id",
            (new_id(), scope.user, conversation_id, scope.agent, turn_key, role, content, text_hash(text),
             index_text(content), at),
        )
        if rows:
            await self._run(
                "INSERT INTO extraction_queue (user_id, message_id, next_attempt_at, created_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (scope.user, rows[0]["id"], at, at),
            )

    async def start_turn(self, op: StartTurn) -> None:
        """Conversation, pending turn and (when persisted) the user's message."""
        at = to_ts(op.at)
        await self._conversation(op.scope, op.conversation_id, at)
        await self._run(
            "INSERT INTO turns (user_id, turn_key, conversation_id, agent_id, history_hash, status, created_at,"
            " updated_at) VALUES (?, ?, ?, ?, ?, 'pending', ?, ?) ON CONFLICT DO NOTHING",
            (op.scope.user, op.turn_key, op.conversation_id, op.scope.agent, op.history_hash, at, at),
        )
        if op.user_text is not None and op.persist:
            await self._message(op.scope, op.conversation_id, op.turn_key, "user", op.user_text, at)

    async def finish_turn(self, op: FinishTurn) -> None:
        """The answer (once per text), the trace (once per turn), status complete."""
        at = to_ts(op.at)
        await self._conversation(op.scope, op.conversation_id, at)
        # Upsert: the StartTurn batch may have been lost, the answer is still worth keeping.
        await self._run(
            "INSERT INTO turns (user_id, turn_key, conversation_id, agent_id, history_hash, status, created_at,"
            " updated_at) VALUES (?, ?, ?, ?, '', 'complete', ?, ?)"
            " ON CONFLICT (user_id, turn_key) DO UPDATE SET status = 'complete', updated_at = excluded.updated_at",
            (op.scope.user, op.turn_key, op.conversation_id, op.scope.agent, at, at),
        )
        await self._message(op.scope, op.conversation_id, op.turn_key, "assistant", op.answer, at)
        if op.steps:
            task, answer = clean_text(op.task), clean_text(op.answer)
            await self._run(
                "INSERT INTO reasoning (id, user_id, agent_id, conversation_id, turn_key, task, steps, answer, terms,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (new_id(), op.scope.user, op.scope.agent, op.conversation_id, op.turn_key, task,
                 steps_json(op.steps), answer, reasoning_terms(task, op.steps, answer), at),
            )

    async def record_tool_calls(self, op: RecordToolCalls) -> None:
        """Remember the call ids of a step (skipped when the turn itself is unknown)."""
        at = to_ts(op.at)
        await self._conn.executemany(
            "INSERT INTO turn_tool_calls (user_id, call_id, turn_key, name, arguments, created_at)"
            " SELECT ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM turns WHERE user_id = ? AND turn_key = ?)"
            " ON CONFLICT DO NOTHING",
            [(op.scope.user, cid, op.turn_key, clean_text(name), clean_text(args), at, op.scope.user, op.turn_key)
             for cid, name, args in op.calls],
        )

    async def set_turn_status(self, op: SetTurnStatus) -> None:
        """A turn that completed stays complete."""
        await self._run(
            "UPDATE turns SET status = ?, updated_at = ? WHERE user_id = ? AND turn_key = ? AND status != 'complete'",
            (op.status, to_ts(op.at), op.scope.user, op.turn_key),
        )

    async def save_block(self, op: SaveBlock) -> None:
        """First block wins, so every step of a tool loop carries the same bytes; log it."""
        at = to_ts(op.at) if op.at else now_ts()
        user = op.scope.user
        saved = await self._run(
            "UPDATE turns SET block = ?, injected = ?, updated_at = ? WHERE user_id = ? AND turn_key = ?"
            " AND block IS NULL RETURNING seq",
            (clean_text(op.block), op.injected, at, user, op.turn_key),
        )
        if not saved:
            return
        await self._run(
            "INSERT INTO injections (user_id, turn_key, log, created_at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (user, op.turn_key, json.dumps(op.log, default=str), at),
        )
        await self._run(
            "DELETE FROM injections WHERE user_id = ? AND seq NOT IN"
            " (SELECT seq FROM injections WHERE user_id = ? ORDER BY seq DESC LIMIT ?)",
            (user, user, INJECTION_LOG_KEEP),
        )
