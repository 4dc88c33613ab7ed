"""The memory path through the proxy (test_memory_path.py) again, on PostgreSQL.

The same test functions, with `make_proxy` serving from a fresh PostgreSQL schema unless
a test names another store: blocks, tool-loop block reuse and caps behave the same on
both backends, as does the reasoning trace of a tools-mode loop (teaching and asking across
replicas is in test_replicas.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import RunningProxy
from tests.test_memory_path import (  # noqa: F401  (collected here again, against PostgreSQL)
    mem,
    test_block_as_a_new_text_part,
    test_block_goes_in_front_of_the_last_user_message,
    test_context_length_error_is_retried_without_the_block,
    test_new_user_gets_no_block,
    test_tool_loop_steps_carry_identical_block_bytes,
    test_x_memory_max_caps_and_zero_disables,
)
from tests.test_tools_mode_chat import (  # noqa: F401  (tools mode's kept steps, on PostgreSQL)
    test_the_trace_holds_every_step_s_memory_calls_once_in_order,
    tproxy,
)


@pytest.fixture
def make_proxy(pg_url: str, make_proxy: Callable[..., RunningProxy]) -> Callable[..., RunningProxy]:
    """conftest's make_proxy, its default store a PostgreSQL schema."""
    def start(**overrides: Any) -> RunningProxy:
        overrides.setdefault("store__url", pg_url)
        return make_proxy(**overrides)

    return start


@pytest.mark.parametrize("call_id", ["call_\u0000x", "call_\ud800x"])
def test_a_tool_call_id_postgresql_cannot_hold_never_fails_recall(make_proxy, fake, pg_url, call_id):
    # The lookup sent it as it came: PostgreSQL refused the read, and five such requests of one
    # user opened the circuit breaker for every user of the replica.
    proxy = make_proxy(store__url=pg_url)
    step = {"model": "m", "messages": [
        {"role": "user", "content": "what is the weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "sunny"}]}
    with proxy.http() as http:
        statuses = [http.post("/v1/chat/completions", content=json.dumps(step).encode(),
                              headers={"x-memory-user": "mallory", "content-type": "application/json"}
                              ).headers["x-memory-status"] for _ in range(6)]
        alice = http.post("/v1/chat/completions", headers={"x-memory-user": "alice"},
                          json={"model": "m", "messages": [{"role": "user", "content": "hi there"}]})
    assert statuses == ["ok"] * 6
    assert alice.headers["x-memory-status"] == "ok"
