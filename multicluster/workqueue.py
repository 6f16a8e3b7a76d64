"""A rate-limited work queue with client-go's guarantees, for asyncio.

- An item waiting twice is queued once (duplicates collapse).
- An item is never handed to two workers at once: re-added while being processed, it is queued
  again only when the worker calls :meth:`WorkQueue.done`.
- Failures back off per item (5 ms doubling up to 1000 s) and, overall, through a token bucket
  (10 per second, bursts of 100), whichever is later; the bucket never holds a retry more than
  10 s (client-go's books without bound: a few thousand failing items delay everyone's
  retries by minutes).
- Items of an initial sync may be added with ``low_priority``: fresh events go first.
- Given ``flow`` (a function of an item, a Request's namespace say), waiting items are handed
  out fairly between flows: round robin, one item of each flow that waits in turn, first in,
  first out within a flow (API Priority and Fairness's fair queuing, with every item costing
  the same). A burst of thousands of items in one flow delays another flow's next item by one
  turn, not by the burst. Every operation stays O(1).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from . import metrics
from .ratelimit import TokenBucket

T = TypeVar("T", bound=Hashable)
MAX_DOUBLINGS = 60
# The overall bucket books tokens ahead: thousands of items failing at once (a hostile target
# refusing every request) would otherwise book minutes of retries, and every other item's first
# retry would wait behind them. Past this wait, a retry books nothing and waits this long.
MAX_BUCKET_WAIT = 10.0


class ShutDown(Exception):
    """The queue was shut down and is empty."""


class FairLane(Generic[T]):
    """Items waiting in flows, served round robin: each flow that has items gives one in its
    turn, and goes to the back of the line if it has more. Without ``flow``, one flow: FIFO."""

    def __init__(self, flow: Callable[[T], Hashable] | None = None) -> None:
        self._flow = flow
        self._flows: dict[Hashable, deque[T]] = {}
        self._turns: deque[Hashable] = deque()  # flows that have items, next first
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def flows(self) -> int:
        """How many flows have items waiting."""
        return len(self._flows)

    def append(self, item: T) -> None:
        key = self._flow(item) if self._flow is not None else None
        items = self._flows.get(key)
        if items is None:
            items = self._flows[key] = deque()
            self._turns.append(key)
        items.append(item)
        self._len += 1

    def popleft(self) -> T:
        """The first item of the flow whose turn it is (IndexError when empty)."""
        key = self._turns.popleft()
        items = self._flows[key]
        item = items.popleft()
        if items:
            self._turns.append(key)
        else:
            del self._flows[key]
        self._len -= 1
        return item


class WorkQueue(Generic[T]):
    def __init__(
        self,
        name: str = "queue",
        *,
        base_delay: float = 0.005,
        max_delay: float = 1000.0,
        qps: float = 10.0,
        burst: int = 100,
        flow: Callable[[T], Hashable] | None = None,
    ) -> None:
        self.name = name
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._bucket = TokenBucket(qps, burst)
        self._queue: FairLane[T] = FairLane(flow)
        self._low: FairLane[T] = FairLane(flow)
        self._dirty: set[T] = set()
        self._processing: set[T] = set()
        self._failures: dict[T, int] = {}
        self._waiting: dict[T, asyncio.TimerHandle] = {}
        self._ready = asyncio.Event()
        self._shutting_down = False
        self._depth = metrics.QUEUE_DEPTH.labels(name)
        self._adds = metrics.QUEUE_ADDS.labels(name)
        self._retries = metrics.QUEUE_RETRIES.labels(name)

    def __len__(self) -> int:
        return len(self._queue) + len(self._low)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def add(self, item: T, *, low_priority: bool = False) -> None:
        if self._shutting_down:
            return
        self._adds.inc()
        if item in self._dirty:
            return
        self._dirty.add(item)
        if item in self._processing:
            return  # queued again by done()
        (self._low if low_priority else self._queue).append(item)
        self._depth.set(len(self))
        self._ready.set()

    def add_after(self, item: T, delay: float) -> None:
        """Add ``item`` after ``delay`` seconds; an earlier pending add wins."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(item)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        pending = self._waiting.get(item)
        if pending is not None:
            if pending.when() <= when:
                return
            pending.cancel()
        self._waiting[item] = loop.call_at(when, self._fire, item)

    def _fire(self, item: T) -> None:
        self._waiting.pop(item, None)
        self.add(item)

    def add_rate_limited(self, item: T) -> None:
        failures = self._failures.get(item, 0)
        self._failures[item] = failures + 1
        self._retries.inc()
        # 2**failures as a float overflows past 1023 failures: an item that fails on every
        # event of a busy object gets there in minutes.
        delay = min(self.max_delay, self.base_delay * 2 ** min(failures, MAX_DOUBLINGS))
        if delay >= MAX_BUCKET_WAIT:
            self.add_after(item, delay)  # later than the bucket would ask: books no token
        else:
            self.add_after(item, max(delay, self._bucket.reserve(MAX_BUCKET_WAIT)))

    def forget(self, item: T) -> None:
        """Reset the item's failure count (after a success)."""
        self._failures.pop(item, None)

    def failures(self, item: T) -> int:
        return self._failures.get(item, 0)

    async def get(self) -> T:
        """The next item; the caller must call :meth:`done` with it. Raises :class:`ShutDown`."""
        while not self._queue and not self._low:
            if self._shutting_down:
                raise ShutDown(self.name)
            self._ready.clear()
            await self._ready.wait()
        item = self._queue.popleft() if self._queue else self._low.popleft()
        self._processing.add(item)
        self._dirty.discard(item)
        self._depth.set(len(self))
        return item

    def done(self, item: T) -> None:
        self._processing.discard(item)
        if item in self._dirty:
            self._queue.append(item)
            self._depth.set(len(self))
            self._ready.set()

    def shut_down(self) -> None:
        """Stop accepting items; waiting getters raise :class:`ShutDown` once the queue drains."""
        self._shutting_down = True
        for handle in self._waiting.values():
            handle.cancel()
        self._waiting.clear()
        self._ready.set()
