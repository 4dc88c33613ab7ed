"""Reasoning traces as in-memory postings (sqlite_postings.py): how they are built and caught up.

Traces are only appended, in rowid order, so a user's postings catch up by reading the
rowids committed since the user's last search, as messages do (sqlite_message_index.py).
A trace deleted or changed moves `reasoning_epoch` (schema v7, a trigger, any process), and
postings built before it moved are rebuilt.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from proxy.stores.sqlite_postings import (
    CATCH_UP_MAX,
    SCAN_MAX,
    UserPostings,
    paced,
    read_transaction,
    rows_by_seq,
)
from proxy.stores.sqlite_postings_cache import CatchUp, PostingsCache

# rowid, conversation, agent, indexed text, FTS5 docsize.
_COLUMNS = "x.seq, x.conversation_id, x.agent_id, x.terms, d.sz"
_ROWS = f"SELECT {_COLUMNS} FROM reasoning x CROSS JOIN reasoning_fts_docsize d ON d.id = x.seq"
_ROWS_OF = (f"SELECT {_COLUMNS} FROM json_each(?) j CROSS JOIN reasoning x ON x.seq = j.value"
            " CROSS JOIN reasoning_fts_docsize d ON d.id = x.seq")


@dataclass(frozen=True)
class ReasoningSnapshot:
    """What a read transaction sees of the traces: the newest rowid, `reasoning_epoch`."""

    visible_seq: int
    epoch: int


def reasoning_snapshot(conn: sqlite3.Connection) -> ReasoningSnapshot:
    """One statement: the newest rowid and `reasoning_epoch`."""
    newest, epoch = conn.execute("SELECT (SELECT ifnull(max(seq), 0) FROM reasoning),"
                                 " (SELECT epoch FROM reasoning_epoch WHERE id = 1)").fetchone()
    return ReasoningSnapshot(newest, epoch or 0)


class ReasoningIndexes(PostingsCache):
    """Each active user's reasoning traces as postings, answering the `reasoning` searches."""

    name = "reasoning-index"

    def build(self, conn: sqlite3.Connection, user: str) -> UserPostings:
        with read_transaction(conn):
            seen = reasoning_snapshot(conn)
            seqs = [seq for (seq,) in conn.execute("SELECT seq FROM reasoning WHERE user_id = ? AND seq <= ?"
                                                   " ORDER BY seq", (user, seen.visible_seq))]
        postings = UserPostings(user, self._weights, finding_column=None)
        postings.caught_up_to = seen.visible_seq
        postings.epoch = seen.epoch
        for seq, conversation, agent, terms, docsize in paced(rows_by_seq(conn, f"{_ROWS_OF} ORDER BY x.seq", seqs)):
            postings.add(seq, conversation, agent, (terms,), docsize)
        return postings

    def catch_up(self, conn: sqlite3.Connection, postings: UserPostings, seen: object) -> CatchUp:
        assert isinstance(seen, ReasoningSnapshot)
        if postings.epoch != seen.epoch:
            return CatchUp.REBUILD
        if seen.visible_seq <= postings.caught_up_to:
            return CatchUp.READY  # an older snapshot: `search` leaves out the rowids it cannot see
        if seen.visible_seq - postings.caught_up_to > SCAN_MAX:
            return CatchUp.REBUILD
        new = conn.execute(f"{_ROWS} WHERE x.seq > ? AND x.seq <= ? AND +x.user_id = ? ORDER BY x.seq LIMIT ?",
                           (postings.caught_up_to, seen.visible_seq, postings.user, CATCH_UP_MAX + 1)).fetchall()
        if len(new) > CATCH_UP_MAX:
            return CatchUp.REBUILD
        for seq, conversation, agent, terms, docsize in new:
            postings.add(seq, conversation, agent, (terms,), docsize)
        postings.caught_up_to = seen.visible_seq
        return CatchUp.READY
