"""Bounds on what servers that are not trusted may make a process hold: large answers read a few
at a time across clients (and one at a time per client), and what informers cache charged to a
budget that refuses to go over and is given back when they stop. Against local aiohttp servers."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiohttp import web

from multicluster import CacheBudget, CacheFull, Informer, ReadLimits
from multicluster.resources import PODS
from tests.multicluster.test_hostile_server import MiB, pod, serve  # noqa: F401 (a fixture)


def page_of(count: int, padding: int = 0) -> bytes:
    items = [pod(f"p{i}", padding) for i in range(count)]
    return orjson.dumps({"metadata": {"resourceVersion": "5"}, "items": items})


async def test_large_answers_of_clients_sharing_limits_are_read_one_at_a_time(serve):  # noqa: F811
    """Two servers each send 3 MiB, the first pausing halfway: with one shared slot, the second
    answer is not read past its first MiB until the first one is done."""
    limits = ReadLimits(total=1)
    halfway, go_on = asyncio.Event(), asyncio.Event()
    body = page_of(3, MiB)

    async def slow(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        halfway.set()
        await go_on.wait()
        await response.write(body[len(body) // 2 :])
        await response.write_eof()
        return response

    async def quick(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    first = await serve(slow, read_limits=limits)
    second = await serve(quick, read_limits=limits)
    reading = asyncio.create_task(first.list(PODS))
    await halfway.wait()
    waiting = asyncio.create_task(second.list(PODS))
    await asyncio.sleep(0.5)
    assert not waiting.done(), "the second large answer was read while the first held the slot"
    go_on.set()
    assert len((await reading)[0]) == 3
    assert len((await waiting)[0]) == 3


async def test_small_answers_take_no_slot(serve):  # noqa: F811
    limits = ReadLimits(total=1)
    body = page_of(10)

    async def handler(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    client = await serve(handler, read_limits=limits)
    holder = limits.slot(asyncio.Lock())
    await holder.take()  # every large-read slot is taken
    try:
        items, _ = await asyncio.wait_for(client.list(PODS), 5)
    finally:
        holder.release()
    assert len(items) == 10


async def test_a_large_watch_event_trickled_loses_its_slot(serve):  # noqa: F811
    """A server that sends a 2 MiB event slowly keeps no slot past ``hold`` seconds."""
    limits = ReadLimits(total=1, hold=1.0)

    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            for _ in range(40):
                await response.write(b"x" * (64 << 10))
                await asyncio.sleep(0.1)
        except (ConnectionError, RuntimeError):
            pass
        return response

    client = await serve(trickle, read_limits=limits)
    with pytest.raises(Exception, match=r"took over 1s to arrive \(not read further\)"):
        async for _ in client.watch(PODS):
            pass
    other = limits.slot(asyncio.Lock())
    await asyncio.wait_for(other.take(), 1)  # given back
    other.release()


async def test_an_informer_charges_what_it_caches_and_gives_it_back_when_it_stops(serve):  # noqa: F811
    body = page_of(100, 2000)

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") == "true":
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            await asyncio.sleep(30)
            return response
        return web.Response(body=body, content_type="application/json")

    budget = CacheBudget(1 * MiB, "the Targets of namespace team-a")
    informer = Informer(await serve(handler), PODS, cluster="c2", budget=budget)
    informer.start()
    assert await informer.wait_synced(5)
    assert 100 * 2000 < budget.used < 100 * 2300, budget.used
    await informer.stop()
    assert budget.used == 0


async def test_an_informer_over_its_budget_caches_nothing_more_and_says_why(serve):  # noqa: F811
    body = page_of(100, 2000)

    async def handler(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    budget = CacheBudget(100_000, "the Targets of namespace team-a")
    informer = Informer(await serve(handler), PODS, cluster="c2", budget=budget)
    informer.start()
    await asyncio.sleep(0.5)
    await informer.stop()
    assert not informer.has_synced
    assert informer.store.list() == []
    assert isinstance(informer.last_error, CacheFull)
    assert "the Targets of namespace team-a would cache over 0 MiB" in str(informer.last_error)
    assert budget.used == 0


async def test_watch_events_are_charged_until_the_budget_refuses_one(serve):  # noqa: F811
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.Response(body=page_of(0), content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            for i in range(1000):  # valid events without end
                event = {"type": "ADDED", "object": pod(f"w{i}", 1000)}
                await response.write(orjson.dumps(event) + b"\n")
        except (ConnectionError, RuntimeError):
            pass
        return response

    budget = CacheBudget(50_000, "ClusterTarget c2")
    informer = Informer(await serve(handler), PODS, cluster="c2", budget=budget)
    informer.start()
    await asyncio.sleep(1)
    cached = len(informer.store.list())
    await informer.stop()
    assert 0 < cached < 50, cached
    assert budget.used == 0
