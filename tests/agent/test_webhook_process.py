"""The webhook served from a child process: answers over TLS, counts seen by the agent's
metrics, a reloaded certificate served, the child gone when the agent stops serving it, and
nothing of the agent's runtime loaded in the child."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
from pathlib import Path

import aiohttp
import pytest

from multicluster import metrics
from multicluster_scheduler.webhook.certificates import new_ca, new_serving_certificate
from multicluster_scheduler.webhook.server import WebhookProcess
from tests.agent.test_webhook_server import elected_pod, review


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def patched() -> float:
    labels = {"webhook": "proxy-pods", "result": "patched"}
    return metrics.REGISTRY.get_sample_value("webhook_requests_total", labels) or 0.0


async def served_certificate(port: int, ca_pem: bytes) -> bytes:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    return ssl.DER_cert_to_PEM_cert(der).encode()


@pytest.mark.timeout(60)
async def test_the_webhook_answers_from_its_own_process_and_stops_with_the_agent(tmp_path: Path):
    ca = new_ca("test-ca")
    first = new_serving_certificate(ca, ["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(first.cert_pem)
    (tmp_path / "tls.key").write_bytes(first.key_pem)
    port = free_port()
    server = WebhookProcess("127.0.0.1", port, tmp_path / "tls.crt", tmp_path / "tls.key")
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(30):
            while not server.started:
                await asyncio.sleep(0.05)
        before = patched()
        context = ssl.create_default_context(cadata=ca.cert_pem.decode())
        connector = aiohttp.TCPConnector(ssl=context)
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(3):
                async with session.post(
                    f"https://127.0.0.1:{port}/mutate", json=review(elected_pod())
                ) as resp:
                    assert resp.status == 200
                    assert (await resp.json())["response"]["patchType"] == "JSONPatch"
        assert patched() == before + 3, "the child's answers show in this process's metrics"

        second = new_serving_certificate(ca, ["127.0.0.1"])
        (tmp_path / "next.crt").write_bytes(second.cert_pem)
        (tmp_path / "next.key").write_bytes(second.key_pem)
        server.reload_certificate(tmp_path / "next.crt", tmp_path / "next.key")
        async with asyncio.timeout(10):
            while await served_certificate(port, ca.cert_pem) != second.cert_pem:
                await asyncio.sleep(0.05)

        # A reload that fails is logged; the process goes on serving what it had.
        server.reload_certificate(tmp_path / "missing.crt", tmp_path / "missing.key")
        await asyncio.sleep(0.5)
        assert await served_certificate(port, ca.cert_pem) == second.cert_pem
        server.reload_certificate(tmp_path / "next.crt", tmp_path / "next.key")

        # A webhook process that dies is started again (the replica unready meanwhile).
        first_pid = server.pid
        os.kill(first_pid, signal.SIGKILL)
        async with asyncio.timeout(30):
            while not (server.started and server.pid != first_pid):
                await asyncio.sleep(0.05)
        async with asyncio.timeout(10):
            while await served_certificate(port, ca.cert_pem) != second.cert_pem:
                await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    with pytest.raises(ConnectionRefusedError):
        await served_certificate(port, ca.cert_pem)


def test_the_webhook_process_loads_neither_the_runtime_nor_the_kubernetes_package():
    import subprocess
    import sys

    probe = (
        "import sys, multicluster_scheduler.webhook.child; "
        "print(sorted(m for m in ('multicluster', 'kubernetes', 'fastapi', 'pydantic') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
