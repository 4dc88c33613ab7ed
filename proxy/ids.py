"""Ids: the ones memproxy makes (opaque, unguessable, in the order they were made), and the
one rule for the ids clients name (users, conversations, agents)."""

from __future__ import annotations

import hashlib
import os
import re
import time

_SCOPE_ID = re.compile(r"[A-Za-z0-9._:@+-]{1,256}")
SCOPE_ID_RULE = "1-256 characters of ASCII letters, digits and ._:@+-"
_MS_BITS = 48
_RANDOM_BYTES = 10  # 80 bits drawn, 74 used


def new_id() -> str:
    """32 hex digits in UUIDv7's layout (RFC 9562): the time in ms, then 74 random bits.

    Ids made one after another sort together, so an index on them (or on a turn's or a
    conversation's id) takes each new row at its end. Random ids sent every turn's rows
    to a random leaf of each such index: 37.3 pages of WAL a turn against 33.7, and 0.49
    against 0.42 ms of writer time (bench/writes.py, 20,000 turns of history).
    """
    ms = (time.time_ns() // 1_000_000) & ((1 << _MS_BITS) - 1)
    bits = int.from_bytes(os.urandom(_RANDOM_BYTES), "big")
    value = (ms << 80) | (0x7 << 76) | ((bits >> 68) << 64) | (0b10 << 62) | (bits & ((1 << 62) - 1))
    return f"{value:032x}"


def derived_id(material: str, at_ns: int) -> str:
    """An id in new_id's layout whose time is `at_ns` and whose other bits come from `material`:
    the same material and time always give the same id (unguessable without the material)."""
    ms = (at_ns // 1_000_000) & ((1 << _MS_BITS) - 1)
    bits = int.from_bytes(hashlib.sha256(material.encode("utf-8", "surrogatepass")).digest()[:_RANDOM_BYTES], "big")
    value = (ms << 80) | (0x7 << 76) | ((bits >> 68) << 64) | (0b10 << 62) | (bits & ((1 << 62) - 1))
    return f"{value:032x}"


def id_time_ns(made: str) -> int:
    """The time in ns (to the ms) of an id new_id or derived_id made."""
    return int(made[:12], 16) * 1_000_000


def is_scope_id(value: object) -> bool:
    """Whether `value` may name a user, conversation or agent (the one rule for headers,
    tokens, config and the CLI)."""
    # "." and ".." fit the character rule but read as paths in /memory/v1/users/{user} URLs.
    return isinstance(value, str) and _SCOPE_ID.fullmatch(value) is not None and value not in (".", "..")
