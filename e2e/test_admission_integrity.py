"""A delegate runs only what the source's admission saw: attacks on the saved manifest.

The delegate that runs in a target is built from the proxy pod's ``sourcepod-manifest``
annotation. Each test is an attack as a tenant with only namespaced ``edit`` (``kubectl --as``)
in a namespace of the source that enforces Pod Security ``restricted``, trying to make a
delegate run what that admission would refuse (host network and PID, a privileged container,
the host's ``/``, a service account of their choice): by rewriting the annotation of a pending
proxy pod, by creating a pod that carries one of their own (directly, or through a Deployment's
template), or by making a proxy pod by hand. Two layers stop them: the chart's
ValidatingAdmissionPolicy ``multicluster-scheduler-proxy-pods`` refuses the change, and, for a
cluster without it, the scheduler builds no delegate from a manifest whose MAC does not verify.
Then, what the agent itself writes on proxy pods, and what tenants may still change there; last,
a pending proxy pod made by a release before MACs is placed after the upgrade.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator

import pytest

from e2e.scenarios import REAL_NODES, SOURCE, TARGET, condition, connect, disconnect, proxies
from multicluster_scheduler.api.keys import PREFIX
from testbed import TestBed, wait_for
from testbed.install import NAMESPACE as RELEASE_NAMESPACE
from testbed.install import RELEASE, Installation
from testbed.kubectl import Kubectl

MANIFEST = PREFIX + "sourcepod-manifest"
MAC = PREFIX + "sourcepod-manifest-mac"
POLICY = f"{RELEASE}-proxy-pods"
POOL = "burst.example.com/pool"  # no node has it until room is made
WATCH = 20.0  # how long an attack is given to work: placements take well under a second
TENANT = "tina"
NOT_SAVED = f"its {MANIFEST} annotation is not the one multicluster-scheduler saved"
NOT_WRITTEN = f"the pod carries a {MANIFEST} annotation multicluster-scheduler did not write"


# -- the tenant's namespace and its pods ----------------------------------------------------------


@pytest.fixture
def restricted(installation: Installation, testbed: TestBed, kubectl: Kubectl) -> Iterator[str]:
    """A namespace of both clusters, enforcing Pod Security ``restricted`` in the source,
    enabled, served by target c2 only (cluster2, where nothing restricts pods); the tenant
    has ``edit`` there in the source, and cluster2 has a service account of their choice."""
    name = f"t{uuid.uuid4().hex[:8]}"
    for context in testbed.clusters:
        kubectl(context, "create", "namespace", name)
    kubectl(SOURCE, "label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    connect(kubectl, testbed, name)
    kubectl(SOURCE, "delete", "target", "c1", "-n", name)  # cluster1 would refuse it anyway
    kubectl(SOURCE, "label", "namespace", name, "multicluster-scheduler=enabled")
    kubectl(
        SOURCE, "create", "rolebinding", f"{TENANT}-edit", "--clusterrole=edit",
        f"--user={TENANT}", "-n", name,
    )  # fmt: skip
    kubectl(TARGET, "create", "serviceaccount", "deployer", "-n", name)
    yield name
    for context in testbed.clusters:
        for kind in ("deployments", "pods"):
            kubectl(context, "delete", kind, "--all", "-n", name, "--wait=false")
    wait_for(lambda: not proxies(kubectl, name), 60, what="the proxy pods gone")
    disconnect(kubectl, name)
    for context in testbed.clusters:
        kubectl(context, "delete", "namespace", name, "--wait=false")


@pytest.fixture
def pool(kubectl: Kubectl) -> Iterator:
    """``make_room()``: a node of cluster2 joins the pool the tenant's pods ask for (room frees
    up); the label goes afterwards."""
    node = kubectl(
        TARGET, "get", "nodes", "-l", REAL_NODES, "-o", "jsonpath={.items[0].metadata.name}"
    )

    def make_room() -> None:
        kubectl(TARGET, "label", "node", node, f"{POOL}=team-a", "--overwrite")

    yield make_room
    kubectl(TARGET, "label", "node", node, f"{POOL}-")


def as_tenant(kubectl: Kubectl, *args: str, stdin: str | None = None, check: bool = True):
    return kubectl.run(SOURCE, f"--as={TENANT}", *args, stdin=stdin, check=check)


def compliant_pod(name: str, **annotations: str) -> dict:
    """An elected pod that Pod Security ``restricted`` admits, waiting for the pool."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {PREFIX + "elect": "", **annotations}},
        "spec": {
            "nodeSelector": {POOL: "team-a"},
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "app",
                    "image": "busybox",
                    "securityContext": {
                        "runAsUser": 1000,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def privileged_manifest(name: str, namespace: str) -> str:
    """What the tenant wants to run: everything ``restricted`` refuses, in the pool."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "nodeSelector": {POOL: "team-a"},
                "hostNetwork": True,
                "hostPID": True,
                "serviceAccountName": "deployer",
                "containers": [
                    {
                        "name": "root",
                        "image": "busybox",
                        "securityContext": {"privileged": True},
                        "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                    }
                ],
                "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
            },
        }
    )


def create_as_tenant(kubectl: Kubectl, namespace: str, body: dict, check: bool = True):
    return as_tenant(
        kubectl, "create", "-n", namespace, "-f", "-", stdin=json.dumps(body), check=check
    )


def proxy_pod(kubectl: Kubectl, namespace: str, name: str) -> dict:
    return kubectl.json(SOURCE, "get", "pod", name, "-n", namespace)


def delegates_of(kubectl: Kubectl, uid: str) -> list[str]:
    """Every pod in either cluster that names ``uid`` as its parent."""
    return [
        f"{context}/{p['metadata']['namespace']}/{p['metadata']['name']}"
        for context in (SOURCE, TARGET)
        for p in kubectl.json(context, "get", "pods", "-A", "-l", f"{PREFIX}parent-uid={uid}")[
            "items"
        ]
    ]


def events(kubectl: Kubectl, namespace: str, name: str, reason: str) -> list[dict]:
    selector = f"involvedObject.name={name},reason={reason}"
    found = kubectl.json(SOURCE, "get", "events", "-n", namespace, "--field-selector", selector)
    return found["items"]


def holds_for(seconds: float, check) -> None:
    deadline = time.monotonic() + seconds
    while True:
        check()
        if time.monotonic() >= deadline:
            return
        time.sleep(1)


def waiting(kubectl: Kubectl, namespace: str, name: str) -> dict:
    """The pod, once the scheduler said why it waits (no node of any target in the pool)."""
    return wait_for(
        lambda: (
            (p := proxy_pod(kubectl, namespace, name))
            and condition(p, "PodScheduled").get("reason") == "Unschedulable"
            and p
        ),
        30,
        what=f"{name} Pending with a reason",
    )


def never_placed(kubectl: Kubectl, namespace: str, name: str) -> str:
    """The pod stays Pending, with the scheduler's refusal in its condition and a Warning
    event, and no delegate anywhere, for ``WATCH`` seconds; the refusal's message."""
    uid = proxy_pod(kubectl, namespace, name)["metadata"]["uid"]

    def unplaced() -> None:
        pod = proxy_pod(kubectl, namespace, name)
        assert not pod["spec"].get("nodeName"), f"placed on {pod['spec']['nodeName']}"
        assert delegates_of(kubectl, uid) == []

    said: list[str] = []

    def refused() -> str | None:
        unplaced()
        message = condition(proxy_pod(kubectl, namespace, name), "PodScheduled").get("message")
        said.append(message or "")
        return message if message and NOT_SAVED in message else None

    try:
        message = wait_for(refused, 30, what="the scheduler's refusal")
    except TimeoutError:
        raise AssertionError(f"{name} was not refused; it says: {said[-1:]}") from None
    holds_for(WATCH, unplaced)
    (event, *_) = wait_for(
        lambda: [
            e
            for e in events(kubectl, namespace, name, "FailedScheduling")
            if NOT_SAVED in e["message"]
        ],
        10,
        what="a Warning event",
    )
    assert event["type"] == "Warning"
    return message


@pytest.fixture
def policy_unbound(kubectl: Kubectl) -> Iterator:
    """``unbind()``: the cluster as one without the chart's policy (its binding deleted); put
    back afterwards."""
    found = kubectl.run(
        SOURCE, "get", "validatingadmissionpolicybinding", POLICY, "-o", "json", check=False
    )
    saved = json.loads(found.stdout) if found.returncode == 0 else None
    removed: list[bool] = []

    def unbind() -> None:
        if saved is not None:
            kubectl(SOURCE, "delete", "validatingadmissionpolicybinding", POLICY)
            removed.append(True)

    yield unbind
    if removed and saved is not None:
        meta = saved["metadata"]
        kept = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
        kubectl.apply(SOURCE, {**saved, "metadata": kept})


def annotate_as_tenant(kubectl: Kubectl, namespace: str, name: str, *pairs: str, check=True):
    return as_tenant(
        kubectl, "annotate", "--overwrite", "pod", name, "-n", namespace, *pairs, check=check
    )


# -- (a) a pending proxy pod's manifest rewritten -------------------------------------------------


def test_rewriting_a_pending_proxy_pods_manifest_is_refused_by_the_policy(
    restricted: str, kubectl: Kubectl
):
    """The tenant's compliant pod waits for the pool; they overwrite its manifest with a
    privileged spec. Before, the annotation was changed, and the delegate ran it once the pool
    had room."""
    namespace = restricted
    create_as_tenant(kubectl, namespace, compliant_pod("web"))
    waiting(kubectl, namespace, "web")
    saved = proxy_pod(kubectl, namespace, "web")["metadata"]["annotations"][MANIFEST]
    forged = privileged_manifest("web", namespace)
    proc = annotate_as_tenant(kubectl, namespace, "web", f"{MANIFEST}={forged}", check=False)
    print(proc.stderr)
    assert proc.returncode != 0, "the manifest was rewritten"
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in proc.stderr
    assert f"annotation {MANIFEST} of proxy pod web is written by multicluster-scheduler" in (
        proc.stderr
    )
    assert proxy_pod(kubectl, namespace, "web")["metadata"]["annotations"][MANIFEST] == saved
    for removal in (f"{MAC}-", f"{PREFIX}has-finalizer-"):
        command = "label" if "has-finalizer" in removal else "annotate"
        proc = as_tenant(kubectl, command, "pod", "web", "-n", namespace, removal, check=False)
        assert proc.returncode != 0, f"{removal} was accepted"
        assert removal.rstrip("-") in proc.stderr


def test_without_the_policy_a_rewritten_manifest_is_never_placed(
    restricted: str, kubectl: Kubectl, pool, policy_unbound
):
    """The same cluster without the chart's policy: the tenant rewrites the manifest (and, in
    a second pod, takes its MAC off as well), then the pool gets room. Before, the delegate ran
    in cluster2 with host network and PID, privileged, the host's / and account deployer."""
    namespace = restricted
    for name in ("web", "bare"):
        create_as_tenant(kubectl, namespace, compliant_pod(name))
        waiting(kubectl, namespace, name)
    policy_unbound()
    for name, extra in (("web", ()), ("bare", (f"{MAC}-",))):
        forged = privileged_manifest(name, namespace)
        wait_for(
            lambda n=name, f=forged, e=extra: (
                annotate_as_tenant(
                    kubectl, namespace, n, f"{MANIFEST}={f}", *e, check=False
                ).returncode
                == 0
            ),
            15,
            what="the policy's binding gone from the API server's view",
        )
    pool()
    said = {name: never_placed(kubectl, namespace, name) for name in ("web", "bare")}
    print(said)
    assert f"its {MAC}: it does not verify for this manifest in this namespace" in said["web"]
    assert f"it has no {MAC}, and the pod was made after the key" in said["bare"]
    assert kubectl.json(TARGET, "get", "pods", "-n", namespace)["items"] == []


# -- (b) a pod created with a manifest of its own -------------------------------------------------


def test_creating_a_pod_with_a_manifest_of_ones_own_is_refused(restricted: str, kubectl: Kubectl):
    """Before, the webhook kept the manifest the pod came with, and its delegate ran it."""
    namespace = restricted
    forged = privileged_manifest("sneaky", namespace)
    proc = create_as_tenant(
        kubectl, namespace, compliant_pod("sneaky", **{MANIFEST: forged}), check=False
    )
    print(proc.stderr)
    assert proc.returncode != 0, "admitted"
    assert f"{NOT_WRITTEN} for you in this namespace (no {MAC}): remove it" in proc.stderr
    assert kubectl.run(SOURCE, "get", "pod", "sneaky", "-n", namespace, check=False).returncode


def test_a_deployment_whose_template_copies_a_saved_manifest_gets_none_of_its_pods(
    restricted: str, kubectl: Kubectl
):
    """The tenant copies a real proxy pod's manifest and MAC into a Deployment's template
    (they would run another pod's spec, or a spec the MAC was made for elsewhere): the
    ReplicaSet's FailedCreate event says what to do."""
    namespace = restricted
    create_as_tenant(kubectl, namespace, compliant_pod("genuine"))
    genuine = waiting(kubectl, namespace, "genuine")["metadata"]["annotations"]
    template = compliant_pod("x", **{k: genuine[k] for k in (MANIFEST, MAC) if k in genuine})
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "copycat"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "copycat"}},
            "template": {
                "metadata": {**template["metadata"], "labels": {"app": "copycat"}},
                "spec": template["spec"],
            },
        },
    }
    del deployment["spec"]["template"]["metadata"]["name"]
    create_as_tenant(kubectl, namespace, deployment)

    def failed_create() -> list[dict]:
        found = kubectl.json(
            SOURCE, "get", "events", "-n", namespace, "--field-selector", "reason=FailedCreate"
        )["items"]
        return [e for e in found if NOT_WRITTEN in e["message"]]

    def copycats() -> list[str]:
        names = [p["metadata"]["name"] for p in proxies(kubectl, namespace)]
        return [n for n in names if n.startswith("copycat-")]

    wait_for(lambda: failed_create() or copycats(), 30, what="a pod of the copy, or a refusal")
    assert copycats() == [], "the ReplicaSet made pods that carry the copied manifest"
    (event, *_) = failed_create()
    print(event["message"])
    assert event["involvedObject"]["kind"] == "ReplicaSet"
    assert "from the pod or from its template" in event["message"]


# -- (c) a proxy pod made by hand ---------------------------------------------------------------


def hand_made_proxy(name: str, namespace: str, **annotations: str) -> dict:
    """What the webhook would have written, written by the tenant: the proxy scheduler, the
    virtual nodes' toleration, our finalizer and a manifest (no elect annotation)."""
    pod = compliant_pod(name)
    pod["metadata"]["annotations"] = {
        MANIFEST: privileged_manifest(name, namespace),
        **annotations,
    }
    pod["metadata"]["finalizers"] = [PREFIX + "multiclusterForegroundDeletion"]
    pod["spec"]["schedulerName"] = "admiralty-proxy"
    pod["spec"]["nodeSelector"] = {"virtual-kubelet.io/provider": "admiralty"}
    pod["spec"]["tolerations"] = [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}]
    return pod


def test_a_proxy_pod_made_by_hand_is_refused(restricted: str, kubectl: Kubectl, pool):
    """In the enabled namespace, the webhook sees it (it carries a manifest), elected or not.
    Before, it was admitted as it was, then placed, and its delegate ran the manifest."""
    namespace = restricted
    pool()
    proc = create_as_tenant(kubectl, namespace, hand_made_proxy("direct", namespace), check=False)
    print(proc.stderr)
    assert proc.returncode != 0, "admitted"
    assert NOT_WRITTEN in proc.stderr


def test_a_proxy_pod_made_by_hand_before_the_namespace_opted_in_is_never_placed(
    restricted: str, kubectl: Kubectl, pool
):
    """Made while the namespace had not opted in (the webhook never saw it), with a MAC copied
    from a real proxy pod of the namespace, or none: never placed once the namespace opts in.
    Before, both were placed and their delegates ran the manifest."""
    namespace = restricted
    create_as_tenant(kubectl, namespace, compliant_pod("genuine"))
    genuine = waiting(kubectl, namespace, "genuine")["metadata"]["annotations"]
    kubectl(SOURCE, "label", "namespace", namespace, "multicluster-scheduler-")
    create_as_tenant(kubectl, namespace, hand_made_proxy("unsealed", namespace))
    mac = {MAC: genuine[MAC]} if MAC in genuine else {}
    create_as_tenant(kubectl, namespace, hand_made_proxy("copied", namespace, **mac))
    kubectl(SOURCE, "label", "namespace", namespace, "multicluster-scheduler=enabled")
    pool()
    said = {name: never_placed(kubectl, namespace, name) for name in ("unsealed", "copied")}
    print(said)
    assert f"it has no {MAC}" in said["unsealed"]
    assert "does not verify for this manifest in this namespace" in said["copied"]
    for name in ("unsealed", "copied"):  # their finalizer is ours: the agent lets them go
        kubectl(SOURCE, "delete", "pod", name, "-n", namespace, "--wait=false")


# -- what still works ---------------------------------------------------------------------------


def test_the_agent_still_writes_on_proxy_pods_and_tenants_their_own_keys(
    restricted: str, kubectl: Kubectl, pool, installation: Installation
):
    """With the policy bound: the genuine pod is placed and runs; an annotation added to its
    delegate comes back to the proxy pod with ``mirrored-annotations`` (both written by the
    agent); the tenant labels and annotates it with keys of their own, and deletes it."""
    namespace = restricted
    pool()
    create_as_tenant(kubectl, namespace, compliant_pod("web"))
    running = wait_for(
        lambda: (
            (p := proxy_pod(kubectl, namespace, "web"))
            and p.get("status", {}).get("phase") == "Running"
            and p
        ),
        60,
        what="the pod Running",
    )
    (delegate,) = delegates_of(kubectl, running["metadata"]["uid"])
    delegate_name = delegate.rsplit("/", 1)[1]
    kubectl(TARGET, "annotate", "pod", delegate_name, "-n", namespace, "example.com/seen=yes")
    mirrored = wait_for(
        lambda: (
            (a := proxy_pod(kubectl, namespace, "web")["metadata"]["annotations"]).get(
                "example.com/seen"
            )
            and a
        ),
        30,
        what="the delegate's annotation mirrored",
    )
    assert mirrored[PREFIX + "mirrored-annotations"] == "example.com/seen"
    as_tenant(kubectl, "label", "pod", "web", "-n", namespace, "team=blue")
    annotate_as_tenant(kubectl, namespace, "web", "example.com/note=mine")
    assert proxy_pod(kubectl, namespace, "web")["metadata"]["labels"]["team"] == "blue"
    as_tenant(kubectl, "delete", "pod", "web", "-n", namespace, "--wait=false")
    wait_for(
        lambda: kubectl.run(SOURCE, "get", "pod", "web", "-n", namespace, check=False).returncode,
        60,
        what="the proxy pod gone (the agent removed its finalizer)",
    )
    key = kubectl.json(SOURCE, "get", "secret", f"{RELEASE}-manifest-key", "-n", RELEASE_NAMESPACE)
    assert set(key["data"]) == {"key", "created"}


# -- upgrading from a release without MACs (last: it replaces the key) ---------------------------


def previous_release_proxy(name: str, namespace: str) -> dict:
    """An elected pod as the webhook of a release before MACs made it a proxy pod."""
    pod = compliant_pod(name)
    pod["metadata"]["namespace"] = namespace
    manifest = json.dumps(pod)
    pod["metadata"]["annotations"][MANIFEST] = manifest
    pod["metadata"]["labels"] = {PREFIX + "has-finalizer": "true"}
    pod["metadata"]["finalizers"] = [PREFIX + "multiclusterForegroundDeletion"]
    pod["spec"].update(
        schedulerName="admiralty-proxy",
        nodeSelector={"virtual-kubelet.io/provider": "admiralty"},
        tolerations=[
            {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "admiralty"},
            {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists"},
        ],
        terminationGracePeriodSeconds=0,
    )
    return pod


def test_a_pending_proxy_pod_of_the_previous_release_is_placed_after_the_upgrade(
    restricted: str, kubectl: Kubectl, pool, installation: Installation
):
    """The pod was made, without a MAC, before the key: as a release before MACs left it
    Pending (made here while the namespace had not opted in, so that no webhook saw it). The
    agent then starts on the empty Secret, as the upgrade's first replica does, and makes the
    key. The pod is placed once there is room, and its delegate runs its manifest."""
    namespace = restricted
    kubectl(SOURCE, "label", "namespace", namespace, "multicluster-scheduler-")
    body = json.dumps(previous_release_proxy("old", namespace))
    kubectl(SOURCE, "create", "-n", namespace, "-f", "-", stdin=body)
    agent = installation.agents[SOURCE][0]
    installation.hold(agent)
    secret = f"{RELEASE}-manifest-key"
    emptied = '[{"op": "remove", "path": "/data"}]'
    kubectl(
        SOURCE, "patch", "secret", secret, "-n", RELEASE_NAMESPACE, "--type=json", "-p", emptied
    )
    time.sleep(1.5)  # a pod's creationTimestamp is to the second
    installation.release(agent)
    created = wait_for(
        lambda: (
            kubectl.json(SOURCE, "get", "secret", secret, "-n", RELEASE_NAMESPACE).get("data") or {}
        ).get("created"),
        60,
        what="the new key",
    )
    print("key made at", base64.b64decode(created).decode())
    kubectl(SOURCE, "label", "namespace", namespace, "multicluster-scheduler=enabled")
    pool()
    running = wait_for(
        lambda: (
            (p := proxy_pod(kubectl, namespace, "old"))
            and p.get("status", {}).get("phase") == "Running"
            and p
        ),
        90,
        what="the previous release's pod Running",
    )
    assert MAC not in running["metadata"]["annotations"]
    (delegate,) = delegates_of(kubectl, running["metadata"]["uid"])
    assert delegate.startswith(f"{TARGET}/")
