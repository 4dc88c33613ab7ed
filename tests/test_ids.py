"""Stored ids: 32 hex digits in UUIDv7's layout, unique, and ordered by the time they were made."""

from __future__ import annotations

import time
import uuid

from proxy.ids import derived_id, new_id


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


def test_a_derived_id_is_the_same_for_the_same_material_and_time() -> None:
    at = 1_764_560_000_123_456_789
    value = derived_id("turn abc 1", at)
    assert value == derived_id("turn abc 1", at)
    parsed = uuid.UUID(value)
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert int(value[:12], 16) == at // 1_000_000
    assert len({derived_id(f"turn abc {n}", at) for n in range(1000)}) == 1000
    assert derived_id("turn abc 1", at + 1_000_000) > value  # a later time sorts after
