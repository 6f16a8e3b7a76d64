"""The create throttle: slots by owner of targets and by namespace, waiting pods let go
namespace by namespace (round robin), first come first served within a namespace."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicluster_scheduler.scheduler.throttle import CreateSlots

OWNER = "clustertarget/c2"


def test_a_namespace_holds_at_most_its_share_of_an_owners_slots():
    slots: CreateSlots[str] = CreateSlots(per_owner=10, per_namespace=8)
    assert [slots.take(OWNER, "a") for _ in range(9)] == [True] * 8 + [False]
    assert slots.take(OWNER, "b")
    assert slots.take(OWNER, "b")
    assert not slots.take(OWNER, "c"), "the owner's slots are all taken"
    assert slots.creating(OWNER) == 10
    assert slots.creating(OWNER, "a") == 8
    slots.give_back(OWNER, "a")
    assert slots.take(OWNER, "c")


def test_waiting_pods_are_let_go_namespace_by_namespace():
    slots: CreateSlots[str] = CreateSlots(per_owner=4, per_namespace=4)
    for _ in range(4):
        assert slots.take(OWNER, "a")
    for n in range(100):
        slots.wait(OWNER, "a", f"a{n}")
    slots.wait(OWNER, "b", "b0")
    slots.wait(OWNER, "b", "b1")
    assert slots.wake(OWNER) == []  # nothing free
    for _ in range(3):
        slots.give_back(OWNER, "a")
    assert slots.wake(OWNER) == ["a0", "b0", "a1"]
    assert slots.waiting(OWNER)


def test_a_pod_waiting_twice_is_let_go_once():
    slots: CreateSlots[str] = CreateSlots(per_owner=1, per_namespace=1)
    assert slots.take(OWNER, "a")
    slots.wait(OWNER, "a", "p")
    slots.wait(OWNER, "a", "p")
    slots.give_back(OWNER, "a")
    assert slots.wake(OWNER) == ["p"]
    assert not slots.waiting(OWNER)
    assert slots.wake(OWNER) == []


def test_a_namespace_at_its_share_is_skipped_not_waited_for():
    slots: CreateSlots[str] = CreateSlots(per_owner=4, per_namespace=2)
    assert slots.take(OWNER, "a")
    assert slots.take(OWNER, "a")
    slots.wait(OWNER, "a", "a0")
    slots.wait(OWNER, "b", "b0")
    slots.wait(OWNER, "b", "b1")
    slots.wait(OWNER, "b", "b2")
    assert slots.wake(OWNER) == ["b0", "b1"], "a holds its share; b takes the two left"
    assert slots.waiting(OWNER)


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        CreateSlots(per_owner=0, per_namespace=1)


@given(
    st.lists(
        st.tuples(st.sampled_from(["take", "wait", "give", "wake"]), st.sampled_from("abc")),
        max_size=150,
    ),
    st.integers(1, 6),
    st.integers(1, 6),
)
def test_limits_hold_and_nothing_waiting_is_lost(ops, per_owner, per_namespace):
    slots: CreateSlots[tuple[str, int]] = CreateSlots(per_owner, per_namespace)
    held: dict[str, int] = {}
    waiting: dict[str, list[tuple[str, int]]] = {}
    for n, (op, namespace) in enumerate(ops):
        if op == "take":
            if slots.take(OWNER, namespace):
                held[namespace] = held.get(namespace, 0) + 1
        elif op == "wait":
            slots.wait(OWNER, namespace, (namespace, n))
            waiting.setdefault(namespace, []).append((namespace, n))
        elif op == "give" and held.get(namespace):
            slots.give_back(OWNER, namespace)
            held[namespace] -= 1
        elif op == "wake":
            woken = slots.wake(OWNER)
            assert len(woken) <= per_owner - sum(held.values())
            for pod in woken:
                assert waiting[pod[0]].pop(0) == pod, "first come, first served in a namespace"
            # The woken take their slots, as the scheduler's workers would: each finds one.
            for pod in woken:
                assert slots.take(OWNER, pod[0])
                held[pod[0]] = held.get(pod[0], 0) + 1
        assert sum(held.values()) <= per_owner
        assert all(count <= min(per_owner, per_namespace) for count in held.values())
        assert slots.waiting(OWNER) == any(waiting.values())
