"""The webhook's HTTPS server: FastAPI on uvicorn, inside the agent's event loop.

Requests are parsed raw with orjson (no model per request) and never wait on an API call. Until
the mutation lands, ``/mutate`` admits every pod unchanged; a body that is not an
AdmissionReview is refused with a 400 that says why, never a 500.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import ssl
from pathlib import Path

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

from multicluster import metrics

log = logging.getLogger(__name__)


def review_response(uid: str, *, allowed: bool = True, patch: bytes | None = None) -> dict:
    response: dict = {"uid": uid, "allowed": allowed}
    if patch is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(patch).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def create_app() -> FastAPI:
    app = FastAPI(title="multicluster-scheduler webhook", docs_url=None, redoc_url=None)
    allowed = metrics.WEBHOOK_REQUESTS.labels("proxy-pods", "allowed")
    malformed = metrics.WEBHOOK_REQUESTS.labels("proxy-pods", "malformed")

    @app.post("/mutate")
    async def mutate(request: Request) -> Response:
        body = await request.body()
        try:
            review = orjson.loads(body)
            uid = review["request"]["uid"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as e:
            malformed.inc()
            message = f"not an AdmissionReview: {type(e).__name__}: {e}"
            return Response(orjson.dumps({"error": message}), 400, media_type="application/json")
        allowed.inc()
        return Response(orjson.dumps(review_response(uid)), media_type="application/json")

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
