"""Isolation as a tested property (docs/security.md): the cross-user leak count is zero.

Three users hold the same kinds of memory, worded alike, each with unique canary tokens,
in every retrieval source. Each asks the same questions. Every response, every request the
upstream receives, every memory API answer and every log line is scanned for another
user's canaries, in each auth mode. The users' own canaries must come back from every
source (so the scan looks where a leak would show); nobody else's may appear anywhere.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from proxy.logs import JsonFormatter
from tests.api_helpers import NDJSON, api_url, chat, jsonl, sign

USERS = ("ann", "ben", "cat")
SOURCES = ("long-term", "graph", "conversation", "cross-session", "reasoning")
SECRET = "canary-signing-secret-of-32-bytes-or-more"
QUESTIONS = {
    "long-term": "What is my favourite tea blend?",
    "graph": "Where is the Falcon Lab research site located?",
    "conversation": "What is the locker code at the gym?",
    "cross-session": "What is our hotel booking reference?",
    "reasoning": "What was the parcel tracking number?",
}
API_READS = ("memories", "conversations", "conversations/home/messages", "conversations/trip/messages", "entities",
             "entities/lab", "reasoning", "injections", "export")


def mode_settings(mode: str) -> dict[str, Any]:
    common = {"memory__commit_timeout_ms": 5000}
    if mode == "api-keys":
        return {**common, "auth__mode": "api-keys", "upstream__api_key": "sk-upstream-0001",
                "auth__api_keys": [{"key": f"mp-key-{user}", "user": user} for user in USERS]}
    if mode == "signed":
        return {**common, "auth__mode": "signed", "auth__signing_secret": SECRET}
    return common


def identity(mode: str) -> Callable[[str, str], dict[str, str]]:
    """How a user's requests say who they are in this mode."""
    def headers(user: str, conversation: str) -> dict[str, str]:
        if mode == "api-keys":  # the header claims another user: the key wins
            return {"Authorization": f"Bearer mp-key-{user}", "X-Memory-User": "ann",
                    "X-Memory-Conversation": conversation}
        if mode == "signed":
            return {"X-Memory-Scope-Token": sign({"sub": user, "exp": int(time.time()) + 600}, SECRET),
                    "X-Memory-Conversation": conversation}
        return {"X-Memory-User": user, "X-Memory-Conversation": conversation}
    return headers


def seed(client: httpx.Client, headers: Callable[[str, str], dict[str, str]], user: str,
         tokens: dict[str, str]) -> None:
    """The user's memory: one canary per source, in text worded like everyone else's."""
    stored = client.post(api_url(user, "memories"), json={"content": f"Favourite tea blend is {tokens['long-term']}",
                                                          "type": "fact"})
    assert stored.status_code == 201
    records = [
        {"kind": "entity", "id": "lab", "name": "Falcon Lab", "type": "organization",
         "description": "research lab located at a remote site"},
        {"kind": "entity", "id": "site", "name": f"Site {tokens['graph']}", "type": "place"},
        {"kind": "relationship", "id": "located", "from_id": "lab", "type": "LOCATED_IN", "to_id": "site"},
        {"kind": "conversation", "id": "errands", "created_at": "2026-01-01T00:00:00+00:00"},
        {"kind": "reasoning", "id": "parcel", "conversation_id": "errands", "task": "Find the parcel tracking number",
         "steps": [{"name": "track_parcel", "arguments": "{}", "result": f"parcel {tokens['reasoning']}"}],
         "answer": f"The parcel tracking number is {tokens['reasoning']}"},
    ]
    assert client.post(api_url(user, "import"), headers=NDJSON, content=jsonl(records)).status_code == 200
    for conversation, text in (("home", f"The locker code at the gym is {tokens['conversation']}."),
                               ("trip", f"Our hotel booking reference is {tokens['cross-session']}.")):
        assert chat(client, headers(user, conversation), text).status_code == 200


class Scan:
    """Counts every other user's canary found in the texts it is shown."""

    def __init__(self, tokens: dict[str, dict[str, str]]) -> None:
        self.tokens = tokens
        self.leaks: list[tuple[str, str, str]] = []  # (where, owner, token)

    def check(self, user: str | None, where: str, text: str) -> None:
        """`user` may see their own canaries here; None: nobody's may appear (logs)."""
        for owner, theirs in self.tokens.items():
            if owner != user:
                self.leaks += [(where, owner, token) for token in theirs.values() if token in text]


@pytest.mark.parametrize("mode", ["trusted", "api-keys", "signed"])
def test_no_user_ever_sees_another_users_memory(make_proxy: Any, fake: Any, caplog: Any, mode: str) -> None:
    caplog.set_level(logging.INFO)  # the production level; message text is never logged at it
    proxy = make_proxy(**mode_settings(mode))
    headers = identity(mode)
    tokens = {user: {source: f"cnry{secrets.token_hex(5)}" for source in SOURCES} for user in USERS}
    scan = Scan(tokens)
    own_found: dict[str, set[str]] = {user: set() for user in USERS}
    with proxy.http() as client:
        for user in USERS:
            seed(client, headers, user, tokens[user])
        fake.reset()
        for user in USERS:
            for source, question in QUESTIONS.items():
                response = chat(client, headers(user, "home"), question)
                scan.check(user, f"{user} response", response.text + str(response.headers))
                sent = fake.chat_requests()[-1]
                scan.check(user, f"{user} upstream", sent.body.decode() + repr(sent.headers))
                if f"[{source}] " in sent.body.decode() and tokens[user][source] in sent.body.decode():
                    own_found[user].add(source)
                found = client.post(api_url(user, "search"), json={"query": question})
                scan.check(user, f"{user} search", found.text)
            for path in API_READS:
                scan.check(user, f"{user} GET {path}", client.get(api_url(user, path)).text)
    for record in caplog.records:
        scan.check(None, f"log {record.name}", JsonFormatter().format(record) + record.getMessage())
    assert scan.leaks == []
    assert own_found == {user: set(SOURCES) for user in USERS}
