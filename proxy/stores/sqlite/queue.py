"""Claiming extraction items on SQLite, where the worker processes of one `memproxy serve
--workers N` share one queue in one file.

As on PostgreSQL (postgres/queue.py): a claim leases its items for CLAIM_LEASE to its
claimant (one id per store, so per process); the result (RecordFacts, ExtractionFailed) ends
the lease, and a process that dies holding items lets them come due again when the lease
runs out (or at the next start of `memproxy serve`, whose recovery ends every lease). One
user's items are extracted by one process at a time, in queue order: a claim skips every
user another claimant holds a live lease on.

A lease is a write, so two claims at once are one after the other under SQLite's write
lock: the UPDATE reads the leases as the claim before it left them, and no item is taken
twice. The worker looks every 50 ms while it is idle, so the claim first asks a read
connection whether any item is due at all, and takes the write lock only then.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from proxy.stores.sqlite.batch import transaction

# How long a claimed extraction item stays with the process that claimed it (as on PostgreSQL).
CLAIM_LEASE_S = 300.0

# Not parked, due, and not leased (or the lease ran out): the first ? is now.
_DUE = "q.parked = 0 AND q.next_attempt_at <= ?1 AND (q.claimed_until IS NULL OR q.claimed_until <= ?1)"
# None of the user's items is leased to another claimant (?2).
_FREE = ("NOT EXISTS (SELECT 1 FROM extraction_queue o WHERE o.user_id = q.user_id"
         " AND o.claimed_until > ?1 AND o.claimed_by IS NOT ?2)")

ANY_DUE = f"SELECT 1 FROM extraction_queue q WHERE {_DUE} AND {_FREE} LIMIT 1"

_LEASE = (
    "UPDATE extraction_queue SET claimed_until = ?4, claimed_by = ?2 WHERE id IN"
    f" (SELECT q.id FROM extraction_queue q WHERE {_DUE} AND {_FREE} ORDER BY q.next_attempt_at, q.id LIMIT ?3)"
    " RETURNING id"
)
_CLAIMED = (
    "SELECT q.id AS queue_id, q.attempts, m.id, m.conversation_id, m.role, m.created_at, m.user_id,"
    " m.agent_id, {content} AS content FROM extraction_queue q"
    " JOIN messages m ON m.user_id = q.user_id AND m.id = q.message_id"
    " WHERE q.id IN ({ids}) ORDER BY q.next_attempt_at, q.id"
)


def lease(conn: sqlite3.Connection, claimant: str, limit: int, now: float, max_chars: int | None
          ) -> list[sqlite3.Row]:
    """On the write connection: lease to `claimant` up to `limit` due items of users no other claimant
    holds, oldest first, in one IMMEDIATE transaction; their rows with the message (text cut at `max_chars`)."""
    content = "m.content" if max_chars is None else f"substr(m.content, 1, {int(max_chars)})"
    claimed: list[sqlite3.Row] = []

    def take() -> None:
        ids = [row[0] for row in conn.execute(_LEASE, (now, claimant, limit, now + CLAIM_LEASE_S))]
        if ids:
            rows = conn.cursor()
            rows.row_factory = sqlite3.Row
            claimed.extend(rows.execute(_CLAIMED.format(content=content, ids=", ".join("?" * len(ids))), ids))

    transaction(conn, take)
    return claimed


def release(conn: sqlite3.Connection, claimant: str, queue_ids: Sequence[int]) -> None:
    """On the write connection: end `claimant`'s leases on the items (they are due again at once)."""
    def end() -> None:
        conn.executemany("UPDATE extraction_queue SET claimed_until = NULL, claimed_by = NULL"
                         " WHERE id = ? AND claimed_by = ?", [(queue_id, claimant) for queue_id in queue_ids])

    transaction(conn, end)
