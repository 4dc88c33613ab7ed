"""Entities and relationships out of saved messages: deterministic rules, or a model."""

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
