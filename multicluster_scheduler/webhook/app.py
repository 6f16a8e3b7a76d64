"""The webhook's HTTP application and server, with nothing of the agent's runtime: the agent's
webhook process imports only this (uvicorn, orjson and the mutation), so it stays small.

``/mutate`` answers the API server's AdmissionReviews for pods: an elected pod, on CREATE, is
admitted with the JSON patch that makes it a proxy pod (see ``mutation``), its saved manifest
sealed with a MAC under the agents' key for the namespace and the requesting user; a pod that
arrives with a saved manifest the webhook did not write for that request is refused (see
``reinvocation``); any other request is admitted unchanged. This is on the path of every pod
creation in enabled namespaces, so the application is a bare ASGI callable (no framework
routing per request), bodies are parsed raw with orjson (no model per request) and nothing
waits on an API call. A pod that cannot be patched is refused in the review (allowed false,
code 400, the reason), and a body that is not an admission.k8s.io/v1 AdmissionReview at all
gets an HTTP 400 that says why (whatever its content type: the body decides): never a 500.
Warnings in the review tell whoever creates an
elected pod what its delegate will lose (labels that become the same prefixed label).

It is served by uvicorn, as the agent's other endpoints, but without FastAPI: importing FastAPI
(and pydantic with it) makes the webhook's process half again as large (31 to 47 MiB measured),
for one route whose body must be parsed raw anyway. The health and metrics endpoints, where
neither counts, are FastAPI (:mod:`multicluster.health`).
"""

from __future__ import annotations

import asyncio.sslproto
import base64
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import Any

import orjson
import uvicorn

from multicluster_scheduler.api.manifest_mac import ManifestKey, seal
from multicluster_scheduler.webhook.mutation import is_elected, label_warnings, mutation_patch
from multicluster_scheduler.webhook.reinvocation import carries_saved_manifest, foreign_manifest

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
log = logging.getLogger("multicluster_scheduler.webhook.server")

RESULTS = ("allowed", "patched", "refused", "malformed")
MAX_BODY = 3 * 1024 * 1024  # the API server's own limit on an object is about 1.5 MiB
JSON_HEADERS = [(b"content-type", b"application/json")]
API_VERSION, KIND = "admission.k8s.io/v1", "AdmissionReview"


def review_response(
    uid: str,
    *,
    allowed: bool = True,
    patch: bytes | None = None,
    status: dict | None = None,
    warnings: list[str] | None = None,
) -> dict:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if patch is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(patch).decode()
    if status is not None:
        response["status"] = status
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def answer_review(body: bytes, key: ManifestKey, now: float | None = None) -> tuple[str, dict]:
    """Answer one AdmissionReview: the result (allowed, patched or refused) and the review.
    ``key`` seals the manifests saved, and checks those that pods arrive with, at ``now``
    (seconds since the epoch; default: the clock's).

    Raises ValueError when ``body`` is not an AdmissionReview (not JSON, no request.uid, an
    apiVersion or kind other than ``admission.k8s.io/v1`` ``AdmissionReview``: the only version
    the webhook configuration asks for, and the one the response is written in).
    """
    try:
        review = orjson.loads(body)
        request = review["request"]
        uid = request["uid"]
    except orjson.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    except (KeyError, TypeError) as e:
        raise ValueError(f"{type(e).__name__}: {e}") from None
    if not isinstance(uid, str):
        raise ValueError("request.uid is not a string")
    for field, wanted in (("apiVersion", API_VERSION), ("kind", KIND)):
        if review.get(field, wanted) != wanted:
            raise ValueError(f"{field} is {review[field]!r}, not {wanted!r}")
    kind = request.get("kind")
    if (
        not isinstance(kind, dict)
        or kind.get("kind") != "Pod"
        or request.get("operation") != "CREATE"
    ):
        return "allowed", review_response(uid)
    pod = request.get("object")
    namespace = request.get("namespace")
    user = request.get("userInfo")
    username = user.get("username") if isinstance(user, dict) else None
    now = time.time() if now is None else now
    try:
        if pod is None:
            raise ValueError("the request has no object")
        elected, carried = is_elected(pod), carries_saved_manifest(pod)
        if not elected and not carried:
            return "allowed", review_response(uid)
        if not isinstance(namespace, str) or not isinstance(username, str):
            raise ValueError("the request names no namespace or no user")
        if carried:
            foreign = foreign_manifest(pod, key, namespace=namespace, username=username, now=now)
            if foreign is not None:
                raise ValueError(foreign)
        if not elected:  # a pod with our own manifest, its elect annotation gone since
            return "allowed", review_response(uid)
        issued = int(now)

        def sealed(manifest: str) -> str:
            return seal(key, namespace, username, manifest, issued)

        ops = mutation_patch(pod, sealed)
    except ValueError as e:
        log.warning(
            "pod refused namespace=%s name=%s reason=%s",
            request.get("namespace"),
            request.get("name"),
            e,
        )
        return "refused", review_response(
            uid, allowed=False, status={"code": 400, "message": str(e)}
        )
    warnings = label_warnings(pod)
    if not ops:
        return "allowed", review_response(uid, warnings=warnings)
    return "patched", review_response(uid, patch=orjson.dumps(ops), warnings=warnings)


Count = Callable[[str], None]


def smaller_tls_buffers(size: int = 64 * 1024) -> None:
    """asyncio gives every TLS connection a 256 KiB read buffer: an agent holding a watch per
    informer on each of ten clusters, or a webhook the API server opens hundreds of connections
    to during a burst, pays tens of MiB for it. 64 KiB reads keep lists fast; the webhook's
    process, whose requests are a pod each, reads 16 KiB at a time (a TLS record at most).
    (Call it once, at the start of a process.)"""
    protocol = asyncio.sslproto.SSLProtocol
    if getattr(protocol, "max_size", 0) > size:
        protocol.max_size = size


def create_app(count: Count, key: ManifestKey, clock: Callable[[], float] = time.time) -> Callable:
    """The ASGI application: ``POST /mutate``; ``count(result)`` is called once per answer;
    ``key`` seals and checks saved manifests at ``clock()`` (seconds since the epoch)."""

    async def send_json(send: Send, status: int, body: dict, extra: tuple = ()) -> None:
        payload = orjson.dumps(body)
        headers = [*JSON_HEADERS, (b"content-length", str(len(payload)).encode()), *extra]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] != "/mutate":
            await send_json(send, 404, {"error": f"no such path: {scope['path']}"})
            return
        if scope["method"] != "POST":
            await send_json(
                send, 405, {"error": "POST an AdmissionReview to /mutate"}, ((b"allow", b"POST"),)
            )
            return
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                count("malformed")
                await send_json(send, 413, {"error": "not an AdmissionReview: too large"})
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        try:
            result, review = answer_review(b"".join(chunks), key, clock())
        except ValueError as e:
            count("malformed")
            await send_json(send, 400, {"error": f"not an AdmissionReview: {e}"})
            return
        count(result)
        await send_json(send, 200, review)

    return app


class _Server(uvicorn.Server):
    on_started: Callable[[], None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # Signals belong to the agent (or, in the child, to its pipe).
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_started is not None:
            self.on_started()


class WebhookServer:
    """The server in the caller's event loop; ``serve`` until ``server.should_exit``."""

    def __init__(
        self,
        host: str,
        port: int,
        cert_file: Path,
        key_file: Path,
        count: Count,
        manifest_key: ManifestKey,
    ):
        self.config = uvicorn.Config(
            create_app(count, manifest_key),
            host=host,
            port=port,
            ssl_certfile=str(cert_file),
            ssl_keyfile=str(key_file),
            log_level="warning",
            access_log=False,
            lifespan="off",
            interface="asgi3",
            timeout_graceful_shutdown=5,
        )
        self.server = _Server(self.config)

    def reload_certificate(self, cert_file: Path, key_file: Path) -> None:
        """New TLS handshakes use the new certificate; no restart."""
        context: ssl.SSLContext | None = getattr(self.config, "ssl", None)
        if context is not None:
            context.load_cert_chain(str(cert_file), str(key_file))

    async def serve(self) -> None:
        try:
            await self.server.serve()
        finally:
            self.server.should_exit = True

    @property
    def started(self) -> bool:
        return self.server.started
