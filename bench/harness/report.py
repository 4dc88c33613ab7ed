"""Printing figures: fixed-width tables, PASS/FAIL lines, and the one JSON object a run ends with."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Column:
    """One column of a table: its title (lines split on newlines), width, alignment and value format."""

    title: str
    width: int
    format: str = ""  # a format spec for the value: ".3f", ",", ".1%"
    align: str = ">"

    def cell(self, value: Any) -> str:
        """The value formatted and aligned; `-` for None."""
        text = "-" if value is None else format(value, self.format)
        return f"{text:{self.align}{self.width}}"


def header(columns: Sequence[Column], indent: str = "") -> str:
    """The titles, a line for each line of the tallest."""
    heads = [column.title.split("\n") for column in columns]
    depth = max(len(head) for head in heads)
    return "\n".join((indent + " ".join(f"{(head[i] if i < len(head) else ''):{c.align}{c.width}}"
                                        for c, head in zip(columns, heads))).rstrip() for i in range(depth))


def row(columns: Sequence[Column], values: Sequence[Any], indent: str = "") -> str:
    """One line of values under `header(columns)`."""
    return (indent + " ".join(c.cell(value) for c, value in zip(columns, values))).rstrip()


def table(columns: Sequence[Column], rows: Iterable[Sequence[Any]], indent: str = "") -> str:
    """The header, then a line per row."""
    return "\n".join([header(columns, indent), *(row(columns, values, indent) for values in rows)])


@dataclass
class Criterion:
    """A line a benchmark judges: its name, whether it passed, and the figures behind the verdict."""

    name: str
    passed: bool | None  # None: not measured in this run (a target or a step was left out)
    detail: str
    informational: bool = False  # printed, but not part of the exit status

    def line(self) -> str:
        verdict = {True: "PASS", False: "FAIL", None: "SKIP"}[self.passed]
        return f"{verdict}  {self.name}{' (informational)' if self.informational else ''}: {self.detail}"

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "pass": self.passed, "detail": self.detail, "informational": self.informational}


def all_passed(criteria: Iterable[Criterion]) -> bool:
    """No criterion that counts failed (SKIP and informational ones aside): exit status 0."""
    return all(c.passed is not False for c in criteria if not c.informational)


def json_option(parser: argparse.ArgumentParser, help: str = "print one JSON object last") -> None:
    """The `--json` option every benchmark takes."""
    parser.add_argument("--json", action="store_true", help=help)


def print_json(figures: Any) -> None:
    """The run's figures as one JSON object on one line (the last a run prints)."""
    print(json.dumps(figures))
