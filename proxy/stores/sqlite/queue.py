"""Claiming extraction items on SQLite, where the worker processes of one file share one queue.

The same leases as on PostgreSQL (postgres/queue.py): a claim leases its items for
CLAIM_LEASE to its claimant (one id per store, so per process); the result (RecordFacts
deletes the item, ExtractionFailed ends the lease) or a hand-back ends it, and a process
that dies holding items lets them come due again when the lease runs out. One user's items
go to one process at a time, in queue order, so a correction said right after a statement
never lands before it: a claim skips every user another claimant holds a live lease on.

SQLite has one writer at a time, so a claim's read of the leases and its update are atomic
when both run in one `BEGIN IMMEDIATE` transaction: no advisory locks are needed. Most
polls find nothing due; `anything_due` answers that on a read connection first, so an idle
worker never takes the write lock.

A claimant is named as a process (sqlite/processes.py): a lease of a process of this host
that is gone (killed, crashed) counts as ended at once, and the worker that takes its place
goes on with its items without waiting CLAIM_LEASE. A store closing ends its own leases
(`release_all`).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta

from proxy.models import Scope
from proxy.stores.base import QueuedMessage
from proxy.stores.sqlite.processes import gone
from proxy.stores.sqlite.rows import message_from_row, to_ts

# How long a claimed extraction item stays with the process that claimed it (as on PostgreSQL).
CLAIM_LEASE = timedelta(minutes=5)

# Not parked, due, and not leased (or the lease ran out, or its claimant is gone); none of the
# user's items leased to another live claimant. :now is the claim's time, :me the claimant,
# :gone a JSON list of the claimants gone.
_GONE = "(SELECT value FROM json_each(:gone))"
# The users held elsewhere are a small list computed once per statement: a subquery correlated
# with each due row cost 3x as much over another process's long backlog of one user.
_HELD_ELSEWHERE = ("SELECT o.user_id FROM extraction_queue o WHERE o.claimed_until > :now"
                   f" AND o.claimed_by IS NOT :me AND o.claimed_by NOT IN {_GONE}")
_DUE_AND_FREE = (
    "q.parked = 0 AND q.next_attempt_at <= :now"
    f" AND (q.claimed_until IS NULL OR q.claimed_until <= :now OR q.claimed_by IN {_GONE})"
    f" AND q.user_id NOT IN ({_HELD_ELSEWHERE})"
)
_CLAIMANTS = ("SELECT DISTINCT claimed_by FROM extraction_queue WHERE claimed_until > ? AND claimed_by IS NOT ?"
              " AND claimed_by IS NOT NULL")

_ANY_DUE = f"SELECT 1 FROM extraction_queue q WHERE {_DUE_AND_FREE} LIMIT 1"

_LEASE = (
    "UPDATE extraction_queue SET claimed_until = :until, claimed_by = :me WHERE id IN"
    f" (SELECT q.id FROM extraction_queue q WHERE {_DUE_AND_FREE} ORDER BY q.next_attempt_at, q.id LIMIT :limit)"
    " RETURNING id"
)

_CLAIMED = (
    "SELECT q.id AS queue_id, q.attempts, m.id, m.conversation_id, m.role, m.created_at, m.user_id,"
    " m.agent_id, {content} AS content FROM json_each(?) j CROSS JOIN extraction_queue q ON q.id = j.value"
    " JOIN messages m ON m.user_id = q.user_id AND m.id = q.message_id ORDER BY q.next_attempt_at, q.id"
)


def _claimants_gone(conn: sqlite3.Connection, claimant: str, at: float) -> str:
    """The claimants holding live leases whose process is gone, as a JSON list."""
    held = [name for (name,) in conn.execute(_CLAIMANTS, (at, claimant))]
    return json.dumps([name for name in held if gone(name)])


def anything_due(conn: sqlite3.Connection, claimant: str, now: datetime) -> bool:
    """True when a claim by `claimant` at `now` would take an item (a read, no lock)."""
    at = to_ts(now)
    return conn.execute(_ANY_DUE, {"now": at, "me": claimant, "gone": _claimants_gone(conn, claimant, at)}
                        ).fetchone() is not None


def claim(conn: sqlite3.Connection, claimant: str, limit: int, now: datetime, max_chars: int | None
          ) -> list[QueuedMessage]:
    """Lease to `claimant` up to `limit` due items, oldest first, of users no other claimant holds.

    Runs inside the caller's `BEGIN IMMEDIATE` transaction on the write connection."""
    at = to_ts(now)
    ids = [queue_id for (queue_id,) in conn.execute(
        _LEASE, {"now": at, "me": claimant, "until": to_ts(now + CLAIM_LEASE), "limit": limit,
                 "gone": _claimants_gone(conn, claimant, at)}).fetchall()]
    if not ids:
        return []
    # Only the head of a long text crosses into Python: the worker reads no more.
    content = "m.content" if max_chars is None else f"substr(m.content, 1, {int(max_chars)})"
    cursor = conn.cursor()
    cursor.row_factory = sqlite3.Row
    rows = cursor.execute(_CLAIMED.format(content=content), [_json_ids(ids)]).fetchall()
    return [QueuedMessage(row["queue_id"], Scope(row["user_id"], agent=row["agent_id"]), message_from_row(row),
                          row["attempts"]) for row in rows]


def release(conn: sqlite3.Connection, claimant: str, queue_ids: list[int]) -> None:
    """End `claimant`'s leases on the items: due again at once."""
    conn.execute("UPDATE extraction_queue SET claimed_until = NULL, claimed_by = NULL"
                 " WHERE id IN (SELECT value FROM json_each(?)) AND claimed_by = ?", [_json_ids(queue_ids), claimant])


def release_all(conn: sqlite3.Connection, claimant: str) -> None:
    """End every lease of `claimant` (its store is closing)."""
    conn.execute("UPDATE extraction_queue SET claimed_until = NULL, claimed_by = NULL WHERE claimed_by = ?",
                 [claimant])


def _json_ids(ids: list[int]) -> str:
    return "[" + ",".join(str(int(i)) for i in ids) + "]"
