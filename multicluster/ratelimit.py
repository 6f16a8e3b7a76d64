"""Rate limits.

A token bucket: at most ``qps`` operations a second on average, bursts up to ``burst``. Used for
client-side request limits (as client-go's QPS and burst) and for the workqueue's overall retry
rate. ``reserve`` never blocks: it books a token and says how long to wait for it, so many
callers can queue up without a lock.

A fair limiter: a token bucket, and a bound on requests under way, whose waiters are let
through fairly between flows (the namespaces of requests, say), round robin, as API Priority
and Fairness queues requests: one namespace's thousands of requests delay another's next one
by a turn, not by the thousands (:class:`FairLimiter`).

A repeat backoff: the first time something happens to a key is acted on at once, each further
time later and later, until it stops happening for a while (:class:`RepeatBackoff`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
PRUNE_AT = 1024  # keys a RepeatBackoff holds before it first forgets the quiet ones


class TokenBucket:
    def __init__(self, qps: float, burst: int) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._last = time.monotonic()

    def reserve(self, at_most: float | None = None) -> float:
        """Take a token (possibly one not yet earned); return the seconds until it is earned.
        With ``at_most``: a token that would be earned later than that is not taken, and
        ``at_most`` is returned (the caller waits that long, unbooked)."""
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
        self._last = now
        if at_most is not None and (1 - self._tokens) / self.qps > at_most:
            return at_most
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    async def acquire(self) -> None:
        delay = self.reserve()
        if delay > 0:
            await asyncio.sleep(delay)


class FairLimiter:
    """At most ``qps`` operations a second on average, bursts up to ``burst``, as
    :class:`TokenBucket`, and, with ``seats``, at most that many under way at once (held with
    :meth:`hold`). When callers must wait, they are let through one flow after another (round
    robin), first come first served within a flow: API Priority and Fairness's fair queuing,
    on the client's side. A caller finds its way free at once when nobody waits; each operation
    is O(1)."""

    def __init__(self, qps: float, burst: int, seats: int | None = None) -> None:
        if qps <= 0 or burst < 1 or (seats is not None and seats < 1):
            raise ValueError("qps must be > 0, burst and seats >= 1")
        self.qps = qps
        self.burst = burst
        self.seats = seats
        self.in_flight = 0
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._flows: dict[Hashable, deque[asyncio.Future[None]]] = {}
        self._turns: deque[Hashable] = deque()  # flows with callers waiting, next first
        self._timer: asyncio.TimerHandle | None = None

    def waiting(self) -> int:
        return sum(len(w) for w in self._flows.values())

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
        self._last = now

    def _seat_free(self) -> bool:
        return self.seats is None or self.in_flight < self.seats

    async def acquire(self, flow: Hashable = None) -> None:
        """A token, and a seat when there are seats (give it back with :meth:`release`)."""
        if not self._flows and self._seat_free():
            self._refill()
            if self._tokens >= 1:
                self._tokens -= 1
                self.in_flight += 1
                return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._flows.get(flow)
        if waiters is None:
            waiters = self._flows[flow] = deque()
            self._turns.append(flow)
        waiters.append(waiter)
        self._schedule()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._tokens += 1  # let through, then cancelled: its token and seat go back
                self.release()
            raise

    def release(self) -> None:
        """A seat taken by :meth:`acquire` is free again."""
        self.in_flight -= 1
        if self._flows and self._timer is None:
            self._let_through()

    @contextlib.asynccontextmanager
    async def hold(self, flow: Hashable = None) -> AsyncIterator[None]:
        """A token and a seat for as long as the block runs."""
        await self.acquire(flow)
        try:
            yield
        finally:
            self.release()

    def _schedule(self) -> None:
        if self._timer is None and self._flows and self._seat_free():
            delay = max(0.0, (1 - self._tokens) / self.qps)
            self._timer = asyncio.get_running_loop().call_later(delay, self._timed)

    def _timed(self) -> None:
        self._timer = None
        self._let_through()

    def _let_through(self) -> None:
        self._refill()
        while self._tokens >= 1 and self._turns and self._seat_free():
            flow = self._turns.popleft()
            waiters = self._flows[flow]
            waiter = waiters.popleft()
            if waiters:
                self._turns.append(flow)
            else:
                del self._flows[flow]
            if waiter.done():  # cancelled while it waited: takes nothing
                continue
            waiter.set_result(None)
            self._tokens -= 1
            self.in_flight += 1
        self._schedule()


class RepeatBackoff(Generic[K]):
    """How long to wait before acting on something that keeps happening to one key (a copy that
    a target deletes again and again, say, and that we would make again each time).

    The first time costs no wait; each further time in a row waits ``base`` seconds, doubling up
    to ``cap``. Each ``cap`` seconds in which nothing happens to a key, after its last wait
    ended, take one off its count (a key whose count is back to nothing is forgotten). Whoever
    makes it happen, however they pace themselves, gets at most ``n + t / cap`` actions in any
    ``t`` seconds, where ``n`` is the count at which the wait reaches ``cap`` (11 for 1 s and
    300 s): one per ``cap`` in the long run. The workqueue's per-item backoff cannot say this:
    every reconcile that succeeds resets it, and acting again is one.
    """

    def __init__(
        self, base: float = 1.0, cap: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if base <= 0 or cap < base:
            raise ValueError("base must be > 0 and cap >= base")
        self.base = base
        self.cap = cap
        self.most = 2 + math.ceil(math.log2(cap / base))  # the count whose wait is cap
        self._clock = clock
        self._keys: dict[K, tuple[int, float]] = {}  # → (count, not before)
        self._prune_at = PRUNE_AT

    def happened(self, key: K) -> float:
        """It happened once more to ``key``: the seconds to wait before acting on it."""
        now = self._clock()
        count = self._count(key, now) + 1
        delay = 0.0 if count == 1 else min(self.cap, self.base * 2 ** (count - 2))
        not_before = max(self._keys.get(key, (0, 0.0))[1], now + delay)
        self._keys[key] = (min(count, self.most), not_before)
        if len(self._keys) >= self._prune_at:
            self._prune(now)
        return not_before - now

    def wait(self, key: K) -> float:
        """The seconds still to wait before acting on ``key`` (0: act now)."""
        found = self._keys.get(key)
        return 0.0 if found is None else max(0.0, found[1] - self._clock())

    def discard_if(self, predicate: Callable[[K], bool]) -> None:
        for key in [k for k in self._keys if predicate(k)]:
            del self._keys[key]

    def __len__(self) -> int:
        return len(self._keys)

    def _count(self, key: K, now: float) -> int:
        """How many times in a row it happened to ``key``, less one per quiet ``cap``."""
        count, not_before = self._keys.get(key, (0, 0.0))
        quiet = max(0.0, now - not_before)
        return max(0, count - int(quiet // self.cap))

    def _prune(self, now: float) -> None:
        """Forget the keys whose count is back to nothing (amortized: the dict doubles in
        between)."""
        self._keys = {k: v for k, v in self._keys.items() if self._count(k, now)}
        self._prune_at = max(PRUNE_AT, 2 * len(self._keys))
