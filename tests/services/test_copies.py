"""Copies of global services in targets: what they hold, when they are out of date, how they
are updated without touching what the target assigned, and whose they are."""

from __future__ import annotations

import copy

import orjson
from hypothesis import given
from hypothesis import strategies as st

from multicluster_scheduler.api import keys
from multicluster_scheduler.api.copies import LAST_APPLIED, MANAGED_KEYS, is_copy
from multicluster_scheduler.api.parents import is_copy_of
from multicluster_scheduler.api.services import (
    copy_differs,
    copy_update,
    desired_copy,
    is_global,
    must_recreate,
    portable_spec,
)

CLUSTER = "cluster1-uid"


def original(**spec) -> dict:
    """A rerouted Service as the source's API server returns it (defaults filled in)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "nginx",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "9",
            "labels": {"app": "nginx", keys.HAS_FINALIZER: "true"},
            "annotations": {
                keys.CILIUM_GLOBAL_SERVICE: "true",
                keys.GLOBAL: "true",
                keys.ORIGINAL_SELECTOR: '{"app":"nginx"}',
                LAST_APPLIED: '{"kind":"Service"}',
            },
            "finalizers": [keys.FINALIZER],
        },
        "spec": {
            "selector": {keys.PREFIX + "app": "nginx"},
            "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}],
            "type": "ClusterIP",
            "sessionAffinity": "None",
            "internalTrafficPolicy": "Cluster",
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"],
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            **spec,
        },
    }


def as_created_in_target(body: dict, **assigned) -> dict:
    """What the target's API server makes of a copy: its own IPs, families, node ports, and
    perhaps defaults of a newer Kubernetes version."""
    made = copy.deepcopy(body)
    made["metadata"] |= {"uid": "t1", "resourceVersion": "100"}
    spec = made["spec"]
    if spec.get("clusterIP") != "None":
        spec["clusterIP"], spec["clusterIPs"] = "10.96.7.7", ["10.96.7.7"]
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")
    if spec.get("type") in ("NodePort", "LoadBalancer"):
        for i, port in enumerate(spec["ports"]):
            port.setdefault("nodePort", 30000 + i)
    spec.update(assigned)
    return made


def test_the_copy_of_the_guides_service():
    body = desired_copy(original(), CLUSTER)
    assert body["metadata"] == {
        "name": "nginx",
        "namespace": "ns",
        "labels": {"app": "nginx", keys.PARENT_UID: "u1"},
        "annotations": {
            keys.CILIUM_GLOBAL_SERVICE: "true",
            keys.GLOBAL: "true",
            keys.ORIGINAL_SELECTOR: '{"app":"nginx"}',
            keys.IS_DELEGATE: "",
            keys.PARENT_NAME: "nginx",
            keys.PARENT_NAMESPACE: "ns",
            keys.PARENT_CLUSTER_NAME: CLUSTER,
            MANAGED_KEYS: (
                '{"annotations":["io.cilium/global-service","multicluster.admiralty.io/global",'
                '"multicluster.admiralty.io/is-delegate","multicluster.admiralty.io/original-'
                'selector","multicluster.admiralty.io/parent-cluster-name","multicluster.'
                'admiralty.io/parent-name","multicluster.admiralty.io/parent-namespace"],'
                '"labels":["app","multicluster.admiralty.io/parent-uid"],'
                '"spec":["ports","selector","sessionAffinity","type"]}'
            ),
        },
    }
    assert body["spec"] == {
        "selector": {keys.PREFIX + "app": "nginx"},
        "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}],
        "type": "ClusterIP",
        "sessionAffinity": "None",
        "internalTrafficPolicy": "Cluster",
    }
    assert is_copy(body)
    assert is_global(body)
    assert is_copy_of(body, "ns", "nginx", CLUSTER)
    assert not is_copy_of(body, "ns", "nginx", "another-cluster")
    assert not is_copy_of(body, "other", "nginx", CLUSTER)
    assert not is_copy_of(original(), "ns", "nginx", CLUSTER), "a user's Service is not ours"


def test_headless_services_stay_headless_and_node_ports_are_the_targets():
    headless = desired_copy(original(clusterIP="None", clusterIPs=["None"]), CLUSTER)
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["clusterIPs"] == ["None"]
    assert "ipFamilies" not in headless["spec"]
    node_port = original(
        type="LoadBalancer",
        externalTrafficPolicy="Local",
        healthCheckNodePort=31999,
        ports=[{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}],
    )
    spec = desired_copy(node_port, CLUSTER)["spec"]
    assert spec["ports"] == [{"name": "http", "port": 80, "protocol": "TCP"}]
    assert "healthCheckNodePort" not in spec
    assert "nodePort" in node_port["spec"]["ports"][0], "the original is not modified"


def test_load_balancer_addresses_asked_by_annotation_are_never_copied():
    asked = original(type="LoadBalancer")
    asked["metadata"]["annotations"] |= {
        "metallb.universe.tf/loadBalancerIPs": "10.9.9.9",
        "io.cilium/lb-ipam-ips": "10.9.9.9",
        "kube-vip.io/loadbalancerIPs": "10.9.9.9",
        "team.example.com/owner": "a",
    }
    annotations = desired_copy(asked, CLUSTER)["metadata"]["annotations"]
    assert "team.example.com/owner" in annotations
    assert not [k for k in annotations if "10.9.9.9" in annotations[k]]


def test_the_source_clusters_own_addresses_are_never_copied():
    """External IPs in a target would make its nodes take traffic for addresses its owners
    never gave (CVE-2020-8554); a load balancer IP is the source's cloud's."""
    spec = desired_copy(
        original(type="LoadBalancer", externalIPs=["10.96.0.10"], loadBalancerIP="1.2.3.4"),
        CLUSTER,
    )["spec"]
    assert "externalIPs" not in spec
    assert "loadBalancerIP" not in spec
    assert spec["type"] == "LoadBalancer"


def test_a_copy_as_the_target_made_it_is_current():
    body = desired_copy(original(), CLUSTER)
    made = as_created_in_target(body, trafficDistribution=None)
    made["spec"].pop("trafficDistribution")
    assert not copy_differs(body, made)
    newer = as_created_in_target(body, someFieldANewerVersionDefaults="x")
    assert not copy_differs(body, newer), "a target's own defaults never look out of date"


def test_changes_of_the_original_make_the_copy_out_of_date():
    made = as_created_in_target(desired_copy(original(), CLUSTER))
    ports = [{"port": 80, "protocol": "TCP", "targetPort": 80}, {"port": 8080, "protocol": "TCP"}]
    assert copy_differs(desired_copy(original(ports=ports), CLUSTER), made)
    relabelled = original()
    relabelled["metadata"]["labels"]["tier"] = "web"
    assert copy_differs(desired_copy(relabelled, CLUSTER), made)
    published = as_created_in_target(desired_copy(original(publishNotReadyAddresses=True), CLUSTER))
    assert copy_differs(desired_copy(original(), CLUSTER), published), "a field removed"
    drifted = copy.deepcopy(made)
    drifted["spec"]["selector"] = {"app": "nginx"}
    assert copy_differs(desired_copy(original(), CLUSTER), drifted), "edited in the target"


def test_updates_keep_what_the_target_assigned():
    old = as_created_in_target(
        desired_copy(
            original(
                type="NodePort",
                ports=[{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 1}],
            ),
            CLUSTER,
        )
    )
    old["metadata"]["finalizers"] = ["someone.else/keep"]
    ports = [
        {"name": "http", "port": 81, "protocol": "TCP", "nodePort": 1},
        {"name": "metrics", "port": 9090, "protocol": "TCP", "nodePort": 2},
    ]
    desired = desired_copy(original(type="NodePort", ports=ports), CLUSTER)
    body = copy_update(desired, old)
    assert body["metadata"]["resourceVersion"] == "100"
    assert body["metadata"]["finalizers"] == ["someone.else/keep"]
    assert body["spec"]["clusterIP"] == "10.96.7.7"
    assert body["spec"]["ipFamilies"] == ["IPv4"]
    assert [p.get("nodePort") for p in body["spec"]["ports"]] == [30000, None]
    assert not copy_differs(desired, as_created_in_target(body))
    assert "clusterIP" not in desired["spec"], "the desired copy is not modified"


def test_headless_or_not_is_changed_by_recreating():
    plain = desired_copy(original(), CLUSTER)
    headless = desired_copy(original(clusterIP="None", clusterIPs=["None"]), CLUSTER)
    assert must_recreate(headless, as_created_in_target(plain))
    assert must_recreate(plain, as_created_in_target(headless))
    assert not must_recreate(plain, as_created_in_target(plain))
    assert copy_differs(plain, as_created_in_target(headless))


PORTS = st.lists(
    st.fixed_dictionaries(
        {"port": st.integers(1, 65535), "protocol": st.sampled_from(["TCP", "UDP"])},
        optional={"name": st.text("abc", min_size=1, max_size=3), "nodePort": st.integers(1, 9)},
    ),
    max_size=3,
)


@given(
    ports=PORTS,
    kind=st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]),
    headless=st.booleans(),
    labels=st.dictionaries(st.text("xyz", min_size=1, max_size=3), st.text("01", max_size=2)),
)
def test_a_written_copy_is_current_and_keeps_nothing_assigned(ports, kind, headless, labels):
    source = original(type=kind, ports=ports)
    source["metadata"]["labels"] = labels
    if headless and kind == "ClusterIP":
        source["spec"] |= {"clusterIP": "None", "clusterIPs": ["None"]}
    body = desired_copy(source, CLUSTER)
    assert "ipFamilies" not in body["spec"]
    assert all("nodePort" not in p for p in body["spec"].get("ports") or ())
    assert body["spec"] == portable_spec(body["spec"])
    made = as_created_in_target(body)
    assert not copy_differs(body, made)
    assert not copy_differs(body, as_created_in_target(copy_update(body, made)))
    touched = touched_in_target(made)
    assert not copy_differs(body, touched)
    assert not copy_differs(body, as_created_in_target(copy_update(body, touched)))


def touched_in_target(made: dict) -> dict:
    """A copy as MetalLB, a cloud's controllers, a webhook and the target's API server leave it:
    their labels, annotations, spec fields and status added, internalTrafficPolicy changed."""
    made = copy.deepcopy(made)
    meta = made["metadata"]
    meta["labels"]["team.example.com/owner"] = "ops"
    meta["annotations"] |= {
        "metallb.universe.tf/ip-allocated-from-pool": "pool-b",
        "cloud.google.com/neg-status": '{"zones":["b"]}',
    }
    made["spec"] |= {"loadBalancerClass": "example.com/lb", "internalTrafficPolicy": "Local"}
    made["status"] = {"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}}
    return made


def test_what_the_target_adds_never_makes_a_copy_out_of_date():
    body = desired_copy(original(type="LoadBalancer", allocateLoadBalancerNodePorts=True), CLUSTER)
    touched = touched_in_target(as_created_in_target(body))
    assert not copy_differs(body, touched)


def test_updates_write_only_what_is_ours_and_keep_the_rest():
    source = original(type="LoadBalancer")
    source["metadata"]["labels"]["tier"] = "web"
    source["metadata"]["annotations"]["example.com/owner"] = "me"
    source["spec"]["externalIPs"] = ["198.51.100.1"]
    touched = touched_in_target(as_created_in_target(desired_copy(source, CLUSTER)))
    assert not copy_differs(desired_copy(source, CLUSTER), touched)

    # The original drops a label, an annotation and a spec field, and changes its ports.
    del source["metadata"]["labels"]["tier"]
    del source["metadata"]["annotations"]["example.com/owner"]
    del source["spec"]["externalIPs"]
    source["spec"]["ports"] = [{"port": 81, "protocol": "TCP", "targetPort": 80}]
    desired = desired_copy(source, CLUSTER)
    assert copy_differs(desired, touched)
    body = copy_update(desired, touched)
    meta = body["metadata"]
    assert "tier" not in meta["labels"]
    assert "example.com/owner" not in meta["annotations"]
    assert "externalIPs" not in body["spec"]
    assert meta["labels"]["team.example.com/owner"] == "ops"
    assert meta["annotations"]["metallb.universe.tf/ip-allocated-from-pool"] == "pool-b"
    assert meta["annotations"]["cloud.google.com/neg-status"] == '{"zones":["b"]}'
    assert body["spec"]["loadBalancerClass"] == "example.com/lb"
    assert body["spec"]["internalTrafficPolicy"] == "Local"
    assert body["spec"]["clusterIP"] == "10.96.7.7"
    assert body["spec"]["ports"] == [
        {"port": 81, "protocol": "TCP", "targetPort": 80, "nodePort": 30000}
    ]
    assert body["status"] == touched["status"]
    assert not copy_differs(desired, body), "written once, then current"


def test_the_original_s_own_controllers_annotations_are_not_copied():
    source = original()
    source["metadata"]["annotations"] |= {
        "metallb.universe.tf/ip-allocated-from-pool": "pool-a",
        "cloud.google.com/neg-status": '{"zones":["a"]}',
    }
    body = desired_copy(source, CLUSTER)
    assert "metallb.universe.tf/ip-allocated-from-pool" not in body["metadata"]["annotations"]
    assert "cloud.google.com/neg-status" not in body["metadata"]["annotations"]
    assert not copy_differs(body, touched_in_target(as_created_in_target(body)))


def test_copies_made_before_managed_keys_are_taken_as_ours_once():
    body = desired_copy(original(), CLUSTER)
    legacy = as_created_in_target(body)
    del legacy["metadata"]["annotations"][MANAGED_KEYS]
    legacy["metadata"]["annotations"]["stale"] = "from an earlier original"
    legacy["metadata"]["annotations"]["metallb.universe.tf/ip-allocated-from-pool"] = "p"
    assert copy_differs(body, legacy)
    updated = copy_update(body, legacy)
    assert "stale" not in updated["metadata"]["annotations"]
    assert updated["metadata"]["annotations"]["metallb.universe.tf/ip-allocated-from-pool"] == "p"
    assert (
        updated["metadata"]["annotations"][MANAGED_KEYS]
        == (body["metadata"]["annotations"][MANAGED_KEYS])
    )
    assert not copy_differs(body, as_created_in_target(updated))


def test_a_mangled_record_is_written_again():
    body = desired_copy(original(), CLUSTER)
    for mangled in ("not json", "[]", '{"labels": 1}'):
        made = as_created_in_target(body)
        made["metadata"]["annotations"][MANAGED_KEYS] = mangled
        assert copy_differs(body, made)
        updated = copy_update(body, made)
        assert orjson.loads(updated["metadata"]["annotations"][MANAGED_KEYS])["labels"]
