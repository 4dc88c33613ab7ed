"""Text as its JSON escapes spell it: `pass\\u200bword`, `\\uff50\\uff41...`, `\\"password\\"`.

A tool call's arguments are JSON text, and a string inside them may hold JSON again (code
that builds a config): what the arguments say is what their escapes spell. The redactor
reads that spelling beside the text as written; what it finds there is cut from the text
as written, whole escapes and all, so the text stays valid JSON and is otherwise unchanged.

Vectorised, as the secrets' view of invisible characters is: arguments holding a file's
code have an escape every few characters, and a loop over them would cost more than the
redaction itself.
"""

from __future__ import annotations

import numpy as np

_BACKSLASH, _U = ord("\\"), ord("u")


def _table(values: dict[str, int], missing: int) -> np.ndarray:
    """A read-only table from each ASCII code to its value (`missing` for the others)."""
    table = np.full(128, missing, dtype=np.int64)
    for char, value in values.items():
        table[ord(char)] = value
    table.flags.writeable = False
    return table


# JSON's escapes (RFC 8259 section 7): the char after the backslash -> what it spells (0: none).
_SHORT = _table({char: ord(spelled) for char, spelled in zip('"\\/bfnrt', '"\\/\b\f\n\r\t')}, 0)
_HEX = _table({digit: int(digit, 16) for digit in "0123456789abcdefABCDEF"}, -1)
_PLACES = np.array([4096, 256, 16, 1], dtype=np.int64)
_HIGH, _LOW, _SURROGATES_END, _REPLACEMENT = 0xD800, 0xDC00, 0xE000, 0xFFFD


def _ascii(codes: np.ndarray) -> np.ndarray:
    """The codes, with every one past ASCII as 0 (an index into the tables above)."""
    return np.where(codes < 128, codes, 0)


def unescaped_mapped(text: str) -> tuple[str, np.ndarray]:
    """`text` with every JSON escape replaced by the character it spells (a surrogate pair by
    its one character, a lone surrogate by U+FFFD), and for each character of that, plus one
    past the end, the index in `text` where it begins: the view's [a, b) is the text's
    [starts[a], starts[b])."""
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    padded = np.concatenate([codes, np.zeros(6, dtype=np.uint32)])  # room to look past the end
    slashes = np.flatnonzero(codes == _BACKSLASH)
    # Read left to right, a run of backslashes is pairs (`\\`) and maybe one more: an escape
    # begins at each even place in the run.
    order = np.arange(len(slashes))
    place = order - np.maximum.accumulate(np.where(np.diff(slashes, prepend=-2) != 1, order, 0))
    at = slashes[place % 2 == 0]
    after = padded[at + 1].astype(np.int64)
    short = _SHORT[_ascii(after)]
    is_short = short > 0
    # What each `\uXXXX` spells (-1 where there is none): only those escapes' digits are read.
    code = np.full(len(at), -1, dtype=np.int64)
    maybe = np.flatnonzero(after == _U)
    digits = _HEX[_ascii(padded[at[maybe, None] + np.arange(2, 6)].astype(np.int64))]
    whole = (digits >= 0).all(axis=1)
    code[maybe[whole]] = digits[whole] @ _PLACES
    is_u = code >= 0
    high = is_u & (code >= _HIGH) & (code < _LOW)
    low = is_u & (code >= _LOW) & (code < _SURROGATES_END)
    pair = np.zeros(len(at), dtype=bool)
    pair[:-1] = high[:-1] & low[1:] & (at[1:] == at[:-1] + 6)
    second = np.concatenate([[False], pair[:-1]])  # the low half of a pair, read with its high half
    value = np.where(is_short, short, code)
    value = np.where(pair, 0x10000 + ((code - _HIGH) << 10) + np.concatenate([code[1:], [_LOW]]) - _LOW, value)
    value[is_u & ~pair & ~second & (code >= _HIGH) & (code < _SURROGATES_END)] = _REPLACEMENT
    length = np.where(pair, 12, np.where(is_short, 2, 6))
    escape = (is_short | is_u) & ~second
    begins, values, ends = at[escape], value[escape], at[escape] + length[escape]
    # Each escape's chars after its backslash are dropped; its backslash becomes what it spells.
    depth = np.zeros(len(codes) + 1, dtype=np.int8)
    depth[begins + 1] += 1
    depth[ends] -= 1
    kept = np.cumsum(depth[:-1], dtype=np.int8) == 0  # escapes never overlap: 0 or 1
    spelled = codes.copy()
    spelled[begins] = values
    view = spelled[kept].tobytes().decode("utf-32-le", "surrogatepass")
    return view, np.append(np.flatnonzero(kept), len(codes))
