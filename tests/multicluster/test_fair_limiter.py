"""The client's QPS limit lets waiting requests through namespace by namespace: one namespace's
burst of requests delays another's next one by a turn, not by the burst."""

from __future__ import annotations

import asyncio
import time

import pytest

from multicluster.client import flow_of
from multicluster.ratelimit import FairLimiter


def test_a_requests_flow_is_the_namespace_its_path_names():
    assert flow_of("/api/v1/namespaces/team-a/pods/p/binding") == "team-a"
    assert flow_of("/apis/apps/v1/namespaces/team-b/deployments") == "team-b"
    assert flow_of("/api/v1/namespaces/team-c") == "team-c"
    assert flow_of("/api/v1/nodes/n1/status") == ""


async def test_a_burst_passes_at_once_then_the_rate_holds():
    limiter = FairLimiter(qps=100, burst=5)
    started = time.monotonic()
    for _ in range(5):
        await limiter.acquire("a")
    assert time.monotonic() - started < 0.02
    await asyncio.gather(*(limiter.acquire("a") for _ in range(10)))
    assert time.monotonic() - started >= 0.09, "10 past the burst at 100/s"


async def test_waiting_namespaces_take_turns():
    limiter = FairLimiter(qps=200, burst=1)
    await limiter.acquire("a")  # the bucket is empty: everyone below waits
    order: list[str] = []

    async def request(flow: str) -> None:
        await limiter.acquire(flow)
        order.append(flow)

    tasks = [asyncio.create_task(request("a")) for _ in range(40)]
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(request("b")) for _ in range(2)]
    await asyncio.gather(*tasks)
    assert order[:4] == ["a", "b", "a", "b"], "b waits a turn, not 40"
    assert order.count("a") == 40


async def test_a_caller_cancelled_while_waiting_takes_no_token():
    limiter = FairLimiter(qps=50, burst=1)
    await limiter.acquire("a")
    gone = asyncio.create_task(limiter.acquire("a"))
    await asyncio.sleep(0)
    gone.cancel()
    started = time.monotonic()
    await limiter.acquire("b")
    assert time.monotonic() - started < 0.035, "the next token went to b"
    assert limiter.waiting() == 0


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="qps"):
        FairLimiter(qps=0, burst=1)


async def test_seats_bound_what_is_under_way_and_go_in_turn():
    limiter = FairLimiter(qps=10_000, burst=10_000, seats=2)
    order: list[str] = []
    under_way = most = 0
    gate = asyncio.Event()

    async def request(flow: str) -> None:
        nonlocal under_way, most
        async with limiter.hold(flow):
            under_way += 1
            most = max(most, under_way)
            order.append(flow)
            await gate.wait()
            under_way -= 1

    tasks = [asyncio.create_task(request("a")) for _ in range(30)]
    await asyncio.sleep(0.01)
    tasks += [asyncio.create_task(request("b")) for _ in range(2)]
    await asyncio.sleep(0.01)
    assert order == ["a", "a"], "two seats, both taken"
    gate.set()
    await asyncio.gather(*tasks)
    assert most == 2
    assert order[2:6] == ["a", "b", "a", "b"], "b waits a turn for a seat, not 28"
    assert limiter.in_flight == 0
    assert limiter.waiting() == 0
