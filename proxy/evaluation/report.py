"""The benchmark's output: a progress bar while it runs, then a table or one JSON object."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

BAR_WIDTH = 30


class ProgressBar:
    """`[#####.....] 120/1347` redrawn in place on a terminal stream."""

    def __init__(self, stream: TextIO | None = None, label: str = "questions") -> None:
        self.stream = stream or sys.stderr
        self.label = label
        self._shown = -1

    def __call__(self, done: int, total: int) -> None:
        filled = BAR_WIDTH * done // total if total else BAR_WIDTH
        if filled == self._shown and done != total:
            return  # redraw only when the bar moves
        self._shown = filled
        self.stream.write(f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} {self.label}")
        if done == total:
            self.stream.write("\n")
        self.stream.flush()


class ProgressLines:
    """`questions: 135/1347 (10%)`, one plain line at each tenth, for a log file or a pipe.

    A redrawn bar would leave its `\r` frames in the file, hundreds of them on one line.
    """

    def __init__(self, stream: TextIO, label: str = "questions") -> None:
        self.stream = stream
        self.label = label
        self._shown = -1

    def __call__(self, done: int, total: int) -> None:
        tenth = 10 * done // total if total else 10
        if tenth == self._shown:
            return
        self._shown = tenth
        self.stream.write(f"{self.label}: {done}/{total} ({10 * tenth}%)\n")
        self.stream.flush()


def progress_for(stream: TextIO, json_output: bool) -> ProgressBar | ProgressLines | None:
    """A bar on a terminal; plain lines elsewhere, or nothing when stdout carries JSON for a program."""
    if stream.isatty():
        return ProgressBar(stream)
    return None if json_output else ProgressLines(stream)


def table(figures: dict[str, Any]) -> str:
    """The figures as a readable table."""
    k = figures["k"]
    rows = [(f"turn recall@{k} (categories 1-4)", f"{figures['turn_recall']:.3f}", str(figures["questions"]))]
    for name, value in figures["by_category"].items():
        shown = "-" if value is None else f"{value:.3f}"
        rows.append((f"  {name}", shown, str(figures["category_questions"][name])))
    rows.append((f"session recall@{k} (categories 1-4)", f"{figures['session_recall']:.3f}", ""))
    adversarial = figures["adversarial"]
    rows.append(("adversarial (category 5) turn recall", f"{adversarial['turn_recall']:.3f}",
                 str(adversarial["questions"])))
    rows.append(("retrieval p50 / p95 (ms)", f"{figures['p50_ms']:.2f} / {figures['p95_ms']:.2f}", ""))
    rows.append(("ingest incl. extraction (s)", f"{figures['ingest_s']:.1f}", f"{figures['turns']} turns"))
    rows.append(("  of which extraction (s)", f"{figures['extract_s']:.1f}", ""))
    slots = ", ".join(f"{source} {n:.2f}" for source, n in figures["slots"].items())
    rows.append(("hits per question by source", slots, ""))
    width = max(len(r[0]) for r in rows)
    lines = [f"{'':{width}}  {'value':>10}  questions"]
    lines += [f"{name:{width}}  {value:>10}  {count}" for name, value, count in rows]
    return "\n".join(lines)


def as_json(figures: dict[str, Any]) -> str:
    """One JSON object on one line."""
    return json.dumps(figures, sort_keys=False)
