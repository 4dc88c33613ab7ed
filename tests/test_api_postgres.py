"""The memory API's store-backed tests (test_api.py) again, on PostgreSQL.

The same test functions, exact JSON included, with the `proxy` fixture overridden to
serve from a fresh PostgreSQL schema: the API behaves the same on both backends. The
tests of the API itself (errors, tokens, the OpenAPI document) run once, in test_api.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import RunningProxy
from tests.test_api import (  # noqa: F401  (collected here again, against PostgreSQL)
    api,
    loaded,
    test_a_long_memory_in_any_script_is_stored_corrected_and_merged,
    test_an_interaction_becomes_a_message_of_the_latest_conversation,
    test_conversations_and_messages,
    test_correcting_an_entity_with_a_description_changes_the_description,
    test_delete_a_user,
    test_delete_one_item_of_each_kind,
    test_deleting_an_entity_takes_its_relationships,
    test_entities_and_one_entity_with_its_relationships,
    test_export_is_the_imported_records,
    test_import_into_another_user_keeps_users_apart,
    test_import_skips_ids_it_already_has,
    test_lists_are_paged_by_cursor,
    test_memories_are_the_entities_seen_as_memories,
    test_reasoning_traces,
    test_search_answers_what_the_proxy_injects,
    test_search_limit_and_sources,
    test_secrets_are_redacted_before_a_memory_is_saved,
    test_store_a_fact_list_it_and_correct_it,
    test_the_injection_log_of_a_turn,
    test_the_same_text_stored_twice_is_one_memory,
)


@pytest.fixture
def proxy(pg_url: str, make_proxy: Any) -> RunningProxy:
    """The proxy of test_api.py, its store on PostgreSQL.

    The answer waits for its commit: a fresh connection's first write batch plans the write
    statement, which on a loaded machine took longer than the default 100 ms, and the
    injection log was read before its row landed (a flaky test_the_injection_log_of_a_turn).
    """
    return make_proxy(store__url=pg_url, memory__commit_timeout_ms=5000)
