"""The event correlator: what is written again, what is counted, what is held back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from multicluster.events import Correlator, Written, object_key

POD = ("ns", "Pod", "web", "uid-1")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_object_gets_its_burst_then_one_write_per_refill():
    clock = Clock()
    correlator = Correlator(burst=3, refill_every=60.0, clock=clock)
    assert [correlator.allow(POD) for _ in range(4)] == [True, True, True, False]
    clock.now = 59.0
    assert not correlator.allow(POD)
    clock.now = 61.0
    assert correlator.allow(POD)
    assert not correlator.allow(POD)


def test_objects_are_limited_apart():
    correlator = Correlator(burst=1, clock=Clock())
    assert correlator.allow(POD)
    assert not correlator.allow(POD)
    assert correlator.allow(("ns", "Pod", "other", "uid-2"))


def test_a_written_event_is_found_again_and_the_least_recent_forgotten_first():
    correlator = Correlator(max_entries=2)
    first, second, third = ((POD, "Warning", "R", m) for m in ("a", "b", "c"))
    correlator.remember(first, Written("web.1", 1))
    correlator.remember(second, Written("web.2", 1))
    assert correlator.written(first) == Written("web.1", 1)  # now the most recent
    correlator.remember(third, Written("web.3", 1))
    assert correlator.written(second) is None
    assert correlator.written(first) is not None
    correlator.forget(first)
    assert correlator.written(first) is None


@given(st.lists(st.floats(min_value=0, max_value=10_000), max_size=200))
def test_writes_never_exceed_the_burst_plus_what_time_refilled(gaps):
    clock = Clock()
    correlator = Correlator(burst=5, refill_every=300.0, clock=clock)
    allowed = 0
    for gap in gaps:
        clock.now += gap
        allowed += correlator.allow(POD)
    assert allowed <= 5 + clock.now / 300.0


def test_cluster_scoped_objects_are_keyed_in_the_default_namespace():
    node = {"kind": "Node", "metadata": {"name": "n1", "uid": "u"}}
    assert object_key(node, "default") == ("default", "Node", "n1", "u")
