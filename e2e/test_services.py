"""The guide's "Service Reroute and Globalization" on the test bed: a Service that selects proxy
pods is rerouted to their delegates and made global, copies follow it into cluster2 and go away
with it; global Services of users are copied too, and a Service of cluster2 that is not ours is
never overwritten. Ingresses that route to global Services follow them, carrying only what the
operator of cluster1 allows: a tenant with ``edit`` there configures nothing else in cluster2."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from e2e.scenarios import (
    SOURCE,
    TARGET,
    all_running,
    connect,
    delegates,
    disconnect,
    endpoint_pods,
    nginx,
    nothing_left,
    service,
)
from multicluster_scheduler.api.keys import PREFIX
from testbed import TestBed, wait_for
from testbed.install import Installation
from testbed.kubectl import Kubectl

FINALIZER = PREFIX + "multiclusterForegroundDeletion"
FOREIGN = "metallb.universe.tf/ip-allocated-from-pool"


def manifest(*ports: int) -> str:
    """The Service ``kubectl expose deployment nginx`` makes, as a manifest (more ports named)."""
    listed = "".join(
        f"\n  - port: {port}\n    protocol: TCP\n    targetPort: 80"
        + (f"\n    name: p{port}" if len(ports) > 1 else "")
        for port in ports
    )
    return f"""apiVersion: v1
kind: Service
metadata:
  name: nginx
  labels:
    app: nginx
spec:
  selector:
    app: nginx
  ports:{listed}
"""


@pytest.fixture
def guide(installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str):
    """Targets c1 (self) and c2 Ready in ``namespace``, which is enabled for elected pods."""
    connect(kubectl, testbed, namespace)
    kubectl(SOURCE, "label", "namespace", namespace, "multicluster-scheduler=enabled")
    yield namespace
    try:
        kubectl(SOURCE, "delete", "services", "--all", "-n", namespace, "--wait=false")
        wait_for(
            lambda: not kubectl.json(SOURCE, "get", "services", "-n", namespace)["items"],
            30,
            what="services deleted: no finalizer of ours left",
        )
        kubectl(SOURCE, "delete", "deployments", "--all", "-n", namespace, "--wait=false")
        wait_for(lambda: nothing_left(kubectl, namespace), 60, what="proxies and delegates gone")
    finally:
        disconnect(kubectl, namespace)


def test_the_guides_service_is_rerouted_globalized_and_replicated(guide, kubectl: Kubectl):
    namespace = guide
    kubectl.apply(SOURCE, nginx(replicas=6), "-n", namespace)
    wait_for(lambda: all_running(kubectl, namespace, 6), 90, what="6 proxy pods Running")
    cluster1 = kubectl.json(SOURCE, "get", "namespace", "kube-system")["metadata"]["uid"]

    # The guide's command.
    kubectl(SOURCE, "expose", "deployment", "nginx", "-n", namespace)
    started = time.monotonic()

    def rerouted() -> dict | None:
        svc = service(kubectl, SOURCE, namespace, "nginx")
        ok = svc and svc["spec"].get("selector") == {PREFIX + "app": "nginx"}
        return svc if ok and FINALIZER in svc["metadata"].get("finalizers", ()) else None

    original = wait_for(rerouted, 30, what="the service rerouted")
    rerouted_after = time.monotonic() - started
    annotations = original["metadata"]["annotations"]
    assert annotations["io.cilium/global-service"] == "true"
    assert annotations[PREFIX + "global"] == "true"
    assert json.loads(annotations[PREFIX + "original-selector"]) == {"app": "nginx"}
    assert original["metadata"]["labels"][PREFIX + "has-finalizer"] == "true"

    copy = wait_for(
        lambda: service(kubectl, TARGET, namespace, "nginx"), 30, what="a copy in cluster2"
    )
    replicated_after = time.monotonic() - started
    meta = copy["metadata"]
    assert meta["annotations"][PREFIX + "is-delegate"] == ""
    assert meta["annotations"][PREFIX + "parent-name"] == "nginx"
    assert meta["annotations"][PREFIX + "parent-namespace"] == namespace
    assert meta["annotations"][PREFIX + "parent-cluster-name"] == cluster1
    assert meta["annotations"]["io.cilium/global-service"] == "true"
    assert meta["labels"][PREFIX + "parent-uid"] == original["metadata"]["uid"]
    assert not meta.get("finalizers"), "cluster2's agent leaves copies alone"
    assert copy["spec"]["selector"] == {PREFIX + "app": "nginx"}
    assert copy["spec"]["ports"] == original["spec"]["ports"]
    assert copy["spec"]["clusterIP"] not in ("", "None", original["spec"]["clusterIP"])
    assert (
        PREFIX + "parent-uid" in json.loads(meta["annotations"][PREFIX + "managed-keys"])["labels"]
    )

    # What cluster2's own controllers add to the copy is theirs: kept, and no update loop.
    kubectl(TARGET, "annotate", "service", "nginx", "-n", namespace, f"{FOREIGN}=pool-b")
    annotated = service(kubectl, TARGET, namespace, "nginx")

    # Each cluster's Service points at the delegates that run there (kwok gives them IPs).
    here = {d["metadata"]["name"] for d in delegates(kubectl, SOURCE, namespace)}
    there = {d["metadata"]["name"] for d in delegates(kubectl, TARGET, namespace)}
    assert here, "some replicas run in cluster1 (self target c1)"
    assert there, "some replicas run in cluster2"
    wait_for(
        lambda: endpoint_pods(kubectl, SOURCE, namespace, "nginx") == here,
        30,
        what="cluster1's endpoints are the delegates in cluster1",
    )
    wait_for(
        lambda: endpoint_pods(kubectl, TARGET, namespace, "nginx") == there,
        30,
        what="cluster2's endpoints are the delegates in cluster2",
    )
    time.sleep(2)
    settled = service(kubectl, TARGET, namespace, "nginx")
    assert settled["metadata"]["annotations"][FOREIGN] == "pool-b"
    assert settled["metadata"]["resourceVersion"] == annotated["metadata"]["resourceVersion"]

    # kubectl apply of the manifest brings the old selector back: rerouted again, then stable.
    kubectl.apply(SOURCE, manifest(80), "-n", namespace)
    stable = wait_for(rerouted, 30, what="rerouted again after kubectl apply")
    time.sleep(3)
    now = service(kubectl, SOURCE, namespace, "nginx")
    assert now["metadata"]["resourceVersion"] == stable["metadata"]["resourceVersion"], "flaps"
    kubectl.apply(SOURCE, manifest(80), "-n", namespace)
    wait_for(rerouted, 30, what="rerouted again after a second kubectl apply")

    # A change reaches the copy.
    kubectl.apply(SOURCE, manifest(80, 8080), "-n", namespace)
    wait_for(
        lambda: (
            {p["port"] for p in service(kubectl, TARGET, namespace, "nginx")["spec"]["ports"]}
            == {80, 8080}
        ),
        30,
        what="the new port in cluster2's copy",
    )
    assert rerouted()
    assert service(kubectl, TARGET, namespace, "nginx")["metadata"]["annotations"][FOREIGN] == (
        "pool-b"
    ), "kept by the update"

    # Deleting the Service deletes its copy, then our finalizer lets it go.
    kubectl(SOURCE, "delete", "service", "nginx", "-n", namespace, "--wait=false")
    started = time.monotonic()
    wait_for(lambda: service(kubectl, TARGET, namespace, "nginx") is None, 30, what="copy deleted")
    wait_for(lambda: service(kubectl, SOURCE, namespace, "nginx") is None, 30, what="service gone")
    print(
        f"\nrerouted in {rerouted_after:.1f}s, copied in {replicated_after:.1f}s, "
        f"deleted everywhere in {time.monotonic() - started:.1f}s"
    )


USER_SERVICES = """apiVersion: v1
kind: Service
metadata:
  name: db
  annotations:
    multicluster.admiralty.io/global: "true"
spec:
  clusterIP: None
  selector:
    role: db
  ports:
  - port: 5432
---
apiVersion: v1
kind: Service
metadata:
  name: taken
  annotations:
    multicluster.admiralty.io/global: "true"
spec:
  selector:
    role: web
  ports:
  - port: 80
"""

CACHE = """apiVersion: v1
kind: Service
metadata:
  name: cache
  annotations:
    multicluster.admiralty.io/global: "true"
spec:
  selector:
    role: cache
  ports:
  - port: 6379
"""

THEIRS = """apiVersion: v1
kind: Service
metadata:
  name: taken
spec:
  selector:
    app: theirs
  ports:
  - port: 81
"""


def events(kubectl: Kubectl, namespace: str, name: str, reason: str) -> list[dict]:
    return kubectl.json(
        SOURCE,
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.name={name},reason={reason}",
    )["items"]


def target_reason(kubectl: Kubectl, namespace: str, name: str) -> str | None:
    target = kubectl.json(SOURCE, "get", "target", name, "-n", namespace)
    for condition in (target.get("status") or {}).get("conditions") or ():
        if condition["type"] == "Ready":
            return condition.get("reason")
    return None


def test_user_global_services_are_copied_and_others_services_left_alone(guide, kubectl: Kubectl):
    namespace = guide
    kubectl.apply(TARGET, THEIRS, "-n", namespace)
    theirs = service(kubectl, TARGET, namespace, "taken")
    kubectl.apply(SOURCE, USER_SERVICES, "-n", namespace)

    copy = wait_for(lambda: service(kubectl, TARGET, namespace, "db"), 30, what="db copied")
    assert copy["spec"]["clusterIP"] == "None", "headless stays headless"
    assert copy["spec"]["selector"] == {"role": "db"}, "no proxy pod: not rerouted"
    original = service(kubectl, SOURCE, namespace, "db")
    assert PREFIX + "original-selector" not in original["metadata"]["annotations"]
    assert original["metadata"]["finalizers"] == [FINALIZER]

    warned = wait_for(
        lambda: events(kubectl, namespace, "taken", "CopyConflict"), 30, what="a CopyConflict"
    )
    assert warned[0]["type"] == "Warning"
    assert "not a copy" in warned[0]["message"]
    still = service(kubectl, TARGET, namespace, "taken")
    assert still["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
    assert PREFIX + "parent-name" not in (still["metadata"].get("annotations") or {})

    # A copy deleted by hand comes back.
    kubectl(TARGET, "delete", "service", "db", "-n", namespace)
    wait_for(
        lambda: (
            (service(kubectl, TARGET, namespace, "db") or copy)["metadata"]["uid"]
            != copy["metadata"]["uid"]
        ),
        30,
        what="db copied again",
    )

    # No longer global: the copy goes, and so do our finalizer and its label.
    kubectl(SOURCE, "annotate", "service", "db", "-n", namespace, PREFIX + "global-")

    def released() -> bool:
        meta = service(kubectl, SOURCE, namespace, "db")["metadata"]
        return not meta.get("finalizers") and PREFIX + "has-finalizer" not in meta.get("labels", {})

    wait_for(lambda: service(kubectl, TARGET, namespace, "db") is None, 30, what="copy deleted")
    wait_for(released, 30, what="finalizer and label removed")

    # The conflicting Service's original is deleted at once; theirs stays.
    kubectl(SOURCE, "delete", "service", "taken", "-n", namespace, "--timeout=30s")
    assert (
        service(kubectl, TARGET, namespace, "taken")["metadata"]["uid"]
        == (theirs["metadata"]["uid"])
    )


def test_copies_left_in_a_target_out_of_reach_go_when_it_is_back_or_deleted(
    guide, kubectl: Kubectl
):
    namespace = guide
    kubectl.apply(SOURCE, CACHE, "-n", namespace)
    wait_for(lambda: service(kubectl, TARGET, namespace, "cache"), 30, what="cache copied")

    # c2 out of reach (its kubeconfig Secret gone): the original is deleted at once, no
    # finalizer waits for c2, and the copy stays there for now.
    secret = kubectl.json(SOURCE, "get", "secret", "c2", "-n", namespace)
    secret["metadata"] = {"name": "c2", "namespace": namespace}
    kubectl(SOURCE, "delete", "secret", "c2", "-n", namespace)
    wait_for(
        lambda: target_reason(kubectl, namespace, "c2") == "SecretNotFound",
        30,
        what="c2 disconnected",
    )
    kubectl(SOURCE, "delete", "service", "cache", "-n", namespace, "--timeout=30s")
    assert service(kubectl, TARGET, namespace, "cache") is not None

    # c2 back: the copy whose original is gone is deleted.
    kubectl.apply(SOURCE, secret)
    wait_for(
        lambda: service(kubectl, TARGET, namespace, "cache") is None,
        30,
        what="the orphaned copy deleted once c2 is back",
    )

    # Deleting the Target deletes our copies there.
    kubectl.apply(SOURCE, CACHE, "-n", namespace)
    wait_for(lambda: service(kubectl, TARGET, namespace, "cache"), 30, what="cache copied again")
    kubectl(SOURCE, "delete", "target", "c2", "-n", namespace)
    wait_for(
        lambda: service(kubectl, TARGET, namespace, "cache") is None,
        30,
        what="copies deleted with their Target",
    )


# -- Ingresses follow global Services ------------------------------------------------------------

INGRESSES = """apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  labels:
    app: nginx
spec:
  ingressClassName: made-up
  rules:
  - host: nginx.example.com
    http:
      paths:
      - path: /
        pathType: Prefix
        backend:
          service:
            name: nginx
            port:
              number: 80
  - host: nothing-routed.example.com
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: plain
spec:
  ingressClassName: made-up
  rules:
  - host: plain.example.com
    http:
      paths:
      - path: /
        pathType: Prefix
        backend:
          service:
            name: plain
            port:
              number: 80
---
apiVersion: v1
kind: Service
metadata:
  name: plain
spec:
  selector:
    role: plain
  ports:
  - port: 80
"""


def ingress(kubectl: Kubectl, context: str, namespace: str, name: str) -> dict | None:
    proc = kubectl.run(context, "get", "ingress", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def annotation(obj: dict | None, key: str) -> str | None:
    return ((obj or {}).get("metadata", {}).get("annotations") or {}).get(key)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@pytest.fixture
def source_policy(installation: Installation) -> Iterator[Callable[..., None]]:
    """``configure(ingress_allowed_hosts="*.example.com", ...)``: cluster1's agent started again
    with these settings in its environment (``MCS_INGRESS_ALLOWED_HOSTS``: the chart's
    ``ingresses.*`` values as flags would be, but an agent that has no such setting runs as it
    always did); as it was before, afterwards."""
    agent = installation.agents[SOURCE][0]
    before = dict(agent.env)

    def restart(env: dict[str, str]) -> None:
        installation.hold(agent)  # SIGKILL; the keeper starts it again once released
        agent.env = env
        installation.release(agent)
        port = installation.health_ports[SOURCE][0]
        wait_for(lambda: _ready(port), 60, what="cluster1's agent ready again")

    def configure(**settings: str) -> None:
        restart(before | {f"MCS_{k.upper()}": v for k, v in settings.items()})

    yield configure
    if agent.env != before:
        restart(before)


# What the mechanics below need allowed (the defaults refuse any class, and every host).
FOLLOW = {
    "ingress_allowed_annotations": "foo",
    "ingress_allowed_hosts": "*.example.com",
    "ingress_class_policy": "keep",
}


def test_an_ingress_follows_the_guides_service_into_cluster2(
    guide, kubectl: Kubectl, source_policy
):
    namespace = guide
    source_policy(**FOLLOW)
    # The Ingresses first: the one naming nginx follows once the Service becomes global.
    kubectl.apply(SOURCE, INGRESSES, "-n", namespace)
    kubectl.apply(SOURCE, nginx(replicas=4), "-n", namespace)
    wait_for(lambda: all_running(kubectl, namespace, 4), 90, what="4 proxy pods Running")
    cluster1 = kubectl.json(SOURCE, "get", "namespace", "kube-system")["metadata"]["uid"]
    kubectl(SOURCE, "expose", "deployment", "nginx", "-n", namespace)
    exposed = time.monotonic()

    copy = wait_for(
        lambda: ingress(kubectl, TARGET, namespace, "web"), 30, what="the Ingress in cluster2"
    )
    copied_after = time.monotonic() - exposed
    original = ingress(kubectl, SOURCE, namespace, "web")
    meta = original["metadata"]
    assert FINALIZER in meta["finalizers"]
    assert meta["labels"][PREFIX + "has-finalizer"] == "true"
    assert meta["annotations"][PREFIX + "global"] == "true"
    copied = copy["metadata"]
    assert copied["annotations"][PREFIX + "is-delegate"] == ""
    assert copied["annotations"][PREFIX + "global"] == "true"
    assert copied["annotations"][PREFIX + "parent-name"] == "web"
    assert copied["annotations"][PREFIX + "parent-namespace"] == namespace
    assert copied["annotations"][PREFIX + "parent-cluster-name"] == cluster1
    assert copied["labels"] == {"app": "nginx", PREFIX + "parent-uid": meta["uid"]}
    assert not copied.get("finalizers"), "cluster2's agent leaves copies alone"
    assert copy["spec"] == original["spec"], "backends keep the Service's name"
    assert service(kubectl, TARGET, namespace, "nginx"), "the Service it names is there too"

    # An Ingress naming a Service that is not global never follows, and is left as it is.
    time.sleep(3)
    assert ingress(kubectl, TARGET, namespace, "plain") is None
    plain = ingress(kubectl, SOURCE, namespace, "plain")["metadata"]
    assert not plain.get("finalizers")
    assert PREFIX + "global" not in (plain.get("annotations") or {})

    # Annotations reach the copy, and go from it with the original's.
    kubectl(SOURCE, "annotate", "ingress", "web", "-n", namespace, "foo=bar")
    annotated = time.monotonic()
    wait_for(
        lambda: annotation(ingress(kubectl, TARGET, namespace, "web"), "foo") == "bar",
        30,
        what="foo=bar on the copy",
    )
    annotated_after = time.monotonic() - annotated
    kubectl(SOURCE, "annotate", "ingress", "web", "-n", namespace, "foo-")
    settled = wait_for(
        lambda: (
            (found := ingress(kubectl, TARGET, namespace, "web"))
            and annotation(found, "foo") is None
            and found
        ),
        30,
        what="foo removed from the copy",
    )
    time.sleep(2)
    now = ingress(kubectl, TARGET, namespace, "web")
    assert now["metadata"]["resourceVersion"] == settled["metadata"]["resourceVersion"], "flaps"

    # Raw configuration of an ingress controller is refused: the copy goes, a Warning says why;
    # without it, the Ingress follows again.
    snippet = "nginx.ingress.kubernetes.io/configuration-snippet"
    kubectl(SOURCE, "annotate", "ingress", "web", "-n", namespace, f"{snippet}=return 200;")
    wait_for(lambda: ingress(kubectl, TARGET, namespace, "web") is None, 30, what="copy deleted")
    warning = wait_for(
        lambda: [
            e
            for e in kubectl.json(SOURCE, "get", "events", "-n", namespace)["items"]
            if e["reason"] == "AnnotationRefused" and e["involvedObject"]["name"] == "web"
        ],
        30,
        what="an AnnotationRefused event on the Ingress",
    )
    assert snippet in warning[0]["message"]
    kubectl(SOURCE, "annotate", "ingress", "web", "-n", namespace, f"{snippet}-")
    wait_for(lambda: ingress(kubectl, TARGET, namespace, "web"), 30, what="copied again")

    # The Service no longer global: the copy goes, and so do the finalizer and the mark; global
    # again: the Ingress follows again.
    kubectl(
        SOURCE,
        "annotate",
        "service",
        "nginx",
        "-n",
        namespace,
        PREFIX + "global=false",
        "--overwrite",
    )

    def released() -> bool:
        meta = ingress(kubectl, SOURCE, namespace, "web")["metadata"]
        return (
            not meta.get("finalizers")
            and PREFIX + "has-finalizer" not in (meta.get("labels") or {})
            and PREFIX + "global" not in (meta.get("annotations") or {})
        )

    wait_for(lambda: ingress(kubectl, TARGET, namespace, "web") is None, 30, what="copy deleted")
    wait_for(released, 30, what="finalizer, label and mark removed")
    kubectl(
        SOURCE,
        "annotate",
        "service",
        "nginx",
        "-n",
        namespace,
        PREFIX + "global=true",
        "--overwrite",
    )
    wait_for(lambda: ingress(kubectl, TARGET, namespace, "web"), 30, what="copied again")

    # Deleting the Ingress deletes its copy, then our finalizer lets it go.
    kubectl(SOURCE, "delete", "ingress", "web", "-n", namespace, "--wait=false")
    deleted = time.monotonic()
    wait_for(lambda: ingress(kubectl, TARGET, namespace, "web") is None, 30, what="copy deleted")
    wait_for(lambda: ingress(kubectl, SOURCE, namespace, "web") is None, 30, what="ingress gone")
    print(
        f"\ningress copied {copied_after:.1f}s after kubectl expose, annotation on the copy in "
        f"{annotated_after:.1f}s, deleted everywhere in {time.monotonic() - deleted:.1f}s"
    )


def test_an_ingress_of_a_namespace_no_target_serves_is_not_copied(
    guide, testbed: TestBed, kubectl: Kubectl, source_policy
):
    """c2 is a Target of ``guide``'s namespace: an enabled namespace next to it, with a global
    Service and an Ingress naming it, reaches nothing in cluster2."""
    source_policy(**FOLLOW)
    other = f"{guide}x"
    for context in testbed.clusters:
        kubectl(context, "create", "namespace", other)
    try:
        kubectl(SOURCE, "label", "namespace", other, "multicluster-scheduler=enabled")
        kubectl.apply(SOURCE, USER_SERVICES.split("---")[0], "-n", other)
        kubectl.apply(
            SOURCE, INGRESSES.split("---")[0].replace("name: nginx\n", "name: db\n"), "-n", other
        )
        wait_for(
            lambda: (
                FINALIZER
                in ingress(kubectl, SOURCE, other, "web")["metadata"].get("finalizers", ())
            ),
            30,
            what="the Ingress looked at (it follows the global Service db)",
        )
        time.sleep(2)
        assert kubectl.json(TARGET, "get", "ingresses,services", "-n", other)["items"] == []
        kubectl(SOURCE, "delete", "ingresses,services", "--all", "-n", other, "--timeout=30s")
    finally:
        for context in testbed.clusters:
            kubectl(context, "delete", "namespace", other, "--wait=false")


# -- what an Ingress may carry into targets ------------------------------------------------------

NGINX = "nginx.ingress.kubernetes.io/"
SHOP = """apiVersion: v1
kind: Service
metadata:
  name: shop
  annotations:
    multicluster.admiralty.io/global: "true"
spec:
  selector:
    app: shop
  ports:
  - port: 80
"""


def ingress_manifest(
    name: str,
    *hosts: str | None,
    ingress_class: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict:
    """An Ingress routing ``hosts`` (default ``<name>.example.com``; None: a rule for every
    host) to the global Service ``shop``."""
    backend = {"service": {"name": "shop", "port": {"number": 80}}}
    rules = []
    for host in hosts or (f"{name}.example.com",):
        rule: dict = {"http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]}}
        if host is not None:
            rule["host"] = host
        rules.append(rule)
    made: dict = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"rules": rules},
    }
    if ingress_class is not None:
        made["spec"]["ingressClassName"] = ingress_class
    return made


def as_tenant(kubectl: Kubectl, namespace: str) -> str:
    """``mallory``, bound to the cluster's own ``edit`` role in ``namespace`` of cluster1 only:
    the ``--as`` flag that acts as her."""
    kubectl(
        SOURCE, "create", "rolebinding", "mallory-edit", "--clusterrole=edit", "--user=mallory",
        "-n", namespace,
    )  # fmt: skip
    return "--as=mallory"


def copied_ingresses(kubectl: Kubectl, namespace: str) -> set[str]:
    return {
        i["metadata"]["name"]
        for i in kubectl.json(TARGET, "get", "ingresses", "-n", namespace)["items"]
    }


def test_a_tenant_with_edit_in_cluster1_configures_nothing_else_in_cluster2(
    guide, kubectl: Kubectl, source_policy
):
    """Each Ingress carries one thing that would configure cluster2's ingress controllers beyond
    routing this namespace's hosts to its Services; the operator of cluster1 allowed hosts under
    example.com and nothing else. Only the Ingress that carries nothing else is copied; each
    other one gets a Warning naming what was refused. (Upstream, and this agent before its allow
    lists, copied them all: only the snippets and URLs of a block list were refused.)"""
    namespace = guide
    source_policy(ingress_allowed_hosts="*.example.com")
    mallory = as_tenant(kubectl, namespace)
    kubectl.apply(SOURCE, SHOP, "-n", namespace, mallory)
    attacks = {
        # a ConfigMap of kube-system, and of another tenant, as headers sent upstream
        "custom-headers": (
            {"annotations": {NGINX + "custom-headers": "kube-system/kubeadm-config"}},
            "AnnotationRefused",
            NGINX + "custom-headers",
        ),
        "auth-headers": (
            {"annotations": {NGINX + "auth-proxy-set-headers": "team-b/headers"}},
            "AnnotationRefused",
            NGINX + "auth-proxy-set-headers",
        ),
        # a Traefik middleware of kube-system
        "middleware": (
            {
                "annotations": {
                    "traefik.ingress.kubernetes.io/router.middlewares": (
                        "kube-system-admin-auth@kubernetescrd"
                    )
                }
            },
            "AnnotationRefused",
            "traefik.ingress.kubernetes.io/router.middlewares",
        ),
        # another tenant's host, by a rule, by an alias, or every host at once
        "other-host": (
            {"hosts": ("bank.other-tenant.test",)},
            "HostRefused",
            "bank.other-tenant.test",
        ),
        "alias": (
            {"annotations": {NGINX + "server-alias": "bank.other-tenant.test"}},
            "AnnotationRefused",
            NGINX + "server-alias",
        ),
        "every-host": ({"hosts": (None,)}, "HostRefused", "(none: every host)"),
        # redirects to the cloud's metadata address; Host headers of kube-system's Services
        "redirect": (
            {
                "annotations": {
                    NGINX + "proxy-redirect-from": "default",
                    NGINX + "proxy-redirect-to": "http://169.254.169.254/",
                }
            },
            "AnnotationRefused",
            NGINX + "proxy-redirect-to",
        ),
        "vhost": (
            {"annotations": {NGINX + "upstream-vhost": "vault.kube-system.svc.cluster.local"}},
            "AnnotationRefused",
            NGINX + "upstream-vhost",
        ),
        # a class of cluster2 the tenant picks (an internal controller, say), both ways
        "class": ({"ingress_class": "nginx-internal"}, "IngressClassRefused", "nginx-internal"),
        "class-annotation": (
            {"annotations": {"kubernetes.io/ingress.class": "nginx-internal"}},
            "IngressClassRefused",
            "nginx-internal",
        ),
    }
    items = [ingress_manifest("fine")]
    for name, (options, _, _) in attacks.items():
        options = dict(options)
        items.append(ingress_manifest(name, *options.pop("hosts", ()), **options))
    listed = {"apiVersion": "v1", "kind": "List", "items": items}
    kubectl.apply(SOURCE, listed, "-n", namespace, mallory)

    # The Ingress that carries nothing refused is copied: the controller is at work.
    wait_for(lambda: ingress(kubectl, TARGET, namespace, "fine"), 30, what="fine copied")

    def looked_at() -> bool:
        copied = copied_ingresses(kubectl, namespace)
        return all(
            name in copied or events(kubectl, namespace, name, reason)
            for name, (_, reason, _) in attacks.items()
        )

    wait_for(looked_at, 30, what="every Ingress copied or warned about")
    time.sleep(2)
    copied = copied_ingresses(kubectl, namespace)
    assert copied == {"fine"}, f"copied into cluster2: {sorted(copied - {'fine'})}"
    for name, (_, reason, said) in attacks.items():
        warning = events(kubectl, namespace, name, reason)[0]
        assert warning["type"] == "Warning"
        assert said in warning["message"], (name, warning["message"])
        meta = ingress(kubectl, SOURCE, namespace, name)["metadata"]
        assert FINALIZER not in (meta.get("finalizers") or ()), f"{name} holds a finalizer"
    kubectl(SOURCE, "delete", "ingresses,services", "--all", "-n", namespace, "--timeout=30s")


def test_what_the_operator_allows_is_copied_and_what_it_stops_allowing_goes(
    guide, kubectl: Kubectl, source_policy
):
    """An allowed annotation is copied and the operator's class lands on the copy; an allowed
    key whose value names another namespace, or a host the operator does not allow, takes the
    copy away until the tenant takes it back; the operator allowing less takes it away too."""
    namespace = guide
    source_policy(
        ingress_allowed_annotations=f"{NGINX}rewrite-target,{NGINX}custom-headers",
        ingress_allowed_hosts="*.example.com",
        ingress_class_policy="rewrite",
        ingress_class="public",
    )
    mallory = as_tenant(kubectl, namespace)
    kubectl.apply(SOURCE, SHOP, "-n", namespace, mallory)
    web = ingress_manifest(
        "web", ingress_class="made-up", annotations={NGINX + "rewrite-target": "/"}
    )
    kubectl.apply(SOURCE, web, "-n", namespace, mallory)

    copy = wait_for(lambda: ingress(kubectl, TARGET, namespace, "web"), 30, what="web copied")
    assert annotation(copy, NGINX + "rewrite-target") == "/"
    assert copy["spec"]["ingressClassName"] == "public", "the operator's class"
    assert copy["spec"]["rules"] == web["spec"]["rules"]
    original = ingress(kubectl, SOURCE, namespace, "web")
    assert original["spec"]["ingressClassName"] == "made-up", "the original is left as it is"

    def gone_with(reason: str, said: str) -> dict:
        wait_for(lambda: ingress(kubectl, TARGET, namespace, "web") is None, 30, what="copy gone")
        return wait_for(
            lambda: [e for e in events(kubectl, namespace, "web", reason) if said in e["message"]],
            30,
            what=f"a {reason} event saying {said}",
        )[0]

    # An allowed key, naming another namespace's ConfigMap: refused; this namespace's: copied.
    headers = NGINX + "custom-headers"
    annotate = ("annotate", "ingress", "web", "-n", namespace, "--overwrite", mallory)
    kubectl(SOURCE, *annotate, f"{headers}=kube-system/kubeadm-config")
    warning = gone_with("AnnotationRefused", f"{headers} names namespace kube-system")
    assert "no chart value allows" in warning["message"]
    kubectl(SOURCE, *annotate, f"{headers}={namespace}/headers")
    copy = wait_for(
        lambda: annotation(ingress(kubectl, TARGET, namespace, "web"), headers),
        30,
        what="copied again, with this namespace's ConfigMap",
    )

    # A host the operator did not allow, added: the copy goes; taken back: it comes back.
    patch = ("patch", "ingress", "web", "-n", namespace, "--type=json", mallory, "-p")
    rule = {"op": "add", "path": "/spec/rules/-", "value": {"host": "bank.other-tenant.test"}}
    kubectl(SOURCE, *patch, json.dumps([rule]))
    warning = gone_with("HostRefused", "bank.other-tenant.test")
    assert "ingresses.allowedHosts" in warning["message"]
    kubectl(SOURCE, *patch, json.dumps([{"op": "remove", "path": "/spec/rules/1"}]))
    wait_for(lambda: ingress(kubectl, TARGET, namespace, "web"), 30, what="copied again")

    # The operator allows less (hosts only, the default class policy): the agent deletes, when
    # it starts, the copy it would no longer make, and says why.
    source_policy(ingress_allowed_hosts="*.example.com")
    warning = gone_with("AnnotationRefused", "ingresses.allowedAnnotations")
    assert NGINX + "rewrite-target" in warning["message"]
    assert events(kubectl, namespace, "web", "IngressClassRefused")
    meta = ingress(kubectl, SOURCE, namespace, "web")["metadata"]
    assert FINALIZER not in (meta.get("finalizers") or ()), "released"
    kubectl(SOURCE, "delete", "ingresses,services", "--all", "-n", namespace, "--timeout=30s")
