"""Messages as in-memory postings (sqlite/postings.py): how they are built, caught up and counted.

Messages are only ever appended, in rowid order, so a user's postings catch up by reading
the rowids committed since the user's last search. A message is deleted or re-indexed only
by the memory API or `memproxy reindex`; `search_epoch` (schema v5, a trigger, any
process) counts those, and postings built before the count moved are rebuilt.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from proxy.stores.sqlite.postings import (
    CATCH_UP_MAX,
    SCAN_MAX,
    UserPostings,
    paced,
    read_transaction,
    rows_by_seq,
)
from proxy.stores.sqlite.postings_cache import CatchUp, PostingsCache

OWN_COLUMN = "terms"  # a message's own words, which find it; `context` holds the words said before it
# rowid, conversation, agent, own words, context, FTS5 docsize.
_COLUMNS = "m.seq, m.conversation_id, m.agent_id, m.terms, m.context, d.sz"
_ROWS = f"SELECT {_COLUMNS} FROM messages m CROSS JOIN messages_fts_docsize d ON d.id = m.seq"
_ROWS_OF = (f"SELECT {_COLUMNS} FROM json_each(?) j CROSS JOIN messages m ON m.seq = j.value"
            " CROSS JOIN messages_fts_docsize d ON d.id = m.seq")


@dataclass(frozen=True)
class Snapshot:
    """What a read transaction sees of the messages: the newest rowid, `search_epoch`."""

    visible_seq: int
    epoch: int


def snapshot(conn: sqlite3.Connection) -> Snapshot:
    """One statement: the newest rowid and `search_epoch`."""
    visible, epoch = conn.execute(
        "SELECT (SELECT ifnull(max(seq), 0) FROM messages), (SELECT epoch FROM search_epoch WHERE id = 1)").fetchone()
    return Snapshot(visible, epoch or 0)


class MessageIndexes(PostingsCache):
    """Each active user's messages as postings, answering the `conversation` and `cross-session` searches."""

    name = "message-index"

    def build(self, conn: sqlite3.Connection, user: str) -> UserPostings:
        # The user's rowids in one snapshot, their rows in chunks after it: a row deleted or
        # changed meanwhile moved `search_epoch`, and the first search rebuilds.
        with read_transaction(conn):
            seen = snapshot(conn)
            seqs = [seq for (seq,) in conn.execute("SELECT seq FROM messages WHERE user_id = ? AND seq <= ?"
                                                   " ORDER BY seq", (user, seen.visible_seq))]
        postings = UserPostings(user, self._weights, finding_column=0)
        postings.caught_up_to = seen.visible_seq
        postings.epoch = seen.epoch
        for seq, conversation, agent, terms, context, docsize in paced(rows_by_seq(
                conn, f"{_ROWS_OF} ORDER BY m.seq", seqs)):
            postings.add(seq, conversation, agent, (terms, context), docsize)
        return postings

    def behind(self, postings: UserPostings, seen: object) -> int:
        assert isinstance(seen, Snapshot)
        return seen.visible_seq - postings.caught_up_to

    def catch_up(self, conn: sqlite3.Connection, postings: UserPostings, seen: object) -> CatchUp:
        assert isinstance(seen, Snapshot)
        if postings.epoch != seen.epoch:
            return CatchUp.REBUILD
        if seen.visible_seq <= postings.caught_up_to:
            return CatchUp.READY  # an older snapshot: `search` leaves out the rowids it cannot see
        if seen.visible_seq - postings.caught_up_to > SCAN_MAX:
            return CatchUp.REBUILD
        # Only the rowids committed since this user's last search are walked (`+`: not the
        # user's index, which would walk all of the user's messages).
        new = conn.execute(f"{_ROWS} WHERE m.seq > ? AND m.seq <= ? AND +m.user_id = ? ORDER BY m.seq LIMIT ?",
                           (postings.caught_up_to, seen.visible_seq, postings.user, CATCH_UP_MAX + 1)).fetchall()
        if len(new) > CATCH_UP_MAX:
            return CatchUp.REBUILD
        for seq, conversation, agent, terms, context, docsize in new:
            postings.add(seq, conversation, agent, (terms, context), docsize)
        postings.caught_up_to = seen.visible_seq
        return CatchUp.READY
