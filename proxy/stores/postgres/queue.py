"""Claiming extraction items on PostgreSQL, where replicas share one queue.

A claim leases its items for CLAIM_LEASE to its claimant (one id per store, so per
replica); the result (RecordFacts, ExtractionFailed) ends the lease, and a replica that
dies holding items lets them come due again when the lease runs out.

One user's items are extracted in queue order by one replica at a time, so a correction
said right after a statement never lands before it: a claim skips every user another
claimant holds a live lease on, and takes each other user's oldest due items. The
claimant itself may go on with the user's next items (its worker submits its results in
queue order). A failed item holds no lease while it waits for its retry, so the user's
later items go on meanwhile, as on one replica.

Two claims at the same moment must not both take one user: each would read, in its
snapshot, no lease on the user, and then take different rows of theirs. So a claim runs
in one transaction of two statements. The first takes a transaction-scoped advisory lock
on each user it means to claim, without waiting (`pg_try_advisory_xact_lock`): a user
another claim is locking is left to that claim, and a try never waits, so no order of
locking can deadlock. The second reads the leases in a snapshot taken after those locks,
so it sees every lease committed by a claim that held one of its users before it, and
claims only users none of whose items another claimant holds.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg

from proxy.models import Scope
from proxy.stores.base import QueuedMessage
from proxy.stores.postgres.rows import message_from_record, utc

# How long a claimed extraction item stays with the replica that claimed it.
CLAIM_LEASE = timedelta(minutes=5)
# The space (the first of two int4 keys) of the claims' advisory locks, the second key being
# hashtext(user). Apart from the users' write locks (one bigint key). Two users whose hashes
# collide only skip each other for a moment.
CLAIM_LOCK_SPACE = 0x6D656D71  # "memq"

# Not parked, due, and not leased (or the lease ran out): $1 is now.
_DUE = "NOT q.parked AND q.next_attempt_at <= $1 AND (q.claimed_until IS NULL OR q.claimed_until <= $1)"
# None of the user's items is leased to another claimant ($2). A lease taken before claims
# named their claimant (claimed_by NULL) is another's.
_FREE = ("NOT EXISTS (SELECT 1 FROM extraction_queue o WHERE o.user_id = q.user_id"
         " AND o.claimed_until > $1 AND o.claimed_by IS DISTINCT FROM $2)")

# The users of the first $3 due items of free users, each locked unless another claim holds it.
# The lock is called outside the LIMITed subquery, so only on those users.
_LOCK_USERS = (
    f"SELECT u.user_id FROM (SELECT DISTINCT f.user_id FROM (SELECT q.user_id FROM extraction_queue q"
    f" WHERE {_DUE} AND {_FREE} ORDER BY q.next_attempt_at, q.id LIMIT $3) f) u"
    " WHERE pg_try_advisory_xact_lock($4, hashtext(u.user_id))"
)

# The first $3 due items of the locked users ($4) still free in this statement's snapshot,
# leased to the claimant. FOR UPDATE without SKIP LOCKED: an item whose result is being
# written (its lease ran out) is waited for, not passed over for the user's later items.
_CLAIM = (
    f"WITH due AS (SELECT q.id FROM extraction_queue q WHERE q.user_id = ANY($4::text[]) AND {_DUE} AND {_FREE}"
    " ORDER BY q.next_attempt_at, q.id LIMIT $3 FOR UPDATE),"
    " claimed AS (UPDATE extraction_queue q SET claimed_until = $1 + $5::interval, claimed_by = $2 FROM due"
    " WHERE q.id = due.id RETURNING q.id, q.user_id, q.message_id, q.attempts, q.next_attempt_at)"
    " SELECT c.id AS queue_id, c.attempts, m.id, m.conversation_id, m.role, m.created_at, m.user_id,"
    " m.agent_id, {content} AS content FROM claimed c"
    " JOIN messages m ON m.user_id = c.user_id AND m.id = c.message_id ORDER BY c.next_attempt_at, c.id"
)


async def claim(conn: asyncpg.Connection, claimant: str, limit: int, now: datetime, max_chars: int | None
                ) -> list[QueuedMessage]:
    """Lease to `claimant` up to `limit` due items, oldest first, of users no other claimant holds."""
    at = utc(now)
    # Only the head of a long text crosses into Python: the worker reads no more.
    content = "m.content" if max_chars is None else f"substr(m.content, 1, {int(max_chars)})"
    async with conn.transaction():
        users = [row["user_id"] for row in await conn.fetch(_LOCK_USERS, at, claimant, limit, CLAIM_LOCK_SPACE)]
        if not users:
            return []
        rows = await conn.fetch(_CLAIM.format(content=content), at, claimant, limit, users, CLAIM_LEASE)
    return [QueuedMessage(row["queue_id"], Scope(row["user_id"], agent=row["agent_id"]),
                          message_from_record(row), row["attempts"]) for row in rows]
