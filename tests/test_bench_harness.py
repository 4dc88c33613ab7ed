"""The benchmarks' harness (bench/harness/): the servers a run starts are stopped together, and the
figures every script reads and prints come out the same way everywhere (bench/README.md)."""

from __future__ import annotations

import httpx
import pytest
import yaml

from bench.harness.figures import Paired, median_ratio, p50_p95, percentile
from bench.harness.report import Column, Criterion, all_passed, table
from bench.harness.targets import Targets


def test_targets_stops_every_server_it_started_even_when_the_run_fails(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="the run failed"):
        with Targets("harness-test-", parent=tmp_path) as targets:
            mock = targets.mock(events=3, delay_ms=1.0)
            memproxy = targets.memproxy(mock.url("/v1"), "warning", hooks=[
                {"event": "stop", "python": "proxy.hook_examples:no_opinion"}])
            assert httpx.get(mock.url("/_stats")).status_code == 200
            answer = httpx.post(memproxy.url("/v1/chat/completions"), json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}]})
            assert (answer.status_code, answer.json()["choices"][0]["message"]["content"]) == (
                200, "Hello from the mock upstream.")
            raise RuntimeError("the run failed")
    assert mock.process.poll() is not None and memproxy.process.poll() is not None
    assert yaml.safe_load((targets.workdir / "memproxy.yaml").read_text()) == {
        "server": {"log_level": "warning"},
        "store": {"url": f"sqlite:///{targets.workdir.resolve() / 'memproxy.db'}"},
        "upstream": {"anthropic_base_url": mock.url("/v1")},
        "hooks": [{"event": "stop", "python": "proxy.hook_examples:no_opinion"}],
    }
    assert {path.name for path in targets.workdir.glob("*.log")} == {"mock.log", "memproxy.log"}


def test_percentiles_are_by_rank_and_comparisons_are_per_round() -> None:
    values = [float(n) for n in range(1, 21)]  # 1 .. 20
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (10.0, 19.0, 20.0)
    assert percentile([], 50) == 0.0
    assert p50_p95([0.12345, 2.0, 3.0]) == {"p50": 2.0, "p95": 3.0}
    paired = Paired([1.0, 5.0, 2.0], [2.0, 1.0, 4.0])  # a - b per round: -1, +4, -2
    assert (paired.rounds, paired.median, paired.below_zero, paired.spread) == ([-1.0, 4.0, -2.0], -1.0, 2, (-2.0, 4.0))
    assert median_ratio([2.0, 9.0, 4.0], [1.0, 3.0, 0.0]) == 2.5  # 2 and 3; a round with b = 0 left out
    assert median_ratio([], []) is None


def test_tables_and_verdicts_print_alike_everywhere() -> None:
    columns = [Column("setup", 7), Column("requests/s", 11, ".0f"), Column("ok", 7, ".1%"),
               Column("total\np50 ms", 8, ".3f")]
    assert table(columns, [("sqlite", 96.4, 1.0, 1.5), ("pg1", 27.0, 0.5, None)]).splitlines() == [
        "  setup  requests/s      ok    total",
        "                              p50 ms",
        " sqlite          96  100.0%    1.500",
        "    pg1          27   50.0%        -",
    ]
    checks = [Criterion("a line", True, "1 ms"), Criterion("skipped", None, "not run"),
              Criterion("another issue's", False, "9 ms", informational=True)]
    assert [c.line() for c in checks] == ["PASS  a line: 1 ms", "SKIP  skipped: not run",
                                          "FAIL  another issue's (informational): 9 ms"]
    assert all_passed(checks) and not all_passed([*checks, Criterion("this one", False, "")])
