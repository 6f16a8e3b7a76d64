"""RepeatBackoff: the first time is free, each further one waits twice as long up to a cap, and
each quiet cap takes one off the count: whoever repeats something gets at most one action per
cap in the long run, however they pace themselves."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicluster.ratelimit import PRUNE_AT, RepeatBackoff


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_first_time_is_free_then_one_two_four_seconds_up_to_the_cap():
    clock = Clock()
    backoff: RepeatBackoff[str] = RepeatBackoff(1.0, 300.0, clock)
    waits = []
    for _ in range(12):
        wait = backoff.happened("a")
        waits.append(wait)
        clock.now += wait  # acted on as soon as allowed, and it happens again at once
    assert waits == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert backoff.most == 11
    assert backoff.happened("b") == 0, "keys are apart"


def test_wait_says_how_long_is_left():
    clock = Clock()
    backoff: RepeatBackoff[str] = RepeatBackoff(1.0, 300.0, clock)
    assert backoff.wait("a") == 0
    backoff.happened("a")
    assert backoff.wait("a") == 0
    backoff.happened("a")
    backoff.happened("a")
    assert backoff.wait("a") == 2
    clock.now += 1.5
    assert backoff.wait("a") == pytest.approx(0.5)
    clock.now += 1
    assert backoff.wait("a") == 0


def test_each_quiet_cap_after_the_wait_takes_one_off_the_count():
    clock = Clock()
    backoff: RepeatBackoff[str] = RepeatBackoff(1.0, 10.0, clock)
    for _ in range(4):
        clock.now += backoff.happened("a")  # 0, 1, 2, 4
    clock.now += 9.9
    assert backoff.happened("a") == pytest.approx(8), "not quiet long enough: fifth in a row"
    clock.now += 8 + 10  # its wait, then a quiet cap: one off, and one on
    assert backoff.happened("a") == pytest.approx(8)
    clock.now += 8 + 30  # three quiet caps: the count is 2, the third in a row waits 2 s
    assert backoff.happened("a") == pytest.approx(2)


def test_a_user_deleting_once_in_a_while_always_gets_it_at_once():
    clock = Clock()
    backoff: RepeatBackoff[str] = RepeatBackoff(1.0, 300.0, clock)
    for _ in range(5):
        assert backoff.happened("a") == 0
        clock.now += 300
    assert backoff.happened("a") == 0
    clock.now += 10
    assert backoff.happened("a") == 1, "twice within five minutes: a second's wait"


def test_discard_if():
    backoff: RepeatBackoff[tuple[str, str]] = RepeatBackoff(clock=Clock())
    for key in (("n1", "a"), ("n1", "b"), ("n2", "a")):
        backoff.happened(key)
        backoff.happened(key)
    backoff.discard_if(lambda key: key[0] == "n1")
    assert len(backoff) == 1
    assert backoff.wait(("n1", "a")) == 0
    assert backoff.wait(("n2", "a")) == 1


def test_quiet_keys_are_pruned_as_keys_pile_up():
    clock = Clock()
    backoff: RepeatBackoff[int] = RepeatBackoff(1.0, 10.0, clock)
    for i in range(PRUNE_AT - 1):
        backoff.happened(i)
    clock.now += 11
    backoff.happened(-1)
    assert len(backoff) == 1


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="base"):
        RepeatBackoff(0, 1)
    with pytest.raises(ValueError, match="cap"):
        RepeatBackoff(2, 1)


@given(st.lists(st.floats(min_value=0, max_value=1000), min_size=1, max_size=200))
def test_however_it_is_paced_the_actions_are_bounded(gaps: list[float]):
    """Something happens after each gap, and is acted on as soon as allowed; actions taken within
    ``t`` seconds are at most 11 + t / cap (at 0, 1, 3, 7... 1023 s at best, then one per cap;
    pausing only buys one more per quiet cap)."""
    clock = Clock()
    cap = 300.0
    backoff: RepeatBackoff[str] = RepeatBackoff(1.0, cap, clock)
    start = clock.now
    actions = 0
    for gap in gaps:
        clock.now += gap
        clock.now += backoff.happened("a")
        actions += 1
    assert backoff.most == 11
    assert actions <= backoff.most + (clock.now - start) / cap
