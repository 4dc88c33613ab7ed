"""The memory API's operations on PostgreSQL: listing, explicit memories, deletes with counts, import.

`PostgresAdmin` is mixed into `PostgresStore`, as `SQLiteAdmin` is into `SQLiteStore`, and
behaves the same (sqlite/admin.py is the reference). Each write runs in one transaction
that first takes the user's advisory lock, so it never interleaves with another
replica's batch for the same user.

Deleting a user removes every row that carries its id: the users row cascades through the
foreign keys, the triggers drop the deleted items' postings, and every table with a
`user_id` is then swept. PostgreSQL keeps deleted tuples in the table files until VACUUM
reclaims them (and backups keep them until they expire): README ("Running several replicas") says so.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar, cast

import asyncpg

from proxy.ids import new_id
from proxy.extracted import canonical_name
from proxy.models import Scope, StoredMessage
from proxy.stores.base import (
    MEMORY_TYPES,
    PAGE_KEY_PARTS,
    TAGS_MAX,
    PageKey,
    PageList,
    ReindexedPage,
    StoreMemory,
    TermsTable,
    text_hash,
)
from proxy.stores.export_records import INJECTIONS_SELECT
from proxy.stores.generations import BUMP_SQL, MARK_SQL, conversation_deleted_key, generation_key, user_deleted_key
from proxy.stores.postgres.import_records import import_records
from proxy.stores.postgres.reads import Args
from proxy.stores.postgres.pruning import conversation_messages, prune_graph
from proxy.stores.postgres.rows import (
    EXPORT,
    clean_text,
    from_micros,
    message_from_record,
    micros,
    utc,
)
from proxy.stores.postgres.schema import CONTEXT_SQL, INTERNAL_TABLES
from proxy.stores.reindex_terms import (
    REINDEX_BATCH,
    TERMS_COLUMNS,
    TermsColumns,
    page_of,
    page_query,
    rewrites,
    said_before_query,
)
from proxy.stores.indexed_text import CONTEXT_MESSAGES, context_terms, entity_terms, index_terms

T = TypeVar("T")
ItemKind = Literal["memory", "message", "entity", "relationship", "conversation"]
Corrected = Literal["entity", "message", "conflict"]
# The table each kind of item lives in.
_ITEM_TABLES = {"message": "messages", "entity": "entities", "relationship": "relationships",
                "conversation": "conversations"}
# Where each list's keys are kept (store.base.PAGE_KEY_PARTS): the table, and its key columns in order.
_KEY_COLUMNS: dict[PageList, tuple[str, str]] = {
    "entities": ("entities", "seq"), "messages": ("messages", "created_at, seq"),
    "conversations": ("conversations", "last_active_at, id"), "reasoning": ("reasoning", "created_at, seq")}


def _agent(scope: Scope, alias: str, first: int) -> tuple[str, list[Any]]:
    """Limit rows to the scope's agent under isolation; `first` is the next parameter number."""
    if scope.agent_isolated:
        return f" AND {alias}.agent_id IS NOT DISTINCT FROM ${first}", [scope.agent]
    return "", []


def _past(listing: PageList, columns: str, after: PageKey | None, args: list[Any], *, first: int = 3,
          newest_first: bool = False) -> str:
    """The condition that starts a page just past `after` in the order of `columns`.

    `args` are the query's parameters from number `first` on; the key's values are added to them.
    """
    if after is None:
        return ""
    number = first + len(args)
    args += [from_micros(cast(float, part)) if kind == "time" else part for kind, part in zip(PAGE_KEY_PARTS[listing], after)]
    marks = ", ".join(f"${n}" for n in range(number, number + len(after)))
    return f" AND ({columns}) {'<' if newest_first else '>'} ({marks})"


class PostgresAdmin:
    """The memory API's half of PostgresStore (the host provides the pool)."""

    async def _fetch(self, sql: str, args: Sequence[Any]) -> list[asyncpg.Record]:  # provided by PostgresStore
        raise NotImplementedError

    async def _locked(self, users: Iterable[str], body: Callable[[asyncpg.Connection], Awaitable[T]]
                      ) -> T:  # provided by PostgresStore
        raise NotImplementedError

    # --- reads

    async def entity_page(self, scope: Scope, *, limit: int = 100,
                          after: PageKey | None = None) -> list[tuple[PageKey, dict[str, Any]]]:
        """The user's entities as export records, oldest first, from just past `after`."""
        agent, args = _agent(scope, "e", 3)
        past = _past("entities", "e.seq", after, args)
        rows = await self._fetch(f"SELECT e.* FROM entities e WHERE e.user_id = $1{agent}{past} ORDER BY e.seq"
                                 " LIMIT $2", [scope.user, limit, *args])
        return [((row["seq"],), EXPORT.entity_record(row)) for row in rows]

    async def conversation_page(self, scope: Scope, *, limit: int = 100,
                                after: PageKey | None = None) -> list[tuple[PageKey, dict[str, Any]]]:
        """The user's conversations, most recently active first, from just past `after`."""
        agent, args = _agent(scope, "c", 3)
        past = _past("conversations", "c.last_active_at, c.id", after, args, newest_first=True)
        rows = await self._fetch(
            "SELECT c.*, (SELECT count(*) FROM messages m WHERE m.user_id = c.user_id"
            f" AND m.conversation_id = c.id) AS message_count FROM conversations c WHERE c.user_id = $1{agent}{past}"
            " ORDER BY c.last_active_at DESC, c.id DESC LIMIT $2", [scope.user, limit, *args])
        return [((micros(row["last_active_at"]), row["id"]),
                 {"id": row["id"], "agent_id": row["agent_id"], "created_at": utc(row["created_at"]),
                  "last_active_at": utc(row["last_active_at"]), "message_count": row["message_count"]})
                for row in rows]

    async def message_page(self, scope: Scope, conversation_id: str, *, limit: int = 100,
                           after: PageKey | None = None) -> list[tuple[PageKey, StoredMessage]]:
        """Messages of one conversation, oldest first, from just past `after`."""
        agent, args = _agent(scope, "m", 4)
        past = _past("messages", "m.created_at, m.seq", after, args, first=4)
        rows = await self._fetch(
            f"SELECT m.* FROM messages m WHERE m.user_id = $1 AND m.conversation_id = $2{agent}{past}"
            " ORDER BY m.created_at, m.seq LIMIT $3", [scope.user, conversation_id, limit, *args])
        return [((micros(row["created_at"]), row["seq"]), message_from_record(row)) for row in rows]

    async def neighbours(self, scope: Scope, message_ids: Sequence[str]
                         ) -> dict[str, tuple[StoredMessage | None, StoredMessage | None]]:
        """For each of these messages that has one, the message just before it and the one just after it."""
        if not message_ids:
            return {}
        agent, args = _agent(scope, "m", 3)
        near_agent = agent.replace("m.agent_id", "p.agent_id")
        # Each side is one step of the (user, conversation, created_at) index, seq breaking ties.
        side = ("SELECT p.seq FROM messages p WHERE p.user_id = h.user_id AND p.conversation_id = h.conversation_id"
                "{agent} AND (p.created_at, p.seq) {op} (h.created_at, h.seq)"
                " ORDER BY p.created_at {order}, p.seq {order} LIMIT 1")
        rows = await self._fetch(
            f"WITH h AS (SELECT m.* FROM messages m WHERE m.user_id = $1 AND m.id = ANY($2::text[]){agent})"
            f" SELECT h.id AS hit_id, -1 AS side, n.* FROM h JOIN messages n"
            f" ON n.seq = ({side.format(agent=near_agent, op='<', order='DESC')})"
            f" UNION ALL SELECT h.id AS hit_id, 1 AS side, n.* FROM h JOIN messages n"
            f" ON n.seq = ({side.format(agent=near_agent, op='>', order='ASC')})",
            [scope.user, list(message_ids), *args])
        found: dict[str, list[StoredMessage | None]] = {}
        for row in rows:
            found.setdefault(row["hit_id"], [None, None])[0 if row["side"] < 0 else 1] = message_from_record(row)
        return {hit: (before, after) for hit, (before, after) in found.items()}

    async def _record(self, scope: Scope, table: str, alias: str, item_id: str) -> asyncpg.Record | None:
        agent, args = _agent(scope, alias, 3)
        rows = await self._fetch(f"SELECT {alias}.* FROM {table} {alias} WHERE {alias}.user_id = $1"
                                 f" AND {alias}.id = $2{agent}", [scope.user, item_id, *args])
        return rows[0] if rows else None

    async def entity_record(self, scope: Scope, entity_id: str) -> dict[str, Any] | None:
        """One entity as an export record."""
        row = await self._record(scope, "entities", "e", entity_id)
        return None if row is None else EXPORT.entity_record(row)

    async def message_record(self, scope: Scope, message_id: str) -> dict[str, Any] | None:
        """One message as an export record."""
        row = await self._record(scope, "messages", "m", message_id)
        return None if row is None else EXPORT.message(row)

    async def conversation_record(self, scope: Scope, conversation_id: str) -> dict[str, Any] | None:
        """One conversation as an export record."""
        row = await self._record(scope, "conversations", "c", conversation_id)
        return None if row is None else EXPORT.conversation(row)

    async def reasoning_page(self, scope: Scope, *, limit: int = 100,
                             after: PageKey | None = None) -> list[tuple[PageKey, dict[str, Any]]]:
        """Reasoning traces as export records, newest first, from just past `after`."""
        agent, args = _agent(scope, "x", 3)
        past = _past("reasoning", "x.created_at, x.seq", after, args, newest_first=True)
        rows = await self._fetch(f"SELECT x.* FROM reasoning x WHERE x.user_id = $1{agent}{past}"
                                 " ORDER BY x.created_at DESC, x.seq DESC LIMIT $2", [scope.user, limit, *args])
        return [((micros(row["created_at"]), row["seq"]), EXPORT.reasoning(row)) for row in rows]

    async def page_key(self, scope: Scope, listing: PageList, item_id: str) -> PageKey | None:
        """The key of the user's item `item_id` in a list, None when the user has no such item."""
        table, columns = _KEY_COLUMNS[listing]
        rows = await self._fetch(f"SELECT {columns} FROM {table} WHERE user_id = $1 AND id = $2", [scope.user, item_id])
        if not rows:
            return None
        return tuple(micros(part) if kind == "time" else part for kind, part in zip(PAGE_KEY_PARTS[listing], rows[0]))

    async def injections(self, scope: Scope, *, limit: int = 20) -> list[dict[str, Any]]:
        """The injection log of the user's latest turns, newest first."""
        rows = await self._fetch(f"{INJECTIONS_SELECT} WHERE i.user_id = $1 ORDER BY i.seq DESC LIMIT $2",
                                 [scope.user, limit])
        return [EXPORT.injection(row) for row in rows]

    # --- writes

    async def store_memory(self, op: StoreMemory) -> str:
        """Apply one StoreMemory alone; the id of the entity or message that holds it."""
        return await self._locked([op.scope.user], lambda conn: store_memory(conn, op))

    async def update_memory(self, scope: Scope, memory_id: str, content: str) -> Corrected | None:
        """Correct an entity's text (its description, or its name when it has none) or a message's."""
        return await self._locked([scope.user], lambda conn: update_memory(conn, scope, memory_id, content))

    async def delete_item(self, scope: Scope, kind: ItemKind, item_id: str) -> dict[str, int] | None:
        """Delete one item and what hangs off it; rows deleted per table, None when there is no such item."""
        return await self._locked([scope.user], lambda conn: delete_item(conn, scope, kind, item_id))

    async def delete_user(self, scope: Scope) -> dict[str, int]:
        """Delete every row of the user; rows deleted per table."""
        return await self._locked([scope.user], lambda conn: delete_user(conn, scope.user))

    async def import_records(self, scope: Scope, records: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
        """Add validated export records to the user, skipping ids it already has; counts per kind."""
        return await self._locked([scope.user], lambda conn: import_records(conn, scope, records))

    async def reindex_terms(self, table: TermsTable, *, after: tuple[Any, ...] | None = None,
                            limit: int = REINDEX_BATCH, user: str | None = None) -> ReindexedPage:
        """One batch of `memproxy reindex --terms` (reindex_terms.py), in one transaction holding the advisory
        locks of the users whose rows it holds, so no replica writes their items meanwhile."""
        spec = TERMS_COLUMNS[table]
        if user is not None:
            return await self._locked([user], lambda conn: reindex_page(conn, spec, after, limit, user, [user]))
        users, upto = await self._batch_window(spec, after, limit)
        if not users:
            return ReindexedPage(0, 0, None)
        return await self._locked(users, lambda conn: reindex_page(conn, spec, after, limit, None, users, upto))

    async def _batch_window(self, spec: TermsColumns, after: tuple[Any, ...] | None, limit: int
                            ) -> tuple[list[str], tuple[Any, ...] | None]:
        """The users whose rows the next batch holds (their locks are taken before it is read
        again), and the key its window ends at (None: the table's end). The second read keeps to
        that window, so a row deleted in between ends neither the table early nor skips a row."""
        args = Args()
        rows = await self._fetch(page_query(spec, after=after, limit=limit, mark=args,
                                            columns=", ".join(dict.fromkeys(("user_id", *spec.key)))), args)
        upto = tuple(rows[-1][column] for column in spec.key) if len(rows) >= limit else None
        return list(dict.fromkeys(row["user_id"] for row in rows)), upto


# --- inside a transaction -----------------------------------------------------------------


async def store_memory(conn: asyncpg.Connection, op: StoreMemory) -> str:
    """An explicit memory: an entity of the user, or (`interaction`) an assistant message."""
    if op.memory_type not in MEMORY_TYPES:
        raise ValueError(f"unknown memory type {op.memory_type!r}")
    at = utc(op.at)
    await conn.execute("INSERT INTO users (id, created_at) VALUES ($1, $2) ON CONFLICT DO NOTHING", op.scope.user, at)
    if op.memory_type == "interaction":
        return await _interaction(conn, op, at)
    return await _fact(conn, op, at)


async def _fact(conn: asyncpg.Connection, op: StoreMemory, at: datetime) -> str:
    """The memory as an entity named by its text, merged by canonical name like extracted ones."""
    name = clean_text(" ".join(op.content.split()))
    key = canonical_name(name)
    if not key:
        raise ValueError("a memory needs some text")
    agent = op.scope.agent if op.scope.agent_isolated else None
    row = await conn.fetchrow(
        "SELECT seq, id, tags FROM entities WHERE user_id = $1 AND (id = $2 OR (coalesce(agent_id, '') = $3"
        " AND canonical_name = $4)) ORDER BY id = $2 DESC LIMIT 1", op.scope.user, op.memory_id, agent or "", key)
    tags = [clean_text(t) for t in op.tags]
    if row is not None:
        held = json.loads(row["tags"])
        merged = (held + [t for t in dict.fromkeys(tags) if t not in held])[-TAGS_MAX:]  # the newest
        await conn.execute("UPDATE entities SET memory_type = $1, confidence = $2, tags = $3, updated_at = $4,"
                           " stored_via = coalesce(stored_via, $6) WHERE seq = $5", op.memory_type, op.confidence,
                           json.dumps(merged), at, row["seq"], op.stored_via)
        return str(row["id"])
    await conn.execute(
        "INSERT INTO entities (id, user_id, agent_id, name, canonical_name, type, description, memory_type, confidence,"
        " tags, name_terms, type_terms, description_terms, created_at, updated_at, stored_via)"
        " VALUES ($1, $2, $3, $4, $5, $6, '', $6, $7, $8, $9, $10, $11, $12, $12, $13)",
        op.memory_id, op.scope.user, agent, name, key, op.memory_type, op.confidence,
        json.dumps(list(dict.fromkeys(tags))), *entity_terms(name, op.memory_type, ""), at, op.stored_via,
    )
    return op.memory_id


async def _interaction(conn: asyncpg.Connection, op: StoreMemory, at: datetime) -> str:
    """The memory as an assistant message in the conversation the op names, else the user's latest
    (a new one if none)."""
    agent, args = _agent(op.scope, "c", 2)
    conversation = op.conversation_id or await conn.fetchval(
        f"SELECT c.id FROM conversations c WHERE c.user_id = $1{agent}"
        " ORDER BY c.last_active_at DESC, c.id DESC LIMIT 1", op.scope.user, *args)
    if conversation is None or op.conversation_id is not None:
        conversation = conversation or new_id()
        await conn.execute("INSERT INTO conversations (user_id, id, agent_id, created_at, last_active_at)"
                           " VALUES ($1, $2, $3, $4, $4) ON CONFLICT DO NOTHING",
                           op.scope.user, conversation, op.scope.agent, at)
    content = clean_text(op.content)
    inserted = await conn.fetchval(
        "INSERT INTO messages (id, user_id, conversation_id, agent_id, role, content, content_hash, terms, context,"
        f" created_at) VALUES ($1, $2, $3, $4, 'assistant', $5, $6, $7, {CONTEXT_SQL.format('$2', '$3', '$8')}, $8)"
        " ON CONFLICT DO NOTHING RETURNING id",
        op.memory_id, op.scope.user, conversation, op.scope.agent, content, text_hash(content), index_terms(content),
        at,
    )
    if inserted is not None:
        await conn.execute("INSERT INTO extraction_queue (user_id, message_id, next_attempt_at, created_at)"
                           " VALUES ($1, $2, $3, $3) ON CONFLICT DO NOTHING", op.scope.user, op.memory_id, at)
    return op.memory_id


async def update_memory(conn: asyncpg.Connection, scope: Scope, memory_id: str, content: str) -> Corrected | None:
    """Replace the text of the entity or message `memory_id`; "conflict" when a name is taken."""
    content = clean_text(content)
    entity = await conn.fetchrow("SELECT * FROM entities WHERE user_id = $1 AND id = $2", scope.user, memory_id)
    if entity is not None:
        return await _correct_entity(conn, entity, content)
    changed = await conn.fetchrow(
        "UPDATE messages SET content = $1, content_hash = $2, terms = $3 WHERE user_id = $4 AND id = $5"
        " RETURNING conversation_id, created_at, seq",
        content, text_hash(content), index_terms(content), scope.user, memory_id,
    )
    if changed is None:
        return None
    await _refresh_followers(conn, scope.user, *changed)
    return "message"


async def _refresh_followers(conn: asyncpg.Connection, user: str, conversation_id: str, created_at: datetime,
                             seq: int) -> None:
    """The context of the messages said after one that was corrected or deleted, made again
    (sqlite.admin._refresh_followers: the words taken out must not stay findable through them)."""
    followers = await conn.fetch(
        "SELECT seq, created_at FROM messages WHERE user_id = $1 AND conversation_id = $2"
        " AND (created_at, seq) > ($3, $4) ORDER BY created_at, seq LIMIT $5",
        user, conversation_id, created_at, seq, CONTEXT_MESSAGES)
    for follower in followers:
        before = await conn.fetch(
            "SELECT terms FROM messages WHERE user_id = $1 AND conversation_id = $2 AND (created_at, seq) < ($3, $4)"
            " ORDER BY created_at DESC, seq DESC LIMIT $5",
            user, conversation_id, follower["created_at"], follower["seq"], CONTEXT_MESSAGES)
        context = context_terms([row["terms"] for row in reversed(before)])
        await conn.execute("UPDATE messages SET context = $1 WHERE seq = $2 AND context <> $1", context, follower["seq"])


async def _correct_entity(conn: asyncpg.Connection, row: asyncpg.Record, content: str) -> Corrected:
    aliases = json.loads(row["aliases"])
    name, description = row["name"], " ".join(content.split())
    key = row["canonical_name"]
    if not row["description"]:
        name, description = description, ""
        key = canonical_name(name)
        taken = await conn.fetchval(
            "SELECT 1 FROM entities WHERE user_id = $1 AND coalesce(agent_id, '') = $2 AND canonical_name = $3"
            " AND seq <> $4", row["user_id"], row["agent_id"] or "", key, row["seq"])
        if taken is not None or not key:
            return "conflict"
    await conn.execute(
        "UPDATE entities SET name = $1, canonical_name = $2, description = $3, name_terms = $4, type_terms = $5,"
        " description_terms = $6, updated_at = GREATEST(updated_at, now()) WHERE seq = $7",
        name, key, description, *entity_terms(name, row["type"], description, aliases), row["seq"],
    )
    return "entity"


async def reindex_page(conn: asyncpg.Connection, spec: TermsColumns, after: tuple[Any, ...] | None, limit: int,
                       user: str | None, users: Sequence[str], upto: tuple[Any, ...] | None = None) -> ReindexedPage:
    """Read the batch (of the locked `users` only), rewrite the rows whose terms are not current; the
    triggers move their postings and statistics, folded at commit.

    A row of a user not locked, saved since the users were read, is passed over: it was saved
    with current terms (unless by a replica not yet upgraded, which the next run catches).
    """
    args = Args()
    among = None if user is not None else f"ANY({args(list(users))}::text[])"
    rows = await conn.fetch(page_query(spec, after=after, limit=limit, mark=args, user=user, among=among, upto=upto),
                            *args)
    said_before: list[str] = []
    if spec.table == "messages" and rows:
        args = Args()
        said_before = [row["content"] for row in reversed(await conn.fetch(said_before_query(rows[0], args), *args))]
    changed = rewrites(spec, rows, said_before)
    if changed:
        columns = (*spec.terms, "seq")
        arrays = ", ".join(f"${n}::{'bigint' if c == 'seq' else 'text'}[]" for n, c in enumerate(columns, start=1))
        assignments = ", ".join(f"{column} = u.{column}" for column in spec.terms)
        await conn.execute(f"UPDATE {spec.table} x SET {assignments} FROM unnest({arrays}) AS u({', '.join(columns)})"
                           " WHERE x.seq = u.seq", *(list(values) for values in zip(*changed)))
    return page_of(spec, rows, limit, len(changed), upto)


async def user_tables(conn: asyncpg.Connection) -> list[str]:
    """Every table of the schema with a `user_id` column, but the search index's own."""
    rows = await conn.fetch(
        "SELECT table_name FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND column_name = 'user_id' ORDER BY table_name")
    return [row["table_name"] for row in rows if row["table_name"] not in INTERNAL_TABLES]


async def _counts(conn: asyncpg.Connection, user: str, tables: Sequence[str]) -> dict[str, int]:
    """Rows of the user per table, in one statement."""
    counts = ", ".join(f'(SELECT count(*) FROM "{t}" WHERE user_id = $1)' for t in tables)
    row = await conn.fetchrow(f"SELECT {counts}", user)
    return {t: int(row[i]) for i, t in enumerate(tables)} if row is not None else {}


async def delete_item(conn: asyncpg.Connection, scope: Scope, kind: ItemKind, item_id: str) -> dict[str, int] | None:
    """Delete one item (cascading); rows deleted per table, or None when it does not exist (a
    conversation is marked deleted even then, as a user is)."""
    kinds: Sequence[str] = ("entity", "message") if kind == "memory" else (kind,)
    tables = await user_tables(conn)
    before = await _counts(conn, scope.user, tables)
    for each in kinds:
        table = _ITEM_TABLES[each]
        if each == "message":
            gone = await conn.fetchrow("DELETE FROM messages WHERE user_id = $1 AND id = $2"
                                       " RETURNING conversation_id, created_at, seq", scope.user, item_id)
            if gone is not None:
                await _refresh_followers(conn, scope.user, *gone)
                await prune_graph(conn, scope.user, [item_id])
            deleted = None if gone is None else item_id
        else:
            said = await conversation_messages(conn, scope.user, item_id) if each == "conversation" else []
            deleted = await conn.fetchval(f"DELETE FROM {table} WHERE user_id = $1 AND id = $2 RETURNING id",
                                          scope.user, item_id)
            if deleted is not None:
                await prune_graph(conn, scope.user, said)  # what its messages alone said goes with them
        if deleted is not None:
            ended = [conversation_deleted_key(scope.user, item_id)] if each == "conversation" else []
            await _deleted(conn, scope.user, ended)
            after = await _counts(conn, scope.user, tables)
            return {t: before[t] - after[t] for t in tables if before[t] != after[t]}
    if kind == "conversation":  # none saved yet, but its first turn may be in flight: it saves nothing
        await _deleted(conn, scope.user, [conversation_deleted_key(scope.user, item_id)])
    return None


async def _deleted(conn: asyncpg.Connection, user: str, ended: Sequence[str]) -> None:
    """Move the user's generation on and record it for each of the `ended` keys (a user or
    conversation deleted: its turns in flight save nothing more), generations.py; clear what
    the user's turns kept that may quote the deleted items."""
    generation = await conn.fetchval(BUMP_SQL.format("$1"), generation_key(user))
    for key in ended:
        await conn.execute(MARK_SQL.format("$1", "$2"), key, generation)
    # A tool loop's kept memory exchanges, and every cached block (the generation just moved
    # past them all, so no lookup uses one again): a loop's next step or a retry computes its
    # block afresh, without the deleted items (deletion wins over replaying the loop's bytes),
    # and the deleted text is not left in the database.
    await conn.execute("UPDATE turn_tool_calls SET exchange = NULL WHERE user_id = $1 AND exchange IS NOT NULL", user)
    await conn.execute("UPDATE turns SET block = NULL WHERE user_id = $1 AND block IS NOT NULL", user)


async def delete_user(conn: asyncpg.Connection, user: str) -> dict[str, int]:
    """Every row of the user, counted then deleted.

    The user's generation moves on even when it had no rows: its first turn may be in flight.
    """
    await _deleted(conn, user, [user_deleted_key(user)])
    tables = await user_tables(conn)
    counts = await _counts(conn, user, tables)
    counts["users"] = int((await conn.execute("DELETE FROM users WHERE id = $1", user)).split()[-1])
    for table in tables:  # rows the cascade did not reach (none, unless a table has no foreign key)
        await conn.execute(f'DELETE FROM "{table}" WHERE user_id = $1', user)
    for table in INTERNAL_TABLES:
        await conn.execute(f'DELETE FROM "{table}" WHERE user_id = $1', user)
    return counts
