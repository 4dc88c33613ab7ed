"""What the stores index and keep as text, the same on every backend: an item's index terms
(the words a search finds it by), a message's context terms, and a trace's steps as JSON.

`memproxy reindex --terms` (reindex_terms.py) makes these again when the tokeniser changes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from proxy.models import ReasoningStep
from proxy.terms import index_text

# Only this much of an item's text is indexed. Indexing costs ~2 µs a word of CPU on the
# write thread, holding the GIL: a 5 MB pasted message took 1.8 s and starved the event
# loop; a memory is only ever injected as a snippet anyway.
INDEX_MAX_CHARS = 65536
# A message is indexed with the words of the messages just before it in its conversation
# (the question an answer replies to), searched at a lower weight. Measured on the LoCoMo
# dev split (README, "Evaluation"): two earlier messages beat one or three. A long earlier
# message lends only its start: context says what was being talked about.
CONTEXT_MESSAGES = 2
CONTEXT_CHARS_PER_MESSAGE = 2000


def index_terms(text: str) -> str:
    """The FTS text of a stored item: `proxy.terms.index_text` of its first INDEX_MAX_CHARS."""
    return index_text(text[:INDEX_MAX_CHARS])


def context_terms(before: Sequence[str]) -> str:
    """A message's context column: the start of each earlier message's index terms, in order
    (one with no terms, emoji only, adds no empty token)."""
    return " ".join(_head(terms, CONTEXT_CHARS_PER_MESSAGE) for terms in before if terms)


def _head(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > 0 else limit]


def entity_terms(name: str, type_: str, description: str, aliases: Sequence[str] = ()) -> tuple[str, str, str]:
    """The entities_fts columns of an entity: (name and aliases, type, description)."""
    return index_terms(" ".join([name, *aliases])), index_terms(type_), index_terms(description)


def reasoning_terms(task: str, steps: Sequence[ReasoningStep], answer: str) -> str:
    """The reasoning_fts text of a trace: task, each call and result, answer."""
    parts = [task, *(f"{s.name} {s.arguments} {s.result}" for s in steps), answer]
    return index_terms(" ".join(parts))


def steps_json(steps: Sequence[ReasoningStep]) -> str:
    """The stored form of a trace's steps."""
    return json.dumps([{"name": s.name, "arguments": s.arguments, "result": s.result} for s in steps])


def steps_from_json(stored: str) -> tuple[ReasoningStep, ...]:
    """A trace's steps from their stored form (`result` may be missing)."""
    return tuple(ReasoningStep(s["name"], s["arguments"], s.get("result", "")) for s in json.loads(stored))
