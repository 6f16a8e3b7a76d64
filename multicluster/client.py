"""An asynchronous REST client for one API server: aiohttp on the wire, plain dicts via orjson.

The official client's generated models cost far too much per object for thousands of pods, so
objects stay the JSON the server sent. Every verb controllers need is here (get, paginated
list, watch, create, update, the four patch types, delete, subresources), with typed errors and
client-side QPS/burst limits like client-go's (waiters let through namespace by namespace, in
turn).

A server that is not trusted (a kubeconfig in a Secret points wherever its writer likes) is read
within the :class:`~.readlimits.ReadLimits` the client is given, and paused when it answers as
no API server does (:mod:`.badanswers`); the agent's own API server is read without limits, as
client-go reads it. Whoever the server is, redirects are never followed (no API server sends
them for these calls, and following one would take the request, and its answer, anywhere), and
watch lines are split as chunks come, in time linear in their size, however long a line is.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Unpack

import aiohttp
import orjson
from yarl import URL

from . import metrics
from .badanswers import BadAnswers
from .config import ClusterConfig
from .errors import (
    ApiError,
    BadResponse,
    NamespaceTerminating,
    NotFound,
    ResponseTooLarge,
    Unreachable,
    error_for,
    phrase,
    status_of,
)
from .ratelimit import FairLimiter
from .readlimits import ReadLimits, Slot, holding
from .resources import PODS, Resource


def flow_of(path: str) -> str:
    """The namespace a request's path names ("" for cluster-scoped ones): its flow for the
    client's fair QPS limit (API Priority and Fairness's ``ByNamespace``)."""
    _, found, rest = path.partition("/namespaces/")
    return rest.partition("/")[0] if found else ""


class RedirectRefused(aiohttp.ClientError):
    """The server sent a request elsewhere (a redirect): not followed."""


def describe(error: BaseException) -> str:
    """Why a server did not answer, in words (not the exception's repr)."""
    if isinstance(error, RedirectRefused):
        return "the server redirects to another address: not followed"
    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        cause = error.certificate_error
        why = getattr(cause, "verify_message", None) or (
            cause.args[-1] if getattr(cause, "args", None) else str(cause)
        )
        return f"the server's TLS certificate is not trusted: {why}"
    if isinstance(error, aiohttp.ClientConnectorError):
        why = error.os_error.strerror or str(error.os_error) or type(error.os_error).__name__
        return f"cannot connect to {error.host}:{error.port}: {why}"
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    if isinstance(error, aiohttp.ClientSSLError | aiohttp.ClientConnectorSSLError):
        return f"TLS failed: {error}"
    if isinstance(error, TimeoutError):
        return "no answer in time"
    # The parser's messages quote what the server sent (a status line, a chunk header): an
    # address that is not an API server would have its first bytes shown to whoever reads this.
    if isinstance(error, aiohttp.ClientResponseError):
        return "the answer is not valid HTTP (not quoted)"
    if isinstance(error, aiohttp.ClientPayloadError):
        return "the answer's body is malformed or cut short (not quoted)"
    return str(error) or type(error).__name__


def size(n: int) -> str:
    """Bytes in words: ``32 MiB``."""
    for unit in ("bytes", "KiB", "MiB"):
        if n < 1024 or n % 1024:
            return f"{n} {unit}"
        n //= 1024
    return f"{n} GiB"


log = logging.getLogger(__name__)

PatchType = Literal["merge", "strategic", "json", "apply"]
PATCH_CONTENT_TYPES: dict[PatchType, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}
USER_AGENT = "multicluster/0.1"

ERROR_BODY_BYTES = 1 << 20
# An idle connection is kept this long (aiohttp's default is 15 s): requests made every 20 s
# (heartbeats to each target) would otherwise each open a new TLS connection, 2 ms of CPU more
# than a request on an open one. Under the 60 s after which load balancers in front of API
# servers commonly drop idle connections.
KEEPALIVE_S = 50.0
"""An error's body, read to find a Status in it (a Status is a few KiB at most)."""
PAGE_SHRINK = 4
"""How much smaller a page is asked again when it was over its limit."""
WEBSOCKET_FRAME_BYTES = 4 << 20
"""One WebSocket message of exec or attach: the streams send a few tens of KiB at a time."""
PAGE_LIMIT = 500
WATCH_TIMEOUT = 300  # seconds the server keeps a watch open, unless asked otherwise
"""Objects a list page holds, unless the caller asks otherwise."""


class RequestOptions(TypedDict, total=False):
    """What one request says besides its method and path: query ``params``, a ``body`` of
    ``content_type`` (JSON by default), a ``timeout`` (the client's by default) and the most
    bytes its answer may have (``max_bytes``)."""

    params: dict[str, Any] | None
    body: Any
    content_type: str
    timeout: float | None
    max_bytes: int | None


class ListOptions(TypedDict, total=False):
    """What a list asks besides its resource and namespace: selectors, and ``limit`` objects a
    page (:data:`PAGE_LIMIT` by default)."""

    label_selector: str | None
    field_selector: str | None
    limit: int


class WatchOptions(TypedDict, total=False):
    """What a watch asks besides its resource and namespace: the events after
    ``resource_version``, selectors, how long the server keeps it open (``timeout_seconds``,
    300 by default), bookmarks (asked by default), an ``idle_timeout`` that ends a watch silent
    that long, and ``on_open``, called once the server has accepted the watch."""

    resource_version: str
    label_selector: str | None
    field_selector: str | None
    timeout_seconds: int
    bookmarks: bool
    idle_timeout: float | None
    on_open: Callable[[], object] | None


VERB_METHODS = {
    "get": "GET",
    "create": "POST",
    "update": "PUT",
    "patch": "PATCH",
    "delete": "DELETE",
}


@dataclass(frozen=True)
class Call:
    """One verb on an object (or, to create one, on its collection) of a resource: what every
    verb of :class:`Client` sends through :meth:`Client.call`, the one place a fake client
    (:mod:`.testing`) answers instead of a server."""

    verb: str  # get, create, update, patch or delete
    resource: Resource
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None

    @property
    def method(self) -> str:
        return VERB_METHODS[self.verb]

    @property
    def path(self) -> str:
        return self.resource.path(self.namespace, self.name, self.subresource)


class WriteOptions(TypedDict, total=False):
    """What a create or an update says besides its body: a ``subresource`` (``status``,
    ``binding``), the ``name`` of the object a created subresource belongs to, and query
    ``params`` (``dryRun``)."""

    subresource: str | None
    name: str | None
    params: dict[str, Any]


class PatchOptions(TypedDict, total=False):
    """What a patch says besides its body: its type (a merge patch by default), a
    ``subresource``, and for server-side apply the ``field_manager`` and ``force``."""

    patch_type: PatchType
    subresource: str | None
    field_manager: str | None
    force: bool | None


class DeleteOptions(TypedDict, total=False):
    """What a delete asks: a ``propagation_policy``, a ``grace_period_seconds``,
    ``preconditions`` (``uid``, ``resourceVersion``); with ``missing_ok``, an object already
    gone is not an error."""

    propagation_policy: str | None
    grace_period_seconds: int | None
    preconditions: dict | None
    missing_ok: bool


class Client:
    """REST access to one cluster. Create it inside the running event loop's lifetime."""

    def __init__(
        self,
        config: ClusterConfig,
        *,
        name: str = "",
        qps: float = 50.0,
        burst: int = 100,
        timeout: float = 30.0,
        max_connections: int = 16,
        read_limits: ReadLimits | None = None,
    ) -> None:
        self.config = config
        self.name = name or config.server
        self.timeout = timeout
        # Requests wait for the QPS limit and for one of ``max_connections`` seats namespace by
        # namespace, in turn (fair queuing), never in aiohttp's queue (first come, first served).
        # Few seats: more requests under way at once would only wait inside a busy API server,
        # where no namespace's turn is kept (16 at 100 ms of round trip: 160 requests a second).
        self._limiter = FairLimiter(qps, burst, seats=max_connections)
        # None: a trusted server, read without limits and never paused.
        self.limits = read_limits
        self.bad_answers = BadAnswers(self.name) if read_limits else None
        self._event_rate = read_limits.events() if read_limits else None
        self._own_slot = asyncio.Lock()  # this client's one large answer at a time
        self._origin = URL(config.server).origin()
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._watch_session: aiohttp.ClientSession | None = None

    def _new_session(self, limit: int) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            ssl=self.config.ssl_context if self.config.ssl_context else False,
            limit=limit,
            ttl_dns_cache=300,
            keepalive_timeout=KEEPALIVE_S,
        )
        return aiohttp.ClientSession(
            connector=connector,
            json_serialize=lambda o: orjson.dumps(o).decode(),
            headers={"User-Agent": USER_AGENT},
            middlewares=(self._this_server_only,),
        )

    async def _this_server_only(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        """Every request, redirects included, goes to this server: aiohttp follows redirects
        of WebSocket handshakes whatever is asked, and the others are asked not to anyway."""
        if request.url.origin() != self._origin:
            raise RedirectRefused(request.url)
        return await handler(request)

    @property
    def session(self) -> aiohttp.ClientSession:
        """Requests: at most ``max_connections`` at once (each TLS connection holds buffers;
        hundreds of idle ones after a burst are memory for nothing), as many as seats."""
        if self._session is None or self._session.closed:
            self._session = self._new_session(self.max_connections)
        return self._session

    @property
    def watch_session(self) -> aiohttp.ClientSession:
        """Watches: one connection each for as long as it lasts, never queued behind requests."""
        if self._watch_session is None or self._watch_session.closed:
            self._watch_session = self._new_session(0)
        return self._watch_session

    async def close(self) -> None:
        for session in (self._session, self._watch_session):
            if session is not None:
                await session.close()
        self._session = self._watch_session = None

    def _headers(self, content_type: str | None = None, accept: str | None = None) -> dict:
        headers = {"Accept": accept or "application/json"}
        token = self.config.authorization()
        if token:
            headers["Authorization"] = token
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(
        self, method: str, path: str, *, raw: bool = False, **options: Unpack[RequestOptions]
    ) -> Any:
        """Send one request; return the decoded JSON body (or bytes when ``raw``). An answer
        over ``max_bytes`` (default: the limits' ``max_response_bytes``, none for a trusted
        server) raises :class:`ResponseTooLarge`; from a server that is not trusted, any answer
        no API server gives pauses it (:mod:`.badanswers`)."""
        context = f"{method} {path} on {self.name}"
        self._check(context)
        try:
            async with holding(self.limits, self._own_slot) as slot:
                payload = await self._request(method, path, slot=slot, **options)
                if raw:
                    return bytes(payload)
                return self._json(payload, context)
        except BadResponse as e:
            if not raw:  # a log is data, not an API object: its size is the caller's choice
                self._record(e)
            raise

    def _check(self, context: str) -> None:
        if self.bad_answers is not None:
            self.bad_answers.check(context)

    def _record(self, error: BadResponse) -> None:
        if self.bad_answers is not None:
            self.bad_answers.record(error)

    async def _request(
        self, method: str, path: str, *, slot: Slot | None = None, **options: Unpack[RequestOptions]
    ) -> bytearray:
        """The body of a 2xx answer; raises the error of any other. Past the limits' ``small``
        bytes, the body is read only once ``slot`` is held (when the server is not trusted)."""
        max_bytes = options.get("max_bytes")
        if max_bytes is None and self.limits is not None:
            max_bytes = self.limits.max_response_bytes
        await self.config.refresh_token()
        data = _encoded(options.get("body"))
        content_type = options.get("content_type", "application/json")
        timeout = options.get("timeout") or self.timeout
        query = _query(options.get("params"))
        # A token and a seat (one of max_connections): requests that wait for either go
        # namespace by namespace, in turn, not first come first served.
        async with self._limiter.hold(flow_of(path)):
            for attempt in (0, 1):
                started = time.perf_counter()
                try:
                    async with self.session.request(
                        method,
                        self.config.server + path,
                        params=query,
                        data=data,
                        headers=self._headers(content_type if data is not None else None),
                        timeout=aiohttp.ClientTimeout(total=timeout),
                        server_hostname=self.config.tls_server_name,
                        allow_redirects=False,
                    ) as resp:
                        status = resp.status
                        if status >= 300:
                            payload = await _read(resp, ERROR_BODY_BYTES)
                        else:
                            small = self.limits.small if self.limits else 0
                            payload = await _read(resp, max_bytes, slot, small)
                except (aiohttp.ClientError, TimeoutError, OSError) as e:
                    metrics.API_ERRORS.labels(self.name, "unreachable").inc()
                    raise Unreachable(f"{method} {path} on {self.name}: {describe(e)}") from e
                finally:
                    metrics.API_LATENCY.labels(self.name, method).observe(
                        time.perf_counter() - started
                    )
                if status == 401 and attempt == 0 and self.config.authorization():
                    await self.config.refresh_token(force=True)
                    continue
                break
        context = f"{method} {path} on {self.name}"
        if status >= 300:
            error = _error(status, payload, context)
            # A create in a namespace being deleted is refused with a 403 that no missing
            # permission causes: counted apart, so that 403s keep meaning RBAC.
            code = "namespace-terminating" if isinstance(error, NamespaceTerminating) else status
            metrics.API_ERRORS.labels(self.name, str(code)).inc()
            raise error
        if payload is None:
            metrics.API_ERRORS.labels(self.name, "too-large").inc()
            raise ResponseTooLarge(
                f"{context}: the answer is over {size(max_bytes or 0)} (not read further)"
            )
        return payload

    def _json(self, payload: bytes | bytearray, context: str) -> Any:
        if not payload:
            return None
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise BadResponse(f"{context}: the answer is not JSON (not quoted)") from None

    # -- verbs --------------------------------------------------------------------------------

    async def get(
        self, resource: Resource, name: str, namespace: str | None = None, **params: Any
    ) -> dict:
        return await self.call(Call("get", resource, namespace, name), params=params)

    async def list(
        self, resource: Resource, namespace: str | None = None, **options: Unpack[ListOptions]
    ) -> tuple[list[dict], str]:
        """All items (following ``continue`` tokens) and the list's resourceVersion."""
        items: builtins.list[dict] = []
        version = ""
        async for page in self.list_pages(resource, namespace, **options):
            items.extend(page.get("items") or ())
            version = page["metadata"].get("resourceVersion", "")
        return items, version

    async def list_pages(
        self, resource: Resource, namespace: str | None = None, **options: Unpack[ListOptions]
    ) -> AsyncGenerator[dict, None]:
        """The pages of a list, as the server sends them. A page over ``max_response_bytes``
        is asked again with a quarter of the ``limit`` (and so are the pages after it), down
        to one object; all pages together may not exceed ``max_list_bytes``."""
        path = resource.path(namespace)
        context = f"GET {path} on {self.name}"
        params = _list_params(options)
        if self.limits is None:
            pages = self._pages(path, context, params)
        else:
            pages = self._bounded_pages(self.limits, path, context, params)
        async for page in self._pausing(context, pages):
            yield page

    async def _pausing(
        self, context: str, items: AsyncGenerator[dict, None]
    ) -> AsyncGenerator[dict, None]:
        """``items``, unless the server is paused; a bad answer among them pauses it."""
        self._check(context)
        try:
            async for item in items:
                yield item
        except BadResponse as e:
            self._record(e)
            raise

    async def _pages(
        self, path: str, context: str, params: dict[str, Any]
    ) -> AsyncGenerator[dict, None]:
        """The pages of a list from a trusted server, as client-go reads them."""
        while True:
            payload = await self._request("GET", path, params=params)
            page = _list_page(self._json(payload, context), context)
            del payload
            yield page
            if not _ask_next_page(page, params):
                return

    async def _bounded_pages(
        self, limits: ReadLimits, path: str, context: str, params: dict[str, Any]
    ) -> AsyncGenerator[dict, None]:
        """The pages of a list from a server that is not trusted: each within the limits, read
        while holding a slot once large, and used while it is held."""
        left = limits.max_list_bytes
        while True:
            async with holding(limits, self._own_slot) as slot:
                per_page = min(limits.max_response_bytes, left)
                try:
                    payload = await self._request(
                        "GET", path, params=params, max_bytes=per_page, slot=slot
                    )
                except ResponseTooLarge:
                    if per_page < limits.max_response_bytes:
                        raise ResponseTooLarge(
                            f"{context}: the list is over {size(limits.max_list_bytes)}"
                            " (not read further)"
                        ) from None
                    params["limit"] = self._smaller_pages(context, params["limit"], per_page)
                    continue
                left -= len(payload)
                page = _list_page(self._json(payload, context), context)
                del payload
                yield page  # used while the slot is held
            if not _ask_next_page(page, params):
                return

    def _smaller_pages(self, context: str, limit: int, per_page: int) -> int:
        """The page size to ask for after a page over ``per_page`` bytes at ``limit``."""
        if limit <= 1:
            raise ResponseTooLarge(
                f"{context}: one object is over {size(per_page)} (not read further)"
            )
        limit = max(1, limit // PAGE_SHRINK)
        log.info(
            "list page over the size limit, asking for smaller pages cluster=%s context=%r "
            "limit=%d",
            self.name,
            context,
            limit,
        )
        return limit

    async def watch(
        self, resource: Resource, namespace: str | None = None, **options: Unpack[WatchOptions]
    ) -> AsyncGenerator[dict, None]:
        """Watch events as dicts ``{"type": ..., "object": ...}``; ends when the server ends it.

        An ``ERROR`` event with code 410 raises :class:`Gone`. ``idle_timeout`` ends a watch
        that has been silent that long (a watchdog for half-open connections). ``on_open`` is
        called once the server has accepted the watch. An event over ``max_event_bytes``, or
        one that is not a JSON event, ends the watch with :class:`BadResponse`.
        """
        await self.config.refresh_token()
        params = _query(
            {
                "watch": "true",
                "resourceVersion": options.get("resource_version") or None,
                "allowWatchBookmarks": "true" if options.get("bookmarks", True) else None,
                "labelSelector": options.get("label_selector"),
                "fieldSelector": options.get("field_selector"),
                "timeoutSeconds": options.get("timeout_seconds", WATCH_TIMEOUT),
            }
        )
        path = resource.path(namespace)
        context = f"WATCH {path} on {self.name}"
        idle_timeout, on_open = options.get("idle_timeout"), options.get("on_open")
        events = self._events(path, context, params, idle_timeout, on_open)
        async for event in self._pausing(context, events):
            yield event

    async def _events(
        self,
        path: str,
        context: str,
        params: Any,
        idle_timeout: float | None,
        on_open: Callable[[], object] | None,
    ) -> AsyncGenerator[dict, None]:
        try:
            async with self.watch_session.get(
                self.config.server + path,
                params=params,
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self.timeout, sock_read=idle_timeout
                ),
                server_hostname=self.config.tls_server_name,
                allow_redirects=False,
            ) as resp:
                if resp.status >= 300:
                    payload = await _read(resp, ERROR_BODY_BYTES)
                    if resp.status == 401:
                        await self.config.refresh_token(force=True)
                    raise _error(resp.status, payload, context)
                if on_open is not None:
                    on_open()
                async with holding(self.limits, self._own_slot) as slot:
                    async for event in self._lines(resp, context, slot):
                        yield event
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise Unreachable(f"{context}: {describe(e)}") from e

    async def _lines(
        self, resp: aiohttp.ClientResponse, context: str, slot: Slot | None
    ) -> AsyncGenerator[dict, None]:
        """The events of a watch, a line each. The line being received is kept in pieces and
        joined once its newline comes (linear in its length, however it is cut). From a server
        that is not trusted, a line may be ``max_event_bytes``; past ``small`` bytes held,
        reading waits for ``slot``, and the line must then be whole within ``hold`` seconds;
        lines come at ``event_rate`` bytes a second at most."""
        limits = self.limits
        limit = limits.max_event_bytes if limits else None
        small = limits.small if limits else 0
        loop = asyncio.get_running_loop()
        pieces: builtins.list[bytes] = []
        pending = 0  # bytes in pieces
        deadline: float | None = None  # while the slot is held
        while True:
            chunk = await self._chunk(resp, context, deadline)
            if not chunk:
                return
            if slot is not None and limits and not slot.held and pending + len(chunk) > small:
                await slot.take()
                deadline = loop.time() + limits.hold
            if b"\n" not in chunk:
                pending += len(chunk)
                if limit is not None and pending > limit:
                    resp.close()
                    raise _event_too_large(context, limit)
                pieces.append(chunk)
                continue
            lines = chunk.split(b"\n")
            if pieces:
                pieces.append(lines[0])
                lines[0] = b"".join(pieces)
                pieces.clear()
            rest = lines.pop()
            pending = len(rest)
            if rest:
                pieces.append(rest)
            for line in lines:
                if limit is not None and len(line) > limit:
                    resp.close()
                    raise _event_too_large(context, limit)
                if self._event_rate is not None and not self._event_rate.spend(len(line)):
                    resp.close()
                    raise BadResponse(
                        f"{context}: watch events come faster than "
                        f"{size(self._event_rate.rate)} a second (not read further)"
                    )
                if line:
                    yield _event(line, context)
            if limit is not None and pending > limit:
                resp.close()
                raise _event_too_large(context, limit)
            if slot is not None and slot.held and pending <= small:
                slot.release()
                deadline = None

    async def _chunk(
        self, resp: aiohttp.ClientResponse, context: str, deadline: float | None
    ) -> bytes:
        """The next bytes of a watch (empty at its end), before ``deadline`` if one is set."""
        if deadline is None:
            return await resp.content.readany()
        try:
            async with asyncio.timeout_at(deadline):
                return await resp.content.readany()
        except TimeoutError:
            resp.close()
            hold = self.limits.hold if self.limits else 0
            raise BadResponse(
                f"{context}: a large watch event took over {hold:.0f}s to arrive (not read further)"
            ) from None

    async def create(
        self,
        resource: Resource,
        body: dict,
        namespace: str | None = None,
        **options: Unpack[WriteOptions],
    ) -> dict:
        namespace = namespace or body.get("metadata", {}).get("namespace")
        subresource = options.get("subresource")
        name = options.get("name") if subresource else None  # a subresource of that object
        call = Call("create", resource, namespace, name, subresource)
        return await self.call(call, params=options.get("params"), body=body)

    async def update(self, resource: Resource, body: dict, **options: Unpack[WriteOptions]) -> dict:
        meta = body["metadata"]
        call = Call(
            "update", resource, meta.get("namespace"), meta["name"], options.get("subresource")
        )
        return await self.call(call, params=options.get("params"), body=body)

    async def call(self, call: Call, **options: Unpack[RequestOptions]) -> Any:
        """Send one verb (:class:`Call`) to the server; return the decoded answer."""
        return await self.request(call.method, call.path, **options)

    async def update_status(self, resource: Resource, body: dict) -> dict:
        return await self.update(resource, body, subresource="status")

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        **options: Unpack[PatchOptions],
    ) -> dict:
        params = {
            "fieldManager": options.get("field_manager"),
            "force": _bool(options.get("force")),
        }
        patch_type = options.get("patch_type", "merge")
        if patch_type == "apply" and not isinstance(patch, bytes | str):
            patch = orjson.dumps(patch)  # JSON is YAML
        return await self.call(
            Call("patch", resource, namespace, name, options.get("subresource")),
            params=params,
            body=patch,
            content_type=PATCH_CONTENT_TYPES[patch_type],
        )

    async def delete(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        **options: Unpack[DeleteOptions],
    ) -> dict | None:
        """Delete an object; with ``missing_ok``, one already gone is not an error."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if options.get("propagation_policy"):
            body["propagationPolicy"] = options["propagation_policy"]
        if options.get("grace_period_seconds") is not None:
            body["gracePeriodSeconds"] = options["grace_period_seconds"]
        if options.get("preconditions"):
            body["preconditions"] = options["preconditions"]
        try:
            return await self.call(Call("delete", resource, namespace, name), body=body)
        except NotFound:
            if options.get("missing_ok"):
                return None
            raise

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, params: Any = None, accept: str = "*/*"
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A GET whose body is read as it comes (a followed pod log), on a connection of its
        own. Opening it raises like :meth:`request`; reading it may raise aiohttp's errors."""
        await self.config.refresh_token()
        query = _query(params) if isinstance(params, dict) else params
        try:
            resp = await self.watch_session.get(
                self.config.server + path,
                params=query,
                headers=self._headers(accept=accept),
                timeout=aiohttp.ClientTimeout(total=None, connect=self.timeout),
                server_hostname=self.config.tls_server_name,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise Unreachable(f"GET {path} on {self.name}: {describe(e)}") from e
        try:
            if resp.status >= 300:
                payload = await _read(resp, ERROR_BODY_BYTES)
                if resp.status == 401:
                    await self.config.refresh_token(force=True)
                raise _error(resp.status, payload, f"GET {path} on {self.name}")
            yield resp
        finally:
            resp.release()

    async def websocket(
        self, path: str, *, params: Any = None, protocols: builtins.list[str] | tuple[str, ...] = ()
    ) -> aiohttp.ClientWebSocketResponse:
        """A WebSocket to the server (pods/exec, pods/attach) offering ``protocols``; the
        caller closes it. A refused handshake raises the error for its status."""
        await self.config.refresh_token()
        headers = self._headers()
        del headers["Accept"]
        try:
            return await self.watch_session.ws_connect(
                self.config.server + path,
                params=params,
                protocols=protocols,
                headers=headers,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=10.0),
                autoping=True,
                max_msg_size=WEBSOCKET_FRAME_BYTES,
                server_hostname=self.config.tls_server_name,
            )
        except aiohttp.WSServerHandshakeError as e:
            if e.status == 401:
                await self.config.refresh_token(force=True)
            raise await self._refusal(path, params, e) from e
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise Unreachable(f"{path} on {self.name}: {describe(e)}") from e

    async def _refusal(
        self, path: str, params: Any, handshake: aiohttp.WSServerHandshakeError
    ) -> ApiError:
        """The error of a refused WebSocket, with the server's words: aiohttp keeps only the
        status of the handshake, so the same request is made without the upgrade (the API
        server checks access and options before it looks for one)."""
        context = f"{path} on {self.name}"
        if handshake.status >= 400:
            try:
                await self.request("GET", path, params=params)
            except ApiError as probe:
                message = (probe.body or {}).get("message") or ""
                if probe.status == handshake.status and "upgrade" not in message.lower():
                    return error_for(probe.status, probe.body, context)
        return error_for(handshake.status, None, context)

    async def log(
        self, name: str, namespace: str, *, container: str | None = None, **params: Any
    ) -> str:
        payload = await self.request(
            "GET",
            PODS.path(namespace, name, "log"),
            params={"container": container, **params},
            raw=True,
        )
        return payload.decode(errors="replace")


def _bool(value: bool | None) -> str | None:
    return None if value is None else ("true" if value else "false")


def _query(params: Any) -> Any:
    """Query parameters as strings; a list of pairs (repeated keys) passes as it is."""
    if not params:
        return None
    if not isinstance(params, dict):
        return params
    return {
        k: (_bool(v) if isinstance(v, bool) else str(v)) for k, v in params.items() if v is not None
    }


async def _read(
    resp: aiohttp.ClientResponse,
    limit: int | None,
    slot: Slot | None = None,
    small: int = 0,
) -> bytearray | None:
    """The body, or None as soon as it is over ``limit`` bytes (one whose length says so is not
    read at all; the connection is then closed). Past ``small`` bytes, reading waits for
    ``slot``, within the request's timeout."""
    declared = resp.content_length
    if limit is None or declared is None or declared <= limit:
        body = bytearray()
        async for chunk in resp.content.iter_any():
            body += chunk
            if limit is not None and len(body) > limit:
                break
            if slot is not None and len(body) > small:
                await slot.take()
        else:
            return body
    resp.close()
    return None


def _encoded(body: Any) -> bytes | str | None:
    """A request's body as it is sent: bytes and text as they are, anything else as JSON."""
    if body is None or isinstance(body, bytes | str):
        return body
    return orjson.dumps(body)


def _list_params(options: ListOptions) -> dict[str, Any]:
    """The query of a list's first page."""
    return {
        "labelSelector": options.get("label_selector"),
        "fieldSelector": options.get("field_selector"),
        "limit": options.get("limit", PAGE_LIMIT),
    }


def _ask_next_page(page: dict, params: dict[str, Any]) -> bool:
    """Whether a list goes on after ``page``; when it does, ``params`` now ask for the next."""
    token = page["metadata"].get("continue")
    if token:
        params["continue"] = token
    return bool(token)


def _error(status: int, payload: bytes | bytearray | None, context: str) -> ApiError:
    """The error of an answer that is not a success: a redirect (which no API server sends
    for these calls, and which is never followed) or an error status."""
    if 300 <= status < 400:
        return BadResponse(f"{context}: the server redirects ({phrase(status)}): not followed")
    return error_for(status, _decode(payload), context)


# The one answer worth recognizing that is not a Status: Go's HTTPS servers say this, word for
# word, to plain HTTP. Saying that it was this constant tells nothing else about the server.
_PLAIN_HTTP_TO_HTTPS = b"Client sent an HTTP request to an HTTPS server."


def _decode(payload: bytes | bytearray | None) -> dict | None:
    """The Status in an error's body, or None (the body is then never quoted)."""
    if not payload:
        return None
    if payload.rstrip() == _PLAIN_HTTP_TO_HTTPS:
        message = "Client sent an HTTP request to an HTTPS server (the URL must be https://)"
        return {"kind": "Status", "message": message}
    try:
        return status_of(orjson.loads(payload))
    except orjson.JSONDecodeError:
        return None


def _list_page(page: Any, context: str) -> dict:
    if (
        type(page) is not dict
        or type(page.get("metadata")) is not dict
        or type(page.get("items") or []) is not list  # null or absent: empty
    ):
        raise BadResponse(f"{context}: the answer is not a list (not quoted)")
    return page


def _event(line: bytes, context: str) -> dict:
    """One watch event; an ``ERROR`` event raises its error."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise BadResponse(f"{context}: a watch event is not JSON (not quoted)") from None
    if (
        type(event) is not dict
        or type(event.get("type")) is not str
        or type(event.get("object")) is not dict
    ):
        raise BadResponse(f"{context}: a watch event is not an event (not quoted)")
    if event.get("type") == "ERROR":
        status = event["object"]
        code = status.get("code")
        if type(code) is not int or not 400 <= code <= 599:
            code = 500
        raise error_for(code, status, context)
    return event


def _event_too_large(context: str, limit: int) -> ResponseTooLarge:
    return ResponseTooLarge(f"{context}: a watch event is over {size(limit)} (not read further)")
