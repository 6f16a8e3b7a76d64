"""The client and informers against a server that is not a friendly API server: a local aiohttp
server answering what a hostile target would (huge lists and watch lines, endless pages, bodies
that are not Statuses, watches that end at once). Reads stay bounded, big legitimate pages still
list, errors quote nothing but a Status's message, and failures back off."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from multicluster import Client, ClusterConfig, Informer, ReadLimits
from multicluster.errors import BadResponse, NotFound, ResponseTooLarge, ServerError, Unreachable
from multicluster.resources import PODS

MiB = 1 << 20
SECRET = "SECRET-INTERNAL-DATA"


def kubeconfig(server: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "c",
        }
    )


@pytest.fixture
async def serve() -> AsyncIterator[Callable]:
    """``await serve(handler, **limits)``: a Client of a server answering every GET of the pods
    collection with ``handler``, read within ``ReadLimits(**limits)`` (or the ``read_limits``
    given; none with ``trusted=True``)."""
    servers: list[TestServer] = []
    clients: list[Client] = []

    async def make(handler, *, trusted: bool = False, read_limits=None, **limits) -> Client:
        app = web.Application()
        app.router.add_get("/api/v1/pods", handler)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        config = ClusterConfig.from_kubeconfig_data(kubeconfig(str(server.make_url(""))))
        if not trusted and read_limits is None:
            read_limits = ReadLimits(**limits)
        client = Client(config, name="hostile", read_limits=read_limits)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()
    for server in servers:
        await server.close()


def pod(name: str, padding: int = 0) -> dict:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
        "pad": "x" * padding,
    }


async def stream(
    request: web.Request, pieces, content_type="application/json"
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": content_type})
    await response.prepare(request)
    try:
        for piece in pieces:
            await response.write(piece)
            await asyncio.sleep(0)
    except (ConnectionError, RuntimeError):
        return response
    await response.write_eof()
    return response


# -- watch lines --------------------------------------------------------------------------------


async def test_a_long_watch_line_arriving_in_small_chunks_is_read_in_linear_time(serve):
    """16 MiB of one event in 4 KiB writes: joining the buffer at every chunk (quadratic) copies
    tens of GiB; joining the pieces once takes milliseconds."""
    event = orjson.dumps({"type": "ADDED", "object": pod("big", 16 * MiB)})
    chunk = 4096

    async def handler(request: web.Request) -> web.StreamResponse:
        pieces = (event[i : i + chunk] for i in range(0, len(event), chunk))
        return await stream(request, [*pieces, b"\n"])

    client = await serve(handler, trusted=True)  # no limit on events: only the joining counts
    started = time.process_time()
    events = [e async for e in client.watch(PODS)]
    spent = time.process_time() - started
    assert [e["object"]["metadata"]["name"] for e in events] == ["big"]
    print(f"16 MiB line in 4 KiB chunks: {spent:.2f}s of CPU")
    assert spent < 5, f"{spent:.1f}s of CPU for a 16 MiB line"


async def test_a_watch_line_over_the_limit_ends_the_watch_without_reading_on(serve):
    sent = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            for _ in range(200):  # 200 MiB, no newline
                await response.write(b"x" * MiB)
                sent += 1
        except (ConnectionError, RuntimeError):
            pass
        return response

    client = await serve(handler, max_event_bytes=2 * MiB)
    with pytest.raises(ResponseTooLarge, match=r"a watch event is over 2 MiB \(not read further\)"):
        async for _ in client.watch(PODS):
            pass
    await asyncio.sleep(0.1)
    assert sent < 50, f"{sent} MiB sent before the client hung up"


async def test_many_events_in_one_chunk_and_events_split_across_chunks(serve):
    events = [{"type": "ADDED", "object": pod(f"p{i}")} for i in range(300)]
    body = b"".join(orjson.dumps(e) + b"\n" for e in events)
    cuts = [0, 1, 2, 50, 51, 4000, 4001, 4002, len(body) - 1, len(body)]

    async def handler(request: web.Request) -> web.StreamResponse:
        return await stream(request, [body[a:b] for a, b in itertools.pairwise(cuts)])

    client = await serve(handler)
    got = [e["object"]["metadata"]["name"] async for e in client.watch(PODS)]
    assert got == [f"p{i}" for i in range(300)]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (SECRET.encode(), "a watch event is not JSON"),
        (b'["' + SECRET.encode() + b'"]', "a watch event is not an event"),
        (b'{"type": "ADDED", "object": "' + SECRET.encode() + b'"}', "not an event"),
        (
            b'{"type": "ERROR", "object": {"code": "x", "message": "' + SECRET.encode() + b'"}}',
            "500 Internal Server Error",
        ),
    ],
)
async def test_malformed_watch_events_are_refused_unquoted(serve, line, message):
    async def handler(request: web.Request) -> web.StreamResponse:
        return await stream(request, [line + b"\n"])

    client = await serve(handler)
    with pytest.raises((BadResponse, ServerError)) as refused:
        async for _ in client.watch(PODS):
            pass
    assert message in str(refused.value)
    assert SECRET not in str(refused.value)


# -- lists --------------------------------------------------------------------------------------


def paged(items: int, padding: int, seen: list[int]):
    """A server with ``items`` pods of ``padding`` bytes each, paginated as asked."""

    async def handler(request: web.Request) -> web.Response:
        limit = int(request.query["limit"])
        seen.append(limit)
        start = int(request.query.get("continue") or 0)
        end = min(items, start + limit)
        page = {
            "kind": "PodList",
            "metadata": {"resourceVersion": "7", **({"continue": str(end)} if end < items else {})},
            "items": [pod(f"p{i}", padding) for i in range(start, end)],
        }
        return web.Response(body=orjson.dumps(page), content_type="application/json")

    return handler


async def test_a_page_of_big_objects_is_asked_again_in_smaller_pages(serve):
    """500 objects of 100 KiB are 50 MiB: over the 4 MiB limit, the page is asked again with a
    quarter of the limit until it fits, and the next pages keep the smaller size."""
    seen: list[int] = []
    client = await serve(paged(60, 100 * 1024, seen), max_response_bytes=4 * MiB)
    items, version = await client.list(PODS)
    assert [i["metadata"]["name"] for i in items] == [f"p{i}" for i in range(60)]
    assert version == "7"
    assert seen == [500, 125, 31, 31]


async def test_one_object_over_the_limit_is_refused(serve):
    seen: list[int] = []
    client = await serve(paged(3, 2 * MiB, seen), max_response_bytes=1 * MiB)
    with pytest.raises(ResponseTooLarge, match=r"one object is over 1 MiB"):
        await client.list(PODS)
    assert seen == [500, 125, 31, 7, 1]


async def test_a_list_whose_pages_never_end_is_refused(serve):
    async def handler(request: web.Request) -> web.Response:
        start = int(request.query.get("continue") or 0)
        page = {
            "metadata": {"continue": str(start + 1)},
            "items": [pod(f"p{start}", 256 * 1024)],
        }
        return web.Response(body=orjson.dumps(page), content_type="application/json")

    client = await serve(handler, max_response_bytes=1 * MiB, max_list_bytes=8 * MiB)
    with pytest.raises(ResponseTooLarge, match=r"the list is over 8 MiB"):
        await client.list(PODS)


async def test_a_declared_length_over_the_limit_is_not_read(serve):
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = 100 * MiB
        await response.prepare(request)
        await asyncio.sleep(30)  # never sends it: the client must not wait for it
        return response

    client = await serve(handler, max_response_bytes=1 * MiB)
    started = time.monotonic()
    with pytest.raises(ResponseTooLarge):
        await client.list(PODS)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "body",
    [
        SECRET.encode(),
        b'["' + SECRET.encode() + b'"]',
        b'{"metadata": "' + SECRET.encode() + b'"}',
        b'{"metadata": {}, "items": {"' + SECRET.encode() + b'": 1}}',
    ],
)
async def test_an_answer_that_is_not_a_list_is_refused_unquoted(serve, body):
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    client = await serve(handler)
    with pytest.raises(BadResponse) as refused:
        await client.list(PODS)
    assert SECRET not in str(refused.value)


# -- errors -------------------------------------------------------------------------------------


async def test_a_list_without_items_is_an_empty_list(serve):
    """A nil slice in Go: what an API server may send for an empty list."""

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=b'{"metadata": {"resourceVersion": "5"}}')

    client = await serve(handler)
    assert await client.list(PODS) == ([], "5")


async def test_an_error_body_that_is_not_a_status_is_not_quoted(serve):
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=404, text=f"{SECRET} " * 100, reason=SECRET)

    client = await serve(handler)
    with pytest.raises(NotFound) as refused:
        await client.list(PODS)
    message = str(refused.value)
    assert message == (
        "GET /api/v1/pods on hostile: 404 Not Found"
        " (the answer is not a Kubernetes Status: not quoted)"
    )
    with pytest.raises(NotFound) as refused:
        async for _ in client.watch(PODS):
            pass
    assert SECRET not in str(refused.value)


async def test_a_status_message_is_quoted_cut_to_a_bounded_length(serve):
    long = "no such thing; " * 200

    async def handler(request: web.Request) -> web.Response:
        status = {"kind": "Status", "apiVersion": "v1", "code": 404, "message": long + "\nforged"}
        return web.Response(status=404, body=orjson.dumps(status))

    client = await serve(handler)
    with pytest.raises(NotFound) as refused:
        await client.list(PODS)
    message = str(refused.value)
    assert message.startswith("GET /api/v1/pods on hostile: 404 no such thing; no such thing;")
    assert len(message) < 1100
    assert "\n" not in message


async def test_an_error_body_over_the_limit_is_not_read(serve):
    async def handler(request: web.Request) -> web.Response:
        status = {"kind": "Status", "code": 500, "message": SECRET, "pad": "x" * (4 * MiB)}
        return web.Response(status=500, body=orjson.dumps(status))

    client = await serve(handler)
    with pytest.raises(ServerError) as refused:
        await client.list(PODS)
    assert SECRET not in str(refused.value)
    assert "500 Internal Server Error" in str(refused.value)


async def test_an_answer_that_is_not_http_is_not_quoted():
    """An address that is not an API server at all (a banner, a status line of its own)."""

    async def banner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(f"{SECRET} ready\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(banner, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = Client(ClusterConfig.from_kubeconfig_data(kubeconfig(f"http://127.0.0.1:{port}")))
    try:
        with pytest.raises(Unreachable) as refused:
            await client.list(PODS)
        assert SECRET not in str(refused.value)
        assert "not valid HTTP" in str(refused.value)
    finally:
        await client.close()
        server.close()


# -- informer back-off --------------------------------------------------------------------------


@pytest.mark.parametrize("answer", ["ends at once", "410 at once", "oversized line"])
async def test_an_informer_backs_off_from_a_server_that_answers_badly_at_once(serve, answer):
    """A server that lists well, then ends every watch at once (or refuses it with a 410, or
    sends a line over the limit) is asked a few times in three seconds, never in a loop."""
    requests = {"list": 0, "watch": 0}

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            requests["list"] += 1
            page = {"metadata": {"resourceVersion": "5"}, "items": [pod("p")]}
            return web.Response(body=orjson.dumps(page), content_type="application/json")
        requests["watch"] += 1
        if answer == "410 at once":
            gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410}}
            return await stream(request, [orjson.dumps(gone) + b"\n"])
        if answer == "oversized line":
            return await stream(request, [b"x" * (2 * MiB)])
        return await stream(request, [])

    client = await serve(handler, max_event_bytes=1 * MiB)
    informer = Informer(client, PODS, cluster="hostile")
    informer.start()
    await asyncio.sleep(3)
    await informer.stop()
    print(f"{answer}: {requests}")
    assert informer.get("p", "ns") is not None
    assert requests["list"] + requests["watch"] <= 12, requests
    assert informer.last_error is not None or answer == "410 at once"


async def test_a_410_to_the_version_resumed_from_relists_at_once_whatever_the_backoff(serve):
    """After an outage (errors that grew the backoff), the watch resumed from the last version
    gets a 410: that is the outage's expected end, and the list follows at once instead of after
    the longest delay yet (which held every informer of a target that was back for 15-30 s)."""
    seen: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            seen.append(("list", loop.time()))
            page = {"metadata": {"resourceVersion": "9"}, "items": [pod("p")]}
            return web.Response(body=orjson.dumps(page), content_type="application/json")
        if request.query.get("resourceVersion") == "9":
            seen.append(("watch", loop.time()))
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            await asyncio.sleep(30)  # open until the informer stops
            return response
        if sum(1 for kind, _ in seen if kind == "error") < 3:
            seen.append(("error", loop.time()))
            return web.Response(status=503, text="starting")
        seen.append(("gone", loop.time()))
        gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410}}
        return await stream(request, [orjson.dumps(gone) + b"\n"])

    client = await serve(handler)
    informer = Informer(client, PODS, cluster="hostile")
    informer.resource_version = "3"  # as a restarted informer resumes
    informer.start()
    try:
        assert await informer.wait_synced(10)
    finally:
        await informer.stop()
    kinds = [kind for kind, _ in seen]
    assert kinds[:5] == ["error", "error", "error", "gone", "list"], kinds
    when = dict((kind, t) for kind, t in seen if kind in ("gone", "list"))
    assert when["list"] - when["gone"] < 0.5, seen
