"""The REST client against a real API server: every verb, typed errors, auth, limits."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from multicluster import (
    AlreadyExists,
    Client,
    ClusterConfig,
    ConfigError,
    Conflict,
    Forbidden,
    Invalid,
    NamespaceTerminating,
    NotFound,
    Unauthorized,
    Unreachable,
)
from multicluster.pki import CertificateAuthority
from multicluster.resources import CONFIGMAPS, NAMESPACES, NODES, PODS
from testbed import TestBed
from testbed.bed import kubeconfig


def configmap(name: str, namespace: str, **data: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": data,
    }


async def test_crud_and_every_patch_type(connect, namespace: str):
    client = connect("cluster1").client
    created = await client.create(CONFIGMAPS, configmap("cm", namespace, a="1"))
    assert created["metadata"]["uid"]
    with pytest.raises(AlreadyExists):
        await client.create(CONFIGMAPS, configmap("cm", namespace))

    got = await client.get(CONFIGMAPS, "cm", namespace)
    got["data"]["b"] = "2"
    updated = await client.update(CONFIGMAPS, got)
    with pytest.raises(Conflict) as stale:
        await client.update(CONFIGMAPS, got)  # resourceVersion is now stale
    assert not isinstance(stale.value, AlreadyExists)

    merged = await client.patch(CONFIGMAPS, "cm", {"data": {"c": "3"}}, namespace)
    assert merged["data"] == {"a": "1", "b": "2", "c": "3"}
    json_patched = await client.patch(
        CONFIGMAPS,
        "cm",
        [{"op": "remove", "path": "/data/a"}],
        namespace,
        patch_type="json",
    )
    assert "a" not in json_patched["data"]
    strategic = await client.patch(
        CONFIGMAPS, "cm", {"metadata": {"labels": {"l": "v"}}}, namespace, patch_type="strategic"
    )
    assert strategic["metadata"]["labels"] == {"l": "v"}
    applied = await client.patch(
        CONFIGMAPS,
        "cm",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"z": "9"}},
        namespace,
        patch_type="apply",
        field_manager="e2e",
        force=True,
    )
    assert applied["data"]["z"] == "9"
    assert any(m["manager"] == "e2e" for m in applied["metadata"]["managedFields"])
    assert int(updated["metadata"]["resourceVersion"]) < int(applied["metadata"]["resourceVersion"])

    with pytest.raises(Invalid):
        await client.patch(CONFIGMAPS, "cm", {"metadata": {"labels": {"bad key!": "x"}}}, namespace)

    await client.delete(CONFIGMAPS, "cm", namespace)
    with pytest.raises(NotFound):
        await client.get(CONFIGMAPS, "cm", namespace)
    with pytest.raises(NotFound):
        await client.delete(CONFIGMAPS, "cm", namespace)


async def test_list_follows_continue_tokens(connect, namespace: str):
    client = connect("cluster1").client
    for i in range(23):
        cm = configmap(f"cm-{i:02d}", namespace, i=str(i))
        cm["metadata"]["labels"] = {"set": "paged"}
        await client.create(CONFIGMAPS, cm)
    paged = client.list_pages(CONFIGMAPS, namespace, label_selector="set=paged", limit=5)
    pages = [page async for page in paged]
    assert [len(p["items"]) for p in pages] == [5, 5, 5, 5, 3]
    items, version = await client.list(CONFIGMAPS, namespace, limit=5)
    names = sorted(i["metadata"]["name"] for i in items if i["metadata"]["name"].startswith("cm-"))
    assert names == [f"cm-{i:02d}" for i in range(23)]
    assert int(version) > 0
    selected, _ = await client.list(CONFIGMAPS, namespace, field_selector="metadata.name=cm-07")
    assert [i["data"] for i in selected] == [{"i": "7"}]


async def test_binding_and_status_subresources(connect, namespace: str):
    client = connect("cluster2").client
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "manual", "namespace": namespace},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "busybox"}]},
    }
    await client.create(PODS, pod)
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "manual", "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "cluster2-node-1"},
    }
    await client.create(PODS, binding, namespace, subresource="binding", name="manual")
    bound = await client.get(PODS, "manual", namespace)
    assert bound["spec"]["nodeName"] == "cluster2-node-1"
    patched = await client.patch(
        PODS,
        "manual",
        {"status": {"conditions": [{"type": "Custom", "status": "True"}]}},
        namespace,
        patch_type="strategic",
        subresource="status",
    )
    assert any(c["type"] == "Custom" for c in patched["status"]["conditions"])
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "manual", "namespace": namespace},
    }
    await client.create(PODS, eviction, namespace, subresource="eviction", name="manual")
    try:
        gone = await client.get(PODS, "manual", namespace)
    except NotFound:
        return  # evicted and already gone: kwok, its kubelet, finishes deletions at once
    assert gone["metadata"].get("deletionTimestamp")


def _identity_kubeconfig(testbed: TestBed, user: str, ca: CertificateAuthority | None) -> str:
    cluster = testbed["cluster1"]
    pki = cluster.dir / "pki"
    signer = ca
    if signer is None:
        signer = CertificateAuthority.load(pki / "ca.crt", pki / "ca.key")
    pair = signer.issue(user, client=True)
    return json.dumps(
        kubeconfig(
            [
                {
                    "name": "x",
                    "server": cluster.server,
                    "ca": (pki / "ca.crt").read_bytes(),
                    "cert": pair.cert_pem,
                    "key": pair.key_pem,
                }
            ]
        )
    )


async def test_forbidden_and_unauthorized_are_told_apart(testbed: TestBed):
    nobody = Client(ClusterConfig.from_kubeconfig_data(_identity_kubeconfig(testbed, "x", None)))
    stranger = Client(
        ClusterConfig.from_kubeconfig_data(
            _identity_kubeconfig(
                testbed, "x", CertificateAuthority.new("other-ca", path_length=None)
            )
        )
    )
    try:
        with pytest.raises(Forbidden) as forbidden:
            await nobody.list(NODES)
        assert 'User "x" cannot list resource "nodes"' in forbidden.value.message
        with pytest.raises(Unauthorized):
            await stranger.list(NODES)
    finally:
        await nobody.close()
        await stranger.close()


async def test_a_create_in_a_namespace_being_deleted_is_not_taken_for_missing_rbac(connect):
    """The API server answers 403 to a create in a namespace being deleted: no permission is
    missing, so it is an error of its own and not counted with the 403s that mean RBAC."""
    from multicluster import metrics

    client = connect("cluster1", name="terminating-check").client
    name = f"t{time.monotonic_ns() % 10**8}"
    held = configmap("held", name)
    held["metadata"]["finalizers"] = ["example.com/hold"]
    await client.create(NAMESPACES, {"metadata": {"name": name}})
    try:
        await client.create(CONFIGMAPS, held)
        await client.delete(NAMESPACES, name)
        deadline = time.monotonic() + 30
        refused: Forbidden | None = None
        while refused is None:  # marked terminating within moments, then seen by admission
            assert time.monotonic() < deadline, "the namespace never refused a create"
            try:
                await client.create(CONFIGMAPS, configmap("late", name))
            except Forbidden as error:
                refused = error
            else:
                await client.delete(CONFIGMAPS, "late", name)
                await asyncio.sleep(0.1)
        assert isinstance(refused, NamespaceTerminating), refused.body
        assert refused.status == 403
        assert "being terminated" in refused.message
        counted = {
            sample.labels["code"]: sample.value
            for family in metrics.REGISTRY.collect()
            if family.name == "rest_client_errors"
            for sample in family.samples
            if sample.name.endswith("_total") and sample.labels["cluster"] == "terminating-check"
        }
        assert counted == {"namespace-terminating": 1.0}, counted
    finally:
        await client.patch(CONFIGMAPS, "held", {"metadata": {"finalizers": None}}, name)


async def test_unreachable_server_and_bad_kubeconfigs():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "ctx",
        }
    )
    client = Client(ClusterConfig.from_kubeconfig_data(data), timeout=2)
    try:
        with pytest.raises(Unreachable):
            await client.get(NODES, "x")
    finally:
        await client.close()
    with pytest.raises(ConfigError, match="not valid YAML"):
        ClusterConfig.from_kubeconfig_data("{")
    with pytest.raises(ConfigError, match="missing"):
        ClusterConfig.from_kubeconfig_data(data, context="missing")


async def test_client_side_qps_limits_requests(connect):
    client = connect("cluster1", qps=20, burst=2).client
    started = time.monotonic()
    for _ in range(12):
        await client.get(NODES, "cluster1-node-0")
    assert time.monotonic() - started >= 0.45, "10 requests past the burst at 20/s"
