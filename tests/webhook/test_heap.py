"""The webhook process trims its heap once a burst of connections is over, never while the burst
holds its memory, and not again until more has been freed."""

from __future__ import annotations

import asyncio

import pytest

from multicluster_scheduler.webhook import heap

MB = 2**20


class FakeProcess:
    """A process whose RSS and memory in use the test sets; a trim gives back what is free."""

    def __init__(self, rss: int, in_use: int) -> None:
        self.resident, self.used = rss, in_use
        self.trims = 0

    def rss(self) -> int:
        return self.resident

    def in_use(self) -> int:
        return self.used

    def trim(self) -> None:
        self.trims += 1
        self.resident = 30 * MB + self.used


async def test_a_trim_once_a_burst_has_freed_what_it_held_and_not_again():
    process = FakeProcess(rss=35 * MB, in_use=5 * MB)
    task = asyncio.create_task(
        heap.trim_after_bursts(
            process.trim, process.in_use, process.rss, interval=0.01, slack=8 * MB
        )
    )
    try:
        process.resident, process.used = 95 * MB, 65 * MB  # a burst holds its connections
        await asyncio.sleep(0.05)
        assert process.trims == 0, "memory in use is not given back"

        process.used = 5 * MB  # closed: free, still resident
        await asyncio.sleep(0.05)
        assert process.trims == 1
        assert process.resident == 35 * MB

        process.resident += 4 * MB  # less than the slack since the trim
        await asyncio.sleep(0.05)
        assert process.trims == 1
    finally:
        task.cancel()


def test_glibc_heap_counts_what_is_allocated():
    malloc = heap.glibc_heap()
    if malloc is None:
        pytest.skip("not glibc")
    before = malloc.in_use()
    held = [bytearray(64 * 1024) for _ in range(64)]
    assert malloc.in_use() - before >= 4 * MB
    del held
    malloc.trim()
