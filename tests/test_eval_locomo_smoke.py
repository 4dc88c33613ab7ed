"""Smoke test: `memproxy eval locomo` on one conversation of the LoCoMo dev split.

The data (CC BY-NC 4.0, evaluation only) is never part of the repository: it sits beside
the clone at ../shared/data/locomo/dev.json, as in CI. Elsewhere this test skips.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.cli import main

DEV = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo" / "dev.json"
SAMPLE = "conv-30"  # the smallest dev conversation: 19 sessions, 369 turns, 105 questions


@pytest.mark.skipif(not DEV.is_file(), reason=f"LoCoMo dev data missing (expected at {DEV})")
def test_eval_locomo_on_one_dev_conversation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "locomo", "--data", str(DEV), "--sample", SAMPLE, "--k", "10", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (figures["k"], figures["conversations"], figures["turns"]) == (10, 1, 369)
    assert (figures["questions"], figures["adversarial"]["questions"], figures["skipped"]) == (81, 24, 0)
    assert set(figures["by_category"]) == {"multi-hop", "temporal", "open-domain", "single-hop"}
    # Far below what this conversation scores: a broken path (nothing saved, nothing found,
    # hits mapped to the wrong turns) lands near zero.
    assert figures["turn_recall"] >= 0.4
    assert figures["session_recall"] >= 0.7
    assert 0 < figures["p50_ms"] <= figures["p95_ms"]
