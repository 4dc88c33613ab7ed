"""Helpers for tests that talk to a running proxy and wait for its background extraction."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime
from typing import Any

from tests.conftest import RunningProxy
from tests.fake_upstream import FakeUpstream

DANA = "dana"


def wait_for(check: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll `check` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def extracted(proxy: RunningProxy) -> dict[str, Any]:
    """/readyz once the extraction queue has no pending item left."""
    with proxy.http() as http:
        def drained() -> dict[str, Any] | None:
            ready = http.get("/readyz").json()
            return ready if ready["extraction_queue"]["pending"] == 0 else None
        return wait_for(drained, what="the extraction queue to drain")  # type: ignore[no-any-return]


def say(proxy: RunningProxy, fake: FakeUpstream, text: str, conversation: str, user: str = DANA) -> str:
    """Send one user message; return what the upstream received as that message (block included)."""
    proxy.client(**{"X-Memory-User": user, "X-Memory-Conversation": conversation}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}])
    return str(json.loads(fake.chat_requests()[-1].body)["messages"][-1]["content"])


def block_lines(sent: str) -> list[str]:
    """The memory block of a sent message, line by line (empty when there is none)."""
    block, found, _ = sent.partition("\n\n")
    return block.split("\n") if found else []


def hits(sent: str) -> list[str]:
    """The block's hit lines without their numbers: `[source] content`."""
    return [line.split(". ", 1)[1] for line in block_lines(sent) if re.match(r"\d+\. \[", line)]


def graph_lines(sent: str) -> list[str]:
    return [hit[len("[graph] "):] for hit in hits(sent) if hit.startswith("[graph] ")]


def said_on(proxy: RunningProxy, text: str) -> str:
    """The UTC date the proxy saved a message with, as the block writes it."""
    path = proxy.settings.store.url[len("sqlite:///"):]
    with closing(sqlite3.connect(path)) as db:
        (ts,) = db.execute("SELECT created_at FROM messages WHERE content = ?", (text,)).fetchone()
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


def db_rows(proxy: RunningProxy, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(proxy.settings.store.url[len("sqlite:///"):])) as db:
        return db.execute(query, params).fetchall()


def export(proxy: RunningProxy, user: str = DANA) -> list[dict[str, Any]]:
    with proxy.http() as http:
        response = http.get(f"/memory/v1/users/{user}/export")
    assert response.status_code == 200
    return [json.loads(line) for line in response.text.splitlines() if line]
