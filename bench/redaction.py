"""Redaction throughput: MB/s of `proxy.redaction.redact.redact` on ordinary and adversarial text.

Each text is built to the given size (1 MB and 8 MB by default) and redacted a few times;
the figure is the best run's MB/s (the least disturbed by other work on the machine).

    python bench/redaction.py [--sizes 1,8] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.figures import repeat_ms  # noqa: E402
from harness.report import Column, header, json_option, print_json, row  # noqa: E402
from proxy.redaction.redact import redact  # noqa: E402

MB = 1_000_000

TEXTS: dict[str, Callable[[int], str]] = {
    "prose": lambda n: _fill("We talked about the deployment plan and the password policy for a while. ", n),
    "prose+secrets": lambda n: _fill("the db is postgres://app:s3cr3tPw@db:5432/x and token=Zm9vYmFyYmF6cXV4 ok. ", n),
    "a" * 3: lambda n: "a" * n,
    "=" * 3: lambda n: "=" * n,
    ":" * 3: lambda n: ":" * n,
    "/" * 3: lambda n: "/" * n,
    "key=key=": lambda n: _fill("key=", n),
    "password: ": lambda n: _fill("password: ", n),
    "base64": lambda n: _fill("QWxhZGRpbjpvcGVuIHNlc2FtZQ+/", n),
    "base64 lines": lambda n: _fill("TWFueSBoYW5kcyBtYWtlIGxpZ2h0IHdvcmsu/+AbCdEfGhIjKlMnOpQrStUvWxYz012\n", n),
    "url://u:": lambda n: "postgres://" + _fill("u:", n),
    "word: word:": lambda n: _fill("setup: ", n),
    "a.b.c": lambda n: _fill("a.", n) + "://",
    # A file's code as a tool call's JSON arguments: an escape every dozen chars, read again as
    # the escapes spell it (two levels: the arguments, then the code's own `\t`).
    "json arguments": lambda n: json.dumps({"content": _fill('def f(x):\n    return "a\\tb" + x  # cfg\n', n)}),
    "\\u escapes": lambda n: _fill("pass\\u0077ord=\\\"a", n),
}


def _fill(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def measure(make: Callable[[int], str], size: int, repeat: int) -> float:
    best_s = min(repeat_ms(partial(redact, make(size)), repeat, warm=False)) / 1000
    return size / MB / best_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8", help="sizes in MB, comma separated")
    parser.add_argument("--repeat", type=int, default=3)
    json_option(parser, help="one JSON object as the last line")
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    figures: dict[str, dict[str, float]] = {}
    columns = [Column("text", 15, align="<"), *(Column(f"{s:g} MB", 11, ".1f") for s in sizes)]
    print(header(columns) + "   (MB/s)")
    for name, make in TEXTS.items():
        figures[name] = {f"{s:g}": measure(make, int(s * MB), args.repeat) for s in sizes}
        print(row(columns, [name, *figures[name].values()]), flush=True)
    if args.json:
        print_json(figures)


if __name__ == "__main__":
    main()
