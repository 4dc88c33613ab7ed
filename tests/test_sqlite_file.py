"""OpenedFiles on real SQLite files in WAL mode: what it says changed, and what it removes."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

from proxy.stores.sqlite.file import FileChanged, OpenedFiles


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[tuple[Path, sqlite3.Connection, OpenedFiles]]:
    """A database in WAL mode, a connection holding it open, and its files as it opened them."""
    directory = tmp_path / "data"
    directory.mkdir()
    db = directory / "m.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (1)")
    yield db, conn, OpenedFiles(str(db))
    conn.close()


def another_database(path: Path) -> None:
    with closing(sqlite3.connect(path)) as other:
        other.execute("CREATE TABLE other (y)")
        other.commit()


@pytest.mark.parametrize(("act", "change"), [
    (lambda db: None, None),
    (lambda db: os.remove(db), "m.db deleted"),
    (lambda db: [os.remove(f"{db}{suffix}") for suffix in ("", "-wal", "-shm")], "m.db deleted"),
    (lambda db: os.remove(f"{db}-wal"), "m.db-wal deleted"),
    (lambda db: os.remove(f"{db}-shm"), "m.db-shm deleted"),
    (lambda db: shutil.rmtree(db.parent), "m.db deleted"),
    (lambda db: (another_database(db.parent / "o.db"), os.replace(db.parent / "o.db", db)), "m.db replaced"),
])
def test_what_happened_to_the_files_since_they_were_opened(opened, act: Callable[[Path], object],
                                                           change: str | None) -> None:
    db, conn, files = opened
    act(db)
    assert files.change() == change
    if change is None:
        files.check()
    else:
        with pytest.raises(FileChanged, match=f"^{change}$"):
            files.check()
    conn.execute("INSERT INTO t VALUES (2)")  # SQLite itself says nothing: it commits into what it holds


def test_the_wal_a_replaced_database_left_behind_is_removed_and_the_new_one_reads_clean(opened) -> None:
    db, conn, files = opened
    conn.execute("INSERT INTO t VALUES (2)")  # in the WAL, not yet in the database
    another_database(db.parent / "o.db")
    os.replace(db.parent / "o.db", db)
    conn.close()
    # SQLite's last close leaves the WAL and its index when the database has moved.
    assert sorted(os.listdir(db.parent)) == ["m.db", "m.db-shm", "m.db-wal"]
    assert files.remove_left_behind() == ["m.db-wal", "m.db-shm"]
    with closing(sqlite3.connect(db)) as check:
        assert check.execute("SELECT name FROM sqlite_master").fetchall() == [("other",)]
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_database_still_at_its_path_keeps_its_wal(opened) -> None:
    db, conn, files = opened
    with closing(sqlite3.connect(db)) as reader:  # another connection, still using the WAL
        reader.execute("SELECT count(*) FROM t").fetchone()
        conn.close()
        assert files.remove_left_behind() == []
        assert os.path.exists(f"{db}-wal") and os.path.exists(f"{db}-shm")
