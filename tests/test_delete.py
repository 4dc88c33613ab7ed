"""Deleting a user (docs/memory-api.md): complete, counted, and gone from the files.

The deleted user's text holds unique canaries; after the delete not one of them can be
found with a byte search of the database, its WAL and its shared-memory file, while the
other user's canaries still can (so the search itself is shown to work).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.api_helpers import NDJSON, api_url, chat, jsonl, lines
from tests.extraction_helpers import extracted
from tests.proxy_db import eventually, rows

DB_SUFFIXES = ("", "-wal", "-shm")


def canary() -> str:
    return "cnry" + secrets.token_hex(6)


def grep(db: Path, needles: list[str]) -> dict[str, list[str]]:
    """Which needles occur in which of the database's files (as UTF-8 bytes)."""
    found: dict[str, list[str]] = {}
    for suffix in DB_SUFFIXES:
        path = Path(f"{db}{suffix}")
        data = path.read_bytes() if path.exists() else b""
        hits = [n for n in needles if n.encode() in data]
        if hits:
            found[path.name] = hits
    return found


def fill(client: httpx.Client, user: str) -> list[str]:
    """Give the user memory in every table, each piece with its own canary; the canaries."""
    tokens = [canary() for _ in range(8)]
    chat(client, {"X-Memory-User": user, "X-Memory-Conversation": "c1"}, f"My locker code is {tokens[0]}.")
    chat(client, {"X-Memory-User": user, "X-Memory-Conversation": "c2"}, f"I work at {tokens[1].title()} Labs.")
    client.post(api_url(user, "memories"), json={"content": f"Prefers {tokens[2]} tea", "type": "fact"})
    client.post(api_url(user, "memories"), json={"content": f"Talked about {tokens[3]}", "type": "interaction"})
    records = [
        {"kind": "entity", "id": f"e-{user}-1", "name": f"Project {tokens[4]}", "type": "project",
         "description": f"codename {tokens[5]}"},
        {"kind": "entity", "id": f"e-{user}-2", "name": "Acme"},
        {"kind": "relationship", "id": f"r-{user}", "from_id": f"e-{user}-1", "type": "OWNED_BY",
         "to_id": f"e-{user}-2"},
        {"kind": "reasoning", "id": f"x-{user}", "conversation_id": "c1", "task": f"find {tokens[6]}",
         "steps": [{"name": "lookup", "arguments": "{}", "result": tokens[7]}], "answer": "done"},
    ]
    assert client.post(api_url(user, "import"), headers=NDJSON, content=jsonl(records)).status_code == 200
    return tokens


def test_a_deleted_users_text_is_gone_from_the_database_files(make_proxy: Any, tmp_path: Path) -> None:
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    db = tmp_path / "memproxy.db"
    with proxy.http() as client:
        keep = fill(client, "keeper")
        gone = fill(client, "leaver")
        assert client.post(api_url("leaver", "search"), json={"query": f"locker code {gone[0]}"}).json()["hits"]
        response = client.delete(api_url("leaver"))
        assert response.status_code == 200
        deleted = response.json()["deleted"]
        exact = {k: deleted[k] for k in ("conversations", "messages", "turns", "injections", "reasoning", "users")}
        assert exact == {"conversations": 2, "messages": 5, "turns": 2, "injections": 2, "reasoning": 1, "users": 1}
        # The background extractor may have added entities and edges of its own from the chat.
        assert deleted["entities"] >= 3 and deleted["relationships"] >= 1
        for path in ("memories", "conversations", "entities", "reasoning", "injections"):
            assert client.get(api_url("leaver", path)).json()["data"] == []
        assert client.get(api_url("leaver", "export")).content == b""
        assert client.post(api_url("leaver", "search"), json={"query": f"locker code {gone[0]}"}).json()["hits"] == []
    assert grep(db, gone) == {}
    assert sorted(set(sum(grep(db, keep).values(), []))) == sorted(keep)


def test_export_delete_import_restores_the_user(make_proxy: Any) -> None:
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    with proxy.http() as client:
        tokens = fill(client, "roundtrip")
        extracted(proxy)  # the chat turns' facts are saved in the background: all of them before the export
        vectors = "SELECT count(*) FROM embeddings WHERE user_id = 'roundtrip'"
        items = ("SELECT (SELECT count(*) FROM messages WHERE user_id = 'roundtrip') + (SELECT count(*) FROM entities"
                 " WHERE user_id = 'roundtrip') + (SELECT count(*) FROM reasoning WHERE user_id = 'roundtrip')")
        assert eventually(lambda: rows(proxy, vectors) == rows(proxy, items))  # every item has its vector
        embedded = rows(proxy, vectors)
        before = client.get(api_url("roundtrip", "export")).content
        question = f"What is my locker code {tokens[0]}?"
        hits_before = client.post(api_url("roundtrip", "search"), json={"query": question}).json()["hits"]
        assert client.delete(api_url("roundtrip")).status_code == 200
        assert client.get(api_url("roundtrip", "export")).content == b""
        imported = client.post(api_url("roundtrip", "import"), headers=NDJSON, content=before).json()
        assert imported["skipped"] == {}
        assert sum(imported["imported"].values()) == len(lines(before))
        assert client.get(api_url("roundtrip", "export")).content == before
        # Vectors are not exported: `memproxy reindex` embeds the imported items again.
        done = memproxy(["reindex", "--user", "roundtrip"], Path(proxy.settings.store.url[len("sqlite:///"):]))
        assert done.returncode == 0, done.stderr
        assert rows(proxy, vectors) == embedded
        hits_after = client.post(api_url("roundtrip", "search"), json={"query": question}).json()["hits"]
        assert [(h["source"], h["id"]) for h in hits_after] == [(h["source"], h["id"]) for h in hits_before]


def memproxy(args: list[str], db: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "MEMPROXY_STORE_URL": f"sqlite:///{db}"}
    return subprocess.run([sys.executable, "-m", "proxy", *args], input=stdin, capture_output=True, env=env,
                          timeout=60, check=False)


def test_the_command_line_imports_exports_and_deletes(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    token = canary()
    records = [{"kind": "conversation", "id": "c1", "created_at": "2026-03-01T00:00:00+00:00",
                "last_active_at": "2026-03-01T00:00:00+00:00"},
               {"kind": "message", "id": "m1", "conversation_id": "c1", "role": "user",
                "content": f"The safe code is {token}", "created_at": "2026-03-01T00:00:00+00:00"}]
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(records))
    done = memproxy(["import", str(source), "--user", "u1"], db)
    assert (done.returncode, json.loads(done.stdout)) == (0, {"imported": {"conversation": 1, "message": 1},
                                                              "skipped": {}})
    again = memproxy(["import", "-", "--user", "u1"], db, stdin=jsonl(records))
    assert json.loads(again.stdout) == {"imported": {}, "skipped": {"conversation": 1, "message": 1}}
    exported = memproxy(["export", "--user", "u1"], db)
    assert lines(exported.stdout) == records
    removed = memproxy(["delete", "--user", "u1"], db)
    assert removed.returncode == 0
    assert json.loads(removed.stdout) == {"user": "u1", "deleted": {
        "conversations": 1, "embeddings": 0, "entities": 0, "extraction_queue": 0, "hook_context": 0, "injections": 0,
        "messages": 1, "provider_objects": 0, "reasoning": 0, "relationships": 0, "responses": 0,
        "turn_tool_calls": 0, "turns": 0,
        "users": 1}}
    assert memproxy(["export", "--user", "u1"], db).stdout == b""
    assert grep(db, [token]) == {}
    # A deleted user's records can be imported again (the record of the deletion blocks only
    # turns that were in flight then).
    restored = memproxy(["import", str(source), "--user", "u1"], db)
    assert json.loads(restored.stdout) == {"imported": {"conversation": 1, "message": 1}, "skipped": {}}
    assert lines(memproxy(["export", "--user", "u1"], db).stdout) == records


def test_the_command_line_rejects_a_bad_file(tmp_path: Path) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_bytes(b'{"kind": "message", "id": "m1", "role": "user", "content": "x"}\n')
    done = memproxy(["import", str(source), "--user", "u1"], tmp_path / "x.db")
    assert (done.returncode, done.stderr.decode()) == (2, "memproxy: line 1: `conversation_id` must be a string id\n")
    missing = memproxy(["import", str(tmp_path / "none.jsonl"), "--user", "u1"], tmp_path / "x.db")
    assert (missing.returncode, missing.stderr.decode()) == (
        1, f"memproxy: {tmp_path / 'none.jsonl'}: No such file or directory\n")
    bad_user = memproxy(["delete", "--user", "*"], tmp_path / "x.db")
    assert (bad_user.returncode, bad_user.stderr.decode()) == (
        2, "memproxy: --user must be 1-256 characters of ASCII letters, digits and ._:@+-\n")
