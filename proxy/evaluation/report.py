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
