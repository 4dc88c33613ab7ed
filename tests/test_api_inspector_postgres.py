"""The inspector's API tests (test_api_inspector.py) again, the proxy's store on PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import RunningProxy
from tests.test_api_inspector import (  # noqa: F401  (collected here again, against PostgreSQL)
    api,
    test_a_corrected_entity_says_it_changed_since_the_turn,
    test_a_user_is_counted_and_an_unknown_one_is_not_found,
    test_each_logged_hit_reads_as_the_line_the_turn_was_sent_until_its_item_goes,
    test_one_memory_is_an_entity_or_a_message,
)


@pytest.fixture
def inspected(pg_url: str, make_proxy: Any) -> RunningProxy:
    return make_proxy(store__url=pg_url, memory__commit_timeout_ms=5000, extraction__from_roles=[])
