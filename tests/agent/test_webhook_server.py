"""The webhook server over TLS on loopback: elected pods patched into proxy pods, other requests
admitted unchanged, unusable pods refused in the review, malformed bodies refused (HTTP 400)."""

from __future__ import annotations

import base64
import ssl

import aiohttp
import orjson
import pytest

from multicluster import metrics
from multicluster_scheduler.api import keys
from tests.webhook.json_patch import apply_patch
from tests.webhook.sealing import NAMESPACE, USER_INFO


@pytest.fixture
async def webhook(served):
    context = ssl.create_default_context(cadata=served.ca.cert_pem.decode())
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        yield session, f"https://127.0.0.1:{served.port}/mutate"


def elected_pod() -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web",
            "namespace": NAMESPACE,
            "labels": {"app": "web"},
            "annotations": {keys.ELECT: ""},
        },
        "spec": {
            "containers": [{"name": "nginx", "image": "nginx"}],
            "nodeSelector": {"disk": "ssd"},
            "affinity": {"nodeAffinity": {}},
        },
    }


def review(obj: object, *, operation: str = "CREATE", kind: str = "Pod") -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "abc-123",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "operation": operation,
            "userInfo": USER_INFO,
            "namespace": NAMESPACE,
            "object": obj,
        },
    }


async def answer(webhook, body: dict) -> dict:
    session, url = webhook
    async with session.post(url, json=body) as resp:
        assert resp.status == 200
        answered = await resp.json()
    assert answered["kind"] == "AdmissionReview"
    assert answered["apiVersion"] == "admission.k8s.io/v1"
    assert answered["response"]["uid"] == "abc-123"
    return answered["response"]


def counted(result: str) -> float:
    labels = {"webhook": "proxy-pods", "result": result}
    return metrics.REGISTRY.get_sample_value("webhook_requests_total", labels) or 0.0


async def test_an_elected_pod_becomes_a_proxy_pod(webhook):
    before = counted("patched")
    response = await answer(webhook, review(elected_pod()))
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    proxy = apply_patch(elected_pod(), orjson.loads(base64.b64decode(response["patch"])))
    assert proxy["spec"]["schedulerName"] == "admiralty-proxy"
    assert proxy["spec"]["nodeSelector"] == {"virtual-kubelet.io/provider": "admiralty"}
    assert "affinity" not in proxy["spec"]
    assert proxy["spec"]["terminationGracePeriodSeconds"] == 0
    assert proxy["spec"]["tolerations"][0]["key"] == "virtual-kubelet.io/provider"
    assert proxy["metadata"]["finalizers"] == [keys.FINALIZER]
    assert proxy["metadata"]["labels"] == {"app": "web", keys.HAS_FINALIZER: "true"}
    manifest = proxy["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST]
    assert orjson.loads(manifest) == elected_pod()
    assert counted("patched") == before + 1


async def test_a_proxy_pod_is_admitted_unpatched(webhook):
    proxy = elected_pod()
    response = await answer(webhook, review(proxy))
    proxy = apply_patch(proxy, orjson.loads(base64.b64decode(response["patch"])))
    assert await answer(webhook, review(proxy)) == {"uid": "abc-123", "allowed": True}


@pytest.mark.parametrize(
    "body",
    [
        review({"metadata": {"name": "plain"}, "spec": {}}),
        review(elected_pod(), operation="UPDATE"),
        review(elected_pod(), operation="DELETE"),
        review(elected_pod(), kind="Service"),
        {"request": {"uid": "abc-123", "operation": "CREATE", "object": {"metadata": {}}}},
    ],
    ids=["not-elected", "update", "delete", "not-a-pod", "no-kind"],
)
async def test_other_requests_are_admitted_unpatched(webhook, body):
    before = counted("allowed")
    assert await answer(webhook, body) == {"uid": "abc-123", "allowed": True}
    assert counted("allowed") == before + 1


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (None, "no object"),
        ("a pod", "not a pod"),
        ({"metadata": {"annotations": {keys.ELECT: "", "n": 1}}}, "not a map of strings"),
        ({"metadata": {"annotations": {keys.ELECT: ""}}, "spec": []}, "spec is not an object"),
    ],
)
async def test_unusable_pods_are_refused_in_the_review(webhook, obj, reason):
    before = counted("refused")
    response = await answer(webhook, review(obj))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert reason in response["status"]["message"]
    assert "patch" not in response
    assert counted("refused") == before + 1


@pytest.mark.parametrize(
    "payload",
    [b"not json", b"[]", b'{"request": {}}', b"{}", b'{"request": {"uid": 1}}'],
)
async def test_malformed_reviews_are_refused_with_a_reason(webhook, payload):
    session, url = webhook
    before = counted("malformed")
    async with session.post(url, data=payload) as resp:
        assert resp.status == 400
        assert "not an AdmissionReview" in (await resp.json())["error"]
    assert counted("malformed") == before + 1


async def test_other_paths_and_methods_are_refused_with_a_reason(webhook):
    session, url = webhook
    async with session.get(url) as resp:
        assert resp.status == 405
        assert resp.headers["Allow"] == "POST"
        assert "POST an AdmissionReview" in (await resp.json())["error"]
    async with session.post(url.replace("/mutate", "/validate"), json={}) as resp:
        assert resp.status == 404
        assert "no such path" in (await resp.json())["error"]


async def test_a_body_too_large_for_any_pod_is_refused_not_read_to_the_end(webhook):
    session, url = webhook
    before = counted("malformed")
    async with session.post(url, data=b" " * (4 * 1024 * 1024)) as resp:
        assert resp.status == 413
    assert counted("malformed") == before + 1
