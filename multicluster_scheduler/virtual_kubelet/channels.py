"""The remote-command channels of exec and attach, and the relays that carry them.

kubectl, the API server and kubelets speak the ``channel.k8s.io`` protocols: one byte names the
stream (0 stdin, 1 stdout, 2 stderr, 3 error: the command's status, 4 terminal resize; v5 adds
255 to close one), the rest is data. The kubelet API relays them to the target's API server over
a WebSocket: frame by frame from a WebSocket (:func:`relay`), or stream by stream from SPDY
(:func:`bridge`). Either way, a target that ends without the command's status is reported as a
lost connection, never as success.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from . import spdy

log = logging.getLogger(__name__)

CHANNEL_PROTOCOLS = (
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "base64.channel.k8s.io",
)
ERROR_CHANNEL = 3
LOG_PARAMS = (
    "follow",
    "previous",
    "timestamps",
    "sinceSeconds",
    "sinceTime",
    "tailLines",
    "limitBytes",
    "stream",
)
TRUE = ("1", "true", "True")
SPDY_PROTOCOLS = ("v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io")
STREAM_WAIT = 30.0  # how long the client has to open its streams, as a kubelet gives it
MAX_RESIZE = 4096  # bytes of one terminal size on the SPDY resize stream
_STREAM_OF_CHANNEL = {1: "stdout", 2: "stderr", ERROR_CHANNEL: "error"}  # the target's, to SPDY


def status_frame(protocol: str, message: str, reason: str, code: int) -> bytes | str:
    """An error on the error channel, as ``protocol`` carries it (a Status from v4 on)."""
    if protocol.startswith(("v4.", "v5.")):
        payload = orjson.dumps(
            {
                "apiVersion": "v1",
                "kind": "Status",
                "metadata": {},
                "status": "Failure",
                "message": message,
                "reason": reason,
                "code": code,
            }
        )
    else:
        payload = message.encode()
    if "base64" in protocol:
        return str(ERROR_CHANNEL) + base64.b64encode(payload).decode()
    return bytes([ERROR_CHANNEL]) + payload


def offered_protocols(request: web.Request) -> list[str]:
    header = request.headers.get("Sec-WebSocket-Protocol", "")
    offered = [p.strip() for p in header.split(",") if p.strip()]
    return [p for p in offered if p in CHANNEL_PROTOCOLS]


def stream_params(query: Any, container: str, kind: str) -> list[tuple[str, str]]:
    """The API server's pods/exec or pods/attach query for a kubelet's /exec or /attach one
    (``input=1`` becomes ``stdin=true``, and so on)."""
    params = [("container", container)]
    for kubelet, api in (("input", "stdin"), ("output", "stdout"), ("error", "stderr")):
        if query.get(kubelet) in TRUE:
            params.append((api, "true"))
    if query.get("tty") in TRUE:
        params.append(("tty", "true"))
    if kind == "exec":
        params += [("command", c) for c in query.getall("command", [])]
    return params


def log_params(query: Any, container: str) -> list[tuple[str, str]]:
    return [("container", container)] + [(k, query[k]) for k in LOG_PARAMS if k in query]


def lost(target: str) -> str:
    return (
        f"the stream from target {target} ended before the command's status came (the "
        "connection to the target was lost)"
    )


async def relay(
    inbound: web.WebSocketResponse,
    upstream: aiohttp.ClientWebSocketResponse,
    protocol: str = "v5.channel.k8s.io",
    target: str = "",
) -> None:
    """Frames both ways until either side closes; then the other is closed too. A target that
    ends without the command's status (from v4 on, it always sends one) lost its connection:
    the caller is told so, not left to believe the command succeeded."""
    said = False  # the target sent the error channel: the command's status

    async def pump(source: Any, sink: Any, down: bool) -> None:
        nonlocal said
        async for message in source:
            if message.type == aiohttp.WSMsgType.BINARY:
                said = said or (down and message.data[:1] == b"\x03")
                await sink.send_bytes(message.data)
            elif message.type == aiohttp.WSMsgType.TEXT:
                said = said or (down and message.data[:1] == "3")
                await sink.send_str(message.data)
            elif message.type in (aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSE):
                break

    down = asyncio.create_task(pump(upstream, inbound, True))
    up = asyncio.create_task(pump(inbound, upstream, False))
    try:
        await asyncio.wait((down, up), return_when=asyncio.FIRST_COMPLETED)
    finally:
        target_ended = down.done() and not up.done()
        await _cancel(down, up)
        await upstream.close()
        abnormal = upstream.close_code not in (None, aiohttp.WSCloseCode.OK)
        if target_ended and not said and (protocol.startswith(("v4.", "v5.")) or abnormal):
            frame = status_frame(protocol, lost(target), "InternalError", 500)
            with contextlib.suppress(ConnectionResetError, RuntimeError):
                if isinstance(frame, bytes):
                    await inbound.send_bytes(frame)
                else:
                    await inbound.send_str(frame)
        # A normal close whatever the upstream's ending (1006 when its connection just ended):
        # what the command said, exit code included, has gone through the error channel.
        await inbound.close(code=aiohttp.WSCloseCode.OK)


async def bridge(
    session: spdy.Session,
    upstream: aiohttp.ClientWebSocketResponse,
    query: Any,
    *,
    tty: bool,
    protocol: str = "v4.channel.k8s.io",
    target: str = "",
) -> None:
    """The client's SPDY streams to the target's WebSocket channels and back, until either
    side ends."""
    bridged = _Bridge(session, upstream, expected_streams(query, tty))
    if await bridged.opened():
        await bridged.relay(protocol, target)


def expected_streams(query: Any, tty: bool) -> set[str]:
    """The SPDY streams a kubelet's /exec or /attach query has the client open: the error
    stream always, stdin, stdout and stderr as asked (a terminal has no stderr of its own)."""
    expected = {"error"}
    if query.get("input") in TRUE:
        expected.add("stdin")
    if query.get("output") in TRUE:
        expected.add("stdout")
    if query.get("error") in TRUE and not tty:
        expected.add("stderr")
    return expected


class _Bridge:
    """One :func:`bridge`: the client's streams as they open, the pumps of those the client
    writes to (stdin, resize), and whether the target has sent the command's status."""

    def __init__(
        self,
        session: spdy.Session,
        upstream: aiohttp.ClientWebSocketResponse,
        expected: set[str],
    ) -> None:
        self.session = session
        self.upstream = upstream
        self.expected = expected
        self.streams: dict[str, spdy.Stream] = {}
        self.arrived = asyncio.Event()
        self.pumps: list[asyncio.Task] = []
        self.said = False  # the target sent the command's status

    async def opened(self) -> bool:
        """Whether the client opened every expected stream within :data:`STREAM_WAIT`."""
        self.session.on_stream = self._on_stream
        self.session.start()
        for stream in list(self.session.streams.values()):
            self._on_stream(stream)
        try:
            async with asyncio.timeout(STREAM_WAIT):
                await self.arrived.wait()
        except TimeoutError:
            log.info(
                "SPDY client opened %s of %s streams in time",
                sorted(self.streams),
                sorted(self.expected),
            )
            return False
        return True

    def _on_stream(self, stream: spdy.Stream) -> None:
        self.streams[stream.kind] = stream
        if self.expected <= self.streams.keys():
            self.arrived.set()
        if stream.kind in ("stdin", "resize"):
            self.pumps.append(asyncio.create_task(_client_to_target(stream, self.upstream)))

    async def relay(self, protocol: str, target: str) -> None:
        """The target's channels to the client's streams until either side ends. A target that
        ends without the command's status lost its connection: the error stream says so."""
        down = asyncio.create_task(self._target_to_client())
        gone = asyncio.create_task(self.session.closed.wait())
        try:
            await asyncio.wait((down, gone), return_when=asyncio.FIRST_COMPLETED)
            abnormal = self.upstream.close_code not in (None, aiohttp.WSCloseCode.OK)
            ended = down.done() and not self.session.closed.is_set()
            if ended and not self.said and (protocol == "v4.channel.k8s.io" or abnormal):
                frame = status_frame(protocol, lost(target), "InternalError", 500)
                assert isinstance(frame, bytes)
                await self.streams["error"].write(frame[1:])
        finally:
            await _cancel(down, gone, *self.pumps)

    async def _target_to_client(self) -> None:
        async for message in self.upstream:
            if message.type != aiohttp.WSMsgType.BINARY or not message.data:
                continue
            data: bytes = message.data
            if data[0] == 255 and len(data) > 1:  # v5: the target closed a channel
                stream = self.streams.get(_STREAM_OF_CHANNEL.get(data[1], ""))
                if stream is not None:
                    await stream.close()
                continue
            stream = self.streams.get(_STREAM_OF_CHANNEL.get(data[0], ""))
            self.said = self.said or data[0] == ERROR_CHANNEL
            if stream is not None and len(data) > 1:
                await stream.write(data[1:])


async def _client_to_target(stream: spdy.Stream, upstream: aiohttp.ClientWebSocketResponse) -> None:
    """What the client writes on its stdin or resize stream, to the target's channel 0 or 4."""
    channel = 0 if stream.kind == "stdin" else 4
    pending = b""
    async for chunk in stream.chunks():
        if channel == 0:
            await upstream.send_bytes(b"\x00" + chunk)
            continue
        # resize: one JSON object per line ({"Width":80,"Height":24}); a line that never
        # ends is not a terminal size, and is not kept either.
        *sizes, pending = (pending + chunk).split(b"\n")
        if len(pending) > MAX_RESIZE:
            log.info("SPDY resize stream closed: a line over %d bytes", MAX_RESIZE)
            return
        for size in sizes:
            if size.strip():
                await upstream.send_bytes(b"\x04" + size.strip())
    if channel == 0 and upstream.protocol == "v5.channel.k8s.io":
        await upstream.send_bytes(b"\xff\x00")  # stdin ended


async def _cancel(*tasks: asyncio.Task) -> None:
    """Cancel ``tasks`` and wait until they have ended, whatever they raise."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
