"""The agent's webhook: served from a process of its own (:class:`WebhookProcess`), or, for
tests, in the caller's event loop (:class:`WebhookServer`).

A pod creation must not wait behind the controllers' work in the agent's event loop: placing a
thousand pods keeps that loop busy for seconds, and every admission in enabled namespaces would
queue behind it. The child process (``webhook.child``) imports only the application and the
mutation, so it stays small; it gets the key that seals saved manifests as the first line of its
stdin (never in its arguments, environment or a file), exits when the agent's end of its stdin
closes, reloads its certificate when told, and counts its answers in a memory-mapped file this
process exports as ``webhook_requests_total``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import mmap
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, Metric

from multicluster import metrics
from multicluster_scheduler.api.manifest_mac import ManifestKey
from multicluster_scheduler.webhook import app
from multicluster_scheduler.webhook.app import RESULTS, answer_review, review_response

__all__ = [
    "RESULTS",
    "AnswerCounts",
    "WebhookProcess",
    "WebhookServer",
    "answer_counts",
    "answer_review",
    "review_response",
]

log = logging.getLogger(__name__)
WEBHOOK = "proxy-pods"
STOP_TIMEOUT = 10.0
RESTART_BACKOFF = (1.0, 30.0)  # first and longest wait before the webhook process restarts


class AnswerCounts:
    """Answers by result, in a small anonymous memory file (no path) the webhook process
    inherits."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("mcs-webhook-counts")
        os.ftruncate(self.fd, 8 * len(RESULTS))
        self._map = mmap.mmap(self.fd, 8 * len(RESULTS))
        self.values = memoryview(self._map).cast("Q")
        self._index = {result: i for i, result in enumerate(RESULTS)}

    def inc(self, result: str) -> None:
        self.values[self._index[result]] += 1

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "webhook_requests",
            "Admission requests answered, by webhook and result "
            "(allowed, patched, refused, malformed).",
            labels=["webhook", "result"],
        )
        for result, value in zip(RESULTS, self.values, strict=True):
            family.add_metric([WEBHOOK, result], value)
        yield family


_counts: AnswerCounts | None = None


def answer_counts() -> AnswerCounts:
    """This process's counts, exported as ``webhook_requests_total`` (created on first use)."""
    global _counts
    if _counts is None:
        _counts = AnswerCounts()
        metrics.REGISTRY.register(_counts)
    return _counts


class WebhookServer(app.WebhookServer):
    """The server in the caller's event loop, counting into this process's metrics."""

    def __init__(
        self, host: str, port: int, cert_file: Path, key_file: Path, manifest_key: ManifestKey
    ) -> None:
        super().__init__(host, port, cert_file, key_file, answer_counts().inc, manifest_key)


class WebhookProcess:
    """The server in a child process, with the interface of :class:`WebhookServer`.

    ``serve`` starts the child and restarts it if it exits (``/readyz`` says so meanwhile);
    cancelling ``serve`` stops it.
    """

    def __init__(
        self, host: str, port: int, cert_file: Path, key_file: Path, manifest_key: ManifestKey
    ) -> None:
        self.host, self.port = host, port
        self.cert_file, self.key_file = cert_file, key_file
        self._manifest_key = manifest_key
        self.counts = answer_counts()
        self._stdin: asyncio.StreamWriter | None = None
        self._started = False
        self.pid: int | None = None  # of the current webhook process

    @property
    def started(self) -> bool:
        return self._started

    def reload_certificate(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self._send_reload()

    def _send_reload(self) -> None:
        if self._stdin is not None and not self._stdin.is_closing():
            line = json.dumps({"reload": [str(self.cert_file), str(self.key_file)]})
            self._stdin.write(line.encode() + b"\n")

    async def serve(self) -> None:
        """Run the webhook process; restart it (with backoff) whenever it exits."""
        delay = RESTART_BACKOFF[0]
        while True:
            started = time.monotonic()
            code = await self._run_once()
            if time.monotonic() - started > 60:
                delay = RESTART_BACKOFF[0]  # it had been up a while: not a crash loop
            log.error("webhook process exited code=%s restart_in=%.0fs", code, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_BACKOFF[1])

    async def _run_once(self) -> int:
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        paths = (self.cert_file, self.key_file)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "multicluster_scheduler.webhook.child",
            f"--host={self.host}",
            f"--port={self.port}",
            f"--cert-file={self.cert_file}",
            f"--key-file={self.key_file}",
            f"--counts-fd={self.counts.fd}",
            f"--log-level={level}",
            f"--parent-pid={os.getpid()}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            pass_fds=(self.counts.fd,),
        )
        self.pid = process.pid
        self._stdin = process.stdin
        assert process.stdin is not None
        process.stdin.write(manifest_key_line(self._manifest_key))
        if (self.cert_file, self.key_file) != paths:  # reloaded while it was starting
            self._send_reload()
        try:
            assert process.stdout is not None
            while line := await process.stdout.readline():
                if line.strip() == b"started":
                    self._started = True
                    log.info("webhook serving pid=%d port=%d", process.pid, self.port)
            return await process.wait()
        finally:
            self._started = False
            self._stdin = None
            with contextlib.suppress(OSError):
                assert process.stdin is not None
                process.stdin.close()  # the child sees EOF and stops
            if process.returncode is None:
                try:
                    await asyncio.wait_for(process.wait(), STOP_TIMEOUT)
                except TimeoutError:
                    process.kill()
                    await process.wait()


def manifest_key_line(key: ManifestKey) -> bytes:
    """The first line the webhook process reads on its stdin: the key, base64, and nothing
    else (when it was made is the scheduler's concern, not the webhook's)."""
    return base64.b64encode(key.secret) + b"\n"
