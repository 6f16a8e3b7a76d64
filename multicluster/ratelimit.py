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
from collections import OrderedDict, deque
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
    is O(1) (amortized).

    With ``shared_seats``: while callers of two flows or more came within ``linger`` seconds,
    only that many seats are used. Many requests under way make a busy server slow to answer
    each, whoever sent it, so one flow's burst would make another's few requests wait as long
    in the server as the burst's; one flow alone keeps all ``seats``, for its throughput. A
    flow that is empty (``""`` or None: cluster-scoped requests, say) counts as no one. A flow
    that comes with nothing under way takes its first seat at once, while any of ``seats`` is
    free: it does not wait for another flow's many to drain down to ``shared_seats``."""

    def __init__(
        self,
        qps: float,
        burst: int,
        seats: int | None = None,
        *,
        shared_seats: int | None = None,
        linger: float = 2.0,
    ) -> None:
        if qps <= 0 or burst < 1 or (seats is not None and seats < 1):
            raise ValueError("qps must be > 0, burst and seats >= 1")
        if shared_seats is not None and (seats is None or shared_seats < 1):
            raise ValueError("shared_seats needs seats, and must be >= 1")
        self.qps = qps
        self.burst = burst
        self.seats = seats
        self.shared_seats = None if shared_seats is None else min(shared_seats, seats or 0)
        self.linger = linger
        self.in_flight = 0
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._flows: dict[Hashable, deque[asyncio.Future[None]]] = {}
        self._turns: deque[Hashable] = deque()  # flows with callers waiting, next first
        self._timer: asyncio.TimerHandle | None = None
        self._seen: OrderedDict[Hashable, float] = OrderedDict()  # flow → its latest caller
        self._held: dict[Hashable, int] = {}  # flow → its callers under way (shared seats only)

    def limit(self) -> int | None:
        """The seats in use now: ``shared_seats`` while several flows are about."""
        if self.shared_seats is None:
            return self.seats
        seen, since = self._seen, time.monotonic() - self.linger
        while seen:
            flow, last = next(iter(seen.items()))
            if last >= since:
                break
            del seen[flow]
        return self.shared_seats if len(seen) > 1 else self.seats

    def _saw(self, flow: Hashable) -> None:
        if flow and self.shared_seats is not None:
            self._seen[flow] = time.monotonic()
            self._seen.move_to_end(flow)

    def waiting(self) -> int:
        return sum(len(w) for w in self._flows.values())

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
        self._last = now

    def _seat_free(self, flow: Hashable = None) -> bool:
        """Whether a caller of ``flow`` may take a seat now."""
        limit = self.limit()
        if limit is None or self.in_flight < limit:
            return True
        return self._newcomer(flow)

    def _newcomer(self, flow: Hashable) -> bool:
        """A flow of someone with nothing under way, while one of all ``seats`` is free."""
        return (
            self.shared_seats is not None
            and bool(flow)
            and flow not in self._held
            and self.in_flight < (self.seats or 0)
        )

    def _take(self, flow: Hashable) -> None:
        self._tokens -= 1
        self.in_flight += 1
        if self.shared_seats is not None:
            self._held[flow] = self._held.get(flow, 0) + 1

    def _next(self) -> tuple[bool, Hashable]:
        """The flow whose caller goes next, if any may now: the next in turn while seats are
        free, else the first waiting flow that is a newcomer."""
        if not self._turns:
            return False, None
        limit = self.limit()
        if limit is None or self.in_flight < limit:
            return True, self._turns[0]
        if self.shared_seats is not None and self.in_flight < (self.seats or 0):
            for flow in self._turns:
                if self._newcomer(flow):
                    return True, flow
        return False, None

    async def acquire(self, flow: Hashable = None) -> None:
        """A token, and a seat when there are seats (give it back with :meth:`release`)."""
        self._saw(flow)
        if (not self._flows or self._newcomer(flow)) and self._seat_free(flow):
            self._refill()
            if self._tokens >= 1:
                self._take(flow)
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
                self.release(flow)
            raise

    def release(self, flow: Hashable = None) -> None:
        """A seat taken by :meth:`acquire` for ``flow`` is free again."""
        self.in_flight -= 1
        held = self._held.get(flow)
        if held is not None:
            if held > 1:
                self._held[flow] = held - 1
            else:
                del self._held[flow]
        if self._flows and self._timer is None:
            self._let_through()

    @contextlib.asynccontextmanager
    async def hold(self, flow: Hashable = None) -> AsyncIterator[None]:
        """A token and a seat for as long as the block runs."""
        await self.acquire(flow)
        try:
            yield
        finally:
            self.release(flow)

    def _schedule(self) -> None:
        if self._timer is None and self._flows and self._next()[0]:
            delay = max(0.0, (1 - self._tokens) / self.qps)
            self._timer = asyncio.get_running_loop().call_later(delay, self._timed)

    def _timed(self) -> None:
        self._timer = None
        self._let_through()

    def _let_through(self) -> None:
        self._refill()
        while self._tokens >= 1:
            found, flow = self._next()
            if not found:
                break
            if self._turns[0] == flow:
                self._turns.popleft()
            else:  # a newcomer, out of turn
                self._turns.remove(flow)
            waiters = self._flows[flow]
            waiter = waiters.popleft()
            if waiters:
                self._turns.append(flow)
            else:
                del self._flows[flow]
            if waiter.done():  # cancelled while it waited: takes nothing
                continue
            waiter.set_result(None)
            self._take(flow)
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
