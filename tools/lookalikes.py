"""Writes proxy/redaction/lookalikes.py from Unicode's confusables.txt, as confusable_homoglyphs carries it.

    pip install confusable_homoglyphs && python tools/lookalikes.py
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import confusable_homoglyphs  # type: ignore[import-not-found]

KEPT = set("-[]():.>")
OUT = Path(__file__).resolve().parent.parent / "proxy" / "redaction" / "lookalikes.py"
HEADER = '''"""Single characters Unicode's confusables.txt says read as ASCII letters, digits or `-[]():.>`.

Generated (`python tools/lookalikes.py`, which needs `pip install confusable_homoglyphs`)
from confusables.txt as that package carries it: every code point NFKD leaves alone whose
skeleton is ASCII of those characters. `proxy.redaction.confusables` folds text with it, so an
imitation spelled in Lisu, Cherokee, Coptic or mathematical letters reads as what it imitates.
"""

CONFUSABLE_ASCII: dict[str, str] = {
'''


def lookalikes() -> dict[str, str]:
    data = json.loads((Path(confusable_homoglyphs.__file__).parent / "confusables.json").read_text("utf-8"))
    found = {}
    for char, targets in data.items():
        if len(char) != 1 or char.isascii() or unicodedata.normalize("NFKD", char) != char or len(targets) != 1:
            continue
        ascii_text = targets[0]["c"]
        if ascii_text and ascii_text.isascii() and all(c.isalnum() or c in KEPT for c in ascii_text):
            found[char] = ascii_text
    return dict(sorted(found.items(), key=lambda item: ord(item[0])))


def main() -> None:
    lines, line = [], "   "
    for char, ascii_text in lookalikes().items():
        code = f"\\u{ord(char):04x}" if ord(char) < 0x10000 else f"\\U{ord(char):08x}"
        entry = f' "{code}": "{ascii_text}",'
        if len(line) + len(entry) > 112:
            lines.append(line)
            line = "   "
        line += entry
    lines.append(line)
    OUT.write_text(HEADER + "\n".join(lines) + "\n}\n", encoding="utf-8")


if __name__ == "__main__":
    main()
