"""Which pods of a target count as a proxy pod's delegate: only one this cluster could have
made, in a target that serves the proxy's namespace, and (to act for it) where the proxy pod is
placed. Everything else in a pod that is not its name and namespace is the word of whoever
created it."""

from __future__ import annotations

import copy

import pytest

from multicluster import Cluster, ClusterConfig
from multicluster.resources import PODS
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.proxy import (
    DELEGATE_LABEL_SELECTOR,
    delegate_pod,
    is_delegate_of,
    looks_like_delegate,
    not_made_by_webhook,
    slim_delegate,
    slim_proxy,
)
from multicluster_scheduler.scheduler.controller import proxy_informer
from multicluster_scheduler.targets.delegates import DelegateLookup, Placement
from multicluster_scheduler.targets.registry import (
    DELEGATE_INDEX,
    TargetConnection,
    TargetRegistry,
    by_parent_uid,
)

ME = "cluster-1"
NS = "team-a"


def pod(name: str = "web-1", uid: str = "uid-1", namespace: str = NS, node: str | None = None):
    """A proxy pod as the source's API server keeps it (a Secret in a volume, a ConfigMap in
    env)."""
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "finalizers": [keys.FINALIZER],
            "annotations": {keys.SOURCEPOD_MANIFEST: "{}"},
        },
        "spec": {
            "schedulerName": "admiralty-proxy",
            "nodeName": node,
            "containers": [
                {"name": "c", "envFrom": [{"configMapRef": {"name": "settings"}}]},
            ],
            "volumes": [{"name": "v", "secret": {"secretName": "token"}}],
        },
    }


def delegate_of(proxy: dict, cluster: str = ME) -> dict:
    made = delegate_pod(proxy, proxy, cluster)
    made["metadata"]["uid"] = "d-" + proxy["metadata"]["uid"]
    return made


def forged(proxy: dict, **metadata) -> dict:
    """What someone who may create pods in a target makes of the delegate's labels."""
    pod = copy.deepcopy(delegate_of(proxy))
    pod["metadata"].update(uid="forged", **metadata)
    return pod


# -- the pure rule ---------------------------------------------------------------------------------


def test_the_delegate_this_cluster_makes_counts():
    proxy = pod()
    assert is_delegate_of(delegate_of(proxy), proxy, ME)
    assert looks_like_delegate(delegate_of(proxy), ME)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"namespace": "team-b"}, id="another namespace"),
        pytest.param({"name": "web-1-mine"}, id="another name"),
    ],
)
def test_a_pod_elsewhere_with_the_same_labels_does_not(change):
    proxy = pod()
    assert not is_delegate_of(forged(proxy, **change), proxy, ME)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (keys.PARENT_CLUSTER_NAME, "cluster-2"),
        (keys.PARENT_NAMESPACE, "team-b"),
        (keys.PARENT_NAME, "web-2"),
    ],
)
def test_nor_one_whose_references_name_another_parent(key, value):
    proxy = pod()
    other = forged(proxy)
    other["metadata"]["annotations"][key] = value
    assert not is_delegate_of(other, proxy, ME)
    assert not looks_like_delegate(other, ME)


def test_nor_one_carrying_another_proxys_uid():
    proxy, victim = pod(), pod("db-1", "uid-2")
    other = forged(proxy)
    other["metadata"]["labels"][keys.PARENT_UID] = "uid-2"
    assert not is_delegate_of(other, victim, ME)
    assert not is_delegate_of(other, proxy, ME)


def test_a_pod_named_like_a_delegate_for_no_one_still_looks_like_ours():
    """An orphan: its proxy pod is gone, its name still derives from the one it names."""
    assert looks_like_delegate(delegate_of(pod("gone", "uid-9")), ME)
    assert not looks_like_delegate(delegate_of(pod("gone", "uid-9"), "cluster-2"), ME)


def test_a_proxy_pod_made_by_hand_is_not_the_webhooks():
    assert not_made_by_webhook(pod()) is None
    by_hand = pod()
    by_hand["metadata"]["finalizers"] = []
    assert not_made_by_webhook(by_hand) == f"no {keys.FINALIZER} finalizer"
    del by_hand["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST]
    by_hand["metadata"]["finalizers"] = [keys.FINALIZER]
    assert not_made_by_webhook(by_hand) == f"no {keys.SOURCEPOD_MANIFEST} annotation"


# -- the lookup over targets -----------------------------------------------------------------------


class Bed:
    """A registry of targets with caches filled by hand (no API server: pure decisions)."""

    def __init__(self) -> None:
        self.local = Cluster("local", ClusterConfig("https://local.invalid:6443", None))
        self.registry = TargetRegistry()
        self.proxies = proxy_informer(self.local)
        self.lookup = DelegateLookup(self.registry, self.proxies, ME)

    def target(
        self, name: str, namespace: str | None = NS, server: str | None = None
    ) -> TargetConnection:
        cluster = Cluster(name, ClusterConfig(server or f"https://{name}.invalid:6443", None))
        delegates = cluster.informer(
            PODS, namespace, label_selector=DELEGATE_LABEL_SELECTOR, transform=slim_delegate
        )
        delegates.add_indexer(DELEGATE_INDEX, by_parent_uid)
        kind = "Target" if namespace else "ClusterTarget"
        connection = TargetConnection(kind, name, namespace, cluster=cluster, delegates=delegates)
        self.registry.connections[connection.node_name] = connection
        return connection

    def proxy(self, proxy: dict) -> dict:
        self.proxies.store.put(f"{NS}/{proxy['metadata']['name']}", slim_proxy(proxy))
        return self.proxies.get(proxy["metadata"]["name"], proxy["metadata"]["namespace"])

    @staticmethod
    def put(connection: TargetConnection, pod: dict) -> dict:
        meta = pod["metadata"]
        assert connection.delegates is not None
        connection.delegates.store.put(f"{meta['namespace']}/{meta['name']}", slim_delegate(pod))
        return connection.delegates.get(meta["name"], meta["namespace"])


@pytest.fixture
def bed() -> Bed:
    return Bed()


def test_a_target_that_does_not_serve_the_namespace_holds_no_delegate(bed):
    other = bed.target("c3", "team-b")
    proxy = bed.proxy(pod())
    bed.put(other, delegate_of(pod()))
    assert bed.lookup.in_target(proxy, other) == []
    assert bed.lookup.everywhere(proxy) == []


def test_a_delegate_seen_through_two_targets_of_one_place_counts_once(bed):
    """A Target of the namespace and a ClusterTarget, with the same kubeconfig server."""
    target = bed.target("c2", NS, "https://c2.invalid:6443")
    cluster_target = bed.target("all", None, "https://c2.invalid:6443")
    proxy = bed.proxy(pod(node=target.node_name))
    seen = [bed.put(target, delegate_of(pod())), bed.put(cluster_target, delegate_of(pod()))]
    assert target.same_place(cluster_target, NS)
    assert not target.same_place(cluster_target, "team-b")  # the Target serves team-a only
    found = bed.lookup.everywhere(proxy, prefer=cluster_target.node_name)
    assert found == [(cluster_target, seen[1])]


def test_the_same_cluster_behind_two_addresses_is_one_place_by_its_summary(bed):
    one, two = bed.target("c2"), bed.target("c2bis")
    assert not one.same_place(two, NS)
    for connection in (one, two):
        connection.summaries = type("S", (), {"get": lambda _s, _n: {"metadata": {"uid": "s1"}}})()  # type: ignore[assignment]
    assert one.same_place(two, NS)


def test_acting_for_a_delegate_needs_its_proxy_pod_placed_there(bed):
    c2, c3 = bed.target("c2"), bed.target("c3")
    there = bed.put(c2, delegate_of(pod()))
    proxy = bed.proxy(pod(node=None))
    assert bed.lookup.proxy_of(there, c2) is None  # not placed anywhere yet
    bed.lookup.placements["uid-1"] = Placement(c2.node_name, "x", 0.0)
    assert bed.lookup.proxy_of(there, c2) is proxy  # being placed there
    bed.lookup.placements["uid-1"] = Placement(c3.node_name, "x", 0.0)
    assert bed.lookup.proxy_of(there, c2) is None  # being placed elsewhere
    del bed.lookup.placements["uid-1"]
    bound = bed.proxy(pod(node=c2.node_name))
    assert bed.lookup.proxy_of(there, c2) is bound
    assert bed.lookup.proxy_of(bed.put(c2, forged(pod(), name="web-1-x")), c2) is None


def test_only_what_the_proxy_pod_itself_uses_is_used(bed):
    c2 = bed.target("c2")
    bed.proxy(pod(node=c2.node_name))
    claims = delegate_of(pod())
    claims["spec"]["containers"][0]["envFrom"].append({"secretRef": {"name": "admin"}})
    there = bed.put(c2, claims)
    assert bed.lookup.uses(there, c2, f"ConfigMap:{NS}/settings")
    assert bed.lookup.uses(there, c2, f"Secret:{NS}/token")
    assert not bed.lookup.uses(there, c2, f"Secret:{NS}/admin")


def test_a_pod_bound_by_hand_without_our_finalizer_is_acted_for_by_no_one(bed):
    """Anyone may create a pod naming our scheduler, bound to a virtual node by hand: without
    the webhook's finalizer it is no proxy pod, whatever its delegate-looking namesake says."""
    c2 = bed.target("c2")
    by_hand = pod(node=c2.node_name)
    by_hand["metadata"]["finalizers"] = []
    bed.proxy(by_hand)
    there = bed.put(c2, delegate_of(pod()))
    assert bed.lookup.proxy_of(there, c2) is None
    assert not bed.lookup.uses(there, c2, f"Secret:{NS}/token")
