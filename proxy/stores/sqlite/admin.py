"""The memory API's operations on SQLite: listing, explicit memories, deletes with counts, import.

`SQLiteAdmin` is mixed into `SQLiteStore`: its reads use the store's read connection, its
writes run on the store's write thread, each in one IMMEDIATE transaction, so they queue
behind (never interleave with) the writer's batches. Every statement names the user.

Deleting a user removes every row that carries its id (the users row cascades through the
foreign keys; each table holding a `user_id` is then swept, so a table added later is
covered too), then merges the full-text indexes and checkpoints the WAL: SQLite's
`secure_delete` zeroes deleted rows, but FTS5 keeps a deleted row's terms in its segments
until they are merged, and the WAL keeps old pages until a checkpoint truncates it.

Any deletion (a user, a conversation, one item) also clears the user's cached memory blocks
and memory exchanges in its own transaction: they may quote what was deleted, and the turn
lookups had stopped using them already (their generation is behind the user's).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from proxy.ids import new_id
from proxy.extracted import canonical_name
from proxy.models import Scope, StoredMessage
from proxy.stores.base import (
    MEMORY_TYPES,
    TAGS_MAX,
    ItemKind,
    PageKey,
    PageList,
    ReindexedPage,
    StoreError,
    StoreMemory,
    TermsTable,
    text_hash,
)
from proxy.stores.export_records import INJECTIONS_SELECT
from proxy.stores.generations import (
    BUMP_SQL,
    MARK_SQL,
    conversation_deleted_key,
    generation_key,
    user_deleted_key,
)
from proxy.stores.reindex_terms import (
    REINDEX_BATCH,
    TERMS_COLUMNS,
    TermsColumns,
    page_of,
    page_query,
    rewrites,
    said_before_query,
)
from proxy.stores.sqlite.entity_index import EntityIndexes
from proxy.stores.sqlite.import_records import import_records, message_context
from proxy.stores.sqlite.message_index import MessageIndexes
from proxy.stores.sqlite.pruning import conversation_messages, prune_graph
from proxy.stores.sqlite.rows import (
    EXPORT,
    agent_clause,
    clean_text,
    from_ts,
    message_from_row,
    now_ts,
    to_ts,
)
from proxy.stores.indexed_text import CONTEXT_MESSAGES, context_terms, entity_terms, index_terms
from proxy.stores.sqlite.schema import FTS_TABLES

log = logging.getLogger("memproxy.store")

T = TypeVar("T")
Corrected = Literal["entity", "message", "conflict"]
_INVALID_WRITE = (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError, sqlite3.DataError,
                  TypeError, ValueError)
# The table each kind of item lives in.
_ITEM_TABLES = {"message": "messages", "entity": "entities", "relationship": "relationships",
                "conversation": "conversations"}
# Where each list's keys are kept (store.base.PAGE_KEY_PARTS): the table, and its key columns in order.
_KEY_COLUMNS: dict[PageList, tuple[str, str]] = {
    "entities": ("entities", "seq"), "messages": ("messages", "created_at, seq"),
    "conversations": ("conversations", "last_active_at, id"), "reasoning": ("reasoning", "created_at, seq")}


def _rows(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
    cursor = conn.cursor()
    cursor.row_factory = sqlite3.Row
    return cursor.execute(sql, params).fetchall()


def _past(columns: str, after: PageKey | None, *, newest_first: bool = False) -> tuple[str, list[Any]]:
    """The condition that starts a page just past `after` in the order of `columns`."""
    if after is None:
        return "", []
    marks = ", ".join("?" * len(after))
    return f" AND ({columns}) {'<' if newest_first else '>'} ({marks})", list(after)


class SQLiteAdmin:
    """The memory API's half of SQLiteStore (the host provides the connections)."""

    _write_thread: Any
    _writer: sqlite3.Connection | None
    _message_indexes: MessageIndexes
    _entity_indexes: EntityIndexes

    async def _rows(self, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:  # provided by SQLiteStore
        raise NotImplementedError

    async def _lookup(self, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:  # provided by SQLiteStore
        raise NotImplementedError

    async def _on_write_thread(self, work: Callable[[sqlite3.Connection], T]) -> T:  # provided by SQLiteStore
        raise NotImplementedError

    async def _on_writer(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run `body` in one IMMEDIATE transaction on the write thread."""

        def run(writer: sqlite3.Connection) -> T:
            writer.execute("BEGIN IMMEDIATE")
            try:
                result = body(writer)
                writer.execute("COMMIT")
            except BaseException:
                writer.rollback()
                raise
            return result

        try:
            return await self._on_write_thread(run)
        except _INVALID_WRITE as exc:
            raise StoreError(f"{type(exc).__name__}: {exc}", transient=False) from exc
        except sqlite3.Error as exc:
            raise StoreError(f"{getattr(exc, 'sqlite_errorname', type(exc).__name__)}: {exc}") from exc

    # --- reads

    async def entity_page(self, scope: Scope, *, limit: int = 100,
                          after: PageKey | None = None) -> list[tuple[PageKey, dict[str, Any]]]:
        """The user's entities as export records, oldest first, from just past `after`."""
        agent, params = agent_clause(scope, "e")
        past, past_params = _past("e.seq", after)
        rows = await self._rows(f"SELECT e.* FROM entities e WHERE e.user_id = ?{agent}{past} ORDER BY e.seq LIMIT ?",
                                [scope.user, *params, *past_params, limit])
        return [((row["seq"],), EXPORT.entity_record(row)) for row in rows]

    async def conversation_page(self, scope: Scope, *, limit: int = 100,
                                after: PageKey | None = None) -> list[tuple[PageKey, dict[str, Any]]]:
        """The user's conversations, most recently active first, from just past `after`."""
        agent, params = agent_clause(scope, "c")
        past, past_params = _past("c.last_active_at, c.id", after, newest_first=True)
        rows = await self._rows(
            "SELECT c.*, (SELECT count(*) FROM messages m WHERE m.user_id = c.user_id"
            " AND m.conversation_id = c.id) AS message_count"
            f" FROM conversations c WHERE c.user_id = ?{agent}{past}"
            " ORDER BY c.last_active_at DESC, c.id DESC LIMIT ?",
            [scope.user, *params, *past_params, limit],
        )
        return [((row["last_active_at"], row["id"]),
                 {"id": row["id"], "agent_id": row["agent_id"], "created_at": from_ts(row["created_at"]),
                  "last_active_at": from_ts(row["last_active_at"]), "message_count": row["message_count"]})
                for row in rows]

    async def message_page(self, scope: Scope, conversation_id: str, *, limit: int = 100,
                           after: PageKey | None = None) -> list[tuple[PageKey, StoredMessage]]:
        """Messages of one conversation, oldest first, from just past `after`."""
        agent, params = agent_clause(scope, "m")
        past, past_params = _past("m.created_at, m.seq", after)
        rows = await self._rows(
            f"SELECT m.* FROM messages m WHERE m.user_id = ? AND m.conversation_id = ?{agent}{past}"
            " ORDER BY m.created_at, m.seq LIMIT ?",
            [scope.user, conversation_id, *params, *past_params, limit],
        )
        return [((row["created_at"], row["seq"]), message_from_row(row)) for row in rows]

    async def neighbours(self, scope: Scope, message_ids: Sequence[str]
                         ) -> dict[str, tuple[StoredMessage | None, StoredMessage | None]]:
        """For each of these messages that has one, the message just before it and the one just after it."""
        if not message_ids:
            return {}
        agent, params = agent_clause(scope, "m")
        near_agent, near_params = agent_clause(scope, "p")
        marks = ", ".join("?" * len(message_ids))
        # Each side is one step of the (user, conversation, created_at) index, seq breaking ties.
        side = ("SELECT p.seq FROM messages p WHERE p.user_id = h.user_id AND p.conversation_id = h.conversation_id"
                "{agent} AND p.created_at {op}= h.created_at"
                " AND (p.created_at {op} h.created_at OR p.seq {op} h.seq)"
                " ORDER BY p.created_at {order}, p.seq {order} LIMIT 1")
        # Only the columns a message is built from, not `*`: the index text stored beside a
        # message is as long as it, and reading it made the lookup three times as long.
        message = "n.id, n.conversation_id, n.role, n.content, n.created_at"
        rows = await self._lookup(
            "WITH h AS (SELECT m.id, m.user_id, m.conversation_id, m.created_at, m.seq FROM messages m"
            f" WHERE m.user_id = ? AND m.id IN ({marks}){agent})"
            f" SELECT h.id AS hit_id, -1 AS side, {message} FROM h JOIN messages n"
            f" ON n.seq = ({side.format(agent=near_agent, op='<', order='DESC')})"
            f" UNION ALL SELECT h.id AS hit_id, 1 AS side, {message} FROM h JOIN messages n"
            f" ON n.seq = ({side.format(agent=near_agent, op='>', order='ASC')})",
            [scope.user, *message_ids, *params, *near_params, *near_params],
        )
        found: dict[str, list[StoredMessage | None]] = {}
        for hit_id, side_of, *values in rows:
            found.setdefault(hit_id, [None, None])[0 if side_of < 0 else 1] = StoredMessage(
                values[0], values[1], values[2], values[3], from_ts(values[4]))
        return {hit: (before, after) for hit, (before, after) in found.items()}

    async def entity_record(self, scope: Scope, entity_id: str) -> dict[str, Any] | None:
        """One entity as an export record."""
        agent, params = agent_clause(scope, "e")
        rows = await self._rows(f"SELECT e.* FROM entities e WHERE e.user_id = ? AND e.id = ?{agent}",
                                [scope.user, entity_id, *params])
        return EXPORT.entity_record(rows[0]) if rows else None

    async def message_record(self, scope: Scope, message_id: str) -> dict[str, Any] | None:
        """One message as an export record."""
        agent, params = agent_clause(scope, "m")
        rows = await self._rows(f"SELECT m.* FROM messages m WHERE m.user_id = ? AND m.id = ?{agent}",
                                [scope.user, message_id, *params])
        return EXPORT.message(rows[0]) if rows else None

    async def conversation_record(self, scope: Scope, conversation_id: str) -> dict[str, Any] | None:
        """One conversation as an export record."""
        agent, params = agent_clause(scope, "c")
        rows = await self._rows(f"SELECT c.* FROM conversations c WHERE c.user_id = ? AND c.id = ?{agent}",
                                [scope.user, conversation_id, *params])
        return EXPORT.conversation(rows[0]) if rows else None

    async def reasoning_page(self, scope: Scope, *, limit: int = 100,
                             after: PageKey | None = None) -> list[tuple[PageKey, dict[str, Any]]]:
        """Reasoning traces as export records, newest first, from just past `after`."""
        agent, params = agent_clause(scope, "x")
        past, past_params = _past("x.created_at, x.seq", after, newest_first=True)
        rows = await self._rows(
            f"SELECT x.* FROM reasoning x WHERE x.user_id = ?{agent}{past} ORDER BY x.created_at DESC, x.seq DESC"
            " LIMIT ?", [scope.user, *params, *past_params, limit])
        return [((row["created_at"], row["seq"]), EXPORT.reasoning(row)) for row in rows]

    async def page_key(self, scope: Scope, listing: PageList, item_id: str) -> PageKey | None:
        """The key of the user's item `item_id` in a list, None when the user has no such item."""
        table, columns = _KEY_COLUMNS[listing]
        rows = await self._rows(f"SELECT {columns} FROM {table} WHERE user_id = ? AND id = ?", [scope.user, item_id])
        return tuple(rows[0]) if rows else None

    async def injections(self, scope: Scope, *, limit: int = 20) -> list[dict[str, Any]]:
        """The injection log of the user's latest turns, newest first."""
        rows = await self._rows(f"{INJECTIONS_SELECT} WHERE i.user_id = ? ORDER BY i.seq DESC LIMIT ?",
                                [scope.user, limit])
        return [EXPORT.injection(row) for row in rows]

    # --- writes

    async def store_memory(self, op: StoreMemory) -> str:
        """Apply one StoreMemory alone; the id of the entity or message that holds it."""
        return await self._on_writer(lambda conn: store_memory(conn, op))

    async def update_memory(self, scope: Scope, memory_id: str, content: str) -> Corrected | None:
        """Correct an entity's text (its description, or its name when it has none) or a message's."""
        return await self._on_writer(lambda conn: update_memory(conn, scope, memory_id, content))

    async def delete_item(self, scope: Scope, kind: ItemKind, item_id: str) -> dict[str, int] | None:
        """Delete one item and what hangs off it; rows deleted per table, None when there is no such item."""
        return await self._on_writer(lambda conn: delete_item(conn, scope, kind, item_id))

    async def delete_user(self, scope: Scope) -> dict[str, int]:
        """Delete every row of the user, merge the indexes and checkpoint; rows deleted per table."""
        counts = await self._on_writer(lambda conn: delete_user(conn, scope.user))
        self._message_indexes.forget(scope.user)
        self._entity_indexes.forget(scope.user)
        writer, thread = self._writer, self._write_thread
        if writer is not None and thread is not None:
            await asyncio.get_running_loop().run_in_executor(thread, checkpoint, writer)
        return counts

    async def import_records(self, scope: Scope, records: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
        """Add validated export records to the user, skipping ids it already has; counts per kind."""
        return await self._on_writer(lambda conn: import_records(conn, scope, records))

    async def reindex_terms(self, table: TermsTable, *, after: tuple[Any, ...] | None = None,
                            limit: int = REINDEX_BATCH, user: str | None = None) -> ReindexedPage:
        """One batch of `memproxy reindex --terms` (reindex_terms.py), in one IMMEDIATE transaction: another
        process writing the file (a proxy serving it) waits its busy_timeout for it, as it waits for theirs."""
        return await self._on_writer(lambda conn: reindex_page(conn, TERMS_COLUMNS[table], after, limit, user))


# --- on the write thread ----------------------------------------------------------------


def store_memory(conn: sqlite3.Connection, op: StoreMemory) -> str:
    """An explicit memory: an entity of the user, or (`interaction`) an assistant message."""
    if op.memory_type not in MEMORY_TYPES:
        raise ValueError(f"unknown memory type {op.memory_type!r}")
    at = to_ts(op.at)
    conn.execute("INSERT INTO users (id, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING", (op.scope.user, at))
    if op.memory_type == "interaction":
        return _interaction(conn, op, at)
    return _fact(conn, op, at)


def _fact(conn: sqlite3.Connection, op: StoreMemory, at: float) -> str:
    """The memory as an entity named by its text, merged by canonical name like extracted ones."""
    name = clean_text(" ".join(op.content.split()))
    key = canonical_name(name)
    if not key:
        raise ValueError("a memory needs some text")
    agent = op.scope.agent if op.scope.agent_isolated else None
    rows = _rows(conn, "SELECT seq, id, tags FROM entities WHERE user_id = ? AND (id = ? OR"
                 " (ifnull(agent_id, '') = ? AND canonical_name = ?)) ORDER BY id = ? DESC LIMIT 1",
                 (op.scope.user, op.memory_id, agent or "", key, op.memory_id))
    tags = [clean_text(t) for t in op.tags]
    if rows:
        held = json.loads(rows[0]["tags"])
        merged = (held + [t for t in dict.fromkeys(tags) if t not in held])[-TAGS_MAX:]  # the newest
        conn.execute("UPDATE entities SET memory_type = ?, confidence = ?, tags = ?, updated_at = ?,"
                     " stored_via = ifnull(stored_via, ?) WHERE seq = ?",
                     (op.memory_type, op.confidence, json.dumps(merged), at, op.stored_via, rows[0]["seq"]))
        return str(rows[0]["id"])
    conn.execute(
        "INSERT INTO entities (id, user_id, agent_id, name, canonical_name, type, description, memory_type, confidence,"
        " tags, name_terms, type_terms, description_terms, created_at, updated_at, stored_via)"
        " VALUES (?, ?, ?, ?, ?, ?, '', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (op.memory_id, op.scope.user, agent, name, key, op.memory_type, op.memory_type, op.confidence,
         json.dumps(list(dict.fromkeys(tags))), *entity_terms(name, op.memory_type, ""), at, at, op.stored_via),
    )
    return op.memory_id


def _interaction(conn: sqlite3.Connection, op: StoreMemory, at: float) -> str:
    """The memory as an assistant message in the conversation the op names, else the user's latest
    (a new one if none)."""
    agent, params = agent_clause(op.scope, "c")
    latest = [] if op.conversation_id is not None else _rows(
        conn, f"SELECT c.id FROM conversations c WHERE c.user_id = ?{agent}"
        " ORDER BY c.last_active_at DESC, c.id DESC LIMIT 1", [op.scope.user, *params])
    conversation = op.conversation_id or (latest[0]["id"] if latest else new_id())
    if not latest:
        conn.execute("INSERT INTO conversations (user_id, id, agent_id, created_at, last_active_at)"
                     " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                     (op.scope.user, conversation, op.scope.agent, at, at))
    content = clean_text(op.content)
    inserted = conn.execute(
        "INSERT INTO messages (id, user_id, conversation_id, agent_id, role, content, content_hash, terms, context,"
        " created_at) VALUES (?, ?, ?, ?, 'assistant', ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING id",
        (op.memory_id, op.scope.user, conversation, op.scope.agent, content, text_hash(content),
         index_terms(content), message_context(conn, op.scope.user, conversation, at), at),
    ).fetchall()
    if inserted:
        conn.execute("INSERT INTO extraction_queue (user_id, message_id, next_attempt_at, created_at)"
                     " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING", (op.scope.user, op.memory_id, at, at))
    return op.memory_id


def update_memory(conn: sqlite3.Connection, scope: Scope, memory_id: str, content: str) -> Corrected | None:
    """Replace the text of the entity or message `memory_id`; "conflict" when a name is taken."""
    content = clean_text(content)
    entity = _rows(conn, "SELECT * FROM entities WHERE user_id = ? AND id = ?", (scope.user, memory_id))
    if entity:
        return _correct_entity(conn, entity[0], content)
    changed = conn.execute(
        "UPDATE messages SET content = ?, content_hash = ?, terms = ? WHERE user_id = ? AND id = ?"
        " RETURNING conversation_id, created_at, seq",
        (content, text_hash(content), index_terms(content), scope.user, memory_id),
    ).fetchone()
    if changed is None:
        return None
    _refresh_followers(conn, scope.user, *changed)
    return "message"


def _refresh_followers(conn: sqlite3.Connection, user: str, conversation_id: str, created_at: float, seq: int
                       ) -> None:
    """The context of the messages said after one that was corrected or deleted, made again.

    Each message's index holds the words of the few said before it (its `context`), so the
    words a correction or a delete took out would otherwise stay findable through them.
    """
    followers = conn.execute(
        "SELECT seq, created_at FROM messages WHERE user_id = ? AND conversation_id = ?"
        " AND (created_at > ? OR (created_at = ? AND seq > ?)) ORDER BY created_at, seq LIMIT ?",
        (user, conversation_id, created_at, created_at, seq, CONTEXT_MESSAGES)).fetchall()
    for follower_seq, follower_at in followers:
        before = conn.execute(
            "SELECT terms FROM messages WHERE user_id = ? AND conversation_id = ?"
            " AND (created_at < ? OR (created_at = ? AND seq < ?)) ORDER BY created_at DESC, seq DESC LIMIT ?",
            (user, conversation_id, follower_at, follower_at, follower_seq, CONTEXT_MESSAGES)).fetchall()
        context = context_terms([row[0] for row in reversed(before)])
        conn.execute("UPDATE messages SET context = ? WHERE seq = ? AND context != ?", (context, follower_seq, context))


def _correct_entity(conn: sqlite3.Connection, row: sqlite3.Row, content: str) -> Corrected:
    aliases = json.loads(row["aliases"])
    name, description = row["name"], " ".join(content.split())
    key = row["canonical_name"]
    if not row["description"]:
        name, description = description, ""
        key = canonical_name(name)
        taken = _rows(conn, "SELECT 1 FROM entities WHERE user_id = ? AND ifnull(agent_id, '') = ?"
                      " AND canonical_name = ? AND seq != ?", (row["user_id"], row["agent_id"] or "", key, row["seq"]))
        if taken or not key:
            return "conflict"
    conn.execute(
        "UPDATE entities SET name = ?, canonical_name = ?, description = ?, name_terms = ?, type_terms = ?,"
        " description_terms = ?, updated_at = max(updated_at, ?) WHERE seq = ?",
        (name, key, description, *entity_terms(name, row["type"], description, aliases), now_ts(), row["seq"]),
    )
    return "entity"


def user_tables(conn: sqlite3.Connection) -> list[str]:
    """Every ordinary table with a `user_id` column (the users table itself excluded)."""
    names = [row[0] for row in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%'"
        " AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '%_fts_%' ORDER BY name")]
    return [name for name in names
            if any(column[1] == "user_id" for column in conn.execute(f'PRAGMA table_info("{name}")'))]


def _counts(conn: sqlite3.Connection, user: str, tables: Sequence[str]) -> dict[str, int]:
    return {t: conn.execute(f'SELECT count(*) FROM "{t}" WHERE user_id = ?', (user,)).fetchone()[0] for t in tables}


def delete_item(conn: sqlite3.Connection, scope: Scope, kind: ItemKind, item_id: str) -> dict[str, int] | None:
    """Delete one item (cascading); rows deleted per table, or None when it does not exist (a
    conversation is marked deleted even then, as a user is)."""
    kinds: Sequence[str] = ("entity", "message") if kind == "memory" else (kind,)
    tables = user_tables(conn)
    before = _counts(conn, scope.user, tables)
    for each in kinds:
        table = _ITEM_TABLES[each]
        if each == "message":
            gone = conn.execute("DELETE FROM messages WHERE user_id = ? AND id = ? RETURNING conversation_id,"
                                " created_at, seq", (scope.user, item_id)).fetchone()
            if gone is not None:
                _refresh_followers(conn, scope.user, *gone)
                prune_graph(conn, scope.user, [item_id])
        else:
            said = conversation_messages(conn, scope.user, item_id) if each == "conversation" else []
            gone = conn.execute(f"DELETE FROM {table} WHERE user_id = ? AND id = ?", (scope.user, item_id)).rowcount
            if gone:
                prune_graph(conn, scope.user, said)  # what its messages alone said goes with them
        if gone:
            ended = [conversation_deleted_key(scope.user, item_id)] if each == "conversation" else []
            _deleted(conn, scope.user, ended)
            after = _counts(conn, scope.user, tables)
            return {t: before[t] - after[t] for t in tables if before[t] != after[t]}
    if kind == "conversation":  # none saved yet, but its first turn may be in flight: it saves nothing
        _deleted(conn, scope.user, [conversation_deleted_key(scope.user, item_id)])
    return None


def _deleted(conn: sqlite3.Connection, user: str, ended: Sequence[str]) -> None:
    """Move the user's generation on and record it for each of the `ended` keys (a user or
    conversation deleted: its turns in flight save nothing more), generations.py; clear what
    the user's turns kept that may quote the deleted items."""
    generation = conn.execute(BUMP_SQL.format("?"), (generation_key(user),)).fetchone()[0]
    conn.executemany(MARK_SQL.format("?", "?"), [(key, generation) for key in ended])
    # A tool loop's kept memory exchanges, and every cached block (the generation just moved
    # past them all, so no lookup uses one again): a loop's next step or a retry computes its
    # block afresh, without the deleted items (deletion wins over replaying the loop's bytes),
    # and the deleted text is not left in the file.
    conn.execute("UPDATE turn_tool_calls SET exchange = NULL WHERE user_id = ? AND exchange IS NOT NULL", (user,))
    conn.execute("UPDATE turns SET block = NULL WHERE user_id = ? AND block IS NOT NULL", (user,))


def delete_user(conn: sqlite3.Connection, user: str) -> dict[str, int]:
    """Every row of the user, counted then deleted; the full-text indexes merged after.

    The user's generation moves on even when it had no rows: its first turn may be in flight.
    """
    _deleted(conn, user, [user_deleted_key(user)])
    tables = user_tables(conn)
    counts = _counts(conn, user, tables)
    counts["users"] = conn.execute("DELETE FROM users WHERE id = ?", (user,)).rowcount
    for table in tables:  # rows the cascade did not reach (none, unless a table has no foreign key)
        conn.execute(f'DELETE FROM "{table}" WHERE user_id = ?', (user,))
    if any(counts.values()):
        for fts in FTS_TABLES:
            conn.execute(f"INSERT INTO {fts}({fts}) VALUES ('optimize')")
    return counts


class _Params(list[Any]):
    """Parameters collected while SQL is built: `params(value)` gives its `?`."""

    def __call__(self, value: Any) -> str:
        self.append(value)
        return "?"


def reindex_page(conn: sqlite3.Connection, spec: TermsColumns, after: tuple[Any, ...] | None, limit: int,
                 user: str | None) -> ReindexedPage:
    """Read the batch, rewrite the rows whose terms are not current; the FTS5 triggers re-index them."""
    params = _Params()
    rows = _rows(conn, page_query(spec, after=after, limit=limit, mark=params, user=user), params)
    said_before: list[str] = []
    if spec.table == "messages" and rows:
        params = _Params()
        said_before = [row[0] for row in reversed(conn.execute(said_before_query(rows[0], params), params).fetchall())]
    changed = rewrites(spec, rows, said_before)
    assignments = ", ".join(f"{column} = ?" for column in spec.terms)
    conn.executemany(f"UPDATE {spec.table} SET {assignments} WHERE seq = ?", changed)
    return page_of(spec, rows, limit, len(changed))


def checkpoint(conn: sqlite3.Connection) -> bool:
    """Copy the WAL into the database and truncate it to zero bytes; False when readers held it."""
    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy:
        log.warning("WAL checkpoint after a delete was blocked by a reader; the WAL is truncated at the next one")
    return not busy
