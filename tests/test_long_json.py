"""proxy.long_json: long strings written in pieces, byte for byte what one json.dumps call writes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.wires.base import dump_json
from proxy.long_json import PIECE_CHARS, list_pieces

# Every char JSON escapes or UTF-8 writes in more than one byte, cut next to each of them.
AWKWARD = ('q"\\\n\t\x01é€😀 ' * (3 * PIECE_CHARS // 10 + 7))
EXACT = "x" * PIECE_CHARS  # as long as a piece: written whole


@pytest.mark.parametrize("body", [
    {"system": AWKWARD, "messages": [{"role": "user", "content": AWKWARD[:PIECE_CHARS + 1]}]},
    {"a": [[AWKWARD, 1, None, True, 2.5], {"b": {"c": AWKWARD}}], "d": EXACT, "e": AWKWARD[::-1]},
    {"decoy": "memproxy-long-text-0", "messages": [{"content": [{"text": AWKWARD}, {"text": "short"}]}]},
    {"nothing long": ["a", {"b": "c"}], "n": 1},
], ids=["top-level and message", "nested in lists and objects", "a decoy stand-in", "no long string"])
def test_a_body_in_pieces_is_the_body_written_whole(body: dict[str, Any]) -> None:
    assert dump_json(body, in_pieces=True) == json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def test_a_lone_surrogate_in_a_long_string_is_escaped_as_the_whole_body_would_be() -> None:
    body = {"messages": [{"content": AWKWARD + "\ud800"}]}
    assert dump_json(body, in_pieces=True) == dump_json(body) == json.dumps(body, separators=(",", ":")).encode()


def test_a_list_in_pieces_is_the_list_written_whole() -> None:
    material = ["ann\u00e9", "", [("user", AWKWARD), ("assistant", EXACT), ("user", "and?")]]
    assert "".join(list_pieces(material)) == json.dumps(material, ensure_ascii=False)
