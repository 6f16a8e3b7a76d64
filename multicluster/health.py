"""The manager's health and metrics endpoints, on FastAPI: ``/healthz``, ``/readyz``,
``/metrics``, served by uvicorn in the manager's own event loop (no thread, no process).

uvicorn's process-level habits are left out: it installs no signal handler (signals belong to
the manager) and configures no logging (the application's)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Generator

import uvicorn
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, Response

from . import metrics


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the manager handles signals


def health_app(unready: Callable[[], str | None]) -> FastAPI:
    """``/healthz``: 200 while the loop answers; ``/readyz``: 503 with ``unready()``'s reason,
    if any; ``/metrics``: the Prometheus text format."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    @app.get("/readyz", response_class=PlainTextResponse)
    async def readyz() -> PlainTextResponse:
        reason = unready()
        return PlainTextResponse(reason or "ok", status_code=503 if reason else 200)

    @app.get("/metrics")
    async def exposition() -> Response:
        return Response(metrics.exposition(), media_type="text/plain; charset=utf-8")

    return app


class HealthServer:
    """``app`` served on ``host:port`` (port 0: any free one, see ``address``)."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        self.socket = socket.create_server((host, port), reuse_port=False)
        self.socket.setblocking(False)
        self.address: tuple[str, int] = self.socket.getsockname()[:2]
        config = uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="off", timeout_graceful_shutdown=1
        )
        self._server = _Server(config)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[self.socket]), name="health-server"
        )
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()  # its error, if it could not start

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        self.socket.close()
