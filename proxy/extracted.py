"""What an extractor returns: entities, relationships and the user's stated name."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

USER_NODE = "User"  # the speaking user until their name is known (docs/retrieval.md)
USER_TYPE = "user"  # the type of the node that stands for the user (retrieval finds it by this type)

# A new fact of one of these types replaces the old edge with the same subject (closed, not deleted).
SINGLE_VALUED = frozenset(
    {
        "WORKS_AT",
        "LIVES_IN",
        "FROM",
        "STUDIES_AT",
        "HAS_SPOUSE",
        "HAS_PARTNER",
        "HAS_MANAGER",
        "HAS_DENTIST",
        "HAS_DOCTOR",
        "HAS_THERAPIST",
        "HAS_MOTHER",
        "HAS_FATHER",
        "HAS_LANDLORD",
    }
)

_SPACE = re.compile(r"\s+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # those that are not whitespace, once _SPACE has run
_POSSESSIVE = re.compile(r"(?:'s|'|\.)+$")
KEY_MAX_CHARS = 200  # 800 bytes at most in UTF-8, with the hash well under PostgreSQL's 2,704


@dataclass(frozen=True)
class ExtractedEntity:
    """A named thing and the fact that mentioned it."""

    name: str
    type: str
    description: str = ""
    confidence: float = 0.7


@dataclass(frozen=True)
class ExtractedRelation:
    """A typed edge between two entity names; USER_NODE stands for the speaking user."""

    from_name: str
    type: str
    to_name: str


@dataclass(frozen=True)
class Extraction:
    """Everything one text yielded: `user_name` is the name the user states ("my name is
    Alice"), `user_alias` the one they ask to be called ("call me Ally")."""

    entities: list[ExtractedEntity] = field(default_factory=list)
    relationships: list[ExtractedRelation] = field(default_factory=list)
    user_name: str | None = None
    user_alias: str | None = None


def canonical_name(name: str) -> str:
    """The merge key of a name: case folded, whitespace collapsed, control characters and a
    trailing possessive removed (a NUL in the key made PostgreSQL refuse the whole batch).

    A key past KEY_MAX_CHARS is its head and a hash of the whole, so two names share a key
    only when they are the same, and PostgreSQL's index can hold it (an entry of over 2,704
    bytes is refused: 1,000 Chinese characters of a memory's text were).
    """
    folded = _CONTROL.sub("", _SPACE.sub(" ", name.replace("\u2019", "'"))).strip().casefold()
    return bounded_key(_POSSESSIVE.sub("", folded).rstrip())


def bounded_key(key: str) -> str:
    """A merge key of at most KEY_MAX_CHARS and a hash (the stores' migrations re-key with it)."""
    if len(key) <= KEY_MAX_CHARS:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{key[:KEY_MAX_CHARS]}#{digest}"
