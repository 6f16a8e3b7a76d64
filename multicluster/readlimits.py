"""What a server that is not trusted may make a process read, hold and cache.

A kubeconfig in a Secret points wherever its writer likes, and a target cluster's API server is
whoever runs that cluster. A :class:`ReadLimits` given to a client (targets' clients share one)
bounds what such a server can cost; a client without one (the agent's own cluster) reads as
client-go does, without limits:

- one answer (a list page included) by ``max_response_bytes``: a page over it is asked again with
  a quarter of the page size, down to one object; one watch event by ``max_event_bytes``; all
  the pages of one list by ``max_list_bytes``. Parsing JSON can cost twenty times its length
  (``[]`` is 3 bytes, and 64 once loaded), so these are kept to a few MiB;
- an answer, or a watch line, past its first ``small`` bytes is read, parsed and used only while
  its reader holds a slot: one per client, and ``large_reads`` across every client that shares
  these limits. A slot is held for as long as a request may take (its timeout), or, for a watch
  event, at most ``hold`` seconds: a server that trickles a large event keeps no slot;
- watch events may come at ``event_rate`` bytes a second, after a burst of ``event_burst``: a
  server that sends the same object again and again, as fast as it can, costs a bounded CPU;
- what informers cache is charged to a :class:`CacheBudget` (by what the objects cost in
  memory, roughly, not their JSON length), page by page as lists arrive, so that a list stops
  as soon as it would go over, and is given back when they stop.

Anything over these limits is an answer no API server gives (:class:`BadResponse`, paused by
:mod:`.badanswers`) or, for the budget, :class:`CacheFull`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from .errors import ApiError

MIB = 1 << 20
MAX_RESPONSE_BYTES = 4 * MIB
"""One answer: an object is at most 1.5 MiB in etcd, a few MiB of JSON with its status."""
MAX_EVENT_BYTES = 4 * MIB
MAX_LIST_BYTES = 256 * MIB
SMALL = 256 << 10
LARGE_READS = 2
HOLD = 30.0
EVENT_RATE = 4 * MIB
EVENT_BURST = 16 * MIB
CONTAINER_COST = 64
"""What a dict, list or other value costs in memory besides its characters, roughly: an empty
list is 56 bytes and a pointer to it 8 more."""


class ReadLimits:
    """The bounds on what servers that are not trusted may make the clients sharing them read."""

    def __init__(
        self,
        *,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        max_event_bytes: int = MAX_EVENT_BYTES,
        max_list_bytes: int = MAX_LIST_BYTES,
        small: int = SMALL,
        large_reads: int = LARGE_READS,
        hold: float = HOLD,
        event_rate: int = EVENT_RATE,
        event_burst: int = EVENT_BURST,
    ) -> None:
        self.max_response_bytes = max_response_bytes
        self.max_event_bytes = max_event_bytes
        self.max_list_bytes = max_list_bytes
        self.small = small
        self.hold = hold
        self.event_rate = event_rate
        self.event_burst = event_burst
        self._slots = asyncio.Semaphore(large_reads)

    def slot(self, own: asyncio.Lock) -> Slot:
        """A slot for one answer of the client whose ``own`` lock is given, taken only when
        that answer grows past ``small`` bytes."""
        return Slot(self._slots, own)

    def events(self, clock: Callable[[], float] = time.monotonic) -> EventRate:
        """The allowance of watch-event bytes of one client."""
        return EventRate(self.event_rate, self.event_burst, clock)


class Slot:
    """One answer's claim on a large-read slot: taken on demand, released at the end."""

    def __init__(self, shared: asyncio.Semaphore, own: asyncio.Lock) -> None:
        self._shared = shared
        self._own = own
        self.held = False

    async def take(self) -> None:
        """Wait for the client's slot, then for a shared one (once: taking it again is a no-op)."""
        if self.held:
            return
        await self._own.acquire()
        try:
            await self._shared.acquire()
        except BaseException:
            self._own.release()
            raise
        self.held = True

    def release(self) -> None:
        if self.held:
            self._shared.release()
            self._own.release()
            self.held = False


@contextlib.asynccontextmanager
async def holding(limits: ReadLimits | None, own: asyncio.Lock) -> AsyncIterator[Slot | None]:
    """A slot for one answer of the client whose ``own`` lock is given (None when the server
    is trusted), released on leaving."""
    if limits is None:
        yield None
        return
    slot = limits.slot(own)
    try:
        yield slot
    finally:
        slot.release()


class EventRate:
    """Bytes of watch events a client may still read now: ``rate`` a second, up to ``burst``."""

    def __init__(self, rate: int, burst: int, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.level = float(burst)
        self.stamp = clock()

    def spend(self, size: int) -> bool:
        """Whether ``size`` more bytes may be read now (they are then counted)."""
        now = self.clock()
        self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        if size > self.level:
            return False
        self.level -= size
        return True


class CacheFull(ApiError):
    """More objects than a cache budget allows (not cached)."""


class CacheBudget:
    """What the informers of some clusters may cache together, in bytes of memory (roughly:
    :func:`cost`)."""

    def __init__(self, limit: int, holder: str) -> None:
        self.limit = limit
        self.holder = holder  # who shares it, in words: "the Targets of namespace team-a"
        self.used = 0

    def check(self, delta: int, context: str) -> None:
        """Raise :class:`CacheFull` if ``delta`` more bytes would go over the limit."""
        if delta > 0 and self.used + delta > self.limit:
            raise CacheFull(
                f"{context}: {self.holder} would cache over {self.limit >> 20} MiB of objects"
                " (not cached)"
            )

    def charge(self, delta: int, context: str) -> None:
        """Count ``delta`` more bytes (fewer when negative); raise :class:`CacheFull` instead of
        going over the limit."""
        self.check(delta, context)
        self.used = max(0, self.used + delta)


def cost(obj: Any) -> int:
    """What ``obj`` (parsed JSON) costs in memory, roughly: the characters of its strings, and
    :data:`CONTAINER_COST` for every value. Linear in its size."""
    total = 0
    stack = [obj]
    while stack:
        value = stack.pop()
        total += CONTAINER_COST
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                total += len(key)
                stack.append(item)
        elif isinstance(value, list):
            stack.extend(value)
    return total
