"""JSON with long strings written in pieces: what one `json.dumps` call would write, byte for byte.

`json.dumps` holds the interpreter for the whole of a string it encodes, so a 30 MB prompt
encoded in a worker thread would still stop the event loop (and every other stream) for
that long. Written PIECE_CHARS at a time, each step is a brief hold. JSON escapes char by
char, so the escaped pieces of a string join into its escaped whole.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

PIECE_CHARS = 1 << 16  # 64 KiB: encoding one piece takes well under a millisecond


def string_pieces(value: str) -> Iterator[str]:
    """`json.dumps(value, ensure_ascii=False)` for a string, in pieces."""
    if len(value) <= PIECE_CHARS:
        yield json.dumps(value, ensure_ascii=False)
        return
    yield '"'
    for start in range(0, len(value), PIECE_CHARS):
        yield json.dumps(value[start:start + PIECE_CHARS], ensure_ascii=False)[1:-1]
    yield '"'


def list_pieces(value: str | list[Any] | tuple[Any, ...]) -> Iterator[str]:
    """`json.dumps(value, ensure_ascii=False)` for strings and (nested) lists or tuples of them."""
    if isinstance(value, str):
        yield from string_pieces(value)
        return
    yield "["
    for n, item in enumerate(value):
        if n:
            yield ", "
        yield from list_pieces(item)
    yield "]"


def dump_in_pieces(body: dict[str, Any]) -> bytes:
    """`json.dumps(body, ensure_ascii=False, separators=(",", ":"))` as UTF-8, long strings in pieces.

    Raises RecursionError and UnicodeEncodeError as that call and its encoding would.
    """
    long: dict[str, str] = {}
    token = secrets.token_hex(8)  # a stand-in no client can have written beforehand

    def held_out(value: Any) -> Any:
        # Only the path to a long string is copied; the rest is shared, never mutated.
        if isinstance(value, str):
            if len(value) <= PIECE_CHARS:
                return value
            stand_in = f"memproxy-long-text-{token}-{len(long)}"
            long[json.dumps(stand_in)] = value
            return stand_in
        if isinstance(value, dict):
            changed = {key: held_out(item) for key, item in value.items()}
            return changed if any(changed[key] is not item for key, item in value.items()) else value
        if isinstance(value, list):
            items = [held_out(item) for item in value]
            return items if any(new is not old for new, old in zip(items, value)) else value
        return value

    text = json.dumps(held_out(body), ensure_ascii=False, separators=(",", ":"))
    return b"".join(piece.encode("utf-8") for piece in _put_back(text, long))


def _put_back(text: str, long: dict[str, str]) -> Iterator[str]:
    # The stand-ins were made in the order json.dumps writes the values they replace.
    position = 0
    for quoted, value in long.items():
        at = text.index(quoted, position)
        yield text[position:at]
        yield from string_pieces(value)
        position = at + len(quoted)
    yield text[position:]
