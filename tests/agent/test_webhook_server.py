"""The webhook server over TLS on loopback: reviews answered, malformed bodies refused (400)."""

from __future__ import annotations

import asyncio
import socket
import ssl

import aiohttp
import pytest

from multicluster_scheduler.webhook.certificates import new_ca, new_serving_certificate
from multicluster_scheduler.webhook.server import WebhookServer


@pytest.fixture
async def webhook(tmp_path):
    ca = new_ca("test-ca")
    serving = new_serving_certificate(ca, ["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(serving.cert_pem)
    (tmp_path / "tls.key").write_bytes(serving.key_pem)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = WebhookServer("127.0.0.1", port, tmp_path / "tls.crt", tmp_path / "tls.key")
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10):
        while not server.started:
            await asyncio.sleep(0.02)
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        yield session, f"https://127.0.0.1:{port}/mutate"
    server.server.should_exit = True
    await task


async def test_a_review_is_answered_with_its_uid(webhook):
    session, url = webhook
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "abc-123", "operation": "CREATE", "object": {"metadata": {}}},
    }
    async with session.post(url, json=review) as resp:
        assert resp.status == 200
        body = await resp.json()
    assert body["response"] == {"uid": "abc-123", "allowed": True}
    assert body["kind"] == "AdmissionReview"


@pytest.mark.parametrize("payload", [b"not json", b"[]", b'{"request": {}}', b"{}"])
async def test_malformed_reviews_are_refused_with_a_reason(webhook, payload):
    session, url = webhook
    async with session.post(url, data=payload) as resp:
        assert resp.status == 400
        assert "not an AdmissionReview" in (await resp.json())["error"]
