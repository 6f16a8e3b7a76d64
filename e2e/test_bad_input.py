"""Bad input of every kind, on the real test bed, all at once: malformed Targets, ClusterTargets,
kubeconfig Secrets, Sources and ClusterSources; elected pods that are too large, pre-bound,
tampered with, colliding once their labels are prefixed, or at the length limits of names;
AdmissionReviews that are not. Each one gets its precise answer: a refusal with the reason
(from the API server's schema, or from our webhook), a condition with its reason and an event,
or an admission warning. Then the point of it all: the agents never restarted and logged no
traceback, good targets stayed Ready, pods placed before still run, and a pod created after
runs too.

Bad objects are applied in bulk, one group per fixture, and each case then checks its own
outcome, so the module costs little more than the slowest reaction (a few seconds)."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import re
import socket
import ssl
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e.scenarios import SOURCE, TARGET, connect, grant_source, kubeconfig_for, secret
from multicluster_scheduler.api.keys import (
    API_VERSION,
    ELECT,
    GROUP,
    PARENT_UID,
    SOURCEPOD_MANIFEST,
)
from testbed import TestBed, wait_for
from testbed.install import Installation
from testbed.kubectl import Kubectl

API = API_VERSION
MANIFEST = SOURCEPOD_MANIFEST
CEL = "exactly one of spec.self (true) and spec.kubeconfigSecret must be set"
SETTLE = 45  # seconds for any one reaction; they usually take one or two


@dataclass
class Bed:
    """The namespaces of this module and what the agents looked like before any bad input."""

    pods: str  # connected (c1 self, c2), enabled for elected pods
    targets: str  # broken Targets next to one good one
    sources: str  # in the target cluster
    started: dict[str, float | None]
    log_offsets: dict[str, int]


def agent_log(testbed: TestBed, cluster: str) -> Path:
    return testbed[cluster].dir / "logs" / "agent-0.log"


@pytest.fixture(scope="module")
def installation(testbed: TestBed):
    """The broken Targets are more than one namespace connects by default (10)."""
    install = Installation(testbed, agent_args=("--max-targets-per-namespace=100",))
    install.install()
    install.start_agents()
    yield install
    if install.installed:
        install.uninstall()


@pytest.fixture(scope="module")
def bed(installation: Installation, testbed: TestBed, kubectl: Kubectl):
    suffix = uuid.uuid4().hex[:8]
    names = {"pods": f"bp{suffix}", "targets": f"bt{suffix}", "sources": f"bs{suffix}"}
    for namespace in names.values():
        for context in (SOURCE, TARGET):
            kubectl(context, "create", "namespace", namespace)
    connect(kubectl, testbed, names["pods"])
    kubectl(SOURCE, "label", "namespace", names["pods"], "multicluster-scheduler=enabled")
    kubectl.apply(SOURCE, deployment("steady", 2), "-n", names["pods"])
    wait_for(lambda: running_proxies(kubectl, names["pods"], "steady") == 2, 60, what="steady")
    agents = {c: installation.agents[c][0] for c in (SOURCE, TARGET)}
    yield Bed(
        **names,
        started={c: a.started_at for c, a in agents.items()},
        log_offsets={c: agent_log(testbed, c).stat().st_size for c in agents},
    )
    for kind in ("deployments", "pods"):
        kubectl(SOURCE, "delete", kind, "--all", "-n", names["pods"], "--wait=false")
    wait_for(  # while the agent runs: proxy pods' finalizers are its to remove
        lambda: not (get(kubectl, SOURCE, "pods", "-n", names["pods"]) or {}).get("items"),
        SETTLE,
        what="the module's pods gone",
    )
    # Targets go before the namespaces (and before the bindings their identities use): the
    # next module's agents must not meet them while the namespaces terminate.
    for namespace in (names["targets"], names["pods"]):
        kubectl(SOURCE, "delete", "targets", "--all", "-n", namespace)
    kubectl(TARGET, "delete", "sources", "--all", "-n", names["sources"], "--wait=false")
    cluster_scoped = kubectl(SOURCE, "get", "clustertargets", "-o", "name").split()
    cluster_scoped = [n for n in cluster_scoped if suffix in n]
    if cluster_scoped:
        kubectl(SOURCE, "delete", *cluster_scoped)
    sources = kubectl(TARGET, "get", "clustersources", "-o", "name").split()
    sources = [n for n in sources if suffix in n]
    if sources:
        kubectl(TARGET, "delete", *sources, "--wait=false")
    kubectl(
        TARGET,
        "delete",
        "clusterrolebinding",
        f"admiralty-source-{names['targets']}-c1-cluster-summary-viewer",
        f"admiralty-source-{names['pods']}-c1-cluster-summary-viewer",
        "--ignore-not-found",
    )
    for namespace in names.values():
        for context in (SOURCE, TARGET):
            kubectl(context, "delete", "namespace", namespace, "--wait=false")


# -- helpers --------------------------------------------------------------------------------


def deployment(name: str, replicas: int) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": {ELECT: ""}},
                "spec": {"containers": [{"name": "main", "image": "nginx"}]},
            },
        },
    }


def get(kubectl: Kubectl, context: str, *args: str) -> dict | None:
    proc = kubectl.run(context, "get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def condition(obj: dict | None, kind: str) -> dict:
    for c in ((obj or {}).get("status") or {}).get("conditions") or ():
        if c["type"] == kind:
            return c
    return {}


def events(kubectl: Kubectl, context: str, namespace: str, name: str, reason: str) -> list[dict]:
    selector = f"involvedObject.name={name},reason={reason}"
    found = get(kubectl, context, "events", "-n", namespace, "--field-selector", selector)
    return (found or {}).get("items") or []


def refused(kubectl: Kubectl, context: str, body: dict, *args: str) -> str:
    """What the API server answered to a refused create (stderr)."""
    proc = kubectl.run(context, "create", "-f", "-", *args, stdin=json.dumps(body), check=False)
    assert proc.returncode != 0, f"accepted: {proc.stdout}"
    return proc.stderr


def running_proxies(kubectl: Kubectl, namespace: str, app: str) -> int:
    found = get(kubectl, SOURCE, "pods", "-n", namespace, "-l", f"app={app}") or {}
    return sum(
        1
        for p in found.get("items") or ()
        if p["spec"].get("schedulerName") == "admiralty-proxy"
        and p["status"].get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    )


def delegate_of(kubectl: Kubectl, proxy: dict) -> dict | None:
    namespace, uid = proxy["metadata"]["namespace"], proxy["metadata"]["uid"]
    for context in (SOURCE, TARGET):
        found = get(kubectl, context, "pods", "-n", namespace, "-l", f"{PARENT_UID}={uid}")
        for item in (found or {}).get("items") or ():
            return item
    return None


# -- Targets and ClusterTargets: refused by the API server's schema ------------------------


def target(name: str, spec: object, kind: str = "Target", namespace: str | None = None) -> dict:
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": API, "kind": kind, "metadata": metadata, "spec": spec}


REFUSED_TARGETS = {
    "self-and-secret": ({"self": True, "kubeconfigSecret": {"name": "c2"}}, CEL),
    "neither": ({}, CEL),
    "self-false": ({"self": False}, CEL),
    "self-a-string": ({"self": "yes"}, "spec.self in body must be of type boolean"),
    "secret-a-string": ({"kubeconfigSecret": "c2"}, "must be of type object"),
    "unknown-field": ({"self": True, "selff": True}, 'unknown field "spec.selff"'),
    "empty-secret-name": (
        {"kubeconfigSecret": {"name": ""}},
        "spec.kubeconfigSecret.name in body should be at least 1 chars long",
    ),
    "no-secret-name": ({"kubeconfigSecret": {"key": "config"}}, "name: Required value"),
    "empty-key": (
        {"kubeconfigSecret": {"name": "c2", "key": ""}},
        "spec.kubeconfigSecret.key in body should be at least 1 chars long",
    ),
    "secret-of-another-namespace": (
        {"kubeconfigSecret": {"name": "c2", "namespace": "admiralty"}},
        'unknown field "spec.kubeconfigSecret.namespace"',
    ),
    "no-spec": (None, "spec: Required value"),
    "Bad_Name": ({"self": True}, "a lowercase RFC 1123 subdomain"),
    "t" * 254: ({"self": True}, "must be no more than 253 characters"),
}
REFUSED_CLUSTER_TARGETS = {
    "self-and-secret": ({"self": True, "kubeconfigSecret": {"name": "c2", "namespace": "x"}}, CEL),
    "secret-without-namespace": (
        {"kubeconfigSecret": {"name": "c2"}},
        "spec.kubeconfigSecret.namespace: Required value",
    ),
    "self-a-number": ({"self": 1}, "spec.self in body must be of type boolean"),
}


@pytest.mark.parametrize("case", list(REFUSED_TARGETS), ids=lambda c: c[:30])
def test_a_malformed_target_is_refused_with_the_reason(bed: Bed, kubectl: Kubectl, case: str):
    spec, reason = REFUSED_TARGETS[case]
    body = target(case, spec, namespace=bed.targets)
    if spec is None:
        del body["spec"]
    assert reason in refused(kubectl, SOURCE, body)


@pytest.mark.parametrize("case", list(REFUSED_CLUSTER_TARGETS))
def test_a_malformed_cluster_target_is_refused_with_the_reason(
    bed: Bed, kubectl: Kubectl, case: str
):
    spec, reason = REFUSED_CLUSTER_TARGETS[case]
    assert reason in refused(
        kubectl, SOURCE, target(f"{bed.targets}-{case}", spec, "ClusterTarget")
    )


# -- Targets and ClusterTargets: accepted, then Ready=False with the reason and an event ------


@dataclass
class Broken:
    """A target that cannot work: its Secret's data (None: no Secret), its reference, and the
    Ready condition's reason and a part of its message."""

    data: Callable[[Context], dict[str, str] | bytes | None]
    reason: str
    says: str
    ref: dict | None = None
    secret_name: str | None = None
    cluster: bool = False  # a ClusterTarget


@dataclass
class Context:
    bed: Bed
    testbed: TestBed
    token: str  # of a service account bound to the summary viewer role in the target
    unbound: str  # of one that is not
    health_port: int  # the target agent's plain-HTTP health port: not a Kubernetes API

    def good(self, change: Callable[[dict], object] | None = None, token: str = "") -> str:
        config = json.loads(kubeconfig_for(self.testbed, token or self.token))
        if change is not None:
            change(config)
        return json.dumps(config)


def cluster_field(**fields) -> Callable[[dict], None]:
    return lambda config: config["clusters"][0]["cluster"].update(fields)


def user(**fields) -> Callable[[dict], None]:
    return lambda config: config["users"][0].update(user=fields)


BROKEN = {
    "no-secret": Broken(lambda c: None, "SecretNotFound", "/no-secret not found"),
    "no-key": Broken(lambda c: {"other": "x"}, "KeyNotFound", "has no key 'config'"),
    "custom-key": Broken(
        lambda c: {"config": c.good()},
        "KeyNotFound",
        "has no key 'kubeconfig'",
        ref={"key": "kubeconfig"},
    ),
    "no-such-context": Broken(
        lambda c: {"config": c.good()},
        "InvalidKubeconfig",
        "kubeconfig context nope: Invalid kube-config file",
        ref={"context": "nope"},
    ),
    "not-yaml": Broken(lambda c: {"config": "key: [unclosed"}, "InvalidKubeconfig", "not valid"),
    "a-string": Broken(lambda c: {"config": "hello"}, "InvalidKubeconfig", "not a mapping"),
    "a-list": Broken(lambda c: {"config": "- a\n- b\n"}, "InvalidKubeconfig", "not a mapping"),
    "binary-garbage": Broken(
        lambda c: bytes(range(256)), "InvalidKubeconfig", "key 'config': kubeconfig is not"
    ),
    "empty-mapping": Broken(
        lambda c: {"config": "{}"}, "InvalidKubeconfig", "Expected key current-context"
    ),
    "no-clusters": Broken(
        lambda c: {"config": c.good(lambda k: k.pop("clusters"))},
        "InvalidKubeconfig",
        "Expected key clusters",
    ),
    "no-contexts": Broken(
        lambda c: {"config": c.good(lambda k: k.pop("contexts"))},
        "InvalidKubeconfig",
        "Expected key contexts",
    ),
    "users-not-a-list": Broken(
        lambda c: {"config": c.good(lambda k: k.update(users="c1"))},
        "InvalidKubeconfig",
        "users is not a list",
    ),
    "garbage-ca": Broken(
        lambda c: {"config": c.good(cluster_field(**{"certificate-authority-data": "bm8="}))},
        "InvalidKubeconfig",
        "TLS settings for https://127.0.0.1:",
    ),
    "garbage-client-certificate": Broken(
        lambda c: {
            "config": c.good(user(**{"client-certificate-data": "bm8=", "client-key-data": "bm8="}))
        },
        "InvalidKubeconfig",
        "TLS settings for https://127.0.0.1:",
    ),
    "ca-of-another-cluster": Broken(
        lambda c: {
            "config": c.good(
                cluster_field(
                    **{
                        "certificate-authority-data": base64.b64encode(
                            c.testbed[SOURCE].ca.cert_pem
                        ).decode()
                    }
                )
            )
        },
        "Unreachable",
        "the server's TLS certificate is not trusted",
    ),
    "server-not-a-url": Broken(
        lambda c: {"config": c.good(cluster_field(server="not a url"))},
        "InvalidKubeconfig",
        "the server URL is not an http:// or https:// URL",
    ),
    # A path and a query would make the agent call any URL of any address it can reach.
    "server-with-a-path": Broken(
        lambda c: {
            "config": c.good(
                cluster_field(server=f"http://127.0.0.1:{c.health_port}/metrics?name[]=")
            )
        },
        "InvalidKubeconfig",
        "the server URL has a path and a query",
    ),
    "unresolvable-host": Broken(
        lambda c: {"config": c.good(cluster_field(server="https://no-such-host.invalid:6443"))},
        "Unreachable",
        "cannot connect to no-such-host.invalid:6443",
    ),
    "http-to-https": Broken(
        lambda c: {
            "config": c.good(
                cluster_field(server=c.testbed[TARGET].server.replace("https", "http"))
            )
        },
        "Unreachable",
        "Client sent an HTTP request to an HTTPS server",
    ),
    "not-kubernetes": Broken(
        lambda c: {"config": c.good(cluster_field(server=f"http://127.0.0.1:{c.health_port}"))},
        "SummaryMissing",
        "is multicluster-scheduler installed there?",
    ),
    "forged-token": Broken(
        lambda c: {"config": c.good(token="eyJhbGciOiJSUzI1NiJ9.e30.c2lnbmF0dXJl")},
        "Unauthorized",
        "the target rejected our credentials",
    ),
    "no-credentials": Broken(
        lambda c: {"config": c.good(user())},
        "Forbidden",
        'User "system:anonymous" cannot',
    ),
    "unbound-identity": Broken(
        lambda c: {"config": c.good(token=c.unbound)},
        "Forbidden",
        "bind the multicluster-scheduler-cluster-summary-viewer ClusterRole",
    ),
    # The schema has no namespace for a namespaced Target's Secret: without validation the
    # field is pruned, and the Secret of that name in the Target's own namespace is looked for.
    "borrowed-secret": Broken(
        lambda c: None,
        "SecretNotFound",
        "/c2 not found",
        ref={"name": "c2", "namespace": "(pods)"},
        secret_name="c2",
    ),
    "cluster-secret-in-no-namespace": Broken(
        lambda c: None,
        "SecretNotFound",
        "-nowhere/x not found",
        ref={"name": "x", "namespace": "(targets)-nowhere"},
        cluster=True,
    ),
    "cluster-no-key": Broken(
        lambda c: {"other": "x"},
        "KeyNotFound",
        "has no key 'config'",
        ref={"namespace": "(targets)"},
        cluster=True,
    ),
}


def broken_name(bed: Bed, case: str) -> str:
    return f"{bed.targets}-{case}" if BROKEN[case].cluster else case


def broken_objects(context: Context) -> tuple[list[dict], list[dict]]:
    """Secrets and Targets for every broken case (ClusterTargets' Secrets in the targets
    namespace), and the Targets applied without validation (a field the schema lacks)."""
    bed = context.bed
    checked, unchecked = [], []
    for case, broken in BROKEN.items():
        name = broken_name(bed, case)
        data = broken.data(context)
        secret_name = broken.secret_name or name
        if isinstance(data, bytes):
            checked.append(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": secret_name, "namespace": bed.targets},
                    "data": {"config": base64.b64encode(data).decode()},
                }
            )
        elif data is not None:
            checked.append(secret(secret_name, bed.targets, data))
        ref = {"name": secret_name}
        for key, value in (broken.ref or {}).items():
            ref[key] = value.replace("(pods)", bed.pods).replace("(targets)", bed.targets)
        if broken.cluster:
            ref.setdefault("namespace", bed.targets)
            body = target(name, {"kubeconfigSecret": ref}, "ClusterTarget")
        else:
            body = target(name, {"kubeconfigSecret": ref}, namespace=bed.targets)
        (unchecked if "namespace" in ref and not broken.cluster else checked).append(body)
    checked.append(target("fine", {"self": True}, namespace=bed.targets))
    return checked, unchecked


@pytest.fixture(scope="module")
def broken_targets(bed: Bed, installation: Installation, testbed: TestBed, kubectl: Kubectl):
    grant_source(kubectl, bed.targets)
    kubectl(TARGET, "create", "serviceaccount", "unbound", "-n", bed.targets)
    context = Context(
        bed,
        testbed,
        token=kubectl(TARGET, "create", "token", "c1", "-n", bed.targets).strip(),
        unbound=kubectl(TARGET, "create", "token", "unbound", "-n", bed.targets).strip(),
        health_port=installation.health_ports[TARGET][0],
    )
    checked, unchecked = broken_objects(context)
    kubectl.apply(SOURCE, {"apiVersion": "v1", "kind": "List", "items": checked})
    kubectl.apply(
        SOURCE, {"apiVersion": "v1", "kind": "List", "items": unchecked}, "--validate=false"
    )
    return bed


def virtual_node(kubectl: Kubectl, bed: Bed, case: str) -> dict | None:
    """The node of a broken target, found by its labels (its name may be hashed)."""
    if BROKEN[case].cluster:
        selector = f"{GROUP}/cluster-target-name={broken_name(bed, case)}"
    else:
        selector = f"{GROUP}/target-namespace={bed.targets},{GROUP}/target-name={case}"
    found = (get(kubectl, SOURCE, "nodes", "-l", selector) or {}).get("items") or []
    return found[0] if len(found) == 1 else None


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_target_says_why_in_its_condition_an_event_and_its_node(
    broken_targets: Bed, kubectl: Kubectl, case: str
):
    bed, broken = broken_targets, BROKEN[case]
    name = broken_name(bed, case)
    args = ("clustertarget", name) if broken.cluster else ("target", name, "-n", bed.targets)

    def ready() -> dict | None:
        found = condition(get(kubectl, SOURCE, *args), "Ready")
        return found if found.get("reason") == broken.reason else None

    found = wait_for(ready, SETTLE, what=f"Ready=False/{broken.reason}")
    assert found["status"] == "False"
    assert broken.says in found["message"], found["message"]
    if "namespace" in (broken.ref or {}) and not broken.cluster:  # pruned: no such field
        stored = get(kubectl, SOURCE, *args)["spec"]["kubeconfigSecret"]
        assert "namespace" not in stored
    where = "default" if broken.cluster else bed.targets
    (event, *_) = wait_for(
        lambda: events(kubectl, SOURCE, where, name, broken.reason), 10, what="an event"
    )
    assert event["type"] == "Warning"
    assert broken.says in event["message"]
    node = wait_for(lambda: virtual_node(kubectl, bed, case), 10, what="its virtual node")
    assert condition(node, "Ready").get("status") != "True"


def test_a_good_target_next_to_broken_ones_is_ready(broken_targets: Bed, kubectl: Kubectl):
    bed = broken_targets
    selector = f"{GROUP}/target-namespace={bed.targets},{GROUP}/target-name=fine"

    def ready() -> bool:
        found = condition(get(kubectl, SOURCE, "target", "fine", "-n", bed.targets), "Ready")
        nodes = (get(kubectl, SOURCE, "nodes", "-l", selector) or {}).get("items") or []
        return (
            found.get("reason") == "Ready"
            and [n for n in nodes if condition(n, "Ready").get("status") == "True"] == nodes != []
        )

    wait_for(ready, SETTLE, what="target fine and its node Ready")


# -- Sources and ClusterSources (in the target cluster) ---------------------------------------


def source(name: str, spec: object, namespace: str | None = None) -> dict:
    kind = "Source" if namespace else "ClusterSource"
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": API, "kind": kind, "metadata": metadata, "spec": spec}


REFUSED_SOURCES = {
    "cluster-empty-account-name": (
        False,
        {"serviceAccount": {"name": "", "namespace": "default"}},
        "spec.serviceAccount.name in body should be at least 1 chars long",
    ),
    "cluster-account-without-namespace": (
        False,
        {"serviceAccount": {"name": "x"}},
        "spec.serviceAccount.namespace: Required value",
    ),
    "cluster-account-a-string": (
        False,
        {"serviceAccount": "x"},
        "spec.serviceAccount in body must be of type object",
    ),
    "account-name-a-list": (
        True,
        {"serviceAccountName": ["x"]},
        "spec.serviceAccountName in body must be of type string",
    ),
    "unknown-field": (True, {"serviceAccount": "x"}, 'unknown field "spec.serviceAccount"'),
}


@pytest.mark.parametrize("case", list(REFUSED_SOURCES))
def test_a_malformed_source_is_refused_with_the_reason(bed: Bed, kubectl: Kubectl, case: str):
    namespaced, spec, reason = REFUSED_SOURCES[case]
    body = source(case, spec, bed.sources) if namespaced else source(f"{bed.sources}-{case}", spec)
    assert reason in refused(kubectl, TARGET, body)


LONG_SOURCE = "s" * 253
ODD_SOURCES = {
    # name: (namespaced, spec, Ready status, reason, part of the message)
    "underscore": (True, {"serviceAccountName": "Bad_Name"}, "False", "Invalid", "'Bad_Name'"),
    "slash": (True, {"serviceAccountName": "a/b"}, "False", "Invalid", "'a/b' is not a valid"),
    "dot-dot": (True, {"serviceAccountName": ".."}, "False", "Invalid", "'..' is not a valid"),
    "too-long": (True, {"serviceAccountName": "a" * 254}, "False", "Invalid", "at most 253"),
    "empty": (True, {"serviceAccountName": ""}, "False", "NoSubject", "nobody to bind"),
    "missing-namespace": (
        False,
        {"serviceAccount": {"name": "x", "namespace": "(sources)-missing"}},
        "False",
        "NamespaceNotFound",
        '-missing" not found',
    ),
    "invalid-namespace": (
        False,
        {"serviceAccount": {"name": "x", "namespace": "Bad_NS"}},
        "False",
        "Invalid",
        "'Bad_NS' is not a valid namespace name",
    ),
    "nobody": (False, {}, "False", "NoSubject", "set spec.serviceAccount or spec.userName"),
    LONG_SOURCE: (True, {"serviceAccountName": "at-limit"}, "True", "Bound", "at-limit may"),
    "long-account": (True, {"serviceAccountName": "a" * 253}, "True", "Bound", "a" * 253),
}


def odd_source_name(bed: Bed, case: str) -> str:
    return case if ODD_SOURCES[case][0] else f"{bed.sources}-{case}"


@pytest.fixture(scope="module")
def odd_sources(bed: Bed, kubectl: Kubectl) -> Bed:
    items = []
    for case, (namespaced, spec, *_) in ODD_SOURCES.items():
        spec = json.loads(json.dumps(spec).replace("(sources)", bed.sources))
        name = odd_source_name(bed, case)
        items.append(source(name, spec, bed.sources if namespaced else None))
    kubectl.apply(TARGET, {"apiVersion": "v1", "kind": "List", "items": items})
    return bed


@pytest.mark.parametrize("case", list(ODD_SOURCES), ids=lambda c: c[:30])
def test_a_source_naming_an_odd_or_missing_account_says_what_it_did(
    odd_sources: Bed, kubectl: Kubectl, case: str
):
    bed = odd_sources
    namespaced, _, status, reason, says = ODD_SOURCES[case]
    name = odd_source_name(bed, case)
    args = ("source", name, "-n", bed.sources) if namespaced else ("clustersource", name)
    found = wait_for(
        lambda: (
            (c := condition(get(kubectl, TARGET, *args), "Ready")).get("reason") == reason and c
        ),
        SETTLE,
        what=f"Ready={status}/{reason}",
    )
    assert found["status"] == status
    assert says in found["message"], found["message"]
    where = bed.sources if namespaced else "default"
    (event, *_) = wait_for(lambda: events(kubectl, TARGET, where, name, reason), 10, what="event")
    assert event["type"] == ("Normal" if status == "True" else "Warning")


# -- elected pods refused at creation --------------------------------------------------------


def pod(
    name: str,
    annotations: dict | None = None,
    labels: dict | None = None,
    elect: bool = True,
    container: dict | None = None,
    **spec,
) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {**({ELECT: ""} if elect else {}), **(annotations or {})},
            "labels": labels or {},
        },
        "spec": {
            "containers": [{"name": "main", "image": "busybox", **(container or {})}],
            **spec,
        },
    }


def tampered(name: str, manifest: object) -> dict:
    """An elected pod created with a manifest of the user's."""
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    return pod(name, {MANIFEST: text})


A_POD = {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "a", "image": "busybox"}]}}
REFUSED_PODS = {
    "huge-annotations": (
        pod("huge", {"example.com/blob": "x" * 150_000}),
        f"the pod is too large to be saved in its {MANIFEST} annotation",
    ),
    "bound-to-a-node": (
        pod("bound", nodeName="cluster1-node-0"),
        "spec.nodeName is set ('cluster1-node-0')",
    ),
    "invalid-annotation-key": (
        pod("badkey", {"bad key!": "v"}),
        'metadata.annotations: Invalid value: "bad key!"',
    ),
    "annotation-not-a-string": (
        pod("notstring", {"example.com/n": 1}),
        "cannot unmarshal number into Go struct field ObjectMeta.metadata.annotations",
    ),
    "name-over-253": (pod("n" * 254), "must be no more than 253 characters"),
    "label-value-over-63": (
        pod("longlabel", labels={"app": "v" * 64}),
        "must be no more than 63",
    ),
    "invalid-quantity": (
        pod("badqty", container={"resources": {"requests": {"cpu": "lots"}}}),
        "quantities must match the regular expression",
    ),
    # Its delegate would run the manifest, which admission never saw: one the user writes, or
    # another pod's, is refused (the scheduler's own checks of a manifest are unit-tested).
    "manifest-of-ones-own": (
        tampered("m-garbage", "{{{"),
        f"the pod carries a {MANIFEST} annotation multicluster-scheduler did not write for you "
        f"in this namespace (no {MANIFEST}-mac): remove it",
    ),
    "another-pods-manifest": (
        tampered("borrowed-manifest", A_POD),
        f"the pod carries a {MANIFEST} annotation multicluster-scheduler did not write",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED_PODS))
def test_an_elected_pod_that_cannot_work_is_refused_with_the_reason(
    bed: Bed, kubectl: Kubectl, case: str
):
    body, reason = REFUSED_PODS[case]
    stderr = refused(kubectl, SOURCE, body, "-n", bed.pods)
    assert reason in stderr, stderr
    assert get(kubectl, SOURCE, "pod", body["metadata"]["name"], "-n", bed.pods) is None


# -- elected pods admitted, then Unschedulable with the reason -------------------------------


# The namespace has two targets of its own (c1, c2); broken ClusterTargets of this module serve
# it too, and are counted as not ready.
NEVER = "0/"
REJECTED = "2 target(s) rejected the delegate. c1: cannot create the delegate: "


def required(*expressions) -> dict:
    terms = [{"matchExpressions": list(expressions)}]
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }


UNSCHEDULABLE = {
    "a-proxy-without-manifest": (
        pod("mimic", elect=False, schedulerName="admiralty-proxy"),
        f"not a proxy pod made by the webhook (it has no {MANIFEST} annotation and no "
        f"{GROUP}/multiclusterForegroundDeletion finalizer)",
    ),
    "unknown-affinity-operator": (
        pod("sometimes", affinity=required({"key": "zone", "operator": "Sometimes"})),
        "invalid proxy pod: required term 0.matchExpressions[0]: unknown operator 'Sometimes'",
    ),
    "in-without-values": (
        pod("novalues", affinity=required({"key": "zone", "operator": "In"})),
        "invalid proxy pod: required term 0.matchExpressions[0]: operator In needs values",
    ),
    "affinity-that-never-fits": (
        pod(
            "nowhere",
            nodeSelector={"zone": "a"},
            affinity=required({"key": "zone", "operator": "NotIn", "values": ["a"]}),
        ),
        NEVER,
        "2 target(s) had no node matching Pod's node affinity/selector",
    ),
    "more-cpu-than-any-node": (
        pod("hungry", container={"resources": {"requests": {"cpu": "1000"}}}),
        NEVER,
        "2 Insufficient cpu",
    ),
    "invalid-toleration": (
        pod("badtol", tolerations=[{"key": "a", "operator": "Bogus"}]),
        NEVER,
        REJECTED,
        'spec.tolerations[0].operator: Unsupported value: "Bogus"',
    ),
    "invalid-topology-spread": (
        pod(
            "badspread",
            topologySpreadConstraints=[
                {"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
            ],
        ),
        NEVER,
        REJECTED,
        "spec.topologySpreadConstraints[0].maxSkew: Invalid value: 0",
    ),
}


@pytest.fixture(scope="module")
def unschedulable(bed: Bed, kubectl: Kubectl) -> Bed:
    items = [body for body, *_ in UNSCHEDULABLE.values()]
    kubectl.apply(SOURCE, {"apiVersion": "v1", "kind": "List", "items": items}, "-n", bed.pods)
    return bed


@pytest.mark.parametrize("case", list(UNSCHEDULABLE))
def test_an_elected_pod_that_cannot_be_placed_waits_with_the_reason(
    unschedulable: Bed, kubectl: Kubectl, case: str
):
    bed = unschedulable
    body, says, *details = UNSCHEDULABLE[case]
    name = body["metadata"]["name"]

    def scheduled() -> dict | None:
        found = condition(get(kubectl, SOURCE, "pod", name, "-n", bed.pods), "PodScheduled")
        return found if found.get("reason") == "Unschedulable" else None

    found = wait_for(scheduled, SETTLE, what="PodScheduled=False/Unschedulable")
    assert found["status"] == "False"
    assert found["message"].startswith(says), found["message"]
    if says == NEVER:
        assert re.match(r"0/\d+ targets are available: ", found["message"]), found["message"]
    for detail in details:
        assert detail in found["message"], found["message"]
    (event, *_) = wait_for(
        lambda: events(kubectl, SOURCE, bed.pods, name, "FailedScheduling"), 10, what="event"
    )
    assert event["type"] == "Warning"
    assert event["message"].startswith(says)
    if REJECTED in details:
        for target_name in ("c1", "c2"):
            assert [
                e
                for e in events(kubectl, SOURCE, bed.pods, name, "FailedCreateDelegate")
                if e["message"].startswith(f"{target_name}: cannot create the delegate: ")
            ]
    proxy = get(kubectl, SOURCE, "pod", name, "-n", bed.pods)
    assert delegate_of(kubectl, proxy) is None


# -- elected pods that are odd but valid: they run ------------------------------------------

LONG_LABEL = "k" * 63
ODD_BUT_VALID = {
    "elect-false": pod("elect-false", {ELECT: "false"}),
    "name-of-253": pod("p" * 253),
    # 50 kB counted four times (kubectl apply's last-applied-configuration holds it too, and the
    # saved manifest holds both): 200 kB, under the limit, so admitted.
    "large-annotations": pod("large", {"example.com/blob": "x" * 50_000}),
    "label-key-and-value-of-63": pod(
        "longlabels", labels={f"a.example.com/{LONG_LABEL}": "v" * 63}
    ),
}


@pytest.fixture(scope="module")
def odd_but_valid(bed: Bed, kubectl: Kubectl) -> Bed:
    items = list(ODD_BUT_VALID.values())
    kubectl.apply(SOURCE, {"apiVersion": "v1", "kind": "List", "items": items}, "-n", bed.pods)
    return bed


def running_with_delegate(kubectl: Kubectl, name: str, namespace: str) -> tuple[dict, dict]:
    def ready():
        proxy = get(kubectl, SOURCE, "pod", name, "-n", namespace)
        if not proxy or proxy["status"].get("phase") != "Running":
            return None
        delegate = delegate_of(kubectl, proxy)
        return (proxy, delegate) if delegate else None

    return wait_for(ready, SETTLE, what=f"{name[:20]}… Running with its delegate")


@pytest.mark.parametrize("case", list(ODD_BUT_VALID))
def test_an_odd_but_valid_elected_pod_runs(odd_but_valid: Bed, kubectl: Kubectl, case: str):
    body = ODD_BUT_VALID[case]
    proxy, delegate = running_with_delegate(kubectl, body["metadata"]["name"], odd_but_valid.pods)
    assert proxy["spec"]["schedulerName"] == "admiralty-proxy"
    assert len(delegate["metadata"]["name"]) <= 63
    assert delegate["metadata"]["annotations"][f"{GROUP}/parent-name"] == body["metadata"]["name"]
    (event, *_) = events(
        kubectl, SOURCE, odd_but_valid.pods, proxy["metadata"]["name"], "Scheduled"
    )
    assert delegate["metadata"]["name"] in event["message"]
    if case == "large-annotations":
        assert delegate["metadata"]["annotations"]["example.com/blob"] == "x" * 50_000
    if case == "label-key-and-value-of-63":
        assert delegate["metadata"]["labels"][f"{GROUP}/{LONG_LABEL}"] == "v" * 63


def test_labels_that_collide_once_prefixed_are_admitted_with_a_warning(bed: Bed, kubectl: Kubectl):
    body = pod("collide", labels={"b.example.com/app": "y", "a.example.com/app": "x"})
    proc = kubectl.run(SOURCE, "create", "-f", "-", "-n", bed.pods, stdin=json.dumps(body))
    assert (
        "Warning: labels a.example.com/app, b.example.com/app all become "
        f"{GROUP}/app on the delegate: b.example.com/app wins"
    ) in proc.stderr
    proxy, delegate = running_with_delegate(kubectl, "collide", bed.pods)
    assert delegate["metadata"]["labels"][f"{GROUP}/app"] == "y"
    assert proxy["metadata"]["labels"]["a.example.com/app"] == "x"


def limits_namespace(kubectl: Kubectl, bed: Bed, tag: str) -> str:
    """A fresh namespace of 63 characters, enabled for elected pods."""
    namespace = f"{bed.targets}{tag}-" + "l" * (63 - len(bed.targets) - len(tag) - 1)
    kubectl(SOURCE, "create", "namespace", namespace)
    kubectl(SOURCE, "label", "namespace", namespace, "multicluster-scheduler=enabled")
    return namespace


def delete_namespace(kubectl: Kubectl, namespace: str) -> None:
    kubectl(SOURCE, "delete", "pods,targets", "--all", "-n", namespace, "--wait=false")
    wait_for(
        lambda: not (get(kubectl, SOURCE, "pods", "-n", namespace) or {}).get("items"),
        SETTLE,
        what="pods gone",
    )
    kubectl(SOURCE, "delete", "namespace", namespace, "--wait=false")


def node_of_target(kubectl: Kubectl, namespace: str) -> dict | None:
    selector = f"{GROUP}/target-namespace={namespace}"
    found = (get(kubectl, SOURCE, "nodes", "-l", selector) or {}).get("items") or []
    ready = [n for n in found if condition(n, "Ready").get("status") == "True"]
    return ready[0] if ready else None


def test_names_at_their_length_limits_stay_valid(bed: Bed, kubectl: Kubectl):
    """A 63-character namespace, a 63-character Target (its name is a label value of its
    virtual node), and a 253-character pod: names derived from them stay valid."""
    namespace = limits_namespace(kubectl, bed, "a")
    try:
        kubectl.apply(SOURCE, target("t" * 63, {"self": True}, namespace=namespace))
        node = wait_for(lambda: node_of_target(kubectl, namespace), SETTLE, what="a Ready node")
        assert len(node["metadata"]["name"]) == 63
        assert node["metadata"]["name"].startswith("admiralty-namespace-")
        assert node["metadata"]["labels"][f"{GROUP}/target-name"] == "t" * 63
        kubectl.apply(SOURCE, pod("p" * 253), "-n", namespace)
        proxy, delegate = running_with_delegate(kubectl, "p" * 253, namespace)
        assert proxy["spec"]["nodeName"] == node["metadata"]["name"]
        assert len(delegate["metadata"]["name"]) <= 63
        assert delegate["metadata"]["namespace"] == namespace
    finally:
        delete_namespace(kubectl, namespace)


def test_a_target_name_over_63_characters_still_gets_its_virtual_node(bed: Bed, kubectl: Kubectl):
    namespace = limits_namespace(kubectl, bed, "b")
    try:
        kubectl.apply(SOURCE, target("t" * 253, {"self": True}, namespace=namespace))
        wait_for(
            lambda: (
                condition(get(kubectl, SOURCE, "target", "t" * 253, "-n", namespace), "Ready").get(
                    "status"
                )
                == "True"
            ),
            SETTLE,
            what="Target Ready",
        )
        wait_for(lambda: node_of_target(kubectl, namespace), 8, what="its virtual node")
    finally:
        delete_namespace(kubectl, namespace)


# -- AdmissionReviews that are not, straight to the webhook ----------------------------------


def post(
    port: int, ca: bytes, body: bytes, *, method: str = "POST", path: str = "/mutate", **headers
) -> tuple[int, dict]:
    context = ssl.create_default_context(cadata=ca.decode())
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=15)
    try:
        headers = {"Content-Type": "application/json", **headers}
        # Refused before the whole body is read: the answer is waiting all the same.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        assert response.getheader("Content-Type") == "application/json"
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def review(obj: object, user: str | None = "alice", **top) -> dict:
    """A review as the API server sends it (who asks included, unless ``user`` is None)."""
    request = {
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE",
        "namespace": "default",
        **({"userInfo": {"username": user}} if user is not None else {}),
        "object": obj,
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        **top,
        "request": request,
    }


def encoded(value: object) -> bytes:
    return json.dumps(value).encode()


ELECTED = pod("p")
NOT_REVIEWS = {
    # case: (body, extra request arguments, HTTP status, part of the error)
    "empty-body": (b"", {}, 400, "not an AdmissionReview: not JSON"),
    "not-json": (b"hello", {}, 400, "not an AdmissionReview: not JSON"),
    "truncated-json": (encoded(review(ELECTED))[:-7], {}, 400, "not JSON"),
    "a-json-array": (b"[]", {}, 400, "not an AdmissionReview: TypeError"),
    "no-request": (encoded({"apiVersion": "admission.k8s.io/v1"}), {}, 400, "KeyError"),
    "no-uid": (encoded({"request": {"operation": "CREATE"}}), {}, 400, "KeyError: 'uid'"),
    "uid-a-number": (encoded({"request": {"uid": 7}}), {}, 400, "request.uid is not a string"),
    "wrong-api-version": (
        encoded(review(ELECTED, apiVersion="admission.k8s.io/v1beta1")),
        {},
        400,
        "apiVersion is 'admission.k8s.io/v1beta1'",
    ),
    "wrong-kind": (encoded(review(ELECTED, kind="Pod")), {}, 400, "kind is 'Pod'"),
    "wrong-content-type": (b"hello", {"Content-Type": "text/plain"}, 400, "not JSON"),
    "huge-body": (b" " * (3 * 1024 * 1024 + 1), {}, 413, "too large"),
    "wrong-method": (b"", {"method": "GET"}, 405, "POST an AdmissionReview to /mutate"),
    "wrong-path": (encoded(review(ELECTED)), {"path": "/validate"}, 404, "no such path"),
}
REFUSED_REVIEWS = {
    "object-a-string": (review("a pod"), "the object is not a pod but a string"),
    "object-missing": (review(None), "the request has no object"),
    "annotations-not-a-map": (
        review({"metadata": {"annotations": [ELECT]}}),
        "metadata.annotations is not an object but an array",
    ),
    "labels-not-strings": (
        review({**ELECTED, "metadata": {**ELECTED["metadata"], "labels": {"a": 1}}}),
        "metadata.labels is not a map of strings: 'a' is a number",
    ),
    "bound-to-a-node": (
        review({**ELECTED, "spec": {**ELECTED["spec"], "nodeName": "n1"}}),
        "spec.nodeName is set ('n1')",
    ),
    "no-user": (review(ELECTED, user=None), "the request names no namespace or no user"),
}


@pytest.fixture(scope="module")
def webhook(bed: Bed, installation: Installation, kubectl: Kubectl) -> tuple[int, bytes]:
    configurations = get(kubectl, SOURCE, "mutatingwebhookconfigurations") or {}
    (ours,) = [
        w
        for c in configurations.get("items") or ()
        for w in c.get("webhooks") or ()
        if w["name"] == "proxy-pods.multicluster.admiralty.io"
    ]
    return installation.webhook_ports[SOURCE], base64.b64decode(ours["clientConfig"]["caBundle"])


@pytest.mark.parametrize("case", list(NOT_REVIEWS))
def test_what_is_not_an_admission_review_gets_a_4xx_with_the_reason(webhook, case: str):
    body, extra, status, says = NOT_REVIEWS[case]
    headers = {k: v for k, v in extra.items() if k not in ("method", "path")}
    options = {k: v for k, v in extra.items() if k in ("method", "path")}
    answered, payload = post(*webhook, body, **options, **headers)
    assert answered == status
    assert says in payload["error"], payload


@pytest.mark.parametrize("case", list(REFUSED_REVIEWS))
def test_a_review_of_an_unusable_pod_is_refused_in_the_review(webhook, case: str):
    body, says = REFUSED_REVIEWS[case]
    status, answer = post(*webhook, encoded(body))
    assert status == 200
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "u-1"
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert says in response["status"]["message"]
    assert "patch" not in response


def test_a_client_that_stops_mid_body_does_not_hold_the_webhook(webhook):
    port, ca = webhook
    context = ssl.create_default_context(cadata=ca.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=15) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as stalled,
    ):
        stalled.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"request":'
        )
        # Meanwhile, a real review is answered at once.
        status, answer = post(port, ca, encoded(review(ELECTED)))
        assert status == 200
        assert answer["response"]["allowed"] is True
        assert answer["response"]["patchType"] == "JSONPatch"


# -- and meanwhile, nothing broke -------------------------------------------------------------


def test_the_agents_never_crashed_and_other_work_went_on(
    bed: Bed, installation: Installation, testbed: TestBed, kubectl: Kubectl
):
    """Runs last: after every bad input above."""
    for cluster in (SOURCE, TARGET):
        agent = installation.agents[cluster][0]
        assert agent.running, f"the agent of {cluster} is not running"
        assert agent.started_at == bed.started[cluster], f"the agent of {cluster} restarted"
        with agent_log(testbed, cluster).open(errors="replace") as log:
            log.seek(bed.log_offsets[cluster])
            written = log.read()
        assert "Traceback" not in written, written[max(0, written.find("Traceback") - 2000) :]
        assert f"start {cluster}/agent-0" not in written
    for name in ("c1", "c2"):
        found = condition(get(kubectl, SOURCE, "target", name, "-n", bed.pods), "Ready")
        assert (found["status"], found["reason"]) == ("True", "Ready")
        node = get(kubectl, SOURCE, "node", f"admiralty-namespace-{bed.pods}-{name}")
        assert condition(node, "Ready")["status"] == "True"
    assert running_proxies(kubectl, bed.pods, "steady") == 2  # placed before, still running
    kubectl.apply(SOURCE, deployment("late", 2), "-n", bed.pods)
    wait_for(lambda: running_proxies(kubectl, bed.pods, "late") == 2, 60, what="late Running")
    late = get(kubectl, SOURCE, "pods", "-n", bed.pods, "-l", "app=late")["items"]
    for proxy in late:
        delegate = delegate_of(kubectl, proxy)
        assert delegate is not None
        assert delegate["status"]["phase"] == "Running"
