"""How much of servers' answers is held at once, and cached, when those servers are not trusted.

The client bounds one answer (a list page, one watch event), but not how many are read at once:
a target has five informers, and a tenant may make several Targets. So an answer past its first
MiB (:data:`SMALL`) is read, parsed and used only while its reader holds a slot: one per client,
and ``total`` across every client that shares these limits (the agent's targets share one). A
slot is held for as long as a request may take (its timeout), or, for a watch event, at most
``hold`` seconds: a server that trickles a large event cannot keep a slot from the others.

What informers keep is bounded too: a server can send valid objects without end. Informers of
such a server charge a :class:`CacheBudget` for each object they cache (its JSON length, at least
:data:`OBJECT_FLOOR`, about what a small object costs in memory) and fail with
:class:`CacheFull` rather than go over it; what they held is given back when they stop.

The clients of trusted servers (the agent's own cluster) share no limits and take no slot.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from .errors import ApiError

SMALL = 1 << 20
"""Bytes of an answer, or of a watch line, read without a slot."""
LARGE_READS = 2
"""Large answers read at once by all the clients sharing the limits."""
HOLD = 30.0
"""Seconds a watch event that needs a slot may take to arrive whole."""
OBJECT_FLOOR = 512
"""The least a cached object is charged, in bytes: a small one's dicts cost about that."""


class ReadLimits:
    """Slots for large answers, shared by the clients of servers that are not trusted."""

    def __init__(self, total: int = LARGE_READS, *, hold: float = HOLD) -> None:
        self.hold = hold
        self._slots = asyncio.Semaphore(total)

    def slot(self, own: asyncio.Lock) -> Slot:
        """A slot for one answer of the client whose ``own`` lock is given, taken only when
        that answer grows past :data:`SMALL`."""
        return Slot(self._slots, own)


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


class CacheFull(ApiError):
    """More objects than a cache budget allows (not cached)."""


class CacheBudget:
    """Bytes that the informers of some clusters may cache together (JSON lengths)."""

    def __init__(self, limit: int, holder: str) -> None:
        self.limit = limit
        self.holder = holder  # who shares it, in words: "the Targets of namespace team-a"
        self.used = 0

    def charge(self, delta: int, context: str) -> None:
        """Count ``delta`` more bytes (fewer when negative); raise :class:`CacheFull` instead of
        going over the limit."""
        if delta > 0 and self.used + delta > self.limit:
            raise CacheFull(
                f"{context}: {self.holder} would cache over {self.limit >> 20} MiB of objects"
                " (not cached)"
            )
        self.used = max(0, self.used + delta)
