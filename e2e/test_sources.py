"""The guide's "Creating ClusterSources and Sources in Target Clusters", done by the source
controller: the service account and bindings appear, drift is repaired, the identity can do
exactly what the source role allows (real RBAC refuses the rest), and deleting a source leaves
nothing behind, no finalizer either."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import yaml

from testbed import TestBed, guide, wait_for
from testbed.install import CHART, NAMESPACE, RELEASE, Installation
from testbed.kubectl import Kubectl

TARGET = "cluster2"
FINALIZER = "multicluster.admiralty.io/multiclusterForegroundDeletion"
HAS_FINALIZER = "multicluster.admiralty.io/has-finalizer"
SOURCE_ROLE = "multicluster-scheduler-source"
VIEWER_ROLE = "multicluster-scheduler-cluster-summary-viewer"
SUMMARY = "/apis/multicluster.admiralty.io/v1alpha1/clustersummaries"
# Owned objects go by kube-controller-manager's garbage collector, at once in a cluster whose
# CRDs are older than 30 s. The test bed installs them seconds before: the collector finds new
# resources every 30 s and meanwhile retries owners of unknown kinds with growing backoff.
GC_TIMEOUT = 120


def get(kubectl: Kubectl, *args: str) -> dict | None:
    proc = kubectl.run(TARGET, "get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def ready(obj: dict | None) -> tuple[str, str] | None:
    for condition in ((obj or {}).get("status") or {}).get("conditions") or ():
        if condition["type"] == "Ready":
            return condition["status"], condition["reason"]
    return None


def events(kubectl: Kubectl, namespace: str, name: str, reason: str) -> list[dict]:
    selector = f"involvedObject.name={name},reason={reason}"
    found = get(kubectl, "events", "-n", namespace, "--field-selector", selector)
    return (found or {}).get("items") or []


def subjects(binding: dict) -> list[tuple]:
    return sorted((s["kind"], s["name"], s.get("namespace", "")) for s in binding["subjects"])


def role_ref(binding: dict) -> tuple:
    ref = binding["roleRef"]
    return ref["apiGroup"], ref["kind"], ref["name"]


def owners(obj: dict) -> list[tuple[str, str]]:
    return [(r["kind"], r["name"]) for r in obj["metadata"].get("ownerReferences") or ()]


class TokenClient:
    """Raw HTTPS calls to the target's API server as a bearer token: status codes, nothing
    else, so that what real RBAC decides is asserted as is."""

    def __init__(self, testbed: TestBed, token: str) -> None:
        cluster = testbed[TARGET]
        self.server = cluster.server
        self.token = token
        self.context = ssl.create_default_context(cadata=cluster.ca.cert_pem.decode())

    def status(self, method: str, path: str, body: dict | None = None) -> int:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=10) as resp:
                return resp.status
        except urllib.error.HTTPError as e:
            return e.code


def pod(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def token_of(kubectl: Kubectl, namespace: str, account: str) -> str:
    """A long-lived token: a Secret the token controller fills (the guide's era)."""
    kubectl.apply(
        TARGET,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/service-account-token",
            "metadata": {
                "name": f"{account}-token",
                "namespace": namespace,
                "annotations": {"kubernetes.io/service-account.name": account},
            },
        },
    )
    secret = wait_for(
        lambda: (
            (s := get(kubectl, "secret", f"{account}-token", "-n", namespace))
            and (s.get("data") or {}).get("token")
            and s
        ),
        30,
        what="the token controller to fill the token",
    )
    return base64.b64decode(secret["data"]["token"]).decode()


def gone(kubectl: Kubectl, *args: str) -> bool:
    return get(kubectl, *args) is None


@pytest.fixture
def sources(installation: Installation, kubectl: Kubectl, namespace: str):
    """The namespace; afterwards every Source in it and the ClusterSources of the tests are
    deleted while the agent still runs (their finalizers must go)."""
    yield namespace
    cluster_sources = ("c1", f"{namespace}-nowhere")
    kubectl(TARGET, "delete", "sources", "--all", "-n", namespace, "--wait=false")
    kubectl(
        TARGET, "delete", "clustersource", *cluster_sources, "--ignore-not-found", "--wait=false"
    )
    wait_for(
        lambda: (
            not (get(kubectl, "sources", "-n", namespace) or {}).get("items")
            and all(gone(kubectl, "clustersource", c) for c in cluster_sources)
        ),
        30,
        what="sources deleted",
    )


def render(bin_dir, *values: str) -> list[dict]:
    argv = [str(bin_dir / "helm"), "template", RELEASE, str(CHART), "-n", NAMESPACE]
    argv += ["--kube-version", "1.36.0"]
    argv += [a for v in values for a in ("--set", v)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_chart_turns_the_source_controller_on_and_off(bin_dir, enabled: bool):
    docs = render(bin_dir, f"sourceController.enabled={str(enabled).lower()}")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--source-controller={str(enabled).lower()}" in args
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == RELEASE)
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert ({"sources", "clustersources", "rolebindings"} <= resources) is enabled
    verbs: dict[str, set[str]] = {}
    for rule in role["rules"]:
        for resource in rule["resources"]:
            verbs.setdefault(resource, set()).update(rule["verbs"])
    if enabled:
        assert {"get", "create", "patch"} <= verbs["serviceaccounts"]  # shared: owners added
        assert "delete" not in verbs["serviceaccounts"]
        return
    # Off: only what lets Sources that carry our finalizer be deleted (the cleanup).
    assert verbs["sources"] == {"get", "list", "watch", "patch"}
    assert verbs["clusterrolebindings"] == {"list", "watch", "delete"}
    # The keeper reads ClusterSources to know whose heartbeats count, and the uid of the service
    # account that wrote one; nothing more.
    assert verbs["clustersources"] == {"list", "watch"}
    assert verbs["serviceaccounts"] == {"get"}
    assert not {"sources/status", "clustersources/status", "rolebindings"} & set(verbs)
    assert not any("bind" in rule["verbs"] for rule in role["rules"])


def test_sources_that_cannot_be_bound_say_why(sources: str, kubectl: Kubectl):
    namespace = sources
    # Someone else's service account and RoleBinding, of the names a Source would use.
    kubectl(TARGET, "create", "serviceaccount", "c2", "-n", namespace)
    kubectl(
        TARGET,
        "create",
        "rolebinding",
        "admiralty-source-c2",
        "-n",
        namespace,
        "--clusterrole=view",
        "--user=someone",
    )
    kubectl.apply(
        TARGET,
        f"""apiVersion: multicluster.admiralty.io/v1alpha1
kind: Source
metadata:
  name: nobody
  namespace: {namespace}
spec: {{}}
---
apiVersion: multicluster.admiralty.io/v1alpha1
kind: Source
metadata:
  name: c2
  namespace: {namespace}
spec:
  serviceAccountName: c2
""",
    )
    wait_for(
        lambda: ready(get(kubectl, "source", "nobody", "-n", namespace)) == ("False", "NoSubject"),
        20,
        what="Source nobody NoSubject",
    )
    wait_for(
        lambda: (
            ready(get(kubectl, "source", "c2", "-n", namespace)) == ("False", "BindingConflict")
        ),
        20,
        what="Source c2 BindingConflict",
    )
    conflict = get(kubectl, "source", "c2", "-n", namespace)["status"]["conditions"][0]
    assert "RoleBinding" in conflict["message"]
    assert "not overwritten" in conflict["message"]
    for name, reason in (("nobody", "NoSubject"), ("c2", "BindingConflict")):
        found = wait_for(
            lambda n=name, r=reason: events(kubectl, namespace, n, r), 10, what="event"
        )
        assert found[0]["type"] == "Warning"
    theirs = get(kubectl, "rolebinding", "admiralty-source-c2", "-n", namespace)
    assert subjects(theirs) == [("User", "someone", "")]
    assert role_ref(theirs)[2] == "view"
    account = get(kubectl, "serviceaccount", "c2", "-n", namespace)
    assert owners(account) == []  # used, not taken over
    assert not account["metadata"].get("labels")


def test_a_user_subject_and_losing_it(sources: str, kubectl: Kubectl):
    namespace = sources
    kubectl.apply(
        TARGET,
        f"""apiVersion: multicluster.admiralty.io/v1alpha1
kind: Source
metadata:
  name: alice
  namespace: {namespace}
spec:
  userName: alice
---
apiVersion: multicluster.admiralty.io/v1alpha1
kind: ClusterSource
metadata:
  name: {namespace}-nowhere
spec:
  serviceAccount:
    name: c1
    namespace: {namespace}-missing
""",
    )
    crb = f"admiralty-source-{namespace}-alice-cluster-summary-viewer"
    wait_for(
        lambda: ready(get(kubectl, "source", "alice", "-n", namespace)) == ("True", "Bound"),
        20,
        what="Source alice Bound",
    )
    assert gone(kubectl, "serviceaccount", "alice", "-n", namespace)
    for binding in (
        get(kubectl, "rolebinding", "admiralty-source-alice", "-n", namespace),
        get(kubectl, "clusterrolebinding", crb),
    ):
        assert binding["subjects"] == [
            {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}
        ]
    # Without a subject, what was bound before is unbound.
    kubectl(
        TARGET, "patch", "source", "alice", "-n", namespace, "--type=merge",
        "-p", '{"spec": {"userName": null}}',
    )  # fmt: skip
    wait_for(
        lambda: (
            ready(get(kubectl, "source", "alice", "-n", namespace)) == ("False", "NoSubject")
            and gone(kubectl, "rolebinding", "admiralty-source-alice", "-n", namespace)
            and gone(kubectl, "clusterrolebinding", crb)
        ),
        20,
        what="Source alice NoSubject, its bindings deleted",
    )
    nowhere = f"{namespace}-nowhere"
    wait_for(
        lambda: ready(get(kubectl, "clustersource", nowhere)) == ("False", "NamespaceNotFound"),
        20,
        what="ClusterSource NamespaceNotFound",
    )


def test_a_cluster_source_binds_a_service_account_in_its_namespace(sources: str, kubectl: Kubectl):
    kubectl.apply(TARGET, guide.CLUSTER_SOURCE)  # service account admiralty/c1
    cluster_source = wait_for(
        lambda: (s := get(kubectl, "clustersource", "c1")) and ready(s) == ("True", "Bound") and s,
        20,
        what="ClusterSource c1 Ready",
    )
    assert not cluster_source["metadata"].get("finalizers")  # owner references suffice
    account = get(kubectl, "serviceaccount", "c1", "-n", NAMESPACE)
    assert owners(account) == [("ClusterSource", "c1")]
    expected = {
        "admiralty-clustersource-c1": SOURCE_ROLE,
        "admiralty-clustersource-c1-cluster-summary-viewer": VIEWER_ROLE,
    }
    for name, role in expected.items():
        binding = get(kubectl, "clusterrolebinding", name)
        assert role_ref(binding)[2] == role
        assert subjects(binding) == [("ServiceAccount", "c1", NAMESPACE)]
        assert owners(binding) == [("ClusterSource", "c1")]

    started = time.monotonic()
    kubectl(TARGET, "delete", "clustersource", "c1", "--wait=false")
    wait_for(
        lambda: (
            gone(kubectl, "clustersource", "c1")
            and all(gone(kubectl, "clusterrolebinding", n) for n in expected)
            and gone(kubectl, "serviceaccount", "c1", "-n", NAMESPACE)
        ),
        GC_TIMEOUT,
        what="ClusterSource, its bindings and service account gone",
    )
    print(f"ClusterSource and all it made gone in {time.monotonic() - started:.1f}s")


def test_a_source_is_bound_repaired_confined_and_cleaned_up(
    sources: str, kubectl: Kubectl, testbed: TestBed
):
    namespace = sources
    rb_name, crb_name = "admiralty-source-c1", f"admiralty-source-{namespace}-c1"
    crb_name += "-cluster-summary-viewer"
    started = time.monotonic()
    kubectl.apply(TARGET, guide.source(namespace))
    source = wait_for(
        lambda: (
            (s := get(kubectl, "source", "c1", "-n", namespace))
            and ready(s) == ("True", "Bound")
            and s
        ),
        20,
        what="Source c1 Ready",
    )
    print(f"Source Ready {time.monotonic() - started:.1f}s after it was applied")

    # What it made: the guide's objects, owned where Kubernetes allows it.
    assert FINALIZER in source["metadata"]["finalizers"]
    assert source["metadata"]["labels"][HAS_FINALIZER] == "true"
    account = get(kubectl, "serviceaccount", "c1", "-n", namespace)
    assert owners(account) == [("Source", "c1")]
    rb = get(kubectl, "rolebinding", rb_name, "-n", namespace)
    assert role_ref(rb) == ("rbac.authorization.k8s.io", "ClusterRole", SOURCE_ROLE)
    assert subjects(rb) == [("ServiceAccount", "c1", namespace)]
    assert owners(rb) == [("Source", "c1")]
    crb = get(kubectl, "clusterrolebinding", crb_name)
    assert role_ref(crb) == ("rbac.authorization.k8s.io", "ClusterRole", VIEWER_ROLE)
    assert subjects(crb) == [("ServiceAccount", "c1", namespace)]
    assert owners(crb) == []  # cluster-scoped: never owned by a namespaced Source
    assert events(kubectl, namespace, "c1", "Bound")

    # Drift is repaired: subjects rewritten, a deleted binding made again.
    started = time.monotonic()
    kubectl(
        TARGET,
        "patch",
        "rolebinding",
        rb_name,
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"subjects": [{"kind": "User", "name": "mallory"}]}),
    )
    wait_for(
        lambda: (
            subjects(get(kubectl, "rolebinding", rb_name, "-n", namespace))
            == [("ServiceAccount", "c1", namespace)]
        ),
        10,
        what="RoleBinding subjects restored",
    )
    print(f"RoleBinding subjects restored in {time.monotonic() - started:.1f}s")
    started = time.monotonic()
    kubectl(TARGET, "delete", "clusterrolebinding", crb_name)
    again = wait_for(
        lambda: get(kubectl, "clusterrolebinding", crb_name), 10, what="ClusterRoleBinding back"
    )
    assert again["metadata"]["uid"] != crb["metadata"]["uid"]
    assert subjects(again) == [("ServiceAccount", "c1", namespace)]
    print(f"ClusterRoleBinding recreated in {time.monotonic() - started:.1f}s")

    # The identity may place pods here and read the summary; real RBAC refuses the rest.
    wait_for(lambda: get(kubectl, "serviceaccount", "default", "-n", namespace), 30, what="sa")
    as_source = TokenClient(testbed, token_of(kubectl, namespace, "c1"))
    pods = f"/api/v1/namespaces/{namespace}/pods"
    assert as_source.status("POST", pods, pod("probe")) == 201
    assert as_source.status("GET", f"/api/v1/namespaces/{namespace}/secrets") == 200
    assert as_source.status("DELETE", f"{pods}/probe") == 200
    assert as_source.status("GET", f"{SUMMARY}/singleton") == 200
    assert as_source.status("GET", SUMMARY) == 200
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    refused = {
        "pod in another namespace": ("POST", "/api/v1/namespaces/default/pods", pod("probe")),
        "list nodes": ("GET", "/api/v1/nodes", None),
        "list pods everywhere": ("GET", "/api/v1/pods", None),
        "secrets in another namespace": ("GET", "/api/v1/namespaces/kube-system/secrets", None),
        "create a namespace": (
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "escape"}},
        ),
        "create a cluster role binding": (
            "POST",
            f"{rbac}/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "escape"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "cluster-admin",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "c1", "namespace": namespace}],
            },
        ),
        "delete its own role binding": (
            "DELETE",
            f"{rbac}/namespaces/{namespace}/rolebindings/{rb_name}",
            None,
        ),
        "delete the summary": ("DELETE", f"{SUMMARY}/singleton", None),
    }
    statuses = {what: as_source.status(*call) for what, call in refused.items()}
    assert statuses == dict.fromkeys(refused, 403)

    # Our service account, deleted, is made again.
    kubectl(TARGET, "delete", "serviceaccount", "c1", "-n", namespace)
    again = wait_for(
        lambda: get(kubectl, "serviceaccount", "c1", "-n", namespace), 10, what="sa made again"
    )
    assert again["metadata"]["uid"] != account["metadata"]["uid"]

    # Deleted: the finalizer removes the ClusterRoleBinding, garbage collection the rest.
    started = time.monotonic()
    kubectl(TARGET, "delete", "source", "c1", "-n", namespace, "--wait=false")
    wait_for(lambda: gone(kubectl, "source", "c1", "-n", namespace), 15, what="Source gone")
    assert gone(kubectl, "clusterrolebinding", crb_name)
    wait_for(
        lambda: (
            gone(kubectl, "rolebinding", rb_name, "-n", namespace)
            and gone(kubectl, "serviceaccount", "c1", "-n", namespace)
        ),
        GC_TIMEOUT,
        what="RoleBinding and ServiceAccount garbage-collected",
    )
    print(f"Source and all it made gone in {time.monotonic() - started:.1f}s")


def test_a_service_account_shared_by_two_sources_outlives_the_first(sources: str, kubectl: Kubectl):
    """Two Sources name service account c1: both own it, so deleting one leaves it (same uid,
    so its tokens stay valid) to the other."""
    namespace = sources
    kubectl.apply(
        TARGET,
        "---\n".join(
            f"""apiVersion: multicluster.admiralty.io/v1alpha1
kind: Source
metadata:
  name: {name}
  namespace: {namespace}
spec:
  serviceAccountName: c1
"""
            for name in ("first", "second")
        ),
    )
    account = wait_for(
        lambda: (
            all(
                ready(get(kubectl, "source", n, "-n", namespace)) == ("True", "Bound")
                for n in ("first", "second")
            )
            and (a := get(kubectl, "serviceaccount", "c1", "-n", namespace))
            and sorted(owners(a)) == [("Source", "first"), ("Source", "second")]
            and a
        ),
        20,
        what="both Sources Ready and owners of service account c1",
    )
    kubectl(TARGET, "delete", "source", "first", "-n", namespace, "--wait=false")
    kept = wait_for(
        lambda: (
            (a := get(kubectl, "serviceaccount", "c1", "-n", namespace))
            and owners(a) == [("Source", "second")]
            and a
        ),
        GC_TIMEOUT,
        what="service account c1 owned by the second Source only",
    )
    assert kept["metadata"]["uid"] == account["metadata"]["uid"]
    assert ready(get(kubectl, "source", "second", "-n", namespace)) == ("True", "Bound")
