"""A token bucket: at most ``qps`` operations a second on average, bursts up to ``burst``.

Used for client-side request limits (as client-go's QPS and burst) and for the workqueue's
overall retry rate. ``reserve`` never blocks: it books a token and says how long to wait for it,
so many callers can queue up without a lock.
"""

from __future__ import annotations

import asyncio
import time


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
