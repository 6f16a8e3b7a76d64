"""The exec/attach relay between two WebSockets: frames pass unchanged both ways, the exit status
on the error channel arrives, and the caller sees a normal close however the far side ends."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from multicluster_scheduler.virtual_kubelet.channels import relay

EXIT_3 = bytes([3]) + orjson.dumps(
    {
        "metadata": {},
        "status": "Failure",
        "message": "command terminated with non-zero exit code: exit status 3",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
    }
)


async def test_frames_pass_both_ways_and_the_exit_status_arrives():
    received: list[bytes] = []

    async def target(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
        await ws.prepare(request)
        message = await ws.receive()  # stdin first
        received.append(message.data)
        await ws.send_bytes(b"\x01" + message.data[1:].upper())  # stdout
        await ws.send_bytes(b"\x02warning\n")  # stderr
        await ws.send_bytes(EXIT_3)
        # Ends without a close frame, as an API server's translated stream may.
        assert request.transport is not None
        request.transport.close()
        return ws

    target_app = web.Application()
    target_app.router.add_get("/exec", target)

    async with TestServer(target_app) as target_server, aiohttp.ClientSession() as session:

        async def kubelet(request: web.Request) -> web.WebSocketResponse:
            upstream = await session.ws_connect(
                target_server.make_url("/exec"), protocols=("v5.channel.k8s.io",)
            )
            inbound = web.WebSocketResponse(protocols=(upstream.protocol,))
            await inbound.prepare(request)
            await relay(inbound, upstream)
            return inbound

        kubelet_app = web.Application()
        kubelet_app.router.add_get("/exec", kubelet)
        async with TestServer(kubelet_app) as kubelet_server:
            ws = await session.ws_connect(
                kubelet_server.make_url("/exec"), protocols=("v5.channel.k8s.io",)
            )
            assert ws.protocol == "v5.channel.k8s.io"
            await ws.send_bytes(b"\x00hello\n")
            frames = []
            async for message in ws:
                assert message.type == aiohttp.WSMsgType.BINARY
                frames.append(message.data)
            assert ws.close_code == aiohttp.WSCloseCode.OK
    assert received == [b"\x00hello\n"]
    assert frames == [b"\x01HELLO\n", b"\x02warning\n", EXIT_3]


async def test_the_caller_leaving_closes_the_far_side():
    closed = []

    async def target(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for _ in ws:
            pass
        closed.append(ws.close_code)
        return ws

    target_app = web.Application()
    target_app.router.add_get("/attach", target)
    async with TestServer(target_app) as target_server, aiohttp.ClientSession() as session:

        async def kubelet(request: web.Request) -> web.WebSocketResponse:
            upstream = await session.ws_connect(target_server.make_url("/attach"))
            inbound = web.WebSocketResponse()
            await inbound.prepare(request)
            await relay(inbound, upstream)
            return inbound

        kubelet_app = web.Application()
        kubelet_app.router.add_get("/attach", kubelet)
        async with TestServer(kubelet_app) as kubelet_server:
            ws = await session.ws_connect(kubelet_server.make_url("/attach"))
            await ws.close()
            for _ in range(100):
                if closed:
                    break
                await asyncio.sleep(0.02)
    assert closed, "the target's side was closed too"


async def relayed_from(target_handler, protocol: str = "v5.channel.k8s.io") -> list[bytes]:
    """The frames a caller gets through the relay from a target served by ``target_handler``."""
    target_app = web.Application()
    target_app.router.add_get("/exec", target_handler)
    async with TestServer(target_app) as target_server, aiohttp.ClientSession() as session:

        async def kubelet(request: web.Request) -> web.WebSocketResponse:
            upstream = await session.ws_connect(
                target_server.make_url("/exec"), protocols=(protocol,)
            )
            inbound = web.WebSocketResponse(protocols=(protocol,))
            await inbound.prepare(request)
            await relay(inbound, upstream, protocol, "c2")
            return inbound

        kubelet_app = web.Application()
        kubelet_app.router.add_get("/exec", kubelet)
        async with TestServer(kubelet_app) as kubelet_server:
            ws = await session.ws_connect(kubelet_server.make_url("/exec"), protocols=(protocol,))
            frames = [m.data async for m in ws]
            assert ws.close_code == aiohttp.WSCloseCode.OK
            return frames


async def test_a_target_lost_mid_command_is_an_error_not_a_success():
    async def target(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
        await ws.prepare(request)
        await ws.send_bytes(b"\x01half of the output\n")
        assert request.transport is not None
        request.transport.abort()  # no status, no close frame
        return ws

    frames = await relayed_from(target)
    assert frames[0] == b"\x01half of the output\n"
    assert frames[1][0] == 3
    status = orjson.loads(frames[1][1:])
    assert status["status"] == "Failure"
    assert "the connection to the target was lost" in status["message"]
    assert "target c2" in status["message"]


async def test_a_v4_stream_closed_without_a_status_is_an_error_too():
    async def target(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)
        await ws.send_bytes(b"\x01out\n")
        await ws.close()  # a clean close, but v4 always ends with a status
        return ws

    frames = await relayed_from(target, "v4.channel.k8s.io")
    assert frames[0] == b"\x01out\n"
    assert orjson.loads(frames[1][1:])["status"] == "Failure"


async def test_a_status_then_a_clean_close_passes_as_it_is():
    success = b"\x03" + orjson.dumps({"metadata": {}, "status": "Success"})

    async def target(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
        await ws.prepare(request)
        await ws.send_bytes(success)
        await ws.close()
        return ws

    assert await relayed_from(target) == [success]
