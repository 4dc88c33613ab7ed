"""List cursors: where a page of a memory API list ended, handed to the client as `next_cursor`.

A cursor carries the sort key of the page's last item (store.base.PAGE_KEY_PARTS), not only
its id, so the next page starts where that item stood even after it has been deleted. It is
`c1~` and url-safe base64 of a checksum and the key as JSON. Ids never hold `~`, so a bare
id, the cursor of earlier versions, is still told apart (records.parse_page reads it).

The checksum covers the key and the list the cursor came from (user, and conversation for
messages): a cursor that was changed, cut, or taken from another list is refused. It is not
a signature, and need not be one: a page is always read from the list the path names, so a
forged cursor can only position a page within what the caller may list anyway.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from dataclasses import dataclass

from proxy.api.errors import InvalidRequest
from proxy.errors import BadScope
from proxy.identity.scope import valid_id
from proxy.stores.base import PAGE_KEY_PARTS, PageKey, PageList

MARK = "~"  # in every cursor, and in no id
PREFIX = f"c1{MARK}"
MAX_CHARS = 512  # a conversation's key (a time and a 256-character id) comes to about 400
PATTERN = f"^{PREFIX}[A-Za-z0-9_-]+$"
_CHECK_BYTES = 8
_SEQ_MAX = 2**63 - 1  # a 64-bit integer column, on either store
# A time in a key is seconds (SQLite) or microseconds (PostgreSQL) from 1970. These bounds are
# a datetime's range (years 1 to 9999) in microseconds: every stored time is inside, and no
# forged one outside can overflow a datetime.
_TIME_MIN, _TIME_MAX = -62_135_596_800 * 10**6, 253_402_300_800 * 10**6 - 1
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")
_INVALID = "`cursor` must be the next_cursor of a page of this same list, unchanged"


@dataclass(frozen=True)
class Listing:
    """The list a cursor belongs to: which one, whose, and for messages, of which conversation."""

    kind: PageList
    user: str
    conversation: str = ""


def write(listing: Listing, key: PageKey) -> str:
    """The cursor of a page whose last item has this key."""
    payload = json.dumps(list(key), separators=(",", ":")).encode()
    return PREFIX + base64.urlsafe_b64encode(_check(listing, payload) + payload).rstrip(b"=").decode()


def read(listing: Listing, cursor: str) -> PageKey:
    """The key a cursor of this list carries, or 400 naming `cursor`."""
    body = cursor[len(PREFIX):]
    if not cursor.startswith(PREFIX) or len(cursor) > MAX_CHARS or not _BASE64URL.fullmatch(body):
        raise InvalidRequest(_INVALID, param="cursor")
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise InvalidRequest(_INVALID, param="cursor") from None
    check, payload = raw[:_CHECK_BYTES], raw[_CHECK_BYTES:]
    key = _key(listing.kind, payload) if check == _check(listing, payload) else None
    if key is None:
        raise InvalidRequest(_INVALID, param="cursor")
    return key


def _check(listing: Listing, payload: bytes) -> bytes:
    whose = f"{listing.kind}\0{listing.user}\0{listing.conversation}".encode()
    return hashlib.sha256(b"memproxy list cursor\0" + whose + b"\0" + payload).digest()[:_CHECK_BYTES]


def _key(kind: PageList, payload: bytes) -> PageKey | None:
    """The key in a payload when it has the list's parts (a forged cursor may not), else None."""
    try:
        parts = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    shape = PAGE_KEY_PARTS[kind]
    if not isinstance(parts, list) or len(parts) != len(shape) or not all(map(_fits, shape, parts)):
        return None
    return tuple(parts)


def _fits(part_kind: str, part: object) -> bool:
    if part_kind == "id":
        return isinstance(part, str) and _is_id(part)
    if isinstance(part, bool) or not isinstance(part, (int, float)):
        return False
    if part_kind == "seq":
        return isinstance(part, int) and 0 <= part <= _SEQ_MAX
    return math.isfinite(part) and _TIME_MIN <= part <= _TIME_MAX


def _is_id(text: str) -> bool:
    try:
        valid_id(text, "cursor")
    except BadScope:
        return False
    return True
