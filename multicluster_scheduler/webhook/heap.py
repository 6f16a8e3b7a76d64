"""The webhook process gives its free heap back to the system after bursts of connections.

During a burst of pod creations the API server opens a connection to the webhook for every
admission it has in flight (HTTP/1.1, one request at a time each) and keeps at most 25 of them
afterwards. Each open connection costs the process about 100 KiB of C heap (OpenSSL's state,
asyncio's TLS read buffer, the HTTP parser; 60 KiB with the 16 KiB reads ``child`` asks for),
all freed when it closes. But glibc's malloc gives back only the top of its heap: the few
allocations still alive among the freed chunks pin the rest, so the process kept the
high-water mark of its busiest burst for good. Measured: 1,000 connections held at once took it
from 33 to 137 MiB; closed, 5 MiB of its heap was in use and 84 MiB free, and it stayed at 127 MiB
(malloc's arena and trim thresholds changed nothing: one thread, one arena, a fragmented
middle); ``malloc_trim`` brought it to 45 MiB in 9 ms.

So the process looks every second at what is resident but no longer in use, and trims once that
has grown by 8 MiB since the last trim: nothing happens under a steady load (its connections
stay open) nor while a burst still holds its memory, and a trim costs about 1 ms per 10 MB it
gives back. Where the C library is not glibc (musl, macOS), nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger("multicluster_scheduler.webhook.server")

CHECK_INTERVAL = 1.0  # seconds between looks
TRIM_SLACK = 8 * 1024 * 1024  # bytes resident but no longer in use, beyond the last trim's


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


class Heap:
    """glibc's malloc: what it has handed out, and ``malloc_trim``."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._mallinfo2 = libc.mallinfo2
        self._mallinfo2.argtypes = []
        self._mallinfo2.restype = _MallInfo2
        self._malloc_trim = libc.malloc_trim
        self._malloc_trim.argtypes = [ctypes.c_size_t]
        self._malloc_trim.restype = ctypes.c_int

    def in_use(self) -> int:
        """Bytes allocated and not yet freed (from the heap and mapped on their own)."""
        info = self._mallinfo2()
        return info.uordblks + info.hblkhd

    def trim(self) -> None:
        """Every whole free page of the heap back to the system."""
        self._malloc_trim(0)


def glibc_heap() -> Heap | None:
    """This process's malloc, when it is glibc's (2.33 or later); None otherwise."""
    try:
        return Heap(ctypes.CDLL(None))
    except (OSError, AttributeError):
        return None


def resident_bytes() -> int:
    """This process's RSS (Linux: ``/proc/self/statm``)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def trim_after_bursts(
    trim: Callable[[], object],
    in_use: Callable[[], int],
    rss: Callable[[], int] = resident_bytes,
    *,
    interval: float = CHECK_INTERVAL,
    slack: int = TRIM_SLACK,
) -> None:
    """Forever: every ``interval`` seconds, ``trim()`` when what is resident but not in use
    (``rss() - in_use()``) has grown by ``slack`` bytes since the last trim (or the start).

    While a burst holds its connections both grow together: no trim. Once they close, memory
    in use falls and the RSS does not: a trim, however short the burst was.
    """
    idle = rss() - in_use()
    while True:
        await asyncio.sleep(interval)
        before = rss()
        if before - in_use() - idle < slack:
            continue
        started = time.perf_counter()
        trim()
        after = rss()
        idle = after - in_use()
        log.debug(
            "heap trimmed rss_before_mb=%.1f rss_after_mb=%.1f ms=%.2f",
            before / 2**20,
            after / 2**20,
            (time.perf_counter() - started) * 1000,
        )
