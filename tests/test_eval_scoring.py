"""The LoCoMo benchmark's reading and scoring, on a tiny hand-made conversation with known answers."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import main
from proxy.evaluation import locomo, runner
from proxy.evaluation.locomo import Question, Turn
from proxy.evaluation.scoring import Answer, Summary, percentile, session_recall, turn_recall
from proxy.settings import Settings
from proxy.stores.sqlite.store import SQLiteStore

# Three sessions of two turns. The questions' evidence is chosen so the answer does not
# depend on ranking: with k = 12 every turn that shares a word with a question is found,
# and D3:2 shares none with the question that names it.
TINY: dict[str, Any] = {
    "sample_id": "tiny-1",
    "conversation": {
        "speaker_a": "Ann",
        "speaker_b": "Bo",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a greyhound called Pixel last week."},
            {"speaker": "Bo", "dia_id": "D1:2", "text": "Lovely! My sister teaches violin in Lisbon."},
        ],
        "session_2_date_time": "10:04 am on 19 June, 2023",
        "session_2": [
            {"speaker": "Ann", "dia_id": "D2:1", "text": "Pixel chewed my left sneaker yesterday."},
            {"speaker": "Bo", "dia_id": "D2:2", "text": "Ha, that happens.", "img_url": ["https://x/1.jpg"],
             "blip_caption": "a photo of a torn sneaker", "query": "torn sneaker"},
        ],
        "session_3_date_time": "9:00 am on 2 July, 2023",
        "session_3": [
            {"speaker": "Ann", "dia_id": "D3:1", "text": "The lab results came back fine."},
            {"speaker": "Bo", "dia_id": "D3:2", "text": "Good news."},
        ],
    },
    "qa": [
        {"question": "What instrument does the sister teach?", "answer": "violin", "evidence": ["D1:2", "D3:2"],
         "category": 4},
        {"question": "What did Pixel chew?", "answer": "a sneaker", "evidence": ["D2:1; D1:1", "D9:9"],
         "category": 1},
        {"question": "When did Ann adopt a greyhound?", "answer": "May 2023", "evidence": ["D1:1"], "category": 2},
        {"question": "What colour is the sky?", "answer": "blue", "evidence": ["D"], "category": 3},
        {"question": "What is the capital of Mars?", "adversarial_answer": "Olympus", "evidence": ["D:3:1"],
         "category": 5},
    ],
    "observation": {"never": "ingested"},
    "session_summary": {"never": "ingested"},
}
KNOWN = frozenset({"D1:1", "D1:2", "D2:1", "D2:2", "D3:1", "D3:2", "D30:5", "D11:26", "D9:17", "D8:6", "D4:4"})


def write_data(tmp_path: Path, samples: list[dict[str, Any]]) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(samples), encoding="utf-8")
    return path


# --- reading the data


@pytest.mark.parametrize(("raw", "expected"), [
    (["D8:6; D9:17"], ("D8:6", "D9:17")),
    (["D9:17 D4:4 D8:6"], ("D9:17", "D4:4", "D8:6")),
    (["D:11:26"], ("D11:26",)),
    (["D30:05"], ("D30:5",)),
    (["D"], ()),
    (["D10:19"], ()),  # well formed, but names no turn of this conversation
    ([], ()),
    (["D1:1", "D1:1", "D1:2"], ("D1:1", "D1:2")),
])
def test_evidence_is_normalised_for_the_known_defects(raw: list[str], expected: tuple[str, ...]) -> None:
    assert locomo.normalise_evidence(raw, KNOWN) == expected


def test_a_sample_reads_turns_sessions_dates_and_questions() -> None:
    sample = locomo.sample(TINY)
    assert sample.sample_id == "tiny-1"
    assert [s.number for s in sample.sessions] == [1, 2, 3]
    assert sample.sessions[0].at == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert sample.sessions[1].at == datetime(2023, 6, 19, 10, 4, tzinfo=UTC)
    assert sample.turns == 6
    assert sample.sessions[1].turns[1] == Turn("D2:2", 2, "Bo", "Ha, that happens.", "a photo of a torn sneaker")
    assert sample.questions == (
        Question("What instrument does the sister teach?", 4, ("D1:2", "D3:2")),
        Question("What did Pixel chew?", 1, ("D2:1", "D1:1")),
        Question("When did Ann adopt a greyhound?", 2, ("D1:1",)),
        Question("What colour is the sky?", 3, ()),
        Question("What is the capital of Mars?", 5, ("D3:1",)),
    )


def test_a_turn_is_saved_as_name_and_text_with_its_photo() -> None:
    sample = locomo.sample(TINY)
    assert locomo.turn_text(sample.sessions[0].turns[0]) == "Ann: I adopted a greyhound called Pixel last week."
    assert locomo.turn_text(sample.sessions[1].turns[1]) == (
        "Bo: Ha, that happens. [shares a photo: a photo of a torn sneaker]"
    )


def test_unreadable_data_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(locomo.DataError):
        locomo.load(tmp_path / "missing.json")
    broken = dict(TINY, qa=[{"question": "no category"}])
    with pytest.raises(locomo.DataError):
        locomo.load(write_data(tmp_path, [broken]))


def test_select_keeps_the_named_samples_and_refuses_unknown_ones() -> None:
    samples = [locomo.sample(TINY), locomo.sample(dict(TINY, sample_id="tiny-2"))]
    assert [s.sample_id for s in locomo.select(samples, ["tiny-2"])] == ["tiny-2"]
    assert locomo.select(samples, None) == samples
    with pytest.raises(locomo.DataError, match="tiny-9"):
        locomo.select(samples, ["tiny-9"])


# --- pure scoring


def test_turn_recall_counts_each_evidence_turn_once() -> None:
    assert turn_recall(("D1:1", "D2:1"), ("D2:1", "D2:1", None, "D5:5")) == 0.5
    assert turn_recall(("D1:1",), ()) == 0.0
    assert turn_recall(("D1:1", "D1:2", "D2:1", "D3:1"), ("D1:1", "D1:2", "D2:1")) == 0.75
    with pytest.raises(ValueError):
        turn_recall((), ("D1:1",))


def test_session_recall_counts_sessions_any_hit_comes_from() -> None:
    # Evidence in sessions 1 and 3; hits from session 1 (another turn) and session 2.
    assert session_recall(("D1:1", "D3:2"), ("D1:7", "D2:1", None)) == 0.5
    assert session_recall(("D1:1", "D1:2"), ("D1:9",)) == 1.0
    assert session_recall(("D4:1",), (None,)) == 0.0


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 95) == 0.0
    assert percentile([4.0], 95) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([float(n) for n in range(1, 101)], 95) == pytest.approx(95.05)


def test_summary_averages_over_questions_and_reports_category_5_apart() -> None:
    summary = Summary(10, [
        Answer(1, ("D1:1", "D2:1"), ("D1:1",), 1.0, ("cross-session",)),
        Answer(4, ("D3:1",), ("D3:1", None), 2.0, ("cross-session", "long-term")),
        Answer(4, ("D3:2",), ("D3:1",), 3.0, ("cross-session",)),
        Answer(2, (), (), 4.0),  # no evidence: skipped
        Answer(5, ("D4:1",), ("D4:1",), 5.0, ("graph",)),
    ], ingest_s=1.5, extract_s=0.5, turns=9, conversations=1)
    figures = summary.as_dict()
    assert figures["turn_recall"] == round((0.5 + 1 + 0) / 3, 4)
    assert figures["by_category"] == {"multi-hop": 0.5, "temporal": None, "open-domain": None, "single-hop": 0.5}
    assert figures["session_recall"] == round((0.5 + 1 + 1) / 3, 4)
    assert figures["adversarial"] == {"turn_recall": 1.0, "session_recall": 1.0, "questions": 1}
    assert (figures["questions"], figures["skipped"]) == (3, 1)
    assert figures["slots"] == {"cross-session": 1.0, "long-term": 0.333}
    assert (figures["p50_ms"], figures["p95_ms"]) == (3.0, 4.8)
    assert (figures["ingest_s"], figures["extract_s"], figures["turns"]) == (1.5, 0.5, 9)


# --- through the real store, extraction and retrieval


def test_each_hit_covers_its_own_turn_and_a_fact_its_latest_message(tmp_path: Path) -> None:
    sample = locomo.sample(TINY)

    async def go() -> tuple[runner.Memory, dict[str, str]]:
        store = SQLiteStore(str(tmp_path / "tiny.db"))
        await store.open()
        try:
            memory = await runner.ingest(store, Settings(), sample, Summary(12))
            names = {e.name: e.id for e in await store.entities(memory.scope)}
        finally:
            await store.close()
        return memory, names

    memory, entities = asyncio.run(go())
    assert sorted(memory.dia_ids.values()) == ["D1:1", "D1:2", "D2:1", "D2:2", "D3:1", "D3:2"]
    for message_id, dia_id in memory.dia_ids.items():
        assert memory.covers("cross-session", message_id) == dia_id
        assert memory.covers("conversation", message_id) == dia_id
        assert memory.covers("reasoning", message_id) is None
    # Pixel is named in D1:1 and D2:1: its entity covers only the later one.
    assert memory.covers("long-term", entities["Pixel"]) == "D2:1"
    assert memory.covers("long-term", "no-such-entity") is None


def test_the_tiny_conversation_scores_what_its_answers_say() -> None:
    summary = asyncio.run(runner.run([locomo.sample(TINY)], Settings(), 12))
    figures = summary.as_dict()
    # sister/violin: D1:2 found, D3:2 shares no word (0.5); Pixel: both turns (1.0);
    # greyhound: D1:1 (1.0); the sky: no turn named, skipped; Mars: nothing found.
    assert figures["turn_recall"] == 0.8333
    assert figures["by_category"] == {"multi-hop": 1.0, "temporal": 1.0, "open-domain": None, "single-hop": 0.5}
    assert figures["session_recall"] == 0.8333
    assert figures["adversarial"] == {"turn_recall": 0.0, "session_recall": 0.0, "questions": 1}
    assert (figures["questions"], figures["skipped"], figures["turns"], figures["conversations"]) == (3, 1, 6, 1)
    assert [a.covered for a in summary.answers][3:] == [(), ()]


def test_k_above_the_hard_cap_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_data(tmp_path, [TINY])
    assert main(["eval", "locomo", "--data", str(data), "--k", "13"]) == 2
    assert "k must be between 1 and 12" in capsys.readouterr().err
    assert main(["eval", "locomo", "--data", str(data), "--k", "0"]) == 2


def test_json_prints_one_object_last(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_data(tmp_path, [TINY])
    assert main(["eval", "locomo", "--data", str(data), "--k", "12", "--json"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    figures = json.loads(last)
    assert {"k", "turn_recall", "by_category", "session_recall", "questions", "p50_ms", "p95_ms"} <= set(figures)
    assert (figures["k"], figures["turn_recall"], figures["questions"]) == (12, 0.8333, 3)


def test_the_table_shows_every_category(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_data(tmp_path, [TINY])
    assert main(["eval", "locomo", "--data", str(data)]) == 0
    captured = capsys.readouterr()
    for label in ("turn recall@10", "multi-hop", "temporal", "open-domain", "single-hop", "session recall@10",
                  "adversarial", "p50 / p95", "ingest"):
        assert label in captured.out
    assert captured.err.splitlines()[-1] == "questions: 5/5 (100%)"  # progress, as plain lines: stderr is no terminal
