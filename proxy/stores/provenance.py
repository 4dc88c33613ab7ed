"""What deleting messages leaves of the graph: the rules for both backends, with no I/O.

Entities and edges keep, as provenance, the ids of the messages they were extracted from
(graph_merge.py). When messages are deleted (one, or a conversation's), what was derived
only from them goes too, as it would with the user's deletion:

- an edge or entity whose provenance is all deleted is deleted (an entity's edges with it);
- an entity also said elsewhere keeps only the description parts and aliases a remaining
  message of its provenance still holds, and loses the deleted ids. Rules extraction
  describes an entity by the sentence that stated it (after a short note of its own), so a
  part is found in its message;
  one an LLM extractor wrote in its own words cannot be traced to a message, and goes.

Entities with no provenance (a memory stored through the API or a tool) are no message's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Union

from proxy.stores.graph_merge import DESCRIPTION_SEPARATOR, Row
from proxy.stores.indexed_text import entity_terms

NOTE_SEPARATOR = "; "  # rules extraction's `note; sentence` (memory/extraction/rules.py)


@dataclass(frozen=True)
class Drop:
    """Delete the entity or edge at `seq`."""

    seq: int


@dataclass(frozen=True)
class KeepEdge:
    """An edge also said elsewhere: its provenance without the deleted ids."""

    seq: int
    provenance: str  # JSON list of message ids


@dataclass(frozen=True)
class KeepEntity:
    """An entity also said elsewhere, rewritten from what remains."""

    seq: int
    description: str
    aliases: str  # JSON list
    provenance: str  # JSON list of message ids
    terms: tuple[str, str, str]  # name, type, description index terms


Change = Union[Drop, KeepEdge, KeepEntity]


def remaining(provenance: str, deleted: set[str]) -> list[str]:
    """The message ids of a provenance list that were not deleted."""
    return [message for message in json.loads(provenance) if message not in deleted]


def edge_change(row: Row, deleted: set[str]) -> Drop | KeepEdge:
    """What becomes of an edge whose provenance names a deleted message."""
    kept = remaining(row["provenance"], deleted)
    return KeepEdge(row["seq"], json.dumps(kept)) if kept else Drop(row["seq"])


def entity_change(row: Row, deleted: set[str], texts: Iterable[str]) -> Drop | KeepEntity:
    """What becomes of an entity whose provenance names a deleted message; `texts` are the
    contents of the remaining messages of its provenance."""
    kept = remaining(row["provenance"], deleted)
    if not kept:
        return Drop(row["seq"])
    said = [_folded(text) for text in texts]
    parts = [part for part in row["description"].split(DESCRIPTION_SEPARATOR) if _stated(part, said)]
    description = DESCRIPTION_SEPARATOR.join(parts)
    aliases = [alias for alias in json.loads(row["aliases"]) if _held(alias, said)]
    return KeepEntity(row["seq"], description, json.dumps(aliases), json.dumps(kept),
                      entity_terms(row["name"], row["type"], description, aliases))


def _folded(text: str) -> str:
    """Whitespace folded as the merge folds it; case kept (an alias is a spelling)."""
    return " ".join(text.split())


def _stated(part: str, texts: Sequence[str]) -> bool:
    """A description part a remaining message states: its sentence, or a rules note on it
    (`cat; I live with my cat Miso.`: the note comes from the sentence it precedes)."""
    note, separator, sentence = part.partition(NOTE_SEPARATOR)
    return _held(part, texts) or bool(separator and note and _held(sentence, texts))


def _held(part: str, texts: Sequence[str]) -> bool:
    folded = _folded(part)
    return bool(folded) and any(folded in text for text in texts)
