"""SQLite schema steps that drop or rebuild a table: a file of the schema before the step opens,
is migrated, and keeps what it held."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path

from proxy.extracted import bounded_key
from proxy.models import Scope
from proxy.stores.sqlite.schema import MIGRATIONS, statements
from proxy.stores.sqlite.store import SQLiteStore
from tests.proxy_db import sqlite_file

ALICE = Scope("alice")


def _version_of(step: str) -> int:
    """The schema version whose script holds `step`."""
    return next(n for n, script in enumerate(MIGRATIONS, start=1) if step in script)


def _file_at(path: Path, version: int) -> None:
    """A SQLite file migrated up to `version`, as a memproxy of that version left it."""
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA foreign_keys = ON")
        db.create_function("memproxy_bounded_key", 1, bounded_key)  # what migration v4 calls
        db.execute("BEGIN")  # one commit: one statement at a time, it took seconds of fsyncs
        db.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
        for n, script in enumerate(MIGRATIONS[:version], start=1):
            for statement in statements(script):
                db.execute(statement)
            db.execute("INSERT INTO schema_version VALUES (?, 0)", (n,))
        db.execute("COMMIT")


def _open_and_close(path: Path) -> None:
    async def body() -> None:
        store = SQLiteStore(str(path))
        await store.open()
        await store.close()

    asyncio.run(body())


def test_the_entity_text_log_goes_and_entities_change_as_before(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    _file_at(path, _version_of("DROP TABLE IF EXISTS entity_text_changes") - 1)
    with sqlite_file(path) as db:
        db.execute("INSERT INTO users VALUES ('alice', 0)")
        db.execute("INSERT INTO entities (id, user_id, name, canonical_name, description, name_terms,"
                   " description_terms, created_at, updated_at)"
                   " VALUES ('e1', 'alice', 'Vault', 'vault', 'combination qx7lm3zp', 'vault', 'combin qx7lm3zp', 0, 0)")
        assert db.execute("SELECT added FROM entity_text_changes").fetchall() == [("vault  combin qx7lm3zp",)]
    _open_and_close(path)
    with sqlite_file(path) as db:
        assert db.execute("SELECT max(version) FROM schema_version").fetchone() == (len(MIGRATIONS),)
        assert db.execute("SELECT type, name FROM sqlite_master WHERE name LIKE '%text%'"
                          " AND name NOT LIKE 'hook_context%'").fetchall() == []
        # The entity index's own log of changed rows (schema v6) goes on as before.
        before = db.execute("SELECT count(*) FROM entity_changes").fetchone()[0]
        db.execute("UPDATE entities SET description_terms = 'combin' WHERE id = 'e1'")
        db.execute("DELETE FROM entities WHERE id = 'e1'")
        assert db.execute("SELECT count(*) FROM entity_changes").fetchone()[0] == before + 2
        assert db.execute("SELECT count(*) FROM entities").fetchone() == (0,)


def _embedding_rows(db: sqlite3.Connection) -> list[tuple[object, ...]]:
    return db.execute("SELECT rowid, user_id, kind, item_id, model, dim, vector, created_at FROM embeddings"
                      " ORDER BY rowid").fetchall()


def test_vectors_keep_their_seqs_and_a_seq_never_comes_again_after_the_rebuild(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    version = _version_of("embeddings_v20")
    _file_at(path, version - 1)
    with sqlite_file(path) as db:
        db.execute("INSERT INTO users VALUES ('alice', 0)")
        db.execute("INSERT INTO conversations VALUES ('alice', 'c1', NULL, 0, 0)")
        for n in range(5):
            db.execute("INSERT INTO messages (id, user_id, conversation_id, role, content, content_hash, terms,"
                       " created_at) VALUES (?, 'alice', 'c1', 'user', ?, ?, ?, ?)",
                       (f"m{n}", f"words {n}", f"hash{n}", f"word {n}", n))
            db.execute("INSERT INTO embeddings (user_id, kind, item_id, model, dim, vector, created_at)"
                       " VALUES ('alice', 'message', ?, 'm', 2, ?, ?)", (f"m{n}", bytes([n]) * 8, n))
        db.execute("INSERT INTO entities (id, user_id, name, canonical_name, description, created_at, updated_at)"
                   " VALUES ('e1', 'alice', 'Vault', 'vault', 'a safe', 0, 0)")
        db.execute("INSERT INTO embeddings (user_id, kind, item_id, model, dim, vector, created_at)"
                   " VALUES ('alice', 'entity', 'e1', 'm', 2, zeroblob(8), 9)")
        db.execute("DELETE FROM messages WHERE id IN ('m1', 'm2')")  # a gap in the seqs: kept as it is
        before = _embedding_rows(db)
    assert [row[0] for row in before] == [1, 4, 5, 6]
    _open_and_close(path)
    with sqlite_file(path) as db:
        assert db.execute("SELECT max(version) FROM schema_version").fetchone() == (len(MIGRATIONS),)
        assert _embedding_rows(db) == before
        assert db.execute("SELECT seq FROM embeddings ORDER BY seq").fetchall() == [(1,), (4,), (5,), (6,)]
        # The item tables' triggers drop vectors from the table made again.
        db.execute("UPDATE entities SET description = 'a locked safe' WHERE id = 'e1'")
        db.execute("DELETE FROM messages WHERE id IN ('m3', 'm4')")  # the newest message vectors
        assert [row[3] for row in _embedding_rows(db)] == ["m0"]
        db.execute("INSERT INTO embeddings (user_id, kind, item_id, model, dim, vector, created_at)"
                   " VALUES ('alice', 'message', 'm0', 'm', 2, zeroblob(8), 10)"
                   " ON CONFLICT (user_id, kind, item_id, model) DO UPDATE SET created_at = excluded.created_at")
        db.execute("INSERT INTO embeddings (user_id, kind, item_id, model, dim, vector, created_at)"
                   " VALUES ('alice', 'entity', 'e1', 'm', 2, zeroblob(8), 10)")
        ((m0, _), (e1, entity)) = db.execute("SELECT seq, item_id FROM embeddings ORDER BY seq").fetchall()
        assert (m0, entity) == (1, "e1") and e1 > 6  # above the deleted newest, not the seq after the largest left
        plan = db.execute("EXPLAIN QUERY PLAN SELECT rowid, created_at FROM embeddings WHERE user_id = 'alice'"
                          " AND kind = 'message' AND model = 'm' ORDER BY rowid DESC LIMIT 1").fetchall()
        assert "USING INDEX embeddings_newest" in plan[0][3] and len(plan) == 1
        kept = _embedding_rows(db)
        # The step run again over its own work (its version row lost) keeps every row and seq.
        db.execute("DELETE FROM schema_version WHERE version >= ?", (version,))
    _open_and_close(path)
    with sqlite_file(path) as db:
        assert db.execute("SELECT max(version) FROM schema_version").fetchone() == (len(MIGRATIONS),)
        assert _embedding_rows(db) == kept


def test_the_rebuild_drops_vectors_whose_user_row_is_gone_and_keeps_the_others(tmp_path: Path) -> None:
    # The sqlite3 shell has foreign keys off by default: a user row deleted there leaves its
    # vectors behind. The table made again checks the user, so copying them failed the whole
    # migration, and the store never opened again.
    path = tmp_path / "m.db"
    _file_at(path, _version_of("embeddings_v20") - 1)
    with sqlite_file(path) as db:
        db.execute("INSERT INTO users VALUES ('alice', 0), ('gone', 0)")
        for user, item in (("alice", "e1"), ("gone", "e2"), ("alice", "e3")):
            db.execute("INSERT INTO embeddings (user_id, kind, item_id, model, dim, vector, created_at)"
                       " VALUES (?, 'entity', ?, 'm', 2, zeroblob(8), 0)", (user, item))
        db.execute("DELETE FROM users WHERE id = 'gone'")
        assert db.execute("SELECT rowid, user_id FROM embeddings ORDER BY rowid").fetchall() == [
            (1, "alice"), (2, "gone"), (3, "alice")]
        alices = [row for row in _embedding_rows(db) if row[1] == "alice"]
    _open_and_close(path)
    with sqlite_file(path) as db:
        assert db.execute("SELECT max(version) FROM schema_version").fetchone() == (len(MIGRATIONS),)
        assert _embedding_rows(db) == alices
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
