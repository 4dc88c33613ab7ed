"""Messages as in-memory postings (sqlite_postings.py): how they are built, caught up and counted.

Messages are only ever appended, in rowid order, so a user's postings catch up by reading
the rowids committed since the user's last search. A message is deleted or re-indexed only
by the memory API or `memproxy reindex`; `search_epoch` (schema v5, a trigger, any
process) counts those, and postings built before the count moved are rebuilt.
"""

from __future__ import annotations

import sqlite3
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass

from proxy.stores.sqlite_postings import (
    CATCH_UP_MAX,
    SCAN_MAX,
    Totals,
    UserPostings,
    fts_tokens,
    paced,
    read_transaction,
    rows_by_seq,
    rows_saying,
    totals,
)
from proxy.stores.sqlite_postings_cache import CatchUp, PostingsCache
from proxy.stores.sqlite_term_counts import LoggedTermCounts, LogPosition

# fts5vocab tables of messages_fts, made on each read connection (sqlite_search.prepare_reader).
VOCAB_COLUMNS = "temp.messages_vocab"  # rows saying a term, per column
VOCAB_ROWS = "temp.messages_vocab_rows"  # rows saying a term in any column
OWN_COLUMN = "terms"  # a message's own words, which find it; `context` holds the words said before it
# rowid, conversation, agent, own words, context, FTS5 docsize.
_COLUMNS = "m.seq, m.conversation_id, m.agent_id, m.terms, m.context, d.sz"
_ROWS = f"SELECT {_COLUMNS} FROM messages m CROSS JOIN messages_fts_docsize d ON d.id = m.seq"
_ROWS_OF = (f"SELECT {_COLUMNS} FROM json_each(?) j CROSS JOIN messages m ON m.seq = j.value"
            " CROSS JOIN messages_fts_docsize d ON d.id = m.seq")


@dataclass(frozen=True)
class Snapshot(Totals):
    """What a read transaction sees of the messages: FTS5's totals, the newest rowid, `search_epoch`."""

    visible_seq: int
    epoch: int


def snapshot(conn: sqlite3.Connection) -> Snapshot:
    """One statement: the newest rowid, `search_epoch`, and FTS5's averages record."""
    visible, epoch, averages = conn.execute(
        "SELECT (SELECT ifnull(max(seq), 0) FROM messages), (SELECT epoch FROM search_epoch WHERE id = 1),"
        " (SELECT block FROM messages_fts_data WHERE id = 1)").fetchone()
    return Snapshot(*totals(averages), visible_seq=visible, epoch=epoch or 0)


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


class MessageTermCounts(LoggedTermCounts):
    """How many rows of the whole message index say each term: in their own words (the
    finding column, which sets a whole-history search's candidate budget) and in any column
    (bm25()'s IDF). Messages are only appended, so the rows committed since the last lookup
    (any user's, a few a turn) are the log; `search_epoch` moving (a row deleted or
    re-indexed) drops every count.
    """

    def lookup(self, conn: sqlite3.Connection, terms: Sequence[str], seen: Snapshot
               ) -> tuple[dict[str, int], dict[str, int]]:
        """(rows saying each term in their own words, rows saying it anywhere), in `seen`."""
        found = self.exact(conn, terms, LogPosition(seen.visible_seq, generation=seen.epoch))
        return {t: c[0] for t, c in found.items()}, {t: c[1] for t, c in found.items()}

    def _read(self, conn: sqlite3.Connection, terms: Sequence[str]) -> dict[str, list[int]]:
        own = rows_saying(conn, VOCAB_COLUMNS, terms, OWN_COLUMN)
        anywhere = rows_saying(conn, VOCAB_ROWS, terms)
        return {term: [own[term], anywhere[term]] for term in terms}

    def _add_changes(self, conn: sqlite3.Connection, counts: MutableMapping[str, tuple[int, ...]], after: int,
                     upto: int) -> None:
        for terms, context in conn.execute("SELECT terms, context FROM messages WHERE seq > ? AND seq <= ?",
                                           (after, upto)):
            own = set(fts_tokens(terms))
            for token in own | set(fts_tokens(context)):
                if (count := counts.get(token)) is not None:
                    counts[token] = (count[0] + (token in own), count[1] + 1)
