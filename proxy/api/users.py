"""GET /users/{user}: what memproxy holds for one user, counted (the inspector's "find a user").

The API names one user per path by design: there is no list of every user, so nothing in
it lets one caller discover the others. Counting walks the user's own pages.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from proxy.models import Scope
from proxy.stores.base import PageKey, Store

COUNT_PAGE = 1000
Pager = Callable[..., Awaitable[list[tuple[PageKey, dict[str, Any]]]]]


async def user_counts(store: Store, scope: Scope) -> dict[str, Any] | None:
    """Counts of conversations, messages and entities, and the user's own node; None when all are zero."""
    conversations = messages = 0
    async for row in _rows(store.conversation_page, scope):
        conversations += 1
        messages += int(row["message_count"])
    entities = 0
    async for _ in _rows(store.entity_page, scope):
        entities += 1
    if not (conversations or entities):
        return None
    node = await store.user_node(scope)
    return {"object": "user", "user": scope.user, "conversations": conversations, "messages": messages,
            "entities": entities, "user_entity_id": None if node is None else node.id}


async def _rows(fetch: Pager, scope: Scope) -> AsyncIterator[dict[str, Any]]:
    after = None
    while True:
        rows = await fetch(scope, limit=COUNT_PAGE, after=after)
        for _, row in rows:
            yield row
        if len(rows) < COUNT_PAGE:
            return
        after = rows[-1][0]
