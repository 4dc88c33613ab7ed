"""Shared pieces of the memory API tests: a fixed set of export records, JWTs, chat turns."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import sqlite3
import time
from contextlib import closing
from typing import Any

import asyncpg
import httpx

# A user's memory as export records, with fixed ids and times so answers are exact.
RECORDS: list[dict[str, Any]] = [
    {"kind": "conversation", "id": "conv-a", "created_at": "2026-01-01T10:00:00+00:00",
     "last_active_at": "2026-01-01T10:06:00+00:00"},
    {"kind": "conversation", "id": "conv-b", "created_at": "2026-01-02T10:00:00+00:00",
     "last_active_at": "2026-01-02T10:00:00+00:00"},
    {"kind": "message", "id": "m1", "conversation_id": "conv-a", "role": "user",
     "content": "Our staging host is internal-hbr-2291.example", "created_at": "2026-01-01T10:00:00+00:00"},
    {"kind": "message", "id": "m2", "conversation_id": "conv-a", "role": "assistant",
     "content": "Noted: staging runs on internal-hbr-2291.example.", "created_at": "2026-01-01T10:05:00+00:00"},
    {"kind": "message", "id": "m3", "conversation_id": "conv-b", "role": "user",
     "content": "I prefer Go for services.", "created_at": "2026-01-02T10:00:00+00:00"},
    {"kind": "entity", "id": "e-acme", "name": "Acme", "type": "organization", "description": "",
     "memory_type": "fact", "confidence": 0.8, "tags": [], "aliases": [], "provenance": ["m1"],
     "created_at": "2026-01-01T10:00:00+00:00", "updated_at": "2026-01-01T10:00:00+00:00"},
    {"kind": "entity", "id": "e-alice", "name": "Alice Chen", "type": "person",
     "description": "staff engineer who works at Acme",
     "memory_type": "fact", "confidence": 0.9, "tags": ["work"], "aliases": ["Alice"], "provenance": ["m1"],
     "created_at": "2026-01-01T10:00:00+00:00", "updated_at": "2026-01-01T10:01:00+00:00"},
    {"kind": "relationship", "id": "r1", "from": "Alice Chen", "type": "WORKS_AT", "to": "Acme",
     "from_id": "e-alice", "to_id": "e-acme", "valid_from": "2026-01-01T10:00:00+00:00", "invalid_at": None,
     "provenance": ["m1"], "created_at": "2026-01-01T10:00:00+00:00"},
    {"kind": "reasoning", "id": "x1", "conversation_id": "conv-a", "task": "Is the staging host up?",
     "steps": [{"name": "ping", "arguments": "{\"host\": \"internal-hbr-2291.example\"}", "result": "ok"}],
     "answer": "It is up.", "created_at": "2026-01-01T10:06:00+00:00"},
]


NDJSON = {"Content-Type": "application/x-ndjson"}  # what an import's body is sent as


def jsonl(records: list[dict[str, Any]]) -> bytes:
    """Records as a JSON Lines body."""
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def lines(body: bytes) -> list[dict[str, Any]]:
    """The records of a JSON Lines body."""
    return [json.loads(line) for line in body.splitlines() if line.strip()]


def api_url(user: str, *parts: str) -> str:
    """A memory API path for the user."""
    return "/".join(["/memory/v1/users", user, *parts])


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign(claims: dict[str, Any], secret: str, header: dict[str, Any] | None = None) -> str:
    """An HS256 JWT, as an application's server would mint a scope token."""
    head = _b64(json.dumps(header or {"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = hmac.new(secret.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(signature)}"


def chat(client: httpx.Client, headers: dict[str, str], text: str, **body: Any) -> httpx.Response:
    """One non-streamed chat turn through the proxy."""
    payload = {"model": "m", "messages": [{"role": "user", "content": text}], **body}
    return client.post("/v1/chat/completions", json=payload, headers=headers)


def vectors_of(proxy: Any, user: str) -> int:
    """How many vectors the proxy's store holds for the user, SQLite or PostgreSQL."""
    url = str(proxy.settings.store.url)
    sql = "SELECT count(*) FROM embeddings WHERE user_id = "
    if url.startswith("sqlite:///"):
        with closing(sqlite3.connect(url[len("sqlite:///"):])) as db:
            return int(db.execute(sql + "?", (user,)).fetchone()[0])

    async def count() -> int:
        conn = await asyncpg.connect(url)
        try:
            return int(await conn.fetchval(sql + "$1", user))
        finally:
            await conn.close()

    return asyncio.run(count())


def wait_for_vectors(proxy: Any, user: str, count: int, timeout: float = 10.0) -> None:
    """Until the user's items all have their vectors (imported ones come from the background worker)."""
    deadline = time.monotonic() + timeout
    while (have := vectors_of(proxy, user)) != count:
        assert time.monotonic() < deadline, f"{have} vectors of {count} after {timeout}s"
        time.sleep(0.05)
