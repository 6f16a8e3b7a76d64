"""Bounds on what servers that are not trusted may make a process hold: large answers read a few
at a time across clients (and one at a time per client), and what informers cache charged to a
budget that refuses to go over and is given back when they stop. Against local aiohttp servers."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from multicluster import BadResponse, CacheBudget, CacheFull, Informer, ReadLimits, Unreachable
from multicluster.client import WEBSOCKET_FRAME_BYTES
from multicluster.readlimits import CONTAINER_COST, cost
from multicluster.resources import PODS
from tests.multicluster.test_hostile_server import MiB, pod, serve  # noqa: F401 (a fixture)


def page_of(count: int, padding: int = 0) -> bytes:
    items = [pod(f"p{i}", padding) for i in range(count)]
    return orjson.dumps({"metadata": {"resourceVersion": "5"}, "items": items})


async def test_large_answers_of_clients_sharing_limits_are_read_one_at_a_time(serve):  # noqa: F811
    """Two servers each send 3 MiB, the first pausing halfway: with one shared slot, the second
    answer is not read past its first MiB until the first one is done."""
    limits = ReadLimits(large_reads=1)
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
    limits = ReadLimits(large_reads=1)
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
    limits = ReadLimits(large_reads=1, hold=1.0)

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
    assert 100 * 2000 < budget.used < 100 * 3000, budget.used
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


# -- the agent's own API server is trusted ------------------------------------------------------


async def test_a_trusted_server_is_read_without_limits_and_never_paused(serve):  # noqa: F811
    body = page_of(40, MiB)  # 40 MiB in one page: over every limit of an untrusted server

    async def handler(request: web.Request) -> web.Response:
        if request.query.get("fail"):
            return web.Response(body=b"<html>", content_type="text/html")
        return web.Response(body=body, content_type="application/json")

    client = await serve(handler, trusted=True)
    assert client.limits is None
    assert len((await client.list(PODS))[0]) == 40
    with pytest.raises(BadResponse, match="not JSON"):
        await client.request("GET", "/api/v1/pods", params={"fail": "1"})
    assert len((await client.list(PODS))[0]) == 40, "not paused"


# -- redirects ----------------------------------------------------------------------------------


@pytest.mark.parametrize("trusted", [False, True])
async def test_redirects_are_never_followed(serve, trusted):  # noqa: F811
    """A server that answers 302 or 307 elsewhere (an internal address, the agent's own
    metrics) gets no request there, for a list, a watch or a streamed log."""
    followed = []

    async def elsewhere(request: web.Request) -> web.Response:
        followed.append(request.path)
        return web.Response(body=b'{"SecretAccessKey": "x"}', content_type="application/json")

    async def redirect(request: web.Request) -> web.Response:
        if request.path == "/api/v1/pods":
            raise web.HTTPTemporaryRedirect("/internal/metadata")
        return await elsewhere(request)

    client = await serve(redirect, trusted=trusted)
    with pytest.raises(BadResponse, match=r"redirects \(307 Temporary Redirect\): not followed"):
        await client.list(PODS)
    client.bad_answers = None  # asked again at once (the pause is tested elsewhere)
    with pytest.raises(BadResponse, match="not followed"):
        async for _ in client.watch(PODS):
            pass
    with pytest.raises(BadResponse, match="not followed"):
        async with client.stream("/api/v1/pods"):
            pass
    assert followed == []


# -- watch events -------------------------------------------------------------------------------


async def test_events_faster_than_the_rate_end_the_watch(serve):  # noqa: F811
    """The same object modified again and again, as fast as the server can: a bounded cost."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        event = orjson.dumps({"type": "MODIFIED", "object": pod("same", 64 << 10)}) + b"\n"
        try:
            while True:
                await response.write(event)
        except (ConnectionError, RuntimeError):
            return response

    client = await serve(handler, event_rate=1 * MiB, event_burst=2 * MiB)
    seen: list[dict] = []

    async def watch() -> None:
        async for event in client.watch(PODS):
            seen.append(event)

    with pytest.raises(BadResponse, match=r"watch events come faster than 1 MiB a second"):
        await watch()
    assert 20 < len(seen) < 60, len(seen)  # about the burst: 2 MiB of 64 KiB events


# -- the cache budget ---------------------------------------------------------------------------


def test_what_an_object_costs_counts_its_values_not_only_its_characters():
    assert cost("abc") == CONTAINER_COST + 3
    assert cost({"a": [], "b": ""}) == 3 * CONTAINER_COST + 2
    # Three bytes of JSON each, some 64 once loaded: charged as what they weigh.
    many = orjson.loads(b"[" + b",".join([b"[]"] * 1000) + b"]")
    assert cost(many) > 1000 * CONTAINER_COST > 20 * len(orjson.dumps(many))


async def test_a_list_over_the_budget_stops_at_the_page_that_goes_over(serve):  # noqa: F811
    asked: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        start = int(request.query.get("continue") or 0)
        asked.append(str(start))
        page = {
            "metadata": {"continue": str(start + 1) if start < 9 else ""},
            "items": [pod(f"p{start}-{i}", 10_000) for i in range(10)],
        }
        return web.Response(body=orjson.dumps(page), content_type="application/json")

    budget = CacheBudget(250_000, "the Targets of namespace team-a")
    informer = Informer(await serve(handler), PODS, cluster="c2", budget=budget, page_size=10)
    informer.start()
    await asyncio.sleep(0.5)
    await informer.stop()
    assert isinstance(informer.last_error, CacheFull)
    assert asked[:3] == ["0", "1", "2"]
    assert "3" not in asked, "pages after the one that went over were asked for"
    assert budget.used == 0


async def test_a_full_budget_stays_the_informers_error_while_its_watch_stays_open(serve):  # noqa: F811
    """The watch that brought an object over the budget ends; the next one, open and silent,
    does not make the error go away: only an event that goes through does."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.Response(body=page_of(0), content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await response.write(orjson.dumps({"type": "ADDED", "object": pod("big", 200_000)}))
            await response.write(b"\n")
            await asyncio.sleep(30)
        return response

    budget = CacheBudget(100_000, "ClusterTarget c2")
    informer = Informer(await serve(handler), PODS, cluster="c2", budget=budget)
    informer.start()
    await asyncio.sleep(3)  # past the one second after which a quiet watch clears errors
    error = informer.last_error
    await informer.stop()
    assert isinstance(error, CacheFull), error


async def test_a_websocket_frame_over_the_limit_ends_the_stream_unread(serve):  # noqa: F811
    """One frame announcing 1.5 GiB cost the agent 3 GiB; past 4 MiB it is not read."""

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
        await ws.prepare(request)
        await ws.send_bytes(b"\x01small\n")
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.send_bytes(b"\x01" + b"x" * (WEBSOCKET_FRAME_BYTES + 1))
        await ws.close()
        return ws

    client = await serve(handler)
    ws = await client.websocket("/api/v1/pods", protocols=("v5.channel.k8s.io",))
    first = await ws.receive()
    second = await ws.receive()
    await ws.close()
    assert first.data == b"\x01small\n"
    assert second.type in (
        aiohttp.WSMsgType.ERROR,
        aiohttp.WSMsgType.CLOSE,
        aiohttp.WSMsgType.CLOSED,
    )
    assert ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG


async def test_a_websocket_handshake_redirected_elsewhere_is_not_followed(serve):  # noqa: F811
    """aiohttp follows redirects of WebSocket handshakes whatever it is asked: the client's
    sessions refuse any request to another address."""
    asked: list[str] = []
    internal = web.Application()

    async def metadata(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(text="secret")

    internal.router.add_get("/latest/meta-data", metadata)
    async with TestServer(internal, host="127.0.0.1") as elsewhere:

        async def redirect(_request: web.Request) -> web.Response:
            raise web.HTTPFound(str(elsewhere.make_url("/latest/meta-data")))

        client = await serve(redirect)
        with pytest.raises(Unreachable, match="redirects to another address: not followed"):
            await client.websocket("/api/v1/pods", protocols=("v5.channel.k8s.io",))
    assert asked == []
