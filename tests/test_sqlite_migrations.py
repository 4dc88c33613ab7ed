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
        db.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
        for n, script in enumerate(MIGRATIONS[:version], start=1):
            for statement in statements(script):
                db.execute(statement)
            db.execute("INSERT INTO schema_version VALUES (?, 0)", (n,))


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
