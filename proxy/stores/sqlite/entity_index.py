"""Entities as in-memory postings (sqlite/postings.py): how they are built and caught up.

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

# A user's postings with more than this share of rows superseded are built again.
DEAD_SHARE_MAX = 0.5
# rowid, user, agent, name, type and description terms, FTS5 docsize.
_COLUMNS = "e.seq, e.user_id, e.agent_id, e.name_terms, e.type_terms, e.description_terms, d.sz"


@dataclass(frozen=True)
class EntitySnapshot:
    """What a read transaction sees of the entity change log: its newest and oldest rows."""

    changed_to: int
    oldest_change: int


def entity_snapshot(conn: sqlite3.Connection) -> EntitySnapshot:
    """One statement: the change log's bounds."""
    changed_to, oldest = conn.execute(
        "SELECT (SELECT ifnull(max(seq), 0) FROM entity_changes), (SELECT ifnull(min(seq), 0) FROM entity_changes)"
    ).fetchone()
    return EntitySnapshot(changed_to, oldest)


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

    def behind(self, postings: UserPostings, seen: object) -> int:
        assert isinstance(seen, EntitySnapshot)
        return seen.changed_to - postings.caught_up_to

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
