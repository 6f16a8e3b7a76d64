"""The webhook's HTTPS server: FastAPI on uvicorn, inside the agent's event loop.

``/mutate`` answers the API server's AdmissionReviews for pods: an elected pod, on CREATE, is
admitted with the JSON patch that makes it a proxy pod (see ``mutation``); any other request is
admitted unchanged. This is on the path of every pod creation in enabled namespaces, so requests
are parsed raw with orjson (no model per request) and never wait on an API call. A pod that
cannot be patched is refused in the review (allowed false, code 400, the reason), and a body
that is not an AdmissionReview at all gets an HTTP 400 that says why: never a 500.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import ssl
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

from multicluster import metrics
from multicluster_scheduler.webhook.mutation import is_elected, mutation_patch

log = logging.getLogger(__name__)

RESULTS = ("allowed", "patched", "refused", "malformed")


def review_response(
    uid: str, *, allowed: bool = True, patch: bytes | None = None, status: dict | None = None
) -> dict:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if patch is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(patch).decode()
    if status is not None:
        response["status"] = status
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def answer_review(body: bytes) -> tuple[str, dict]:
    """Answer one AdmissionReview: the result (allowed, patched or refused) and the review.

    Raises ValueError when ``body`` is not an AdmissionReview (not JSON, no request.uid).
    """
    try:
        request = orjson.loads(body)["request"]
        uid = request["uid"]
    except orjson.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    except (KeyError, TypeError) as e:
        raise ValueError(f"{type(e).__name__}: {e}") from None
    if not isinstance(uid, str):
        raise ValueError("request.uid is not a string")
    kind = request.get("kind")
    if (
        not isinstance(kind, dict)
        or kind.get("kind") != "Pod"
        or request.get("operation") != "CREATE"
    ):
        return "allowed", review_response(uid)
    pod = request.get("object")
    try:
        if pod is None:
            raise ValueError("the request has no object")
        if not is_elected(pod):
            return "allowed", review_response(uid)
        ops = mutation_patch(pod)
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
    if not ops:
        return "allowed", review_response(uid)
    return "patched", review_response(uid, patch=orjson.dumps(ops))


def create_app() -> FastAPI:
    app = FastAPI(title="multicluster-scheduler webhook", docs_url=None, redoc_url=None)
    counters = {result: metrics.WEBHOOK_REQUESTS.labels("proxy-pods", result) for result in RESULTS}

    @app.post("/mutate")
    async def mutate(request: Request) -> Response:
        try:
            result, review = answer_review(await request.body())
        except ValueError as e:
            counters["malformed"].inc()
            message = f"not an AdmissionReview: {e}"
            return Response(orjson.dumps({"error": message}), 400, media_type="application/json")
        counters[result].inc()
        return Response(orjson.dumps(review), media_type="application/json")

    return app


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # the agent's manager owns signals
        yield


class WebhookServer:
    def __init__(self, host: str, port: int, cert_file: Path, key_file: Path) -> None:
        self.config = uvicorn.Config(
            create_app(),
            host=host,
            port=port,
            ssl_certfile=str(cert_file),
            ssl_keyfile=str(key_file),
            log_level="warning",
            access_log=False,
            lifespan="off",
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
