"""Fair queuing between flows (namespaces): a burst in one flow never starves another, and the
workqueue's own guarantees hold with flows as without (duplicates collapse, one worker per
item, fresh events before an initial sync's, order kept within a flow)."""

from __future__ import annotations

import asyncio
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from multicluster import Request, by_namespace
from multicluster.workqueue import FairLane, WorkQueue

Item = tuple[str, int]  # (flow, number)


def flow_of(item: Item) -> str:
    return item[0]


def test_a_lane_without_flows_is_first_in_first_out():
    lane: FairLane[int] = FairLane()
    for n in (3, 1, 2):
        lane.append(n)
    assert [lane.popleft() for _ in range(3)] == [3, 1, 2]
    assert not lane


def test_a_lane_serves_flows_in_turn():
    lane: FairLane[Item] = FairLane(flow_of)
    for n in range(1000):
        lane.append(("a", n))
    lane.append(("b", 0))
    lane.append(("b", 1))
    lane.append(("c", 0))
    out = [lane.popleft() for _ in range(7)]
    assert out == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("a", 2), ("a", 3)]
    assert len(lane) == 996
    assert lane.flows() == 1


async def test_a_burst_of_one_namespace_delays_another_by_one_turn():
    q: WorkQueue[Request] = WorkQueue("t", flow=by_namespace)
    for n in range(3000):
        q.add(Request("c", "team-a", f"a-{n}"))
    for n in range(5):
        q.add(Request("c", "team-b", f"b-{n}"))
    handed = [await q.get() for _ in range(10)]
    assert [r.namespace for r in handed].count("team-b") == 5


async def test_initial_sync_items_are_fair_too_and_still_after_fresh_ones():
    q: WorkQueue[Item] = WorkQueue("t", flow=flow_of)
    for n in range(100):
        q.add(("a", n), low_priority=True)
    q.add(("b", 0), low_priority=True)
    q.add(("c", 0))
    assert [await q.get() for _ in range(3)] == [("c", 0), ("a", 0), ("b", 0)]


# -- the guarantees, as a property over any sequence of operations --------------------------------

ITEMS = st.tuples(st.sampled_from("abc"), st.integers(0, 5))
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(ITEMS, min_size=1, max_size=8), st.booleans()),
        st.tuples(st.just("get"), st.just([]), st.just(False)),
        st.tuples(st.just("done"), st.lists(ITEMS, min_size=1, max_size=1), st.just(False)),
    ),
    max_size=120,
)


class Model:
    """What the queue must do, said as checks on what it hands out."""

    def __init__(self) -> None:
        self.dirty: set[Item] = set()
        self.processing: set[Item] = set()
        self.lane: dict[Item, str] = {}  # waiting items: "fresh" or "low"
        self.seq: dict[Item, int] = {}  # when each waiting item joined its lane
        self.ahead: dict[Item, int] = {}  # fresh items of its flow waiting before it then
        self.since: dict[Item, Counter[str]] = {}  # items handed out of each flow since
        self.clock = 0
        self.last_handed: dict[tuple[str, str], int] = {}  # (flow, lane) → seq last handed

    def enqueue(self, item: Item, lane: str) -> None:
        self.clock += 1
        self.lane[item] = lane
        self.seq[item] = self.clock
        self.ahead[item] = sum(
            1 for i, where in self.lane.items() if where == "fresh" and i[0] == item[0]
        ) - (lane == "fresh")
        self.since[item] = Counter()

    def add(self, item: Item, low: bool) -> None:
        if item in self.dirty:
            return
        self.dirty.add(item)
        if item not in self.processing:
            self.enqueue(item, "low" if low else "fresh")

    def handed(self, item: Item) -> None:
        assert item not in self.processing, "handed to two workers at once"
        assert item in self.lane, "handed out without waiting"
        lane = self.lane.pop(item)
        if lane == "low":
            assert "fresh" not in self.lane.values(), "an initial sync's item before a fresh one"
        else:
            for other, count in self.since[item].items():
                if other != item[0]:
                    assert count <= self.ahead[item] + 1, f"flow {other} went {count} times"
        key = (item[0], lane)
        seq = self.seq.pop(item)
        assert seq > self.last_handed.get(key, 0), "order within a flow not kept"
        self.last_handed[key] = seq
        for waiting in self.since:
            if waiting != item:
                self.since[waiting][item[0]] += 1
        del self.since[item], self.ahead[item]
        self.dirty.discard(item)
        self.processing.add(item)

    def done(self, item: Item) -> None:
        self.processing.discard(item)
        if item in self.dirty:
            self.enqueue(item, "fresh")


@given(OPS)
def test_fair_queue_guarantees(ops):
    async def scenario() -> None:
        q: WorkQueue[Item] = WorkQueue("t", flow=flow_of)
        model = Model()
        for op, items, low in ops:
            if op == "add":
                for item in items:  # a burst
                    q.add(item, low_priority=low)
                    model.add(item, low)
            elif op == "get" and len(q):
                model.handed(await q.get())
            elif op == "done" and items[0] in model.processing:
                q.done(items[0])
                model.done(items[0])
            assert len(q) == len(model.lane), "duplicates collapse"
        while len(q):  # nothing starves: every waiting item comes out
            model.handed(await q.get())
        assert not model.lane

    asyncio.run(scenario())
