"""An asynchronous REST client for one API server: aiohttp on the wire, plain dicts via orjson.

The official client's generated models cost far too much per object for thousands of pods, so
objects stay the JSON the server sent. Every verb controllers need is here (get, paginated
list, watch, create, update, the four patch types, delete, subresources), with typed errors and
client-side QPS/burst limits like client-go's.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import aiohttp
import orjson

from . import metrics
from .config import ClusterConfig
from .errors import ApiError, NotFound, Unreachable, error_for
from .ratelimit import TokenBucket
from .resources import PODS, Resource


def describe(error: BaseException) -> str:
    """Why a server did not answer, in words (not the exception's repr)."""
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
    return str(error) or type(error).__name__


log = logging.getLogger(__name__)

PatchType = Literal["merge", "strategic", "json", "apply"]
PATCH_CONTENT_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}
USER_AGENT = "multicluster/0.1"


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
        max_connections: int = 64,
    ) -> None:
        self.config = config
        self.name = name or config.server
        self.timeout = timeout
        self._limiter = TokenBucket(qps, burst)
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._watch_session: aiohttp.ClientSession | None = None

    def _new_session(self, limit: int) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            ssl=self.config.ssl_context if self.config.ssl_context else False,
            limit=limit,
            ttl_dns_cache=300,
        )
        return aiohttp.ClientSession(
            connector=connector,
            json_serialize=lambda o: orjson.dumps(o).decode(),
            headers={"User-Agent": USER_AGENT},
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        """Requests: at most ``max_connections`` at once (each TLS connection holds buffers;
        hundreds of idle ones after a burst are memory for nothing)."""
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
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        raw: bool = False,
        timeout: float | None = None,
    ) -> Any:
        """Send one request; return the decoded JSON body (or bytes when ``raw``)."""
        await self.config.refresh_token()
        await self._limiter.acquire()
        data = None
        if body is not None:
            data = body if isinstance(body, bytes | str) else orjson.dumps(body)
        query = _query(params)
        for attempt in (0, 1):
            started = time.perf_counter()
            try:
                async with self.session.request(
                    method,
                    self.config.server + path,
                    params=query,
                    data=data,
                    headers=self._headers(content_type if data is not None else None),
                    timeout=aiohttp.ClientTimeout(total=timeout or self.timeout),
                    server_hostname=self.config.tls_server_name,
                ) as resp:
                    payload = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                metrics.API_ERRORS.labels(self.name, "unreachable").inc()
                raise Unreachable(f"{method} {path} on {self.name}: {describe(e)}") from e
            finally:
                metrics.API_LATENCY.labels(self.name, method).observe(time.perf_counter() - started)
            if status == 401 and attempt == 0 and self.config.authorization():
                await self.config.refresh_token(force=True)
                continue
            break
        if status >= 400:
            metrics.API_ERRORS.labels(self.name, str(status)).inc()
            raise error_for(status, _decode(payload), f"{method} {path} on {self.name}")
        if raw:
            return payload
        return orjson.loads(payload) if payload else None

    # -- verbs --------------------------------------------------------------------------------

    async def get(
        self, resource: Resource, name: str, namespace: str | None = None, **params: Any
    ) -> dict:
        return await self.request("GET", resource.path(namespace, name), params=params)

    async def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
    ) -> tuple[list[dict], str]:
        """All items (following ``continue`` tokens) and the list's resourceVersion."""
        items: list[dict] = []
        version = ""
        async for page in self.list_pages(
            resource,
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            limit=limit,
        ):
            items.extend(page["items"] or ())
            version = page["metadata"].get("resourceVersion", "")
        return items, version

    async def list_pages(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
    ) -> AsyncIterator[dict]:
        params: dict[str, Any] = {
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "limit": limit,
        }
        while True:
            page = await self.request("GET", resource.path(namespace), params=params)
            yield page
            token = page["metadata"].get("continue")
            if not token:
                return
            params["continue"] = token

    async def watch(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        resource_version: str = "",
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        bookmarks: bool = True,
        idle_timeout: float | None = None,
        on_open=None,
    ) -> AsyncIterator[dict]:
        """Watch events as dicts ``{"type": ..., "object": ...}``; ends when the server ends it.

        An ``ERROR`` event with code 410 raises :class:`Gone`. ``idle_timeout`` ends a watch
        that has been silent that long (a watchdog for half-open connections). ``on_open`` is
        called once the server has accepted the watch.
        """
        await self.config.refresh_token()
        params = _query(
            {
                "watch": "true",
                "resourceVersion": resource_version or None,
                "allowWatchBookmarks": "true" if bookmarks else None,
                "labelSelector": label_selector,
                "fieldSelector": field_selector,
                "timeoutSeconds": timeout_seconds,
            }
        )
        path = resource.path(namespace)
        try:
            async with self.watch_session.get(
                self.config.server + path,
                params=params,
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self.timeout, sock_read=idle_timeout
                ),
                server_hostname=self.config.tls_server_name,
            ) as resp:
                if resp.status >= 400:
                    payload = await resp.read()
                    if resp.status == 401:
                        await self.config.refresh_token(force=True)
                    raise error_for(resp.status, _decode(payload), f"WATCH {path} on {self.name}")
                if on_open is not None:
                    on_open()
                buffer = b""
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    if b"\n" not in chunk:
                        continue
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if not line:
                            continue
                        event = orjson.loads(line)
                        if event.get("type") == "ERROR":
                            status = event.get("object") or {}
                            code = status.get("code", 500)
                            error = error_for(code, status, f"WATCH {path} on {self.name}")
                            raise error
                        yield event
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise Unreachable(f"WATCH {path} on {self.name}: {describe(e)}") from e

    async def create(
        self,
        resource: Resource,
        body: dict,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        name: str | None = None,
        **params: Any,
    ) -> dict:
        namespace = namespace or body.get("metadata", {}).get("namespace")
        path = resource.path(namespace, name, subresource) if subresource else None
        return await self.request(
            "POST", path or resource.path(namespace), params=params, body=body
        )

    async def update(
        self, resource: Resource, body: dict, *, subresource: str | None = None, **params: Any
    ) -> dict:
        meta = body["metadata"]
        path = resource.path(meta.get("namespace"), meta["name"], subresource)
        return await self.request("PUT", path, params=params, body=body)

    async def update_status(self, resource: Resource, body: dict) -> dict:
        return await self.update(resource, body, subresource="status")

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool | None = None,
    ) -> dict:
        params = {"fieldManager": field_manager, "force": _bool(force)}
        if patch_type == "apply" and not isinstance(patch, bytes | str):
            patch = orjson.dumps(patch)  # JSON is YAML
        return await self.request(
            "PATCH",
            resource.path(namespace, name, subresource),
            params=params,
            body=patch,
            content_type=PATCH_CONTENT_TYPES[patch_type],
        )

    async def delete(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        *,
        propagation_policy: str | None = None,
        grace_period_seconds: int | None = None,
        preconditions: dict | None = None,
        missing_ok: bool = False,
    ) -> dict | None:
        """Delete an object; with ``missing_ok``, one already gone is not an error."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if preconditions:
            options["preconditions"] = preconditions
        try:
            return await self.request("DELETE", resource.path(namespace, name), body=options)
        except NotFound:
            if missing_ok:
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
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise Unreachable(f"GET {path} on {self.name}: {describe(e)}") from e
        try:
            if resp.status >= 400:
                payload = await resp.read()
                if resp.status == 401:
                    await self.config.refresh_token(force=True)
                raise error_for(resp.status, _decode(payload), f"GET {path} on {self.name}")
            yield resp
        finally:
            resp.release()

    async def websocket(
        self, path: str, *, params: Any = None, protocols: list[str] | tuple[str, ...] = ()
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
                max_msg_size=0,
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
        return error_for(handshake.status, handshake.message, context)

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


def _decode(payload: bytes) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload.decode(errors="replace")[:500]
