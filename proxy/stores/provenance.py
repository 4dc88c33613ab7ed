"""What deleting messages leaves of the graph: the rules for both backends, with no I/O.

Entities and edges keep, as provenance, the ids of the messages they were extracted from
(graph_merge.py). When messages are deleted (one, or a conversation's), what was derived
only from them goes too, as it would with the user's deletion:

- an edge whose provenance is all deleted is deleted, and an edge of the same subject and
  type it had closed (a single-valued fact it replaced) is current again, or closed by the
  next one that remains;
- an entity whose provenance is all deleted is deleted (its edges with it), unless an edge
  that remains names it: an extractor may relate a stored entity without describing it
  again, and a kept message's edge must not go with it. It then keeps what those edges'
  messages state, and their ids as its provenance;
- an entity also said elsewhere keeps only the description parts and aliases a remaining
  message of its provenance still holds, and loses the deleted ids. Rules extraction
  describes an entity by the sentence that stated it (after a short note of its own), so a
  part is found in its message;
  one an LLM extractor wrote in its own words cannot be traced to a message, and goes.

Entities with no provenance, or stored explicitly (`stored_via`: the memory API, a tool,
MCP) and merged with extracted ones since, are no message's: they stay.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Union

from proxy.extracted import USER_NODE, USER_TYPE, canonical_name
from proxy.stores.graph_merge import DESCRIPTION_SEPARATOR, PROVENANCE_KEEP, Row, SetEdgeProvenance
from proxy.stores.indexed_text import entity_terms

NOTE_SEPARATOR = "; "  # rules extraction's `note; sentence` (memory/extraction/rules.py)


@dataclass(frozen=True)
class Drop:
    """Delete the entity or edge at `seq`."""

    seq: int


@dataclass(frozen=True)
class KeepEntity:
    """An entity also said elsewhere, rewritten from what remains."""

    seq: int
    name: str
    canonical: str  # canonical_name(name)
    description: str
    aliases: str  # JSON list
    provenance: str  # JSON list of message ids
    terms: tuple[str, str, str]  # name, type, description index terms


# An edge also said elsewhere keeps its provenance without the deleted ids: the merge's own step.
Change = Union[Drop, SetEdgeProvenance, KeepEntity]


def remaining(provenance: str, deleted: set[str]) -> list[str]:
    """The message ids of a provenance list that were not deleted."""
    return [message for message in json.loads(provenance) if message not in deleted]


def edge_change(row: Row, deleted: set[str]) -> Drop | SetEdgeProvenance:
    """What becomes of an edge whose provenance names a deleted message."""
    kept = remaining(row["provenance"], deleted)
    return SetEdgeProvenance(row["seq"], json.dumps(kept)) if kept else Drop(row["seq"])


def entity_change(row: Row, deleted: set[str], texts: Iterable[str], named_by: Sequence[str] = (),
                  name_said: bool = True, stored: bool = False) -> Drop | KeepEntity:
    """What becomes of an entity whose provenance names a deleted message; `texts` are the
    contents of the remaining messages of its provenance (else of `named_by`, the remaining
    provenance of the edges that name it). `name_said` is False for the user's node when no
    remaining message of the user holds its name: the name was stated only in what was
    deleted, and the node is the user's again, unnamed. A `stored` entity (a memory the user
    stored explicitly, `stored_via`) is no message's: it stays, with what no remaining message
    states taken out."""
    kept = remaining(row["provenance"], deleted) or list(named_by)
    if not kept and not stored:
        return Drop(row["seq"])
    said = [_folded(text) for text in texts]
    parts = [part for part in row["description"].split(DESCRIPTION_SEPARATOR) if _stated(part, said)]
    description = DESCRIPTION_SEPARATOR.join(parts)
    aliases = [alias for alias in json.loads(row["aliases"]) if _held(alias, said)]
    name = row["name"] if name_said or row["type"] != USER_TYPE else USER_NODE
    return KeepEntity(row["seq"], name, canonical_name(name), description, json.dumps(aliases), json.dumps(kept),
                      entity_terms(name, row["type"], description, aliases))


def user_name_check(row: Row) -> str | None:
    """The name to look for in the user's remaining messages: the user's node's stated name."""
    if row["type"] != USER_TYPE or canonical_name(row["name"]) == canonical_name(USER_NODE):
        return None
    return str(row["name"])


def edges_provenance(provenances: Iterable[str]) -> list[str]:
    """The message ids of the edges naming an entity (JSON lists), once each, the most recent kept."""
    ids = list(dict.fromkeys(message for provenance in provenances for message in json.loads(provenance)))
    return ids[-PROVENANCE_KEEP:]


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
