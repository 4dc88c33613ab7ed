"""Entities as in-memory postings (sqlite_postings.py): how they are built and caught up.

Extraction rewrites entities in place (a description grows, an alias is added) and merges
two into one, deleting the other. A trigger logs the rowid of every entity added, deleted,
or whose indexed text, user or agent changed, by any process (`entity_changes`, schema
v6; the rowid only, never whose). A user's postings catch up by re-reading the entities
logged since their last search: one still the user's is indexed as it now reads, any other
is forgotten. The log keeps its newest 65,536 rows; postings further behind are rebuilt.
"""

from __future__ import annotations

import json
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

# fts5vocab table of entities_fts (rows saying a term in any column), made on each read
# connection (sqlite_search.prepare_reader).
VOCAB = "temp.entities_vocab"
# A user's postings with more than this share of rows superseded are built again.
DEAD_SHARE_MAX = 0.5
# rowid, user, agent, name, type and description terms, FTS5 docsize.
_COLUMNS = "e.seq, e.user_id, e.agent_id, e.name_terms, e.type_terms, e.description_terms, d.sz"


@dataclass(frozen=True)
class EntitySnapshot(Totals):
    """What a read transaction sees of the entities: FTS5's totals, the change log's newest and
    oldest rows, and where it sees the text change log (schema v7)."""

    changed_to: int
    oldest_change: int
    texts: LogPosition


def entity_snapshot(conn: sqlite3.Connection) -> EntitySnapshot:
    """One statement: the change logs' bounds and FTS5's averages record."""
    changed_to, oldest, texts_to, oldest_text, averages = conn.execute(
        "SELECT (SELECT ifnull(max(seq), 0) FROM entity_changes), (SELECT ifnull(min(seq), 0) FROM entity_changes),"
        " (SELECT ifnull(max(seq), 0) FROM sqlite_sequence WHERE name = 'entity_text_changes'),"
        " (SELECT min(seq) FROM entity_text_changes),"
        " (SELECT block FROM entities_fts_data WHERE id = 1)").fetchone()
    # The text log's newest row is AUTOINCREMENT's: a log emptied by a user's deletion still
    # says how far it went, and that nothing of it is left to read.
    texts = LogPosition(texts_to, texts_to + 1 if oldest_text is None else oldest_text)
    return EntitySnapshot(*totals(averages), changed_to=changed_to, oldest_change=oldest, texts=texts)


class EntityIndexes(PostingsCache):
    """Each active user's entities as postings, answering the `long-term` searches."""

    name = "entity-index"

    def build(self, conn: sqlite3.Connection, user: str) -> UserPostings:
        # The user's rowids in one snapshot, their rows in chunks after it: an entity changed
        # or deleted meanwhile is in the change log past that snapshot, and the first
        # search's catch-up reads it again.
        with read_transaction(conn):
            changed_to = entity_snapshot(conn).changed_to
            seqs = [seq for (seq,) in conn.execute("SELECT seq FROM entities WHERE user_id = ? ORDER BY seq", (user,))]
        postings = UserPostings(user, self._weights, finding_column=None)
        postings.caught_up_to = changed_to
        for seq, user_id, agent, name, type_, description, docsize in paced(rows_by_seq(
                conn, f"SELECT {_COLUMNS} FROM json_each(?) j CROSS JOIN entities e ON e.seq = j.value"
                " CROSS JOIN entities_fts_docsize d ON d.id = e.seq ORDER BY e.seq", seqs)):
            if user_id == user:  # not moved to another user meanwhile (the log says so too)
                postings.add(seq, None, agent, (name, type_, description), docsize)
        return postings

    def catch_up(self, conn: sqlite3.Connection, postings: UserPostings, seen: object) -> CatchUp:
        assert isinstance(seen, EntitySnapshot)
        if seen.changed_to < postings.caught_up_to:
            return CatchUp.LATER  # an older snapshot than the postings: FTS5 answers it
        if seen.changed_to == postings.caught_up_to:
            return CatchUp.READY
        if seen.changed_to - postings.caught_up_to > SCAN_MAX or seen.oldest_change > postings.caught_up_to + 1:
            return CatchUp.REBUILD  # too far behind, or the log no longer holds what they missed
        changed = [seq for (seq,) in conn.execute(
            "SELECT DISTINCT entity_seq FROM entity_changes WHERE seq > ? AND seq <= ?",
            (postings.caught_up_to, seen.changed_to))]
        rows = {row[0]: row for row in conn.execute(
            f"SELECT {_COLUMNS} FROM json_each(?) j CROSS JOIN entities e ON e.seq = j.value"
            " CROSS JOIN entities_fts_docsize d ON d.id = e.seq", [json.dumps(changed)])}
        mine = 0
        for seq in changed:
            row = rows.get(seq)
            if row is not None and row[1] == postings.user:
                _, _, agent, name, type_, description, docsize = row
                postings.add(seq, None, agent, (name, type_, description), docsize)
                mine += 1
                if mine > CATCH_UP_MAX:
                    return CatchUp.REBUILD
            else:
                postings.remove(seq)
        if postings.dead_share > DEAD_SHARE_MAX:
            return CatchUp.REBUILD
        postings.caught_up_to = seen.changed_to
        return CatchUp.READY


class EntityTermCounts(LoggedTermCounts):
    """How many entities of the whole index say each term (in any column: bm25()'s IDF and a
    search's candidate plan alike), kept exact by the text change log of schema v7."""

    def lookup(self, conn: sqlite3.Connection, terms: Sequence[str], seen: EntitySnapshot) -> dict[str, int]:
        """Rows saying each term, in `seen`."""
        return {term: counts[0] for term, counts in self.exact(conn, terms, seen.texts).items()}

    def _read(self, conn: sqlite3.Connection, terms: Sequence[str]) -> dict[str, list[int]]:
        return {term: [count] for term, count in rows_saying(conn, VOCAB, terms).items()}

    def _add_changes(self, conn: sqlite3.Connection, counts: MutableMapping[str, tuple[int, ...]], after: int,
                     upto: int) -> None:
        for removed, added in conn.execute("SELECT removed, added FROM entity_text_changes WHERE seq > ? AND seq <= ?",
                                           (after, upto)):
            for text, step in ((removed, -1), (added, 1)):
                for token in set(fts_tokens(text or "")):
                    if (count := counts.get(token)) is not None:
                        counts[token] = (count[0] + step,)
