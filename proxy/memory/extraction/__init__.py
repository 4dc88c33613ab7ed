"""Entities and relationships out of saved messages: deterministic rules, or a model's answer read.

Pure functions of text: `rules` (with `clauses`, `names`, `roles`, `relations`,
`preferences`, `identifiers`, `lexicon`) finds them by rule, `llm` writes the model's prompt
and reads its answer. No I/O and no awaits; it imports the shared layer only (the naming
rule in `extracted`); `learning/` runs it and applies what it finds (import-linter holds it).
"""

from proxy.extracted import (
    SINGLE_VALUED,
    USER_NODE,
    ExtractedEntity,
    ExtractedRelation,
    Extraction,
    canonical_name,
)
from proxy.memory.extraction.rules import extract

__all__ = [
    "SINGLE_VALUED",
    "USER_NODE",
    "ExtractedEntity",
    "ExtractedRelation",
    "Extraction",
    "canonical_name",
    "extract",
]
