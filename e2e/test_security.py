"""The security promises of DESIGN.md, checked with real requests on the test bed: a namespaced
Target serves and reads only its own namespace; the identity a target cluster exports to a
source gets 403s from the target's API server for everything outside its namespace but the
ClusterSummary; the webhook speaks TLS only and the health port serves probes and metrics only;
and secret data never reaches logs, events, statuses or metrics."""

from __future__ import annotations

import base64
import http.client
import json
import secrets
import socket
import ssl
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from e2e.scenarios import (
    SOURCE,
    TARGET,
    all_running,
    cli,
    condition,
    connect,
    disconnect,
    grant_source,
    kubeconfig_for,
    live,
    nginx,
    node_ready,
    nothing_left,
    proxies,
    secret,
)
from multicluster_scheduler.api.keys import PREFIX
from testbed import TestBed, guide, wait_for
from testbed.install import NAMESPACE as RELEASE_NAMESPACE
from testbed.install import RELEASE, Installation
from testbed.kubectl import Kubectl

GROUP = "multicluster.admiralty.io/v1alpha1"
ENABLED = "multicluster-scheduler=enabled"
NO_TARGET = "0/0 targets are available: no target is configured for this namespace."


# -- helpers ------------------------------------------------------------------------------------


@pytest.fixture
def other_namespace(testbed: TestBed, kubectl: Kubectl):
    """A second fresh namespace in every cluster (B, next to the ``namespace`` fixture's A)."""
    name = f"t{uuid.uuid4().hex[:8]}"
    for context in testbed.clusters:
        kubectl(context, "create", "namespace", name)
    yield name
    for context in testbed.clusters:
        kubectl(context, "delete", "namespace", name, "--wait=false")


def ready(kubectl: Kubectl, kind: str, name: str, namespace: str | None = None) -> dict:
    """The Ready condition of a Target or Source ({} while there is none)."""
    where = ("-n", namespace) if namespace else ()
    context = TARGET if kind in ("source", "clustersource") else SOURCE
    proc = kubectl.run(context, "get", kind, name, *where, "-o", "json", check=False)
    if proc.returncode != 0:
        return {}
    for found in json.loads(proc.stdout).get("status", {}).get("conditions") or ():
        if found["type"] == "Ready":
            return found
    return {}


def target(name: str, namespace: str, secret_name: str, /, **reference: str) -> dict:
    return {
        "apiVersion": GROUP,
        "kind": "Target",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"kubeconfigSecret": {"name": secret_name, **reference}},
    }


def raw_secret(name: str, namespace: str, data: dict[str, bytes]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def create(kubectl: Kubectl, context: str, manifest: dict) -> None:
    """``kubectl create`` (not apply: no last-applied annotation holding a copy of the data)."""
    kubectl(context, "create", "-f", "-", stdin=json.dumps(manifest))


def parent_uids(kubectl: Kubectl, context: str) -> set[str]:
    """The proxy uids named by every delegate of ``context``, in any namespace."""
    found = kubectl.json(context, "get", "pods", "-A", "-l", PREFIX + "parent-uid")["items"]
    return {p["metadata"]["labels"][PREFIX + "parent-uid"] for p in found}


def cleanup(kubectl: Kubectl, *namespaces: str) -> None:
    """Owners deleted and every proxy (with its finalizer) and delegate gone."""
    for namespace in namespaces:
        for kind in ("deployments", "pods"):
            kubectl(SOURCE, "delete", kind, "--all", "-n", namespace, "--wait=false")
    for namespace in namespaces:
        wait_for(lambda n=namespace: nothing_left(kubectl, n), 60, what=f"{namespace} emptied")


# -- 1. a namespaced Target serves and reads its own namespace only ------------------------------


def test_a_namespaced_target_never_places_pods_of_another_namespace(
    installation: Installation,
    testbed: TestBed,
    kubectl: Kubectl,
    namespace: str,
    other_namespace: str,
):
    """Targets c1 (self: the agent's own identity, which could create pods anywhere in
    cluster1) and c2 serve namespace A; namespace B is enabled too but has no Target."""
    a, b = namespace, other_namespace
    connect(kubectl, testbed, a)
    for name in (a, b):
        kubectl(SOURCE, "label", "namespace", name, ENABLED)
    try:
        kubectl(SOURCE, "apply", "-n", a, "-f", "-", stdin=nginx(2))
        kubectl(SOURCE, "apply", "-n", b, "-f", "-", stdin=nginx(2))
        wait_for(lambda: all_running(kubectl, a, 2), 60, what="A's pods Running")

        def explained() -> bool:
            found = live(proxies(kubectl, b))
            return len(found) == 2 and all(
                condition(p, "PodScheduled").get("message") == NO_TARGET for p in found
            )

        wait_for(explained, 30, what="B's proxy pods Unschedulable with a reason")
        time.sleep(3)  # any placement would have happened by now: A's pods ran meanwhile
        stuck = live(proxies(kubectl, b))
        assert len(stuck) == 2
        for pod in stuck:
            scheduled = condition(pod, "PodScheduled")
            assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
            assert scheduled["message"] == NO_TARGET
            assert pod["status"]["phase"] == "Pending"
            assert not pod["spec"].get("nodeName")
        uids = {p["metadata"]["uid"] for p in stuck}
        for context in (SOURCE, TARGET):
            assert not uids & parent_uids(kubectl, context), f"a delegate of B in {context}"
        assert not kubectl.json(TARGET, "get", "pods", "-n", b)["items"]
        events = kubectl.json(
            SOURCE,
            "get",
            "events",
            "-n",
            b,
            "--field-selector",
            "reason=FailedScheduling",
        )["items"]
        assert {e["message"] for e in events} == {NO_TARGET}
    finally:
        cleanup(kubectl, a, b)
        disconnect(kubectl, a)


def test_a_target_reads_its_kubeconfig_secret_from_its_own_namespace_only(
    installation: Installation,
    testbed: TestBed,
    kubectl: Kubectl,
    namespace: str,
    other_namespace: str,
):
    a, b = namespace, other_namespace
    grant_source(kubectl, b)  # the identity in the Secret may place pods in B (only)
    token = kubectl(TARGET, "create", "token", "c1", "-n", b, "--duration=1h").strip()
    kubectl.apply(SOURCE, secret("elsewhere", b, {"config": kubeconfig_for(testbed, token)}))
    try:
        # The Secret is good: a Target of its own namespace connects with it.
        kubectl.apply(SOURCE, target("control", b, "elsewhere"))
        wait_for(
            lambda: ready(kubectl, "target", "control", b).get("reason") == "Ready",
            30,
            what="a Target of B Ready with B's Secret",
        )

        # A Target of A naming it does not find it.
        kubectl.apply(SOURCE, target("borrower", a, "elsewhere"))
        wait_for(
            lambda: ready(kubectl, "target", "borrower", a).get("reason") == "SecretNotFound",
            20,
            what="Ready=False/SecretNotFound",
        )
        found = ready(kubectl, "target", "borrower", a)
        assert found["status"] == "False"
        assert found["message"] == f"secret {a}/elsewhere not found"

        # Naming B's namespace is refused by the schema (strict field validation, kubectl's
        # default), and pruned when validation is off: never read.
        named = target("named", a, "elsewhere", namespace=b)
        refused = kubectl.run(SOURCE, "apply", "-f", "-", stdin=json.dumps(named), check=False)
        assert refused.returncode != 0
        assert 'unknown field "spec.kubeconfigSecret.namespace"' in refused.stderr, refused.stderr
        assert kubectl.run(SOURCE, "get", "target", "named", "-n", a, check=False).returncode
        kubectl(SOURCE, "create", "--validate=false", "-f", "-", stdin=json.dumps(named))
        stored = kubectl.json(SOURCE, "get", "target", "named", "-n", a)
        assert stored["spec"]["kubeconfigSecret"] == {"name": "elsewhere", "key": "config"}
        wait_for(
            lambda: ready(kubectl, "target", "named", a).get("reason") == "SecretNotFound",
            20,
            what="the pruned Target Ready=False/SecretNotFound",
        )
        assert ready(kubectl, "target", "named", a)["message"] == f"secret {a}/elsewhere not found"
        for name in ("borrower", "named"):
            assert node_ready(kubectl, f"admiralty-namespace-{a}-{name}") != "True"
    finally:
        kubectl(SOURCE, "delete", "targets", "--all", "-n", a, "--wait=false")
        disconnect(kubectl, b)


def test_two_targets_reaching_the_same_cluster_and_namespace_keep_each_others_delegates(
    installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str
):
    """Targets c2 and c2bis of one namespace use the same kubeconfig: every pod placed through
    either runs, with one delegate, and stays so."""
    grant_source(kubectl, namespace)
    token = kubectl(TARGET, "create", "token", "c1", "-n", namespace, "--duration=1h").strip()
    kubectl.apply(SOURCE, secret("c2", namespace, {"config": kubeconfig_for(testbed, token)}))
    for name in ("c2", "c2bis"):
        kubectl.apply(SOURCE, target(name, namespace, "c2"))
    for name in ("c2", "c2bis"):
        node = f"admiralty-namespace-{namespace}-{name}"
        wait_for(lambda n=node: node_ready(kubectl, n) == "True", 30, what=f"{node} Ready")
    kubectl(SOURCE, "label", "namespace", namespace, ENABLED)
    try:
        kubectl(SOURCE, "apply", "-n", namespace, "-f", "-", stdin=nginx(4))

        def running() -> bool:
            failed = [
                f"{p['metadata']['name']}: {p['status'].get('reason')}"
                for p in proxies(kubectl, namespace)
                if p["status"].get("phase") == "Failed"
            ]
            assert not failed, f"proxy pods failed: {failed}"
            return all_running(kubectl, namespace, 4)

        wait_for(running, 60, what="4 proxies Running")
        first = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in proxies(kubectl, namespace)}
        print("placed on", sorted(first.values()))

        def delegates_by_parent() -> dict[str, list[str]]:
            found: dict[str, list[str]] = {}
            pods = kubectl.json(TARGET, "get", "pods", "-n", namespace)["items"]
            for pod in pods:
                parent = (pod["metadata"].get("labels") or {}).get(PREFIX + "parent-uid")
                if parent and not pod["metadata"].get("deletionTimestamp"):
                    found.setdefault(parent, []).append(pod["metadata"]["uid"])
            return found

        seen = delegates_by_parent()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            now = {p["metadata"]["uid"]: p for p in proxies(kubectl, namespace)}
            assert set(now) == set(first), "a proxy pod was replaced"
            assert all(p["status"].get("phase") == "Running" for p in now.values()), [
                (p["metadata"]["name"], p["status"].get("phase"), p["status"].get("reason"))
                for p in now.values()
            ]
            assert delegates_by_parent() == seen, "a delegate was deleted or duplicated"
            assert sorted(seen) == sorted(first)
            assert all(len(uids) == 1 for uids in seen.values())
            time.sleep(2)
        lost = kubectl(
            SOURCE, "get", "events", "-n", namespace, "--field-selector", "reason=DelegateLost"
        )
        assert "DelegateLost" not in lost
    finally:
        cleanup(kubectl, namespace)
        disconnect(kubectl, namespace)


# -- 2. the exported source identity -------------------------------------------------------------


@dataclass
class Identity:
    """The service account a target cluster exported for a source, as a client of the target."""

    user: str
    server: str
    token: str
    ssl_context: ssl.SSLContext
    kubectl: Kubectl
    context: str

    def request(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict]:
        content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
        sent = urllib.request.Request(
            self.server + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": content_type,
                "Accept": "application/json",
                **(headers or {}),
            },
        )
        try:
            with urllib.request.urlopen(sent, context=self.ssl_context, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def can_i(self, *args: str) -> str:
        return self.kubectl.run(self.context, "auth", "can-i", *args, check=False).stdout.strip()


@pytest.fixture
def identity(
    installation: Installation,
    testbed: TestBed,
    kubectl: Kubectl,
    namespace: str,
    other_namespace: str,
    tmp_path: Path,
):
    """A Source ``c1`` in cluster2's ``namespace``, exported with ``multicluster-scheduler export``
    as users do; and something to reach in ``other_namespace`` of cluster2."""
    kubectl.apply(TARGET, guide.source(namespace))
    wait_for(
        lambda: ready(kubectl, "source", "c1", namespace).get("reason") == "Bound",
        30,
        what="Source Bound",
    )
    exported = cli(
        testbed.kubeconfig, "export", "--context", TARGET, "-n", namespace, "c1", "--as", "c2"
    )
    assert exported.returncode == 0, exported.stderr
    config = yaml.safe_load(base64.b64decode(yaml.safe_load(exported.stdout)["data"]["config"]))
    path = tmp_path / "exported.kubeconfig"
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    cluster = config["clusters"][0]["cluster"]
    ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
    # Things of namespace B the identity must not reach.
    kubectl.apply(TARGET, secret("private", other_namespace, {"password": secrets.token_hex(8)}))
    kubectl(TARGET, "create", "configmap", "settings", "-n", other_namespace)
    kubectl(TARGET, "run", "resident", "-n", other_namespace, "--image=nginx")
    yield Identity(
        user=f"system:serviceaccount:{namespace}:c1",
        server=cluster["server"],
        token=config["users"][0]["user"]["token"],
        ssl_context=ssl.create_default_context(cadata=ca),
        kubectl=Kubectl(path, testbed.bin_dir),
        context=config["current-context"],
    )
    kubectl(TARGET, "delete", "source", "c1", "-n", namespace, "--wait=false")


def test_an_exported_source_identity_is_refused_everything_outside_its_namespace_but_summaries(
    identity: Identity, testbed: TestBed, namespace: str, other_namespace: str
):
    ns, other = namespace, other_namespace
    mcs = "/apis/multicluster.admiralty.io/v1alpha1"
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "intruder"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    cluster_admin = {
        "metadata": {"name": "escalate"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "cluster-admin",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "c1", "namespace": ns}],
    }
    token_request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    # (method, path, body, headers) → the verb and resource the API server names in its 403.
    refused = [
        ("GET", f"/api/v1/namespaces/{other}/pods", None, None, "list", "pods"),
        ("GET", f"/api/v1/namespaces/{other}/pods/resident", None, None, "get", "pods"),
        ("POST", f"/api/v1/namespaces/{other}/pods", pod, None, "create", "pods"),
        ("DELETE", f"/api/v1/namespaces/{other}/pods/resident", None, None, "delete", "pods"),
        ("GET", f"/api/v1/namespaces/{other}/secrets", None, None, "list", "secrets"),
        ("GET", f"/api/v1/namespaces/{other}/secrets/private", None, None, "get", "secrets"),
        ("GET", f"/api/v1/namespaces/{other}/configmaps", None, None, "list", "configmaps"),
        ("GET", f"/api/v1/namespaces/{other}/configmaps/settings", None, None, "get", "configmaps"),
        ("GET", f"/api/v1/namespaces/{other}/services", None, None, "list", "services"),
        (
            "GET",
            f"/apis/networking.k8s.io/v1/namespaces/{other}/ingresses",
            None,
            None,
            "list",
            "ingresses",
        ),
        ("GET", "/api/v1/secrets", None, None, "list", "secrets"),
        ("GET", "/api/v1/pods", None, None, "list", "pods"),
        ("GET", f"/api/v1/namespaces/{RELEASE_NAMESPACE}/secrets", None, None, "list", "secrets"),
        ("GET", "/api/v1/namespaces/kube-system/secrets", None, None, "list", "secrets"),
        ("POST", "/api/v1/namespaces/kube-system/pods", pod, None, "create", "pods"),
        ("GET", "/api/v1/nodes", None, None, "list", "nodes"),
        ("GET", "/api/v1/nodes/anything", None, None, "get", "nodes"),
        ("GET", "/api/v1/namespaces", None, None, "list", "namespaces"),
        ("DELETE", f"/api/v1/namespaces/{ns}", None, None, "delete", "namespaces"),
        (
            "POST",
            f"{mcs}/clustersummaries",
            {"apiVersion": GROUP, "kind": "ClusterSummary", "metadata": {"name": "forged"}},
            None,
            "create",
            "clustersummaries",
        ),
        (
            "PATCH",
            f"{mcs}/clustersummaries/singleton",
            {"metadata": {"labels": {"forged": "true"}}},
            None,
            "patch",
            "clustersummaries",
        ),
        ("DELETE", f"{mcs}/clustersummaries/singleton", None, None, "delete", "clustersummaries"),
        ("GET", f"{mcs}/namespaces/{ns}/sources", None, None, "list", "sources"),
        ("GET", f"{mcs}/namespaces/{ns}/sources/c1", None, None, "get", "sources"),
        ("GET", f"{mcs}/namespaces/{ns}/targets", None, None, "list", "targets"),
        ("GET", f"{mcs}/clustersources", None, None, "list", "clustersources"),
        ("GET", f"{mcs}/clustertargets", None, None, "list", "clustertargets"),
        # What it may do, it may not do as someone else.
        (
            "GET",
            f"/api/v1/namespaces/{ns}/pods",
            None,
            {"Impersonate-User": "system:admin"},
            "impersonate",
            None,
        ),
        (
            "GET",
            f"/api/v1/namespaces/{ns}/pods",
            None,
            {
                "Impersonate-User": f"system:serviceaccount:{RELEASE_NAMESPACE}:{RELEASE}",
            },
            "impersonate",
            None,
        ),
        (
            "POST",
            f"/api/v1/namespaces/{RELEASE_NAMESPACE}/serviceaccounts/{RELEASE}/token",
            token_request,
            None,
            "create",
            "serviceaccounts/token",
        ),
        (
            "POST",
            f"/api/v1/namespaces/{ns}/serviceaccounts/default/token",
            token_request,
            None,
            "create",
            "serviceaccounts/token",
        ),
        (
            "POST",
            f"/api/v1/namespaces/{ns}/serviceaccounts",
            {"metadata": {"name": "another"}},
            None,
            "create",
            "serviceaccounts",
        ),
        (
            "POST",
            f"{rbac}/namespaces/{ns}/rolebindings",
            cluster_admin,
            None,
            "create",
            "rolebindings",
        ),
        (
            "POST",
            f"{rbac}/namespaces/{ns}/roles",
            {"metadata": {"name": "all"}, "rules": []},
            None,
            "create",
            "roles",
        ),
        (
            "POST",
            f"{rbac}/clusterrolebindings",
            cluster_admin,
            None,
            "create",
            "clusterrolebindings",
        ),
        (
            "PATCH",
            f"{rbac}/clusterroles/multicluster-scheduler-source",
            {"rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]},
            None,
            "patch",
            "clusterroles",
        ),
    ]
    for method, path, body, headers, verb, resource in refused:
        code, answer = identity.request(method, path, body, headers)
        what = f"{method} {path} {headers or ''}"
        assert code == 403, f"{what}: {code} {answer}"
        assert answer.get("reason") == "Forbidden", f"{what}: {answer}"
        assert f'User "{identity.user}" cannot {verb}' in answer["message"], what
        if resource is not None:  # impersonation is checked by a verb of its own per request
            assert f'resource "{resource}"' in answer["message"], f"{what}: {answer['message']}"
        print(f"403 {what}")

    # The same question asked with kubectl, as a user of the exported kubeconfig would.
    for question in (
        ("list", "secrets", "-n", other),
        ("get", "secrets", "-A"),
        ("get", "nodes"),
        ("create", "pods", "-n", "kube-system"),
        ("patch", "clustersummaries"),
        ("delete", "clustersummaries"),
        ("get", "sources", "-n", ns),
        ("impersonate", "users"),
        ("create", "serviceaccounts/token", "-n", RELEASE_NAMESPACE),
        ("bind", "clusterroles"),
        ("escalate", "clusterroles"),
        ("create", "rolebindings", "-n", ns),
    ):
        assert identity.can_i(*question) == "no", question


def test_an_exported_source_identity_may_do_what_placing_delegates_needs(
    identity: Identity, namespace: str
):
    ns = namespace
    mcs = "/apis/multicluster.admiralty.io/v1alpha1"
    code, summary = identity.request("GET", f"{mcs}/clustersummaries/singleton")
    assert code == 200, summary
    assert summary["metadata"]["name"] == "singleton"
    assert "allocatable" in summary
    code, listed = identity.request("GET", f"{mcs}/clustersummaries")
    assert code == 200
    assert [s["metadata"]["name"] for s in listed["items"]] == ["singleton"]

    objects = {
        "pods": {
            "metadata": {"name": "placed"},
            "spec": {"containers": [{"name": "main", "image": "nginx"}]},
        },
        "configmaps": {"metadata": {"name": "placed"}, "data": {"k": "v"}},
        "secrets": {"metadata": {"name": "placed"}, "stringData": {"k": "v"}},
        "services": {"metadata": {"name": "placed"}, "spec": {"ports": [{"port": 80}]}},
    }
    for resource, body in objects.items():
        base = f"/api/v1/namespaces/{ns}/{resource}"
        for method, path, sent, expected in (
            ("POST", base, body, 201),
            ("GET", f"{base}/placed", None, 200),
            ("GET", base, None, 200),
            ("PATCH", f"{base}/placed", {"metadata": {"labels": {"patched": "yes"}}}, 200),
            ("DELETE", f"{base}/placed", None, 200),
        ):
            code, answer = identity.request(method, path, sent)
            assert code == expected, f"{method} {path}: {code} {answer}"
    code, _ = identity.request("GET", f"/api/v1/namespaces/{ns}/events")
    assert code == 200
    for question in (
        ("get", "clustersummaries"),
        ("watch", "clustersummaries"),
        ("create", "pods", "-n", ns),
        ("delete", "pods", "-n", ns),
        ("get", "pods", "--subresource=log", "-n", ns),
        ("create", "secrets", "-n", ns),
        ("create", "configmaps", "-n", ns),
        ("create", "services", "-n", ns),
        ("create", "ingresses.networking.k8s.io", "-n", ns),
        ("delete", "ingresses.networking.k8s.io", "-n", ns),
        ("watch", "ingresses.networking.k8s.io", "-n", ns),
    ):
        assert identity.can_i(*question) == "yes", question


def test_creating_a_source_takes_the_right_to_bind_its_role(
    installation: Installation,
    testbed: TestBed,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
):
    """Kubernetes refuses a RoleBinding to whoever neither holds what it grants nor may ``bind``
    its role; a Source makes the agent create one, so the chart's admission policy asks the same
    of whoever creates or changes a Source: a tenant allowed to create Sources must not get the
    namespace's Secrets through the agent."""
    ns = namespace
    role = f"""apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: sources, namespace: {ns}}}
rules:
  - apiGroups: [multicluster.admiralty.io]
    resources: [sources]
    verbs: [get, list, create, patch]
"""
    bind = """  - apiGroups: [rbac.authorization.k8s.io]
    resources: [clusterroles]
    resourceNames: [multicluster-scheduler-source]
    verbs: [bind]
"""
    kubectl.apply(
        TARGET,
        f"""apiVersion: v1
kind: ServiceAccount
metadata: {{name: tenant, namespace: {ns}}}
---
{role}---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: tenant-sources, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: sources}}
subjects: [{{kind: ServiceAccount, name: tenant, namespace: {ns}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {ns}-clustersources}}
rules:
  - apiGroups: [multicluster.admiralty.io]
    resources: [clustersources]
    verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {ns}-clustersources}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {ns}-clustersources}}
subjects: [{{kind: ServiceAccount, name: tenant, namespace: {ns}}}]
""",
    )
    path = tmp_path / "tenant.kubeconfig"
    path.write_text(kubeconfig_for(testbed, kubectl(TARGET, "create", "token", "tenant", "-n", ns)))
    tenant = Kubectl(path, testbed.bin_dir)

    def source(name: str, account: str) -> str:
        return json.dumps(
            {
                "apiVersion": GROUP,
                "kind": "Source",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"serviceAccountName": account},
            }
        )

    def refused(proc) -> None:
        assert proc.returncode != 0, proc.stdout
        assert "(Forbidden)" in proc.stderr, proc.stderr
        assert "binds the ClusterRole multicluster-scheduler-source" in proc.stderr, proc.stderr

    try:
        assert "(Forbidden)" in tenant.run("c2", "get", "secrets", "-n", ns, check=False).stderr
        made = tenant.run("c2", "create", "-f", "-", stdin=source("mine", "tenant"), check=False)
        print(f"a Source of the tenant: {made.stderr.strip()}")
        refused(made)
        cluster_source = {
            "apiVersion": GROUP,
            "kind": "ClusterSource",
            "metadata": {"name": f"{ns}-tenant"},
            "spec": {"serviceAccount": {"name": "tenant", "namespace": ns}},
        }
        stdin = json.dumps(cluster_source)
        refused(tenant.run("c2", "create", "-f", "-", stdin=stdin, check=False))
        kubectl(TARGET, "create", "--dry-run=server", "-f", "-", stdin=stdin)  # an administrator

        # A Source made by an administrator: the tenant may label it, not redirect it.
        kubectl(TARGET, "create", "-f", "-", stdin=source("granted", "c1"))
        wait_for(
            lambda: ready(kubectl, "source", "granted", ns).get("reason") == "Bound",
            30,
            what="the administrator's Source Bound",
        )
        tenant("c2", "label", "source", "granted", "-n", ns, "team=blue")
        redirect = '{"spec": {"serviceAccountName": "tenant"}}'
        patched = tenant.run(
            "c2",
            "patch",
            "source",
            "granted",
            "-n",
            ns,
            "--type=merge",
            "-p",
            redirect,
            check=False,
        )
        refused(patched)
        assert "(Forbidden)" in tenant.run("c2", "get", "secrets", "-n", ns, check=False).stderr

        # Given the right to bind the role in the namespace, the tenant may (as with RBAC).
        kubectl.apply(TARGET, role + bind)
        wait_for(
            lambda: (
                tenant.run(
                    "c2", "create", "-f", "-", stdin=source("mine", "tenant"), check=False
                ).returncode
                == 0
            ),
            10,
            what="the tenant's Source accepted",
        )
        refused(tenant.run("c2", "create", "-f", "-", stdin=stdin, check=False))
    finally:
        kubectl(TARGET, "delete", "sources", "--all", "-n", ns, "--wait=false")
        kubectl(TARGET, "delete", "clustersource", f"{ns}-tenant", "--ignore-not-found")
        kubectl(TARGET, "delete", "clusterrolebinding,clusterrole", f"{ns}-clustersources")


# -- 3. TLS only ---------------------------------------------------------------------------------


def review(uid: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "default",
                "operation": "CREATE",
                "object": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "plain", "namespace": "default"},
                    "spec": {"containers": [{"name": "main", "image": "nginx"}]},
                },
            },
        }
    ).encode()


def plain_http(port: int, path: str, body: bytes) -> bytes:
    """What a plain-HTTP POST to ``port`` gets back before the connection ends."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head + body)
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return answer


def test_the_webhook_answers_over_tls_only_with_a_certificate_of_its_ca_bundle(
    installation: Installation, testbed: TestBed, kubectl: Kubectl
):
    port = installation.webhook_ports[SOURCE]
    configuration = kubectl.json(SOURCE, "get", "mutatingwebhookconfiguration", RELEASE)
    client = configuration["webhooks"][0]["clientConfig"]
    assert client["url"] == f"https://127.0.0.1:{port}/mutate"
    ca_bundle = base64.b64decode(client["caBundle"]).decode()

    uid = str(uuid.uuid4())
    answer = plain_http(port, "/mutate", review(uid))
    print(f"plain HTTP to the webhook port: {answer[:60]!r}")
    assert not answer.startswith(b"HTTP/1.1 200")
    assert b"AdmissionReview" not in answer
    assert uid.encode() not in answer
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("POST", "/mutate", body=review(uid))
        resp = conn.getresponse()
        outcome: object = (resp.status, resp.read())
    except (http.client.HTTPException, ConnectionError, TimeoutError) as e:
        outcome = e
    print(f"http.client over plain HTTP: {outcome!r:.100}")
    if isinstance(outcome, tuple):  # an error page at most, never a review
        assert outcome[0] != 200, outcome
        assert b"AdmissionReview" not in outcome[1], outcome

    trusted = ssl.create_default_context(cadata=ca_bundle)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=trusted, timeout=5)
    conn.request("POST", "/mutate", body=review(uid), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    body = json.loads(resp.read())
    assert body["kind"] == "AdmissionReview"
    assert body["response"] == {"uid": uid, "allowed": True}
    peer = conn.sock.getpeercert()
    assert ("IP Address", "127.0.0.1") in peer["subjectAltName"]
    conn.close()

    # Signed by that CA, not by any other the machine or the test bed knows.
    for other in (
        ssl.create_default_context(),
        ssl.create_default_context(cadata=testbed[SOURCE].ca.cert_pem.decode()),
    ):
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=other, timeout=5)
        with pytest.raises(ssl.SSLCertVerificationError):
            conn.request("POST", "/mutate", body=review(uid))
        conn.close()


def test_the_health_port_serves_probes_and_metrics_only(installation: Installation):
    port = installation.health_ports[SOURCE][0]

    def get(path: str, method: str = "GET") -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.read()

    assert get("/healthz") == (200, b"ok")
    assert get("/readyz") == (200, b"ok")
    code, metrics = get("/metrics")
    assert code == 200
    assert b"# HELP" in metrics
    for path in (
        "/",
        "/mutate",
        "/config",
        "/env",
        "/debug/pprof/",
        "/secrets",
        "/logs",
        "/metrics/../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
    ):
        code, body = get(path)
        assert code == 404, (path, code, body[:200])
    assert get("/mutate", "POST")[0] in (404, 405)
    assert get("/metrics", "DELETE")[0] == 405


# -- 4. secret data never reaches logs, events, statuses or metrics ------------------------------


def needles(value: bytes | str, jwt: bool = False) -> list[bytes]:
    """How a value could show: as is, base64 (whole or a 63-byte prefix, as in a Secret's
    data), Python's repr of bytes; for a JWT, its signature alone."""
    raw = value.encode() if isinstance(value, str) else value
    found = [raw, base64.b64encode(raw)]
    if jwt:  # its header is the same in every token of the issuer: not distinctive
        return [*found, raw.split(b".")[2]]
    found.append(base64.b64encode(raw[:63]))
    if len(raw) > 64:
        found.append(raw[:64])
    try:
        raw.decode()
    except UnicodeDecodeError:
        found.append(repr(raw[:32])[2:-1].encode())
    return found


def haystacks(testbed: TestBed, kubectl: Kubectl, installation: Installation) -> dict[str, bytes]:
    """Everything an operator or another tenant may read: every agent's log (with its webhook
    process's output), every event of every cluster, the conditions of our resources, and
    every agent's /metrics."""
    found: dict[str, bytes] = {}
    for name, cluster in testbed.clusters.items():
        logs = sorted((cluster.dir / "logs").glob("agent-*.log"))
        assert logs, f"no agent log in {cluster.dir / 'logs'}"
        for log in logs:
            found[f"{name} {log.name}"] = log.read_bytes()
        for kind in ("events", "events.events.k8s.io"):
            found[f"{name} {kind}"] = kubectl(name, "get", kind, "-A", "-o", "json").encode()
        for kind in ("targets", "clustertargets", "sources", "clustersources"):
            items = kubectl.json(name, "get", kind, "-A")["items"]
            found[f"{name} {kind} status"] = json.dumps([i.get("status") for i in items]).encode()
        for port in installation.health_ports[name]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                found[f"{name} :{port}/metrics"] = resp.read()
    return found


def leaks(found: dict[str, bytes], values: dict[str, list[bytes]]) -> list[str]:
    return [
        f"{what} ({needle[:24]!r}…) in {where}"
        for what, forms in values.items()
        for needle in forms
        for where, text in found.items()
        if needle in text
    ]


def agent_token(testbed: TestBed, name: str) -> str:
    config = json.loads((testbed[name].dir / "agent.kubeconfig").read_text())
    return config["users"][0]["user"]["token"]


def distinctive(what: str) -> str:
    return f"{what}-{secrets.token_hex(12)}"


def kubeconfig_with(testbed: TestBed, user: dict, server: str | None = None, **top) -> str:
    config = json.loads(kubeconfig_for(testbed, "placeholder", server))
    config["users"] = [{"name": "c1", "user": user}]
    config.update(top)
    return json.dumps(config)


def test_secret_data_never_reaches_logs_events_statuses_or_metrics(
    installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str
):
    ns = namespace
    grant_source(kubectl, ns)
    token = kubectl(TARGET, "create", "token", "c1", "-n", ns, "--duration=1h").strip()
    forged = distinctive("forged")
    env_value, env_from_value, volume_value = (distinctive(w) for w in ("env", "envfrom", "vol"))
    binary = b"\xff\xfe\x00" + secrets.token_bytes(48) + b"\x80"
    huge = (distinctive("huge") * 40_000)[:600_000].encode()
    stray, broken_ca, bad_user = (distinctive(w) for w in ("stray", "ca", "user"))
    values = {
        "the real token": needles(token, jwt=True),
        "a forged token": needles(forged),
        "an env secret": needles(env_value),
        "an envFrom secret": needles(env_from_value),
        "a volume secret": needles(volume_value),
        "a binary secret": needles(binary),
        "a huge secret": needles(huge),
        "another key of a kubeconfig Secret": needles(stray),
        "a bad certificate": needles(broken_ca),
        "a user of an invalid kubeconfig": needles(bad_user),
        **{
            f"the agent token of {n}": needles(agent_token(testbed, n), jwt=True)
            for n in testbed.clusters
        },
    }

    # Targets: one Ready with the real token, and each way of failing with secret content.
    ca_data = base64.b64encode(broken_ca.encode() * 3).decode()
    made = {
        "c2": ({"config": kubeconfig_for(testbed, token)}, "Ready"),
        "forged": ({"config": kubeconfig_for(testbed, forged)}, "Unauthorized"),
        "away": (
            {"config": kubeconfig_for(testbed, token, "https://127.0.0.1:1")},
            "Unreachable",
        ),
        "nokey": ({"other": stray}, "KeyNotFound"),
        "nocontext": (
            {"config": kubeconfig_with(testbed, {"token": bad_user}, **{"current-context": "x"})},
            "InvalidKubeconfig",
        ),
        "badca": (
            {
                "config": kubeconfig_for(testbed, token).replace(
                    json.loads(kubeconfig_for(testbed, token))["clusters"][0]["cluster"][
                        "certificate-authority-data"
                    ],
                    ca_data,
                )
            },
            "InvalidKubeconfig",
        ),
    }
    for name, (data, _) in made.items():
        kubectl.apply(SOURCE, secret(name, ns, data))
        kubectl.apply(SOURCE, target(name, ns, name))
    create(kubectl, SOURCE, raw_secret("binary", ns, {"config": b"token: " + binary}))
    kubectl.apply(SOURCE, target("binary", ns, "binary"))
    made["binary"] = ({}, "InvalidKubeconfig")
    for name, (_, reason) in made.items():
        wait_for(
            lambda n=name, r=reason: ready(kubectl, "target", n, ns).get("reason") == r,
            30,
            what=f"Target {name} {reason}",
        )

    # An elected pod that uses secrets every way a pod can, followed to cluster2.
    create(kubectl, SOURCE, raw_secret("env", ns, {"value": env_value.encode()}))
    create(kubectl, SOURCE, raw_secret("envfrom", ns, {"VALUE": env_from_value.encode()}))
    create(
        kubectl,
        SOURCE,
        raw_secret("volume", ns, {"value": volume_value.encode(), "blob": binary, "huge": huge}),
    )
    kubectl(SOURCE, "label", "namespace", ns, ENABLED)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "reader", "annotations": {PREFIX + "elect": ""}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "env": [
                        {
                            "name": "VALUE",
                            "valueFrom": {"secretKeyRef": {"name": "env", "key": "value"}},
                        }
                    ],
                    "envFrom": [{"secretRef": {"name": "envfrom"}}],
                    "volumeMounts": [{"name": "secret", "mountPath": "/secret"}],
                }
            ],
            "volumes": [{"name": "secret", "secret": {"secretName": "volume"}}],
        },
    }
    kubectl(SOURCE, "create", "-n", ns, "-f", "-", stdin=json.dumps(pod))
    try:
        wait_for(lambda: all_running(kubectl, ns, 1), 60, what="the elected pod Running")
        placed = proxies(kubectl, ns)[0]["spec"]["nodeName"]
        assert placed == f"admiralty-namespace-{ns}-c2"
        for name in ("env", "envfrom", "volume"):
            here = kubectl.json(SOURCE, "get", "secret", name, "-n", ns)["data"]
            there = kubectl.json(TARGET, "get", "secret", name, "-n", ns)["data"]
            assert there == here, f"secret {name} followed"
        time.sleep(2)  # events are written asynchronously

        found = haystacks(testbed, kubectl, installation)
        print(f"searched {sum(len(t) for t in found.values())} bytes in {len(found)} places")
        # The places searched do tell of these flows (the search is not of empty files).
        for reason in {r for _, r in made.values()}:
            assert f'"reason": "{reason}"'.encode() in found[f"{SOURCE} events"], reason
        copied = f"copy created Secret {ns}/volume target=c2".encode()
        assert copied in found[f"{SOURCE} agent-0.log"]
        assert (
            b"multicluster_scheduler_"
            in found[f"{SOURCE} :{installation.health_ports[SOURCE][0]}/metrics"]
        )
        assert leaks(found, values) == []
    finally:
        cleanup(kubectl, ns)
        disconnect(kubectl, ns)


def test_a_kubeconfig_that_is_not_yaml_is_not_quoted_in_its_error(
    installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str
):
    value = f"pw{secrets.token_hex(8)}"  # a password's length: short enough to be quoted whole
    broken = f'apiVersion: v1\nkind: Config\nusers:\n- name: c1\n  user: {{password: "{value}\n'
    kubectl.apply(SOURCE, secret("broken", namespace, {"config": broken}))
    kubectl.apply(SOURCE, target("broken", namespace, "broken"))
    wait_for(
        lambda: ready(kubectl, "target", "broken", namespace).get("reason") == "InvalidKubeconfig",
        30,
        what="Target InvalidKubeconfig",
    )
    message = ready(kubectl, "target", "broken", namespace)["message"]
    print(f"InvalidKubeconfig: {message}")
    time.sleep(1)
    try:
        assert (
            leaks(haystacks(testbed, kubectl, installation), {"a password": needles(value)}) == []
        )
    finally:
        kubectl(SOURCE, "delete", "targets", "--all", "-n", namespace, "--wait=false")


class Recorder(BaseHTTPRequestHandler):
    """A server a Target's kubeconfig may point at: it records the credentials it is sent."""

    seen: list[str] = []

    def do_GET(self) -> None:
        Recorder.seen.append(self.headers.get("Authorization") or "")
        self.send_response(401)
        self.end_headers()

    def log_message(self, *_args) -> None:
        pass


def test_a_target_kubeconfig_can_neither_run_commands_nor_read_the_agents_files(
    installation: Installation,
    testbed: TestBed,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
):
    """A user who may create Secrets and Targets in one namespace must not get the agent (which
    reads every Secret of the cluster) to run a command, or to send its own credentials."""
    ran = tmp_path / "ran"
    credential = json.dumps(
        {
            "apiVersion": "client.authentication.k8s.io/v1",
            "kind": "ExecCredential",
            "status": {"token": "from-a-command"},
        }
    )
    command = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": "sh",
        "args": ["-c", f"touch {ran}; echo '{credential}'"],
        "interactiveMode": "Never",
    }
    Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"http://127.0.0.1:{server.server_address[1]}"
    own = testbed[SOURCE].dir / "agent.kubeconfig"
    kubectl.apply(
        SOURCE, secret("runs", namespace, {"config": kubeconfig_with(testbed, {"exec": command})})
    )
    kubectl.apply(
        SOURCE,
        secret(
            "reads",
            namespace,
            {"config": kubeconfig_with(testbed, {"tokenFile": str(own)}, address)},
        ),
    )
    try:
        for name in ("runs", "reads"):
            kubectl.apply(SOURCE, target(name, namespace, name))
        for name in ("runs", "reads"):
            wait_for(
                lambda n=name: ready(kubectl, "target", n, namespace).get("status") == "False",
                30,
                what=f"Target {name} not Ready",
            )
        time.sleep(2)
        sent = [header for header in Recorder.seen if agent_token(testbed, SOURCE) in header]
        print(f"exec ran: {ran.exists()}; requests with the agent's token: {len(sent)}")
        assert not ran.exists(), "the agent ran a command of a Target's kubeconfig"
        assert not sent, "the agent sent its own token to a Target's server"
        for name in ("runs", "reads"):
            assert ready(kubectl, "target", name, namespace)["reason"] == "InvalidKubeconfig"
    finally:
        kubectl(SOURCE, "delete", "targets", "--all", "-n", namespace, "--wait=false")
        server.shutdown()
