"""The shared store: PostgreSQL through an asyncpg connection pool, for several replicas.

It keeps the SQLite store's behaviour (sqlite/store.py is the reference) and adds what
replicas sharing one database need:
- Every write is idempotent on the same per-user unique keys (`ON CONFLICT`), so the turn
  cache, the persist-once keys and the tool-call ids are in the database, not in a replica.
- Each batch takes a transaction-scoped advisory lock per user first, in key order (no
  deadlock between two replicas' batches), so one user's writes apply in order.
- Extraction claims lease a user's items to one replica at a time (postgres/queue.py),
  so one user's facts land in the order they were said.
- Recovery at open marks as interrupted only turns pending for longer than
  `STALE_PENDING`: younger ones may be in flight on another replica.
- Search is BM25 computed in SQL from an inverted index (postgres/schema.py) with per-user
  statistics read in the same statement, so there is no per-process index to go stale.
Schema: postgres/schema.py; records to models: postgres/rows.py; write ops: postgres/batch.py;
reads and search: postgres/reads.py; the memory API: postgres/admin.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

from proxy.ids import new_id
from proxy.models import Scope, Turn
from proxy.stores.base import RESPONSE_CHAIN_MAX, FoundTurn, QueuedMessage, ResponseChain, StoreError, WriteOp
from proxy.stores.generations import generation_key
from proxy.stores.postgres.admin import PostgresAdmin
from proxy.stores.postgres.batch import apply_ops, recover
from proxy.stores.postgres.owners import PostgresProviderObjects
from proxy.stores.postgres.queue import claim
from proxy.stores.postgres.reads import Args, PostgresReads, agent_clause
from proxy.stores.postgres.rows import clean_text, turn_from_record, utc
from proxy.stores.postgres.schema import migrate
from proxy.stores.postgres.vectors import PostgresVectors

POOL_MIN = 2
POOL_MAX = 20  # per replica; retrieval runs its sources' queries in parallel
CONNECT_TIMEOUT_S = 5.0  # asyncpg's default of 60 s would hold a write retry that long
COMMAND_TIMEOUT_S = 30.0
PING_TIMEOUT_S = 2.0
CLOSE_TIMEOUT_S = 10.0
# JIT compiling a search's aggregate costs more than running it. A generic plan of a prepared
# search (PostgreSQL's choice after five runs) cannot see how rare the query's terms are or
# how large the user's history is, and scanned postings it should have probed: measured at
# 100k messages, p95 went from 25 ms to 250 ms; planning each search costs ~1 ms. Write
# transactions set it back (_transaction).
SERVER_SETTINGS = {"jit": "off", "plan_cache_mode": "force_custom_plan", "application_name": "memproxy"}
_LOCK_NAMESPACE = b"memproxy:user:"
T = TypeVar("T")

# SQLSTATE classes no retry can fix: bad data (22), a constraint (23), bad SQL or
# privileges (42), a limit of the server such as an index row too large (54), an
# exception raised by a trigger (P0). Connection loss (08), deadlock or serialisation
# (40), a full disk (53), shutdown (57) and the like are transient. A write taken for
# transient is retried forever, and every later write waits behind it.
_INVALID_CLASSES = frozenset({"22", "23", "42", "54", "P0"})


def _error(exc: BaseException) -> StoreError:
    """A StoreError saying whether retrying can help."""
    if isinstance(exc, asyncpg.PostgresError):
        state = exc.sqlstate or ""
        return StoreError(f"{state} {type(exc).__name__}: {exc}", transient=state[:2] not in _INVALID_CLASSES)
    # asyncpg reports an argument it cannot encode as a ValueError; a closed connection or
    # pool as an InterfaceError; the network as OSError or TimeoutError.
    invalid = isinstance(exc, (TypeError, ValueError))
    return StoreError(f"{type(exc).__name__}: {exc}", transient=not invalid)


# InternalClientError: a pooled connection left mid-operation by an outage ("cannot switch to
# state 12; another operation is in progress"); the next try takes another connection.
_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError, TimeoutError,
           TypeError, ValueError)


def user_lock_key(user: str) -> int:
    """The advisory lock key of a user: 64 bits of a hash, as a signed bigint."""
    digest = hashlib.sha256(_LOCK_NAMESPACE + user.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


_TURN_COLUMNS = ("t.turn_key, t.conversation_id, t.status, t.created_at, t.block, t.injected, t.prompt,"
                 " t.hook_context")
class PostgresStore(PostgresReads, PostgresAdmin, PostgresVectors, PostgresProviderObjects):
    """The Store protocol on a PostgreSQL database shared by any number of replicas.

    Reads and search: postgres/reads.py; the memory API: postgres/admin.py; embeddings: postgres/vectors.py.
    """

    def __init__(self, url: str, *, min_connections: int = POOL_MIN, max_connections: int = POOL_MAX) -> None:
        self._url = url
        self._sizes = (min_connections, max_connections)
        self._pool: asyncpg.Pool | None = None
        self._batches: set[asyncio.Task[Any]] = set()
        self._claimant = new_id()  # names the extraction leases this replica takes (postgres/queue.py)

    # --- lifecycle

    async def open(self) -> None:
        """Connect, migrate the schema, mark turns left pending by a dead replica as interrupted."""
        if self._pool is not None:
            return
        try:
            pool = await asyncpg.create_pool(self._url, min_size=self._sizes[0], max_size=self._sizes[1],
                                             timeout=CONNECT_TIMEOUT_S, command_timeout=COMMAND_TIMEOUT_S,
                                             server_settings=SERVER_SETTINGS, reset=_keep_session)
        except (*_ERRORS, asyncio.TimeoutError) as exc:
            raise StoreError(f"cannot open {_redacted(self._url)}: {_error(exc)}") from exc
        try:
            async with pool.acquire() as conn:
                await migrate(conn)
                await recover(conn)
        except _ERRORS as exc:
            pool.terminate()
            raise StoreError(f"cannot open {_redacted(self._url)}: {_error(exc)}") from exc
        self._pool = pool

    async def close(self) -> None:
        """Let running batches commit, then release every connection."""
        pool, self._pool = self._pool, None
        if self._batches:
            await asyncio.wait(list(self._batches), timeout=CLOSE_TIMEOUT_S)
        if pool is None:
            return
        try:
            await asyncio.wait_for(pool.close(), CLOSE_TIMEOUT_S)
        except (*_ERRORS, asyncio.TimeoutError):
            pool.terminate()  # connections that cannot close cleanly (the server is gone)

    def searched_in_memory(self) -> dict[str, int]:
        return {}  # the server searches its own indexes

    async def ping(self) -> bool:
        """True when the database answers a trivial query."""
        if self._pool is None:
            return False
        try:
            return bool(await self._pool.fetchval("SELECT 1", timeout=PING_TIMEOUT_S) == 1)
        except _ERRORS:
            return False

    def _open_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreError("store is not open")
        return self._pool

    # --- writes

    async def apply(self, ops: Sequence[WriteOp]) -> None:
        """Apply a batch of writes in one transaction; raise StoreError on failure."""
        if ops:
            batch = list(ops)
            await self._locked({op.scope.user for op in batch}, lambda conn: apply_ops(conn, batch))

    async def _locked(self, users: Iterable[str], body: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """Run `body` in one transaction that first takes each user's advisory lock.

        The transaction runs as its own task: a caller cancelled meanwhile does not stop
        it, so it commits or rolls back whole, and close() waits for it.
        """
        task = asyncio.get_running_loop().create_task(self._transaction(self._open_pool(), sorted(set(users)), body))
        self._batches.add(task)
        task.add_done_callback(_forget(self._batches))
        try:
            return await asyncio.shield(task)
        except _ERRORS as exc:
            raise _error(exc) from exc

    @staticmethod
    async def _transaction(pool: asyncpg.Pool, users: list[str], body: Callable[[asyncpg.Connection], Awaitable[T]]
                           ) -> T:
        async with pool.acquire(timeout=CONNECT_TIMEOUT_S) as conn, conn.transaction():
            # Ascending key order: two replicas' transactions never wait on each other in a cycle.
            keys = sorted(user_lock_key(user) for user in users)
            # Writes take generic plans: planning the APPLY statement anew each time doubled its cost.
            # One statement for both: under load each round trip waits for the event loop's next pass.
            await conn.execute("SELECT set_config('plan_cache_mode', 'auto', true),"
                               " (SELECT count(pg_advisory_xact_lock(k)) FROM unnest($1::bigint[]) AS k)", keys)
            result = await body(conn)
            await conn.execute("SELECT fold_stats($1::text[])", users)  # the search counts, one row a key
            return result

    # --- the extraction queue (every user's: the background worker is not a request)

    async def claim_extraction(self, limit: int, now: datetime, *, max_chars: int | None = None
                               ) -> list[QueuedMessage]:
        """Due, unparked items, oldest first, each with its scope and message (text cut at `max_chars`).

        Replicas share the queue: the items are leased to this store for CLAIM_LEASE, and
        a user another replica holds items of is skipped, so one user's items are extracted
        and applied in queue order whichever replicas run (postgres/queue.py).
        """
        try:
            async with self._open_pool().acquire(timeout=CONNECT_TIMEOUT_S) as conn:
                return await claim(conn, self._claimant, limit, now, max_chars)
        except _ERRORS as exc:
            raise _error(exc) from exc

    async def release_extraction(self, queue_ids: Sequence[int]) -> None:
        """End this replica's leases on the items: until the lease ran out (CLAIM_LEASE) they were
        not due, and this replica went on with their users' later items first."""
        if queue_ids:
            await self._fetch("UPDATE extraction_queue SET claimed_until = NULL, claimed_by = NULL"
                              " WHERE id = ANY($1::bigint[]) AND claimed_by = $2", [list(queue_ids), self._claimant],
                              served=False)

    async def queue_depth(self) -> dict[str, int]:
        """Items waiting for extraction (`pending`, retries and claimed ones included) and given up on (`parked`)."""
        rows = await self._fetch("SELECT parked, count(*) AS n FROM extraction_queue GROUP BY parked", [], served=False)
        counts = {bool(row["parked"]): int(row["n"]) for row in rows}
        return {"pending": counts.get(False, 0), "parked": counts.get(True, 0)}

    # --- reads

    async def _fetch(self, sql: str, args: Sequence[Any], *, served: bool = True) -> list[asyncpg.Record]:
        """The rows of a read; `served`: one a request makes, noted in answered_at when answered (the
        extraction worker's polls are not: they say nothing of whether requests' reads are answered)."""
        try:
            rows = list(await self._open_pool().fetch(sql, *args))
        except _ERRORS as exc:
            raise _error(exc) from exc
        if served:
            self.answered_at = time.monotonic()
        return rows

    # --- turn and conversation identity

    async def find_turn(self, scope: Scope, call_ids: Sequence[str], history_hash: str, since: datetime,
                        previous_response: str | None = None) -> FoundTurn:
        """The user's generation and the turn the request belongs to, in one statement (one snapshot)."""
        args = Args()
        user = args(scope.user)
        key = args(generation_key(scope.user))
        generation = f"(SELECT coalesce((SELECT generation FROM generations WHERE id = {key}), 0) AS generation)"
        columns = f"{_TURN_COLUMNS}, t.block_generation"
        # Cleaned as they were saved: a NUL or lone surrogate from the client failed the read,
        # and five such requests opened the circuit breaker for every user of the replica.
        by_calls = (f"SELECT 0 AS rank, {columns} FROM turn_tool_calls c"
                    " JOIN turns t ON t.user_id = c.user_id AND t.turn_key = c.turn_key"
                    f" WHERE c.user_id = {user} AND c.call_id = ANY({args([clean_text(i) for i in call_ids])}::text[])"
                    f"{agent_clause(scope, 't', args)}"
                    # Of the turns that carried these ids, the one the request continues (TurnReads.find_turn).
                    f" ORDER BY t.turn_key IS NOT DISTINCT FROM (SELECT turn_key FROM responses WHERE user_id = {user}"
                    f" AND response_id = {args(clean_text(previous_response or ''))}) DESC,"
                    f" t.history_hash = {args(history_hash)} DESC, t.created_at DESC, t.seq DESC LIMIT 1")
        by_history = (f"SELECT 1 AS rank, {columns} FROM turns t WHERE t.user_id = {user}"
                      f" AND t.history_hash = {args(history_hash)} AND t.created_at >= {args(utc(since))}"
                      f"{agent_clause(scope, 't', args)} ORDER BY t.created_at DESC, t.seq DESC LIMIT 1")
        rows = await self._fetch(
            f"SELECT g.generation, f.* FROM {generation} g LEFT JOIN"
            f" (SELECT * FROM (({by_calls}) UNION ALL ({by_history})) found ORDER BY rank LIMIT 1) f ON true",
            args,
        )
        row = rows[0]
        if row["turn_key"] is None:
            return FoundTurn(None, row["generation"])
        turn = turn_from_record(row)
        if row["block_generation"] < row["generation"]:  # a deletion came after the block was computed
            turn = replace(turn, block=None, injected=0)
        return FoundTurn(turn, row["generation"])

    async def provider_response(self, scope: Scope, conversation_id: str, response_id: str) -> str | None:
        """The provider's own id recorded for a response id the client saw in the conversation, if any."""
        rows = await self._fetch("SELECT provider_id FROM responses WHERE user_id = $1 AND response_id = $2"
                                 " AND conversation_id = $3", [scope.user, clean_text(response_id), conversation_id])
        return rows[0]["provider_id"] if rows else None

    async def memory_exchanges(self, scope: Scope, turn_key: str, call_ids: Sequence[str]) -> dict[str, str]:
        """call id -> the memory exchange the turn recorded with it (tools mode), for those that have one."""
        if not call_ids:
            return {}
        rows = await self._fetch(
            "SELECT call_id, exchange FROM turn_tool_calls WHERE user_id = $1 AND turn_key = $2"
            " AND exchange IS NOT NULL AND call_id = ANY($3::text[])",
            [scope.user, turn_key, [clean_text(i) for i in call_ids]])
        return {row["call_id"]: row["exchange"] for row in rows}

    async def response_chain(self, scope: Scope, response_id: str) -> ResponseChain | None:
        """The conversation of a recorded response id and the messages of its chain's turns."""
        args = Args()
        user = args(scope.user)
        rows = await self._fetch(
            "WITH RECURSIVE chain(response_id, parent_id, turn_key, conversation_id, depth) AS ("
            " SELECT response_id, parent_id, turn_key, conversation_id, 0 FROM responses"
            f" WHERE user_id = {user} AND response_id = {args(clean_text(response_id))}"
            " UNION ALL SELECT r.response_id, r.parent_id, r.turn_key, r.conversation_id, c.depth + 1"
            f" FROM responses r JOIN chain c ON r.user_id = {user} AND r.response_id = c.parent_id"
            f" WHERE c.depth < {args(RESPONSE_CHAIN_MAX)})"
            " SELECT c.depth, c.conversation_id, m.content FROM chain c"
            f" LEFT JOIN messages m ON m.user_id = {user} AND m.turn_key = c.turn_key ORDER BY c.depth DESC, m.seq",
            args,
        )
        if not rows:
            return None
        conversation = next(str(row[1]) for row in rows if row[0] == 0)
        return ResponseChain(conversation, tuple(dict.fromkeys(str(row[2]) for row in rows if row[2] is not None)))

    async def turn(self, scope: Scope, turn_key: str) -> Turn | None:
        """One turn by key."""
        args = Args()
        rows = await self._fetch(
            f"SELECT {_TURN_COLUMNS} FROM turns t WHERE t.user_id = {args(scope.user)}"
            f" AND t.turn_key = {args(turn_key)}{agent_clause(scope, 't', args)}",
            args,
        )
        return turn_from_record(rows[0]) if rows else None

    async def conversation_by_assistant_hashes(self, scope: Scope, hashes: Sequence[str]) -> str | None:
        """The conversation holding the first of `hashes` (newest first) that was saved.

        When several conversations hold that text, the most recently active one wins.
        """
        if not hashes:
            return None
        args = Args()
        rows = await self._fetch(
            f"SELECT m.conversation_id FROM unnest({args(list(hashes))}::text[]) WITH ORDINALITY AS h(hash, ord)"
            f" JOIN messages m ON m.user_id = {args(scope.user)} AND m.content_hash = h.hash"
            " AND m.role = 'assistant'"
            " JOIN conversations c ON c.user_id = m.user_id AND c.id = m.conversation_id"
            f" WHERE true{agent_clause(scope, 'm', args)} ORDER BY h.ord, c.last_active_at DESC, c.id DESC LIMIT 1",
            args,
        )
        return str(rows[0]["conversation_id"]) if rows else None

    async def hook_context(self, scope: Scope, conversation_id: str) -> list[tuple[int, str]]:
        """The conversation's queued hook context, oldest first, as (seq, text)."""
        rows = await self._fetch("SELECT seq, text FROM hook_context WHERE user_id = $1 AND conversation_id = $2"
                                 " ORDER BY seq", [scope.user, conversation_id])
        return [(row["seq"], row["text"]) for row in rows]

    async def latest_conversation(self, scope: Scope) -> str | None:
        """The user's most recently active conversation."""
        ids = await self.recent_conversations(scope, 1)
        return ids[0] if ids else None

    async def recent_conversations(self, scope: Scope, limit: int | None) -> list[str]:
        """Ids of the user's conversations, most recently active first (all when None)."""
        args = Args()
        rows = await self._fetch(
            f"SELECT c.id FROM conversations c WHERE c.user_id = {args(scope.user)}{agent_clause(scope, 'c', args)}"
            f" ORDER BY c.last_active_at DESC, c.id DESC LIMIT {args(limit)}",
            args,
        )
        return [row["id"] for row in rows]

async def _keep_session(conn: asyncpg.Connection) -> None:
    """Nothing to reset when a connection goes back to the pool.

    asyncpg's default reset (unlock advisory locks, CLOSE ALL, UNLISTEN, RESET ALL) is one
    more round trip per query; this store holds no session state: its advisory locks are
    transaction-scoped, and it opens no cursors, listens to nothing and sets nothing.
    """


def _forget(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    """A done callback: drop the task and mark its error seen (its caller may be gone)."""

    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()

    return done


def _redacted(url: str) -> str:
    """The URL without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)
