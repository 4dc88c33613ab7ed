"""Deleting a conversation through the memory API takes the facts only its messages said.

Rules extraction describes an entity by the sentence that stated it; before, a deleted
conversation's sentence stayed in those descriptions word for word, and was exported,
searched and injected afterwards. End to end: a real proxy, the official client, the
memory API's DELETE, then export, search and the next request's upstream body.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from tests.api_helpers import api_url, lines


def test_a_deleted_conversations_words_leave_the_facts(make_proxy: Any, fake: Any) -> None:
    proxy = make_proxy(memory__commit_timeout_ms=5000)
    codeword = f"zebra{secrets.token_hex(4)}"

    def say(conversation: str, text: str) -> None:
        proxy.client(**{"X-Memory-User": "alice", "X-Memory-Conversation": conversation}).chat.completions.create(
            model="m", messages=[{"role": "user", "content": text}])

    say("secret", f"My locker codeword is {codeword} and I live at 12 Elm Street.")
    say("home", "I live at 12 Elm Street with my cat Miso.")
    with proxy.http() as client:
        before = lines(client.get(api_url("alice", "export")).content)
        assert any(codeword in r.get("description", "") for r in before if r["kind"] == "entity")
        deleted = client.delete(api_url("alice", "conversations", "secret"))
        assert deleted.status_code == 200, deleted.text
        after = lines(client.get(api_url("alice", "export")).content)
        assert codeword not in json.dumps(after)
        assert "locker" not in json.dumps([r for r in after if r["kind"] in ("entity", "relationship")])
        kept = {r["name"]: r["description"] for r in after if r["kind"] == "entity"}
        # Said in the other conversation too: kept, described by what that one said.
        assert kept == {"Elm Street": "I live at 12 Elm Street with my cat Miso.", "User": "",
                        "Miso": "cat; I live at 12 Elm Street with my cat Miso."}
        hits = client.post(api_url("alice", "search"), json={"query": "What is my locker codeword?"}).json()["hits"]
        assert codeword not in json.dumps(hits)
    fake.reset()
    say("later", "What is my locker codeword? And where do I live?")
    (sent,) = fake.chat_requests()
    assert codeword not in sent.body.decode()
    assert "12 Elm Street" in sent.json()["messages"][-1]["content"]
