"""Rate limits.

A token bucket: at most ``qps`` operations a second on average, bursts up to ``burst``. Used for
client-side request limits (as client-go's QPS and burst) and for the workqueue's overall retry
rate. ``reserve`` never blocks: it books a token and says how long to wait for it, so many
callers can queue up without a lock.

A repeat backoff: the first time something happens to a key is acted on at once, each further
time later and later, until it stops happening for a while (:class:`RepeatBackoff`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Hashable
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
