"""Workqueue guarantees: dedup, one worker per item, backoff, delays, priority, shutdown."""

from __future__ import annotations

import asyncio
import time

import pytest

from multicluster.workqueue import MAX_BUCKET_WAIT, ShutDown, WorkQueue


async def test_duplicates_collapse_while_waiting():
    q: WorkQueue[str] = WorkQueue("t")
    for _ in range(5):
        q.add("a")
    q.add("b")
    assert len(q) == 2
    assert [await q.get(), await q.get()] == ["a", "b"]


async def test_an_item_readded_while_processing_waits_for_done():
    q: WorkQueue[str] = WorkQueue("t")
    q.add("a")
    item = await q.get()
    q.add("a")
    assert len(q) == 0, "not handed out again while a worker holds it"
    q.done(item)
    assert len(q) == 1
    assert await q.get() == "a"


async def test_never_two_workers_on_one_item():
    q: WorkQueue[int] = WorkQueue("t")
    active: set[int] = set()
    overlaps = 0
    handled = 0

    async def worker():
        nonlocal overlaps, handled
        while True:
            try:
                item = await q.get()
            except ShutDown:
                return
            if item in active:
                overlaps += 1
            active.add(item)
            await asyncio.sleep(0.001)
            active.discard(item)
            handled += 1
            q.done(item)

    workers = [asyncio.create_task(worker()) for _ in range(8)]
    for round_ in range(50):
        for item in range(4):
            q.add(item)
        await asyncio.sleep(0.0005 * (round_ % 3))
    await asyncio.sleep(0.05)
    q.shut_down()
    await asyncio.gather(*workers)
    assert overlaps == 0
    assert 4 <= handled < 200


async def test_rate_limited_retries_back_off_exponentially_and_forget_resets():
    q: WorkQueue[str] = WorkQueue("t", base_delay=0.01)
    delays = []
    for _ in range(4):
        started = time.monotonic()
        q.add_rate_limited("a")
        item = await q.get()
        delays.append(time.monotonic() - started)
        q.done(item)
    assert q.failures("a") == 4
    for expected, measured in zip([0.01, 0.02, 0.04, 0.08], delays, strict=True):
        assert expected * 0.8 <= measured < expected + 0.05
    q.forget("a")
    assert q.failures("a") == 0


async def test_overall_token_bucket_limits_retries_of_many_items():
    q: WorkQueue[int] = WorkQueue("t", base_delay=0.0001, qps=100, burst=5)
    started = time.monotonic()
    for item in range(15):
        q.add_rate_limited(item)
    for _ in range(15):
        q.done(await q.get())
    assert time.monotonic() - started >= 0.09, "10 items past the burst at 100/s"


async def test_an_item_that_fails_thousands_of_times_waits_the_longest_delay():
    """2**1024 does not fit a float: an item failing on every event of a busy object (a
    hostile target's) made the queue raise, and the agent exit."""
    q: WorkQueue[str] = WorkQueue("t")
    for _ in range(2000):
        q.add_rate_limited("a")
    assert q.failures("a") == 2000
    q.shut_down()


def test_many_failing_items_never_hold_another_items_retry_past_ten_seconds(monkeypatch):
    """Each retry books a token of the overall bucket: 5,000 items failing at once (a target
    refusing every request) booked 500 s of retries ahead of everyone."""
    waits: list[float] = []
    q: WorkQueue[int] = WorkQueue("t")
    monkeypatch.setattr(q, "add_after", lambda _item, delay: waits.append(delay))
    for item in range(5000):
        q.add_rate_limited(item)
    q.add_rate_limited(-1)  # another tenant's first retry
    assert waits[-1] <= MAX_BUCKET_WAIT
    assert max(waits) <= MAX_BUCKET_WAIT
    assert sorted(waits)[150] > 1, "the bucket still spreads the retries out"


async def test_add_after_keeps_the_earliest():
    q: WorkQueue[str] = WorkQueue("t")
    q.add_after("a", 1.0)
    q.add_after("a", 0.02)
    q.add_after("a", 1.5)
    started = time.monotonic()
    assert await q.get() == "a"
    # (bounds far apart: a busy machine's loop runs timers late, never early)
    assert time.monotonic() - started < 0.9, "the earliest was kept"
    q.done("a")
    await asyncio.sleep(1.6)
    assert len(q) == 0, "later adds were absorbed"


async def test_fresh_events_go_before_initial_sync_items():
    q: WorkQueue[str] = WorkQueue("t")
    for name in ("old1", "old2"):
        q.add(name, low_priority=True)
    q.add("fresh")
    assert [await q.get() for _ in range(3)] == ["fresh", "old1", "old2"]


async def test_shut_down_wakes_getters_and_refuses_adds():
    q: WorkQueue[str] = WorkQueue("t")
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.shut_down()
    with pytest.raises(ShutDown):
        await getter
    q.add("late")
    assert len(q) == 0
