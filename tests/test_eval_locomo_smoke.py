"""Smoke test: `memproxy eval locomo` on one conversation of the LoCoMo dev split.

The data (CC BY-NC 4.0, evaluation only) is never part of the repository: set
MEMPROXY_LOCOMO_DATA to a LoCoMo file holding conv-30 (data/locomo10.json or its dev split,
docs/evaluation.md). Without it the test looks where CI keeps the dev split, a `shared`
directory beside the clone, and skips when the file is not there either.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from proxy.cli import main

DEV = Path(os.environ.get("MEMPROXY_LOCOMO_DATA")
           or Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo" / "dev.json")
SAMPLE = "conv-30"  # the smallest dev conversation: 19 sessions, 369 turns, 105 questions


@pytest.mark.skipif(not DEV.is_file(), reason=f"no LoCoMo data at {DEV}: set MEMPROXY_LOCOMO_DATA (docs/evaluation.md)")
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
