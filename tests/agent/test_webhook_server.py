"""The webhook server over TLS on loopback: reviews answered, malformed bodies refused (400)."""

from __future__ import annotations

import ssl

import aiohttp
import pytest


@pytest.fixture
async def webhook(served):
    context = ssl.create_default_context(cadata=served.ca.cert_pem.decode())
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        yield session, f"https://127.0.0.1:{served.port}/mutate"


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
