"""Stored ids: 32 hex digits in UUIDv7's layout, unique, and ordered by the time they were made."""

from __future__ import annotations

import time
import uuid

from proxy.ids import new_id


def test_an_id_is_a_uuid7_whose_first_48_bits_are_the_time_in_ms() -> None:
    before = time.time_ns() // 1_000_000
    value = new_id()
    after = time.time_ns() // 1_000_000
    assert len(value) == 32 and int(value, 16) >= 0
    parsed = uuid.UUID(value)
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert before <= int(value[:12], 16) <= after


def test_ids_are_unique_and_later_ones_sort_after_earlier_ones() -> None:
    first = [new_id() for _ in range(20_000)]
    assert len(set(first)) == len(first)
    time.sleep(0.002)
    later = new_id()
    assert all(value < later for value in first)
