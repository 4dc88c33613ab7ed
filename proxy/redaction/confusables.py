"""Text as a reader sees it: invisible characters out, and look-alikes folded to ASCII.

The memory block's header, source labels and graph note are recognised in stored text on
its folded form, so `[long‐term]` with U+2010, fullwidth `［graph］` or a header spelled with
a Cyrillic `е` count as the imitations they read as. The fold is for recognising only:
what is cut is cut from the original text, and every other character stays as written.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from functools import lru_cache
from itertools import chain

import numpy as np

from proxy.redaction.lookalikes import CONFUSABLE_ASCII

# Every character of category Cf as of Unicode 15 (zero-width, bidi and other format
# controls, the tag characters U+E0000–E007F that spell hidden ASCII a model reads), the
# code points reserved as default-ignorable (U+2065, U+FFF0–FFF8, U+E0000–E0FFF), and the
# invisible fillers and selectors of other categories: the combining grapheme joiner
# (U+034F), the Hangul fillers (U+115F, U+1160, U+3164, U+FFA0), the Khmer inherent vowels
# (U+17B4, U+17B5), the Mongolian variation selectors (U+180B–180F), the Khitan filler
# (U+16FE4) and the variation selectors (U+FE00–FE0F, U+E0100–E01EF). test_block.py checks
# the list against the running Python's Unicode database.
# An emoji ZWJ sequence (👩‍💻) loses its joiner and reads as its parts (👩💻), and an emoji
# loses the selector asking for its colour form (❤️ reads ❤): a small price for text that
# cannot hide anything.
INVISIBLE = re.compile(
    "[\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u115f\u1160\u17b4\u17b5\u180b-\u180f"
    "\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U00016fe4\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff]"
)
# U+2800, the blank Braille pattern, is printed as an empty cell: it stands where a space
# would, and passes for "not a space" in text that hides words. It becomes a space.
BRAILLE_BLANK = "\u2800"

# Characters that NFKD leaves alone but a reader takes for ASCII punctuation or a Latin letter:
# Unicode's confusables.txt (lookalikes.py), and by hand what it leaves out but reads the same
# (box-drawing and CJK strokes as dashes, corner brackets as square ones).
_LOOKALIKES = {
    **CONFUSABLE_ASCII,
    # dashes and hyphens
    **dict.fromkeys("\u058a\u1400\u1806\u2010\u2011\u2012\u2013\u2014\u2015\u2043\u2212\u2e1a\u2e3a\u2e3b"
                    "\u30fc\ufe58\ufe63\uff0d\u02d7\u2796\u2e40\u301c\u2500\u2501\u2574\u2576\u2578"
                    "\u257a\u3161\u1173\u4e00\u2f00", "-"),
    # brackets and parentheses
    **dict.fromkeys("\u2045\u27e6\u298b\u298d\u298f\u3010\u3014\u3016\u3018\u301a\u23a1\u23a3\u23a2"
                    "\u2308\u230a\u2e22\u2e24\u300c\u300e\u231c\u231e", "["),
    **dict.fromkeys("\u2046\u27e7\u298c\u298e\u2990\u3011\u3015\u3017\u3019\u301b\u23a4\u23a6\u23a5"
                    "\u2309\u230b\u2e23\u2e25\u300d\u300f\u231d\u231f", "]"),
    **dict.fromkeys("\u2768\u276a\u27ee\u2985\u3008\u300a", "("),
    **dict.fromkeys("\u2769\u276b\u27ef\u2986\u3009\u300b", ")"),
    **dict.fromkeys("\u02d0\u0589\u05c3\u16ec\u2236\ua789\ua4fd", ":"),
    **dict.fromkeys("\u0701\u0702\u06d4\ua4f8\u3002\uff61", "."),
    **dict.fromkeys("\u02c3\u203a\u2192\u27f6", ">"),
    # Cyrillic
    "а": "a", "в": "b", "г": "r", "е": "e", "һ": "h", "і": "i", "ј": "j", "к": "k", "о": "o", "р": "p",
    "с": "c", "у": "y", "х": "x", "ѕ": "s", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ӏ": "l", "ү": "y",
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C", "Т": "T",
    "Х": "X", "І": "I", "Ј": "J", "Ѕ": "S", "Ү": "Y", "Ԛ": "Q", "Ԝ": "W", "Ӏ": "I", "Ԍ": "G",
    # Greek
    "α": "a", "β": "b", "γ": "y", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t",
    "υ": "u", "χ": "x", "ω": "w", "ϲ": "c", "ϳ": "j",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O",
    "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X", "Ϲ": "C",
    # Armenian, and Latin letters of other alphabets (IPA, small capitals)
    "օ": "o", "ս": "u", "հ": "h", "ո": "n", "ց": "g", "զ": "q", "ı": "i", "ȷ": "j", "ɑ": "a", "ɡ": "g", "ɩ": "i",
    "ʀ": "r", "ɢ": "g", "ʜ": "h", "ɪ": "i", "ʟ": "l", "ɴ": "n", "ᴀ": "a", "ᴄ": "c", "ᴅ": "d", "ᴇ": "e",
    "ᴊ": "j", "ᴋ": "k", "ᴍ": "m", "ᴏ": "o", "ᴘ": "p", "ᴛ": "t", "ᴜ": "u", "ᴠ": "v", "ᴡ": "w", "ᴢ": "z",
    "ꜱ": "s", "ʏ": "y",
}
_TABLE = str.maketrans(_LOOKALIKES)
# The combining diacritical marks' blocks: `gr̈aph` reads as `graph` with an accent on it.
_MARKS = re.compile("[\u0300-\u036f\u0483-\u0489\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")
_CHARS_CACHED = 8192


def reads_as(text: str) -> str:
    """`text` as it reads: compatibility forms (NFKD) and look-alikes made ASCII, accents dropped."""
    if text.isascii():
        return text
    return _MARKS.sub("", unicodedata.normalize("NFKD", text)).translate(_TABLE)


def reads_as_mapped(text: str) -> tuple[str, Sequence[int]]:
    """`reads_as(text)`, and for each of its characters the index in `text` it came from."""
    if text.isascii():
        return text, range(len(text))
    pieces: list[str] = []
    origins: list[int] = []
    for index, char in enumerate(text):
        piece = char if char.isascii() else _char_reads_as(char)
        pieces.append(piece)
        origins.extend([index] * len(piece))
    return "".join(pieces), origins


@lru_cache(maxsize=_CHARS_CACHED)
def _char_reads_as(char: str) -> str:
    return reads_as(char)


# The code points the secrets' view maps (past them every char reads as itself): the planes
# with letters and punctuation, and the tag characters.
_VIEW_PLANES = (range(0x80, 0xD800), range(0xE000, 0x30000), range(0xE0000, 0xE1000))
_VIEW_END = 0xE1000
_DROPPED = np.uint32(0xFFFFFFFF)


@lru_cache(maxsize=1)
def _view_table() -> np.ndarray:
    """For each code point below _VIEW_END, the one it reads as in the secrets' view: itself,
    the ASCII char it reads as (when it reads as exactly one), or _DROPPED (invisible)."""
    table = np.arange(_VIEW_END, dtype=np.uint32)
    for code in chain(*_VIEW_PLANES):
        char = chr(code)
        if INVISIBLE.match(char):
            table[code] = _DROPPED
        elif char == BRAILLE_BLANK:
            table[code] = ord(" ")
        elif (reads := reads_as(char)) != char and len(reads) == 1 and reads.isascii():
            table[code] = ord(reads)
    return table


_view_table()  # built at import (0.15 s), not by the first request that needs it


def visible_ascii_mapped(text: str) -> tuple[str, np.ndarray]:
    """`text` as the secret rules read it: invisible characters out, and every character that
    reads as one ASCII char (`ｐａｓｓｗｏｒｄ`, a Cyrillic `а`, a no-break space) made that char;
    and for each char of it the index in `text` it came from. Vectorised: a megabyte costs
    milliseconds."""
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    inside = codes < _VIEW_END
    mapped = np.where(inside, _view_table()[np.where(inside, codes, 0)], codes)
    kept = mapped != _DROPPED
    return mapped[kept].tobytes().decode("utf-32-le", "surrogatepass"), np.flatnonzero(kept)
