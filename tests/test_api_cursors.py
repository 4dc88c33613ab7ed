"""List cursors of the memory API, on both stores: pages that survive deletes and activity.

A real proxy serves the API from a SQLite file, then from a fresh PostgreSQL schema; items
are imported, paged with a small limit, and deleted (or made active) between pages through
the API itself, and every page's ids and next_cursor are checked exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from proxy.api.cursors import Listing, write
from proxy.stores.base import PageList
from tests.api_helpers import NDJSON, api_url, chat, jsonl
from tests.conftest import RunningProxy
from tests.fake_upstream import JsonReply, completion

ALICE, BOB = "alice", "bob"
CURSOR_ERROR = "`cursor` must be the next_cursor of a page of this same list, unchanged"
CONVERSATIONS = [{"kind": "conversation", "id": f"c{i}", "created_at": f"2026-02-0{i}T00:00:00+00:00"}
                 for i in range(1, 7)]
MESSAGES = [{"kind": "message", "id": f"m{i}", "conversation_id": "c1", "role": "user", "content": f"note {i}",
             "created_at": f"2026-02-01T00:00:0{i}+00:00"} for i in range(1, 7)]
ENTITIES = [{"kind": "entity", "id": f"e{i}", "name": f"Thing {i}"} for i in range(1, 7)]
# Each trace has a conversation of its own: deleting that conversation deletes the trace
# (traces have no delete endpoint of their own).
TRACES = [{"kind": "reasoning", "id": f"x{i}", "conversation_id": f"k{i}", "task": f"task {i}",
           "created_at": f"2026-02-0{i}T01:00:00+00:00"} for i in range(1, 7)]


@dataclass(frozen=True)
class List:
    """A list of six items: what to import, its ids in order, and the path that deletes an item."""

    records: list[dict[str, Any]]
    order: list[str]
    deleter: Callable[[str], str]


LISTS = {
    "memories": List(ENTITIES, [f"e{i}" for i in range(1, 7)], lambda item: f"memories/{item}"),
    "entities": List(ENTITIES, [f"e{i}" for i in range(1, 7)], lambda item: f"entities/{item}"),
    "conversations": List(CONVERSATIONS, [f"c{i}" for i in range(6, 0, -1)], lambda item: f"conversations/{item}"),
    "conversations/c1/messages": List(MESSAGES, [f"m{i}" for i in range(1, 7)], lambda item: f"messages/{item}"),
    "reasoning": List(TRACES, [f"x{i}" for i in range(6, 0, -1)], lambda item: f"conversations/k{item[1:]}"),
}


@pytest.fixture(params=["sqlite", "postgres"])
def proxy(request: pytest.FixtureRequest, make_proxy: Any) -> RunningProxy:
    """The proxy on a SQLite file, then on a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return make_proxy()
    return make_proxy(store__url=request.getfixturevalue("pg_url"))


@pytest.fixture
def api(proxy: RunningProxy) -> Any:
    with proxy.http() as client:
        yield client


def load(api: httpx.Client, records: list[dict[str, Any]]) -> None:
    """The records, into alice and into bob (the same ids: ids belong to their user)."""
    for user in (ALICE, BOB):
        assert api.post(api_url(user, "import"), headers=NDJSON, content=jsonl(records)).status_code == 200


def page(api: httpx.Client, user: str, path: str, cursor: str | None = None, limit: int = 2) -> tuple[list[str], Any]:
    """One page: its ids, and its next_cursor."""
    params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor is not None else {})}
    response = api.get(api_url(user, path), params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    return [item["id"] for item in body["data"]], body["next_cursor"]


def every_page(api: httpx.Client, user: str, path: str) -> list[list[str]]:
    """The ids of each page, to the end."""
    pages, cursor = [], None
    while True:
        ids, cursor = page(api, user, path, cursor)
        pages.append(ids)
        if cursor is None:
            return pages


def delete(api: httpx.Client, user: str, path: str) -> None:
    response = api.delete(api_url(user, path))
    assert response.status_code == 200, response.text


def cursor_error(response: httpx.Response) -> str:
    """The message of a 400 that names the `cursor` parameter."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("cursor", "invalid_request")
    return str(error["message"])


@pytest.mark.parametrize("path", list(LISTS))
def test_deleting_the_cursor_item_and_others_neither_ends_nor_shifts_the_list(api: httpx.Client, path: str) -> None:
    listing = LISTS[path]
    load(api, listing.records)
    a, b, c, d, e, f = listing.order
    first, cursor = page(api, ALICE, path)
    assert first == [a, b] and cursor.startswith("c1~")
    assert page(api, ALICE, path) == (first, cursor)  # the same page, the same cursor
    delete(api, ALICE, listing.deleter(b))  # the item the cursor stands on
    delete(api, ALICE, listing.deleter(d))  # and one the next page would have shown
    second, cursor = page(api, ALICE, path, cursor)
    assert second == [c, e] and cursor.startswith("c1~")
    delete(api, ALICE, listing.deleter(e))  # the cursor's item again, with only f after it
    assert page(api, ALICE, path, cursor) == ([f], None)
    # Bob's list, the same ids in his own memory, lost nothing; alice's cursor is not his.
    assert every_page(api, BOB, path) == [[a, b], [c, d], [e, f]]
    assert cursor_error(api.get(api_url(BOB, path), params={"cursor": cursor})) == CURSOR_ERROR


def test_a_changed_cut_or_borrowed_cursor_is_refused(api: httpx.Client) -> None:
    load(api, ENTITIES + MESSAGES)
    _, cursor = page(api, ALICE, "entities")
    _, messages_cursor = page(api, ALICE, "conversations/c1/messages")
    middle = len(cursor) // 2
    changed = cursor[:middle] + ("B" if cursor[middle] == "A" else "A") + cursor[middle + 1:]
    for bad in (changed, cursor[:-3], cursor + "A", cursor + "=", "c1~", "c1~!!", "c1~" + "A" * 600,
                "C1~" + cursor[3:], "c2~" + cursor[3:], cursor.replace("c1~", "c1~c1~")):
        assert cursor_error(api.get(api_url(ALICE, "entities"), params={"cursor": bad})) == CURSOR_ERROR, bad
    # Another list, another user, another conversation's messages: the cursor is not theirs.
    for user, path, borrowed in ((ALICE, "reasoning", cursor), (ALICE, "conversations", messages_cursor),
                                 (BOB, "entities", cursor), (ALICE, "conversations/c2/messages", messages_cursor)):
        assert cursor_error(api.get(api_url(user, path), params={"cursor": borrowed})) == CURSOR_ERROR, path
    assert page(api, ALICE, "entities", cursor) == (["e3", "e4"], page(api, ALICE, "entities", cursor)[1])


def test_a_cursor_with_a_good_checksum_but_no_key_of_its_list_is_refused(api: httpx.Client) -> None:
    # The checksum is no signature: anyone can make one. What it carries is still checked,
    # so a forged key is a 400, never a store error.
    load(api, MESSAGES + ENTITIES + TRACES)
    forged: list[tuple[PageList, str, list[Any]]] = [
        ("entities", "entities", [-1]), ("entities", "entities", ["e1"]), ("entities", "entities", [True]),
        ("entities", "entities", [2**63]), ("entities", "entities", [1.5]), ("entities", "entities", [1, 2]),
        ("entities", "entities", []), ("conversations", "conversations", [1.0, "../x"]),
        ("conversations", "conversations", [math.inf, "c1"]), ("conversations", "conversations", ["c1", 1.0]),
        ("conversations", "conversations", [2.0**60, "c1"]), ("reasoning", "reasoning", [None, 1]),
        ("messages", "conversations/c1/messages", [1.0, "1"]),
    ]
    for kind, path, key in forged:
        cursor = write(Listing(kind, ALICE, "c1" if kind == "messages" else ""), tuple(key))
        assert cursor_error(api.get(api_url(ALICE, path), params={"cursor": cursor})) == CURSOR_ERROR, key
    # A forged key of the right shape is only a place in the caller's own list, even at the
    # ends of the times a key may hold (a datetime's range, in microseconds).
    earliest, latest = -62_135_596_800 * 10**6, 253_402_300_800 * 10**6 - 1
    cursor = write(Listing("entities", BOB), (0,))
    assert page(api, BOB, "entities", cursor, limit=6)[0] == [f"e{i}" for i in range(1, 7)]
    cursor = write(Listing("messages", BOB, "c1"), (earliest, 0))
    assert page(api, BOB, "conversations/c1/messages", cursor, limit=6)[0] == [f"m{i}" for i in range(1, 7)]
    for at in (latest, 2.534023007999999e17):
        cursor = write(Listing("reasoning", BOB), (at, 0))
        assert page(api, BOB, "reasoning", cursor, limit=6)[0] == [f"x{i}" for i in range(6, 0, -1)]
    for at in (latest + 1, earliest - 1, 2.5340230080000003e17):
        cursor = write(Listing("conversations", BOB), (at, "c1"))
        assert cursor_error(api.get(api_url(BOB, "conversations"), params={"cursor": cursor})) == CURSOR_ERROR


def test_a_conversation_active_while_paging_moves_ahead_and_is_found_again_from_the_front(
        api: httpx.Client, fake: Any) -> None:
    # docs/memory-api.md: every conversation without new activity is listed once; one that gets new
    # activity moves ahead of the cursor, and reading from the first page again, until
    # last_active_at is before the time paging started, finds it.
    load(api, CONVERSATIONS)
    started = datetime.now(UTC)
    first, cursor = page(api, ALICE, "conversations")
    assert first == ["c6", "c5"]
    for conversation in ("c5", "c2"):  # c5 was listed already, c2 was not
        fake.queue(JsonReply(completion("Noted.")))
        headers = {"X-Memory-User": ALICE, "X-Memory-Conversation": conversation}
        assert chat(api, headers, "a new note").status_code == 200
    delete(api, ALICE, "conversations/c4")
    assert page(api, ALICE, "conversations", cursor) == (["c3", "c1"], None)

    caught_up, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        body = api.get(api_url(ALICE, "conversations"), params=params).json()
        recent = [c["id"] for c in body["data"] if datetime.fromisoformat(c["last_active_at"]) >= started]
        caught_up += recent
        cursor = body["next_cursor"]
        if len(recent) < len(body["data"]) or cursor is None:
            break
    assert caught_up == ["c2", "c5"]


@pytest.mark.parametrize("path", list(LISTS))
def test_an_old_style_cursor_still_pages_while_its_item_exists(api: httpx.Client, path: str) -> None:
    listing = LISTS[path]
    load(api, listing.records)
    old_style = listing.order[1]  # what next_cursor was before it carried keys: the last item's id
    ids, cursor = page(api, ALICE, path, old_style)
    assert ids == listing.order[2:4] and cursor.startswith("c1~")
    delete(api, ALICE, listing.deleter(old_style))
    message = cursor_error(api.get(api_url(ALICE, path), params={"cursor": old_style}))
    assert message == (f"`cursor` names no item of this list ({old_style}); a next_cursor from a page keeps its"
                       " place even when its item is deleted")
    assert page(api, ALICE, path, cursor) == (listing.order[4:6], None)
