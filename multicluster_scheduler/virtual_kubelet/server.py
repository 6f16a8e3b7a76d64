"""The kubelet API of the virtual nodes: ``kubectl logs``, ``exec`` and ``attach`` on proxy pods.

The API server answers ``kubectl logs/exec/attach`` by calling the kubelet of the pod's node, at
the node's address and ``daemonEndpoints`` port, over HTTPS with its kubelet client certificate.
For a proxy pod, that node is a virtual node and the kubelet is this server (one port for all
of the agent's virtual nodes): it finds the pod's delegate and asks the target's API server for
the same thing (``pods/log``, ``pods/exec``, ``pods/attach``), streaming both ways.

Who may call is :mod:`.access`'s business; the channels and their relays are :mod:`.channels`'.
Exec and attach come as WebSockets from API servers from 1.36 (virtual nodes declare
``ExtendWebSocketsToKubelet``, so kubectl's WebSocket is passed through), and as SPDY from
older ones and older clients: aiohttp serves HTTP and WebSockets, and the first request of a
connection that asks for SPDY is served by :mod:`.spdy` instead. (aiohttp, not the FastAPI and
uvicorn of the other endpoints: an ASGI server cannot hand a connection's socket over to another
protocol after a ``101 Switching Protocols``, which SPDY needs.)
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import Counter
from yarl import URL

from multicluster import ApiError, Client, NotFound, Unreachable, metrics
from multicluster.client import WEBSOCKET_FRAME_BYTES
from multicluster.resources import PODS

from ..api.proxy import is_deleting
from ..targets.delegates import DelegateLookup
from ..targets.registry import TargetConnection
from . import spdy
from .access import Authorizer, kind_of, user_of, verb_for
from .channels import (
    SPDY_PROTOCOLS,
    TRUE,
    bridge,
    log_params,
    offered_protocols,
    relay,
    status_frame,
    stream_params,
)

log = logging.getLogger(__name__)

WEBSOCKETS_FEATURE = "ExtendWebSocketsToKubelet"
SHUTDOWN_TIMEOUT = 1.0  # seconds streams still open get when the agent stops
REQUESTS = Counter(
    "multicluster_scheduler_kubelet_api_requests_total",
    "Requests to the virtual nodes' kubelet API, by kind (logs, exec, attach) and result "
    "(relayed; refused: the caller may not; failed: no delegate or target to relay to).",
    ["kind", "result"],
    registry=metrics.REGISTRY,
)


class KubeletError(Exception):
    """A request that cannot be served, with the status and words the user will see."""

    def __init__(self, status: int, message: str, reason: str = "BadRequest") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason


@dataclass(frozen=True)
class Located:
    proxy: dict
    connection: TargetConnection
    delegate: dict

    @property
    def client(self) -> Client:
        return self.connection.client

    @property
    def namespace(self) -> str:
        return self.delegate["metadata"]["namespace"]

    @property
    def name(self) -> str:
        return self.delegate["metadata"]["name"]

    @property
    def target(self) -> str:
        return self.connection.name


class KubeletServer:
    """The HTTPS kubelet API of every virtual node of this agent (one port, all nodes: the path
    names the pod, whose node names the target)."""

    def __init__(
        self,
        lookup: DelegateLookup,
        authorizer: Authorizer | None,
        *,
        host: str,
        port: int,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self.lookup = lookup
        self.proxies = lookup.proxies
        self.registry = lookup.registry
        self.authorizer = authorizer
        self.host = host
        self.port = port
        self.leading = leading
        self.started = False
        self._runner: web.AppRunner | None = None
        self._spdy_tasks: set[asyncio.Task] = set()
        self._listener: asyncio.Server | None = None
        self.context: ssl.SSLContext | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._authenticate])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self.container_logs)
        for kind in ("exec", "attach"):
            handler = self._streamer(kind)
            app.router.add_route("GET", f"/{kind}/{{namespace}}/{{pod}}/{{container}}", handler)
            app.router.add_route("POST", f"/{kind}/{{namespace}}/{{pod}}/{{container}}", handler)
        return app

    async def serve(self, context: ssl.SSLContext) -> None:
        """Serve until cancelled (an OSError if the port cannot be had)."""
        self.context = context
        # Handlers are cancelled when their caller leaves: a followed log that is quiet would
        # otherwise hold its stream from the target until the next line. Streams still open
        # at shutdown get a moment, not aiohttp's minute (twice).
        self._runner = web.AppRunner(
            self.app(),
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            shutdown_timeout=SHUTDOWN_TIMEOUT,
        )
        await self._runner.setup()
        try:
            self._listener = await self._listen()
            self.started = True
            log.info("kubelet API serving on %s:%d", self.host or "*", self.port)
            await asyncio.Event().wait()
        finally:
            self.started = False
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            for task in list(self._spdy_tasks):
                task.cancel()
            await self._runner.cleanup()

    async def _listen(self) -> asyncio.Server:
        http = self._runner.server if self._runner else None
        assert http is not None
        assert self.context is not None
        return await asyncio.get_running_loop().create_server(
            lambda: _Front(http, self._spdy_upgrade),
            self.host or None,  # "": every address, IPv4 and IPv6
            self.port,
            ssl=self.context,
            ssl_handshake_timeout=10.0,
        )

    async def use_context(self, context: ssl.SSLContext) -> None:
        """Serve new connections with ``context`` (a new client CA): the listener is replaced;
        connections already open go on."""
        self.context = context
        if self._listener is not None:
            self._listener.close()
            self._listener = await self._listen()

    # -- authentication and authorization ------------------------------------------------------

    @web.middleware
    async def _authenticate(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        transport = request.transport
        user, groups = user_of(transport.get_extra_info("peercert") if transport else None)
        if self.authorizer is not None:
            verb = verb_for(request.method, request.path)
            refusal = await self.authorizer.refusal(user, groups, verb)
            if refusal is not None:
                log.warning("kubelet API request refused path=%s: %s", request.path, refusal)
                REQUESTS.labels(kind_of(request.path), "refused").inc()
                return web.Response(status=403, text=f"Forbidden: {refusal}")
        return await handler(request)

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    # -- finding the delegate ------------------------------------------------------------------

    def locate(self, namespace: str, name: str) -> Located:
        if not self.leading():
            raise KubeletError(
                503,
                "this agent replica does not lead: the virtual node's address is about to "
                "change to the leader's; try again in a few seconds",
                "ServiceUnavailable",
            )
        proxy = self.proxies.get(name, namespace)
        if proxy is None:
            raise KubeletError(
                404, f"pod {namespace}/{name} is not a proxy pod on a virtual node", "NotFound"
            )
        node = proxy["spec"].get("nodeName")
        connection = self.registry.by_node(node)
        if connection is None or connection.cluster is None:
            raise KubeletError(
                503,
                f"target of node {node} is not connected"
                + (f": {connection.reason}: {connection.message}" if connection else ""),
                "ServiceUnavailable",
            )
        # Ours only (a co-tenant of a shared target could label a pod with this uid; it would
        # not get the session).
        delegates = [d for d in self.lookup.in_target(proxy, connection) if not is_deleting(d)]
        if not delegates:
            state = f"{connection.reason}: {connection.message}".rstrip(": ")
            if not connection.delegates_synced:  # unreachable, or not listed yet: cannot tell
                raise KubeletError(
                    503,
                    f"target {connection.name} cannot be read now ({state}): the delegate of "
                    f"pod {namespace}/{name} may still run there; try again once the target "
                    "is Ready",
                    "ServiceUnavailable",
                )
            why = "" if connection.ready else f" (target {connection.name} is not ready: {state})"
            raise KubeletError(
                404,
                f"the delegate of pod {namespace}/{name} is gone from target "
                f"{connection.name}{why}",
                "NotFound",
            )
        return Located(proxy, connection, delegates[0])

    @staticmethod
    def _upstream_error(located: Located, error: Exception) -> KubeletError:
        if isinstance(error, Unreachable):
            return KubeletError(
                500,
                f"target {located.target} is unreachable: {error}",
                "InternalError",
            )
        assert isinstance(error, ApiError)
        message = (error.body or {}).get("message") or str(error)
        if isinstance(error, NotFound):
            message = (
                f"the delegate of pod {located.proxy['metadata']['namespace']}/"
                f"{located.proxy['metadata']['name']} ({located.namespace}/{located.name}) "
                f"is gone from target {located.target}"
            )
        else:
            message = f"target {located.target}: {message}"
        code = error.status if error.status in (400, 403, 404) else 500
        return KubeletError(code, message, "InternalError" if code == 500 else "BadRequest")

    # -- logs ----------------------------------------------------------------------------------

    async def container_logs(self, request: web.Request) -> web.StreamResponse:
        match = request.match_info
        try:
            located = self.locate(match["namespace"], match["pod"])
        except KubeletError as e:
            return _text(e)
        path = PODS.path(located.namespace, located.name, "log")
        params = log_params(request.query, match["container"])
        response: web.StreamResponse | None = None
        try:
            async with located.client.stream(path, params=params) as upstream:
                response = web.StreamResponse(
                    headers={"Content-Type": upstream.headers.get("Content-Type", "text/plain")}
                )
                await response.prepare(request)
                REQUESTS.labels("logs", "relayed").inc()
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (ApiError, Unreachable) as e:
            return _text(self._upstream_error(located, e))
        except (aiohttp.ClientError, TimeoutError) as e:  # the target went away mid-stream
            log.info("log stream of %s/%s from %s ended: %s", *_names(located), e)
            if response is None:
                return _text(self._upstream_error(located, Unreachable(str(e))))
            return response
        except ConnectionResetError:  # the client went away
            if response is None:
                raise
            return response

    # -- exec and attach -----------------------------------------------------------------------

    def _streamer(self, kind: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self.remote_command(request, kind)

        return handler

    async def remote_command(self, request: web.Request, kind: str) -> web.StreamResponse:
        upgrade = request.headers.get("Upgrade", "").lower()
        if upgrade != "websocket":
            what = "SPDY" if upgrade.startswith("spdy") else "a plain request"
            return _text(
                KubeletError(
                    400,
                    f"{kind} on proxy pods needs WebSocket streaming, not {what}: use an API "
                    f"server from Kubernetes 1.36 (feature {WEBSOCKETS_FEATURE}) and kubectl "
                    "1.30 or later",
                ),
                kind,
            )
        offered = offered_protocols(request)
        if not offered:
            return _text(KubeletError(400, "no channel.k8s.io WebSocket protocol offered"), kind)
        match = request.match_info
        try:
            located = self.locate(match["namespace"], match["pod"])
        except KubeletError as e:
            return await _refuse(request, offered[0], e)
        params = stream_params(request.query, match["container"], kind)
        path = PODS.path(located.namespace, located.name, kind)
        try:
            await self._check_container(located, match["container"])
            upstream = await located.client.websocket(path, params=params, protocols=offered)
        except KubeletError as e:
            return await _refuse(request, offered[0], e)
        except (ApiError, Unreachable) as e:
            return await _refuse(request, offered[0], self._upstream_error(located, e))
        try:
            protocol = upstream.protocol or offered[0]
            inbound = web.WebSocketResponse(
                protocols=(protocol,),
                autoping=True,
                max_msg_size=WEBSOCKET_FRAME_BYTES,
                compress=False,
            )
            await inbound.prepare(request)
            REQUESTS.labels(kind, "relayed").inc()
            log.info(
                "%s to %s/%s relayed to %s/%s in target %s protocol=%s",
                kind,
                match["namespace"],
                match["pod"],
                *_names(located),
                located.target,
                protocol,
            )
            await relay(inbound, upstream, protocol, located.target)
            return inbound
        finally:
            await upstream.close()

    # -- exec and attach over SPDY (API servers before 1.36, older clients) -------------------

    def _spdy_upgrade(self, session: spdy.Session, head: RequestHead) -> None:
        task = asyncio.get_running_loop().create_task(self._serve_spdy(session, head))
        self._spdy_tasks.add(task)
        task.add_done_callback(self._spdy_tasks.discard)

    async def _serve_spdy(self, session: spdy.Session, head: RequestHead) -> None:
        transport = session.transport
        try:
            await self.spdy_remote_command(session, head)
        except KubeletError as e:
            kind = kind_of(head.url.path)
            log.info("%s refused: %s", head.url.path, e.message)
            transport.write(_http_error(_text(e, kind)))
            transport.close()
        except (ConnectionResetError, asyncio.CancelledError):
            transport.close()
            raise
        except Exception:
            log.exception("SPDY %s failed", head.url.path)
            transport.close()

    async def spdy_remote_command(self, session: spdy.Session, head: RequestHead) -> None:
        match = SPDY_PATH.fullmatch(head.url.path)
        if match is None or head.method not in ("GET", "POST"):
            raise KubeletError(404, f"{head.method} {head.url.path} is not served here")
        kind, namespace, name, container = match.groups()
        if self.authorizer is not None:
            peercert = session.transport.get_extra_info("peercert")
            user, groups = user_of(peercert)
            verb = verb_for(head.method, head.url.path)
            refusal = await self.authorizer.refusal(user, groups, verb)
            if refusal is not None:
                log.warning("kubelet API request refused path=%s: %s", head.url.path, refusal)
                REQUESTS.labels(kind, "refused").inc()
                raise KubeletError(403, f"Forbidden: {refusal}")
        offered, protocol = spdy_protocol(head)
        located = self.locate(namespace, name)
        await self._check_container(located, container)
        params = stream_params(head.url.query, container, kind)
        path = PODS.path(located.namespace, located.name, kind)
        upstream_protocols = (
            ["v5.channel.k8s.io", protocol] if protocol == "v4.channel.k8s.io" else [protocol]
        )
        try:
            upstream = await located.client.websocket(
                path, params=params, protocols=upstream_protocols
            )
        except (ApiError, Unreachable) as e:
            raise self._upstream_error(located, e) from e
        try:
            session.transport.write(
                b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                b"Upgrade: SPDY/3.1\r\n"
                + (f"X-Stream-Protocol-Version: {protocol}\r\n".encode() if offered else b"")
                + b"\r\n"
            )
            REQUESTS.labels(kind, "relayed").inc()
            log.info(
                "%s to %s/%s relayed to %s/%s in target %s protocol=%s (SPDY) upstream=%s",
                kind,
                namespace,
                name,
                *_names(located),
                located.target,
                protocol,
                upstream.protocol,
            )
            await bridge(
                session,
                upstream,
                head.url.query,
                tty=head.url.query.get("tty") in TRUE,
                protocol=protocol,
                target=located.target,
            )
        finally:
            await upstream.close()
            await session.close()

    async def _check_container(self, located: Located, container: str) -> None:
        """Errors the target would give only as a failed handshake, in words."""
        try:
            pod = await located.client.get(PODS, located.name, located.namespace)
        except (ApiError, Unreachable) as e:
            raise self._upstream_error(located, e) from e
        spec = pod.get("spec") or {}
        names = [c["name"] for c in spec.get("containers") or ()]
        names += [c["name"] for c in spec.get("initContainers") or ()]
        names += [c["name"] for c in spec.get("ephemeralContainers") or ()]
        if container not in names:
            raise KubeletError(
                400,
                f"container {container} is not found in delegate {located.namespace}/"
                f"{located.name} in target {located.target} (it has {', '.join(names)})",
            )
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        statuses += (pod.get("status") or {}).get("initContainerStatuses") or []
        statuses += (pod.get("status") or {}).get("ephemeralContainerStatuses") or []
        state = next((s.get("state") or {} for s in statuses if s.get("name") == container), {})
        if "running" not in state:
            waiting = state.get("waiting") or state.get("terminated") or {}
            why = waiting.get("reason") or "not started"
            raise KubeletError(
                400,
                f"container {container} of delegate {located.namespace}/{located.name} in "
                f"target {located.target} is not running: {why}",
            )


async def _refuse(request: web.Request, protocol: str, error: KubeletError) -> web.StreamResponse:
    """Accept the WebSocket only to say why not, on the error channel (kubectl prints it and
    does not retry over SPDY, as it would after a refused handshake)."""
    log.info("%s refused: %s", request.path, error.message)
    REQUESTS.labels(kind_of(request.path), "failed").inc()
    ws = web.WebSocketResponse(protocols=(protocol,))
    await ws.prepare(request)
    frame = status_frame(protocol, error.message, error.reason, error.status)
    if isinstance(frame, bytes):
        await ws.send_bytes(frame)
    else:
        await ws.send_str(frame)
    await ws.close()
    return ws


def _text(error: KubeletError, kind: str = "logs") -> web.Response:
    """The API server shows the body of a 400, 403 or 500 from a kubelet to the user (and
    only a generic sentence for other codes), so those are the codes we answer with."""
    status = error.status if error.status in (400, 403) else 500 if error.status >= 500 else 400
    REQUESTS.labels(kind, "failed").inc()
    return web.Response(status=status, text=error.message)


def _names(located: Located) -> tuple[str, str]:
    return located.namespace, located.name


SPDY_PATH = re.compile(r"/(exec|attach)/([^/]+)/([^/]+)/([^/]+)")
MAX_HEAD = 64 * 1024


@dataclass(frozen=True)
class RequestHead:
    method: str
    url: URL
    headers: CIMultiDict


def spdy_protocol(head: RequestHead) -> tuple[list[str], str]:
    """The stream protocols the client offers, and the one chosen (the best we speak)."""
    offered = [
        p.strip()
        for value in head.headers.getall("X-Stream-Protocol-Version", [])
        for p in value.split(",")
    ]
    protocol = next((p for p in SPDY_PROTOCOLS if p in offered), None)
    if offered and protocol is None:
        raise KubeletError(400, f"none of the stream protocols {offered} is supported")
    return offered, protocol or "channel.k8s.io"


def parse_head(data: bytes) -> RequestHead | None:
    """The request line and headers of an HTTP/1.1 request (None if it is not one)."""
    lines = data.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    headers: CIMultiDict = CIMultiDict()
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            return None
        headers.add(name.strip(), value.strip())
    try:
        url = URL(parts[1])
    except ValueError:
        return None
    return RequestHead(parts[0], url, headers)


class _Front(asyncio.Protocol):
    """The first request of a connection says who serves it: SPDY upgrades are ours (aiohttp
    knows only WebSocket ones), everything else goes to aiohttp."""

    def __init__(self, http: Any, on_spdy: Callable[[spdy.Session, RequestHead], None]) -> None:
        self.http = http
        self.on_spdy = on_spdy
        self.transport: Any = None
        self.buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD:
                self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\n\r\n")
                self.transport.close()
            return
        head = parse_head(bytes(self.buffer[:end]))
        upgrade = head.headers.get("Upgrade", "").lower() if head else ""
        if head is not None and upgrade.startswith("spdy/"):
            session = spdy.Session(self.transport)
            self.transport.set_protocol(session)
            session.data_received(bytes(self.buffer[end + 4 :]))
            self.on_spdy(session, head)
        else:
            handler = self.http()
            self.transport.set_protocol(handler)
            handler.connection_made(self.transport)
            handler.data_received(bytes(self.buffer))
        self.buffer = bytearray()

    def connection_lost(self, exc: Exception | None) -> None:
        pass


def _http_error(response: web.Response) -> bytes:
    body = response.text.encode() if response.text else b""
    return (
        f"HTTP/1.1 {response.status} {response.reason}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
