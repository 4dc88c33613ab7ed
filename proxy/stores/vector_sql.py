"""What each kind of item is embedded as, in SQL both backends run the same way.

The embedding text is computed by the database, both when an item is handed out to be
embedded and when its vector is saved: a vector is saved only while the item still reads
the text it was computed from, so an edit made while the call was out leaves no stale
vector behind (the edit's trigger already dropped the old one).
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.stores.base import EmbeddingKind

# ~2,000 tokens: past this an embedding says little more about a memory, and every
# provider's input limit is above it.
EMBED_CHARS = 8000


@dataclass(frozen=True)
class VectorTable:
    """The table of one kind of item, its embedding text, and the column sources group it by."""

    table: str
    text: str  # SQL over alias x, before the cut
    group: str  # SQL over alias x: the conversation, or NULL

    @property
    def cut_text(self) -> str:
        return f"substr({self.text}, 1, {EMBED_CHARS})"


VECTOR_TABLES: dict[EmbeddingKind, VectorTable] = {
    "message": VectorTable("messages", "x.content", "x.conversation_id"),
    "entity": VectorTable("entities", "trim(x.name || ' ' || x.description)", "NULL"),
    "reasoning": VectorTable("reasoning", "trim(x.task || ' ' || x.answer)", "x.conversation_id"),
}


def table_of(kind: str) -> VectorTable:
    """The VectorTable of a kind; ValueError for any other (the kind goes into SQL)."""
    try:
        return VECTOR_TABLES[kind]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"not an embedding kind: {kind!r}") from None
