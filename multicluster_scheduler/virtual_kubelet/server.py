"""The kubelet API of the virtual nodes: ``kubectl logs``, ``exec`` and ``attach`` on proxy pods.

The API server answers ``kubectl logs/exec/attach`` by calling the kubelet of the pod's node, at
the node's address and ``daemonEndpoints`` port, over HTTPS with its kubelet client certificate.
For a proxy pod, that node is a virtual node and the kubelet is this server: it finds the pod's
delegate and asks the target's API server for the same thing (``pods/log``, ``pods/exec``,
``pods/attach``), streaming both ways.

Only the API server may call: TLS requires a client certificate from the cluster's client CA,
and the certificate's user must be allowed ``nodes/proxy`` (a SubjectAccessReview, cached), as
a kubelet in ``Webhook`` authorization mode requires.

Exec and attach are WebSocket streams (``v5.channel.k8s.io`` and earlier channel protocols),
relayed frame by frame to a WebSocket with the target's API server. Virtual nodes declare the
``ExtendWebSocketsToKubelet`` feature, so API servers from 1.36 pass kubectl's WebSocket
through to us instead of translating it to SPDY; SPDY requests are refused with a message that
says so.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import Counter
from yarl import URL

from multicluster import ApiError, Client, NotFound, Unreachable, metrics
from multicluster.resources import CONFIGMAPS, PODS, Resource

from ..api.proxy import is_deleting, parent_cluster
from ..targets.registry import TargetConnection, TargetRegistry
from ..webhook.certificates import new_ca
from . import spdy
from .serving import KubeletCertificates

log = logging.getLogger(__name__)

SUBJECT_ACCESS_REVIEWS = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
WEBSOCKETS_FEATURE = "ExtendWebSocketsToKubelet"
# Remote command protocols, newest first (what kubectl and the API servers speak).
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
ALLOWED_TTL = 300.0
DENIED_TTL = 30.0
TRUE = ("1", "true", "True")
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
        assert self.connection.cluster is not None
        return self.connection.cluster.client

    @property
    def namespace(self) -> str:
        return self.delegate["metadata"]["namespace"]

    @property
    def name(self) -> str:
        return self.delegate["metadata"]["name"]

    @property
    def target(self) -> str:
        return self.connection.name


def user_of(peercert: dict | None) -> tuple[str, list[str]]:
    """User name and groups of a verified client certificate (CN and O, as Kubernetes reads
    them)."""
    user, groups = "", []
    for rdn in (peercert or {}).get("subject") or ():
        for key, value in rdn:
            if key == "commonName":
                user = value
            elif key == "organizationName":
                groups.append(value)
    return user, groups


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


class Authorizer:
    """Whether a client certificate's user may use the kubelet API (``nodes/proxy``), asked of
    the local API server and remembered for a while, as the kubelet's webhook authorizer does."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._cache: dict[tuple, tuple[float, str | None]] = {}

    async def refusal(self, user: str, groups: list[str], verb: str) -> str | None:
        """None if allowed, else why not."""
        if not user:
            return "the client certificate names no user"
        key = (user, tuple(groups), verb)
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached and cached[0] > now:
            return cached[1]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": groups,
                "resourceAttributes": {"verb": verb, "resource": "nodes", "subresource": "proxy"},
            },
        }
        try:
            answer = await self.client.create(SUBJECT_ACCESS_REVIEWS, review)
        except (ApiError, Unreachable) as e:
            log.error("cannot review access of %s to the kubelet API: %s", user, e)
            return f"cannot check authorization: {e}"
        status = answer.get("status") or {}
        refusal = None
        if not status.get("allowed"):
            why = status.get("reason") or status.get("evaluationError") or ""
            refusal = f'user "{user}" may not {verb} nodes/proxy' + (f": {why}" if why else "")
        if len(self._cache) > 1024:
            self._cache.clear()
        self._cache[key] = (now + (ALLOWED_TTL if refusal is None else DENIED_TTL), refusal)
        return refusal


class KubeletServer:
    """The HTTPS kubelet API of every virtual node of this agent (one port, all nodes: the path
    names the pod, whose node names the target)."""

    def __init__(
        self,
        proxies: Any,  # the informer of bound proxy pods (PodSync.proxies)
        registry: TargetRegistry,
        authorizer: Authorizer | None,
        *,
        host: str,
        port: int,
        leading: Callable[[], bool] = lambda: True,
        cluster_name: str | None = None,
    ) -> None:
        self.cluster_name = cluster_name
        self.proxies = proxies
        self.registry = registry
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
    async def _authenticate(self, request: web.Request, handler) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        transport = request.transport
        user, groups = user_of(transport.get_extra_info("peercert") if transport else None)
        if self.authorizer is not None:
            verb = _verb(request.method, request.path)
            refusal = await self.authorizer.refusal(user, groups, verb)
            if refusal is not None:
                log.warning("kubelet API request refused path=%s: %s", request.path, refusal)
                REQUESTS.labels(_kind(request.path), "refused").inc()
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
        uid = proxy["metadata"]["uid"]
        # Ours only: in this namespace, made for this cluster (a co-tenant of a shared target
        # could label a pod with this uid; it would not get the session).
        delegates = [
            d
            for d in connection.delegates_of(uid)
            if not is_deleting(d)
            and d["metadata"].get("namespace") == namespace
            and (self.cluster_name is None or parent_cluster(d) == self.cluster_name)
        ]
        if not delegates:
            why = (
                f" (target {connection.name} is not ready: {connection.message})"
                if not connection.ready
                else ""
            )
            raise KubeletError(
                404,
                f"the delegate of pod {namespace}/{name} is not found in target "
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
                f"is not found in target {located.target}"
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

    def _streamer(self, kind: str):
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
                protocols=(protocol,), autoping=True, max_msg_size=0, compress=False
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
            await _relay(inbound, upstream, protocol, located.target)
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
            kind = _kind(head.url.path)
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
            verb = _verb(head.method, head.url.path)
            refusal = await self.authorizer.refusal(user, groups, verb)
            if refusal is not None:
                log.warning("kubelet API request refused path=%s: %s", head.url.path, refusal)
                REQUESTS.labels(kind, "refused").inc()
                raise KubeletError(403, f"Forbidden: {refusal}")
        offered = [
            p.strip()
            for value in head.headers.getall("X-Stream-Protocol-Version", [])
            for p in value.split(",")
        ]
        protocol = next((p for p in SPDY_PROTOCOLS if p in offered), None)
        if offered and protocol is None:
            raise KubeletError(400, f"none of the stream protocols {offered} is supported")
        protocol = protocol or "channel.k8s.io"
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
            await _bridge(
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


def lost(target: str) -> str:
    return (
        f"the stream from target {target} ended before the command's status came (the "
        "connection to the target was lost)"
    )


async def _relay(
    inbound: web.WebSocketResponse,
    upstream: aiohttp.ClientWebSocketResponse,
    protocol: str = "v5.channel.k8s.io",
    target: str = "",
) -> None:
    """Frames both ways until either side closes; then the other is closed too. A target that
    ends without the command's status (from v4 on, it always sends one) lost its connection:
    the caller is told so, not left to believe the command succeeded."""
    said = False  # the target sent the error channel: the command's status

    async def pump(source, sink, down: bool) -> None:
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
        for task in (down, up):
            task.cancel()
        for task in (down, up):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
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


async def _refuse(request: web.Request, protocol: str, error: KubeletError) -> web.StreamResponse:
    """Accept the WebSocket only to say why not, on the error channel (kubectl prints it and
    does not retry over SPDY, as it would after a refused handshake)."""
    log.info("%s refused: %s", request.path, error.message)
    REQUESTS.labels(_kind(request.path), "failed").inc()
    ws = web.WebSocketResponse(protocols=(protocol,))
    await ws.prepare(request)
    frame = status_frame(protocol, error.message, error.reason, error.status)
    if isinstance(frame, bytes):
        await ws.send_bytes(frame)
    else:
        await ws.send_str(frame)
    await ws.close()
    return ws


def _verb(method: str, path: str) -> str:
    """What a caller must be allowed on ``nodes/proxy``: ``create`` to run or attach to
    anything (whether the upgrade came as GET or POST), ``get`` to read logs."""
    if _kind(path) in ("exec", "attach") or method not in ("GET", "HEAD"):
        return "create"
    return "get"


def _kind(path: str) -> str:
    kind = path.strip("/").split("/", 1)[0]
    return {"containerLogs": "logs", "exec": "exec", "attach": "attach"}.get(kind, "other")


def _text(error: KubeletError, kind: str = "logs") -> web.Response:
    """The API server shows the body of a 400, 403 or 500 from a kubelet to the user (and
    only a generic sentence for other codes), so those are the codes we answer with."""
    status = error.status if error.status in (400, 403) else 500 if error.status >= 500 else 400
    REQUESTS.labels(kind, "failed").inc()
    return web.Response(status=status, text=error.message)


def _names(located: Located) -> tuple[str, str]:
    return located.namespace, located.name


SPDY_PATH = re.compile(r"/(exec|attach)/([^/]+)/([^/]+)/([^/]+)")
SPDY_PROTOCOLS = ("v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io")
STREAM_WAIT = 30.0  # how long the client has to open its streams, as a kubelet gives it
MAX_HEAD = 64 * 1024
MAX_RESIZE = 4096  # bytes of one terminal size on the SPDY resize stream


@dataclass(frozen=True)
class RequestHead:
    method: str
    url: URL
    headers: CIMultiDict


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

    def connection_made(self, transport) -> None:
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


async def _bridge(
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
    expected = {"error"}
    if query.get("input") in TRUE:
        expected.add("stdin")
    if query.get("output") in TRUE:
        expected.add("stdout")
    if query.get("error") in TRUE and not tty:
        expected.add("stderr")
    streams: dict[str, spdy.Stream] = {}
    arrived = asyncio.Event()

    def on_stream(stream: spdy.Stream) -> None:
        streams[stream.kind] = stream
        if expected <= streams.keys():
            arrived.set()
        if stream.kind in ("stdin", "resize"):
            pumps.append(asyncio.create_task(client_to_target(stream)))

    async def client_to_target(stream: spdy.Stream) -> None:
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

    pumps: list[asyncio.Task] = []
    session.on_stream = on_stream
    session.start()
    for stream in list(session.streams.values()):
        on_stream(stream)
    try:
        async with asyncio.timeout(STREAM_WAIT):
            await arrived.wait()
    except TimeoutError:
        log.info("SPDY client opened %s of %s streams in time", sorted(streams), sorted(expected))
        return
    channels = {1: "stdout", 2: "stderr", 3: "error"}

    said = False  # the target sent the command's status

    async def target_to_client() -> None:
        nonlocal said
        async for message in upstream:
            if message.type != aiohttp.WSMsgType.BINARY or not message.data:
                continue
            data: bytes = message.data
            if data[0] == 255 and len(data) > 1:  # v5: the target closed a channel
                stream = streams.get(channels.get(data[1], ""))
                if stream is not None:
                    await stream.close()
                continue
            stream = streams.get(channels.get(data[0], ""))
            said = said or data[0] == 3
            if stream is not None and len(data) > 1:
                await stream.write(data[1:])

    down = asyncio.create_task(target_to_client())
    gone = asyncio.create_task(session.closed.wait())
    try:
        await asyncio.wait((down, gone), return_when=asyncio.FIRST_COMPLETED)
        abnormal = upstream.close_code not in (None, aiohttp.WSCloseCode.OK)
        ended = down.done() and not session.closed.is_set()
        if ended and not said and (protocol == "v4.channel.k8s.io" or abnormal):
            frame = status_frame(protocol, lost(target), "InternalError", 500)
            assert isinstance(frame, bytes)
            await streams["error"].write(frame[1:])
    finally:
        for task in (down, gone, *pumps):
            task.cancel()
        for task in (down, gone, *pumps):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def server_context(cert_file, key_file, client_ca_pem: bytes) -> ssl.SSLContext:
    """TLS that requires a client certificate from the cluster's client CA."""
    # Only the client CA: never the system's public CAs (load_default_certs).
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=client_ca_pem.decode())
    return context


CLIENT_CA_NAMESPACE = "kube-system"
CLIENT_CA_CONFIGMAP = "extension-apiserver-authentication"
CLIENT_CA_KEY = "client-ca-file"
RETRY = 10.0
CLIENT_CA_FILE_CHECK = 60.0
SHUTDOWN_TIMEOUT = 1.0


class KubeletApi:
    """The kubelet API as the agent runs it: the client CA and a serving certificate first
    (retried until they can be had, without holding up the rest of the agent), then the server,
    with the certificate renewed and new client CAs trusted as they appear."""

    def __init__(
        self,
        client: Client,
        proxies: Any,
        registry: TargetRegistry,
        *,
        host: str,
        port: int,
        address: str,
        node_name: str,
        signer: str | None,
        client_ca_file: Any,
        cert_dir: Any,
        ca: Any,
        leading: Callable[[], bool],
        cluster_name: str | None = None,
    ) -> None:
        self.client = client
        self.address = address
        self.node_name = node_name
        self.signer = None if (signer or "none").lower() == "none" else signer
        self.client_ca_file = client_ca_file
        self.cert_dir = cert_dir
        self.ca = ca
        self.server = KubeletServer(
            proxies,
            registry,
            Authorizer(client),
            host=host,
            port=port,
            leading=leading,
            cluster_name=cluster_name,
        )
        self.certificates: KubeletCertificates | None = None

    async def client_ca(self) -> bytes:
        """The CA of client certificates the API server presents (its kubelet client one)."""
        if self.client_ca_file:
            return await asyncio.to_thread(_read, self.client_ca_file)
        configmap = await self.client.get(CONFIGMAPS, CLIENT_CA_CONFIGMAP, CLIENT_CA_NAMESPACE)
        pem = (configmap.get("data") or {}).get(CLIENT_CA_KEY)
        if not pem:
            raise KubeletError(
                500, f"{CLIENT_CA_NAMESPACE}/{CLIENT_CA_CONFIGMAP} has no {CLIENT_CA_KEY}"
            )
        return pem.encode()

    async def _prepare(self) -> tuple[ssl.SSLContext, bytes]:
        client_ca = await self.client_ca()
        self.certificates = KubeletCertificates(
            client=self.client,
            node_name=self.node_name,
            addresses=[self.address],
            signer=self.signer,
            cert_dir=self.cert_dir,
            ca=self.ca or new_ca("multicluster-scheduler-kubelet-ca"),
        )
        await self.certificates.obtain()
        certificates = self.certificates
        context = server_context(certificates.cert_file, certificates.key_file, client_ca)
        certificates.on_reload(
            lambda cert, key: (self.server.context or context).load_cert_chain(cert, key)
        )
        log.info(
            "kubelet API certificate issued by %s%s",
            certificates.issuer,
            f" ({certificates.fallback_reason})" if certificates.fallback_reason else "",
        )
        return context, client_ca

    async def run(self) -> None:
        while True:
            try:
                context, client_ca = await self._prepare()
                break
            except (ApiError, Unreachable, KubeletError, OSError, ValueError) as e:
                log.error("kubelet API not served yet (logs, exec and attach): %s", e)
                await asyncio.sleep(RETRY)
        assert self.certificates is not None
        background = [
            asyncio.create_task(_logged(self.certificates.renew_forever(), "certificate renewal")),
            asyncio.create_task(_logged(self._follow_client_ca(client_ca), "client CA")),
        ]
        try:
            while True:
                try:
                    await self.server.serve(self.server.context or context)
                except OSError as e:
                    log.error(
                        "kubelet API cannot listen on %s:%d: %s",
                        self.server.host or "*",
                        self.server.port,
                        e,
                    )
                    await asyncio.sleep(RETRY)
        finally:
            for task in background:
                task.cancel()

    async def _follow_client_ca(self, known: bytes) -> None:
        """Trust the client CA the cluster publishes now, and only that one: a rotated-out CA
        stops being trusted (its ConfigMap is watched; a file is looked at every minute)."""
        while True:
            try:
                async for current in self._client_cas():
                    if current != known:
                        await self._trust(current)
                        known = current
                continue  # the watch ended as watches do: again
            except (ApiError, Unreachable, KubeletError, OSError) as e:
                log.warning("cannot follow the client CA, retrying: %s", e)
            await asyncio.sleep(RETRY)

    async def _client_cas(self):
        if self.client_ca_file:
            while True:
                await asyncio.sleep(CLIENT_CA_FILE_CHECK)
                yield await asyncio.to_thread(_read, self.client_ca_file)
        async for event in self.client.watch(
            CONFIGMAPS,
            CLIENT_CA_NAMESPACE,
            field_selector=f"metadata.name={CLIENT_CA_CONFIGMAP}",
            bookmarks=False,
        ):
            data = (event.get("object") or {}).get("data") or {}
            if event.get("type") in ("ADDED", "MODIFIED") and data.get(CLIENT_CA_KEY):
                yield data[CLIENT_CA_KEY].encode()

    async def _trust(self, client_ca: bytes) -> None:
        certificates = self.certificates
        assert certificates is not None
        try:
            context = server_context(certificates.cert_file, certificates.key_file, client_ca)
        except (ssl.SSLError, ValueError) as e:
            log.error("the cluster's client CA is not usable, keeping the previous one: %s", e)
            return
        await self.server.use_context(context)
        log.info("kubelet API trusts the cluster's current client CA")


async def _logged(work, what: str) -> None:
    """Run a background loop; say so if it ever fails (instead of a silent dead task)."""
    try:
        await work
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("kubelet API %s stopped", what)


def _read(path: Any) -> bytes:
    with open(path, "rb") as f:
        return f.read()
