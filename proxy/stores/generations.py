"""Deletion generations: a turn in flight when its user or conversation is deleted saves nothing.

Each user has a generation: how many deletions its memory has seen (the user, a
conversation, any single item). A turn reads it when it starts, in the same read that
looks its turn up, and carries it with each of its writes. Deleting the user or a
conversation also records the generation it moved to, so a write carrying an older
generation for that user or conversation is skipped inside the commit's own
transaction: whichever replica commits it, a turn in flight at the deletion saves nothing
afterwards, while a turn that starts later reads the new generation and saves as usual.

A turn's cached memory block is reused only while the generation it was computed at is
current: after any deletion, a tool loop's next step (or a retry) recomputes its block
without the deleted items.

The rows are keyed by hashes, so the record of a deletion keeps no user id in the clear.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Generation:
    """The user's generation when a turn began, and the conversation the turn writes to."""

    number: int
    conversation_id: str


def _key(*parts: str) -> str:
    material = "\0".join(parts).encode("utf-8", "surrogatepass")
    return hashlib.sha256(material).hexdigest()


def generation_key(user: str) -> str:
    """The row holding the user's generation."""
    return _key("generation", user)


def deleted_keys(user: str, conversation_id: str) -> list[str]:
    """The rows a write of a turn in this conversation checks: an older generation than theirs is stale."""
    return [user_deleted_key(user), conversation_deleted_key(user, conversation_id)]


def user_deleted_key(user: str) -> str:
    """The row holding the generation the user was last deleted at."""
    return _key("user deleted", user)


def conversation_deleted_key(user: str, conversation_id: str) -> str:
    """The row holding the generation the conversation was last deleted at."""
    return _key("conversation deleted", user, conversation_id)


# Moves the user's generation on by one; the new number is returned.
BUMP_SQL = ("INSERT INTO generations AS g (id, generation) VALUES ({0}, 1)"
            " ON CONFLICT (id) DO UPDATE SET generation = g.generation + 1 RETURNING generation")
# Records the generation a user or conversation was deleted at.
MARK_SQL = ("INSERT INTO generations AS g (id, generation) VALUES ({0}, {1})"
            " ON CONFLICT (id) DO UPDATE SET generation = excluded.generation")
