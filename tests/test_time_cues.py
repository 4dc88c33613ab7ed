"""Which questions carry a time cue, and which messages answer one."""

from __future__ import annotations

from datetime import UTC, datetime

from proxy.memory.retrieval.sources.time_cues import asks_when, dated, periods, within


def test_questions_that_ask_for_a_time() -> None:
    assert asks_when("When did Alice move to Porto?")
    assert asks_when("How long has Bob been running?")
    assert asks_when("What year did we buy the car?")
    assert not asks_when("Where did Alice move?")
    assert not asks_when("Whenever I cook, what do I use?")


def test_named_periods() -> None:
    assert periods("Did James have a girlfriend during April 2022?") == [(2022, 4)]
    assert periods("How many times did I go to the beach in 2023?") == [(2023, None)]
    assert periods("first half of september 2022 or 2023") == [(2022, 9), (2023, None)]
    assert periods("What is the code 12023 for? Room 2022b?") == []
    assert periods("What did I do in April?") == []


def test_messages_that_date_what_they_say() -> None:
    assert dated("We went hiking last week.")
    assert dated("I start the new job on Monday!")
    assert dated("It was back in March 2021.")
    assert not dated("We went hiking with the dogs.")
    assert not dated("The weekly standup moved.")


def test_a_date_within_a_named_period() -> None:
    at = datetime(2022, 4, 30, 23, 0, tzinfo=UTC)
    assert within(at, [(2022, 4)]) and within(at, [(2022, None)]) and within(at, [(2021, None), (2022, 4)])
    assert not within(at, [(2022, 5)]) and not within(at, [(2023, None)]) and not within(at, [])
