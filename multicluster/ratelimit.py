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

    def reserve(self) -> float:
        """Take a token (possibly one not yet earned); return the seconds until it is earned."""
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    async def acquire(self) -> None:
        delay = self.reserve()
        if delay > 0:
            await asyncio.sleep(delay)
