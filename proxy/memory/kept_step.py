"""A tools-mode step kept with its application tool calls until the loop's next step.

The store keeps one text per step: the memory exchange as the provider saw it (the next step
puts it back byte for byte), and the step's memory calls as the turn's reasoning trace shows
them (redacted, results in their short form). A step that ends in the application's calls
saves no answer, so its memory calls wait here for the turn's final step, which saves the
trace. A step with no trace to keep is stored as its exchange alone, as before.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from proxy.models import ReasoningStep

_PACKED = '{"exchange":'  # how a packed step begins: no wire's exchange does (they are arrays, or {"shown":...})


def packed(exchange: str, trace: Sequence[ReasoningStep]) -> str:
    """What the store keeps of a step: its exchange and, when it has any, its memory calls."""
    if not trace:
        return exchange
    return json.dumps({"exchange": exchange, "trace": [asdict(step) for step in trace]}, ensure_ascii=False,
                      separators=(",", ":"))


def unpacked(kept: str) -> tuple[str, tuple[ReasoningStep, ...]]:
    """A kept step's exchange (byte for byte as it was given) and its memory calls."""
    if not kept.startswith(_PACKED):
        return kept, ()
    try:
        doc = json.loads(kept)
    except (ValueError, RecursionError):
        return kept, ()
    exchange, trace = doc.get("exchange"), doc.get("trace")
    if not isinstance(exchange, str) or not isinstance(trace, list):
        return kept, ()
    return exchange, tuple(ReasoningStep(str(step.get("name", "")), str(step.get("arguments", "")),
                                         str(step.get("result", "")))
                           for step in trace if isinstance(step, dict))


def earlier_steps(kept: dict[str, str], call_ids: Sequence[str]
                  ) -> tuple[dict[str, str], dict[str, tuple[ReasoningStep, ...]]]:
    """From the kept steps a request's calls name (call id -> what the store kept): call id -> its
    step's exchange, and each step's memory calls under the first of its calls the request shows
    (so a step's calls go into the trace once, before its application calls)."""
    echoes: dict[str, str] = {}
    traces: dict[str, tuple[ReasoningStep, ...]] = {}
    read: dict[str, tuple[str, tuple[ReasoningStep, ...]]] = {}  # the calls of one step share its text
    for call_id in call_ids:
        stored = kept.get(call_id)
        if stored is None:
            continue
        first = stored not in read
        if first:
            read[stored] = unpacked(stored)
        echoes[call_id], trace = read[stored]
        if first and trace:
            traces[call_id] = trace
    return echoes, traces
