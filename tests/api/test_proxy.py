"""Proxy pods and their delegates (docs/scheduling.md, "From proxy pod to delegate"): how a
delegate is built from the saved manifest, named, and found again, without a cluster."""

from __future__ import annotations

import copy
import re

import orjson
import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from multicluster_scheduler.api import keys
from multicluster_scheduler.api.proxy import (
    SERVICE_ACCOUNT_MOUNT,
    InvalidManifest,
    controller_uid,
    delegate_name,
    delegate_pod,
    is_proxy,
    prefixed_labels,
    slim_delegate,
    slim_proxy,
    source_manifest,
    stopped_status,
)

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
TOKEN_VOLUME = "kube-api-access-x7k2p"


def token_mount(path: str = SERVICE_ACCOUNT_MOUNT) -> dict:
    return {"name": TOKEN_VOLUME, "mountPath": path, "readOnly": True}


def manifest_of(**spec) -> dict:
    """A pod as the webhook received it: user labels and annotations, the service-account token
    injected by the API server, and scheduling constraints the delegate must keep."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-7d4b9c-abcde",
            "namespace": "default",
            "labels": {
                "app": "web",
                "app.kubernetes.io/name": "web",
                "pod-template-hash": "7d4b9c",
            },
            "annotations": {
                keys.ELECT: "",
                "prometheus.io/scrape": "true",
                "team": "payments",
            },
        },
        "spec": {
            "nodeName": "node-1",
            "priority": 1000,
            "priorityClassName": "high",
            "schedulerName": "default-scheduler",
            "nodeSelector": {"topology.kubernetes.io/region": "eu"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
                        ]
                    }
                }
            },
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "web"}],
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app": "web"}},
                }
            ],
            "initContainers": [
                {
                    "name": "init",
                    "image": "busybox",
                    "volumeMounts": [token_mount(), {"name": "data", "mountPath": "/data"}],
                }
            ],
            "containers": [
                {
                    "name": "web",
                    "image": "nginx",
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/nginx"},
                        token_mount(),
                    ],
                },
                {"name": "sidecar", "image": "envoy", "volumeMounts": [token_mount()]},
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": "nginx"}},
                {"name": "data", "emptyDir": {}},
                {"name": TOKEN_VOLUME, "projected": {"sources": []}},
            ],
            **spec,
        },
    }


def proxy_of(manifest: dict | None = None, **meta) -> dict:
    annotations = {}
    if manifest is not None:
        annotations[keys.SOURCEPOD_MANIFEST] = orjson.dumps(manifest).decode()
    return {
        "metadata": {
            "name": "web-7d4b9c-abcde",
            "namespace": "default",
            "uid": "0b6a5d1e-7f43-4c3a-9d0e-2f1b8c7a6e55",
            "annotations": annotations,
            **meta,
        },
        "spec": {"schedulerName": keys.PROXY_SCHEDULER_NAME, "nodeName": "admiralty-cluster-c1"},
    }


@pytest.fixture
def manifest() -> dict:
    return manifest_of()


@pytest.fixture
def delegate(manifest) -> dict:
    return delegate_pod(proxy_of(manifest), manifest, "cluster1")


# delegate_pod: metadata


def test_delegate_labels_are_prefixed_copies_plus_the_parent_uid(delegate):
    assert delegate["metadata"]["labels"] == {
        keys.PREFIX + "app": "web",
        keys.PREFIX + "name": "web",
        keys.PREFIX + "pod-template-hash": "7d4b9c",
        keys.PARENT_UID: "0b6a5d1e-7f43-4c3a-9d0e-2f1b8c7a6e55",
    }


def test_a_user_label_cannot_forge_the_parent_uid(manifest):
    manifest["metadata"]["labels"][keys.PARENT_UID] = "forged"
    delegate = delegate_pod(proxy_of(manifest), manifest, "cluster1")
    assert delegate["metadata"]["labels"][keys.PARENT_UID] == proxy_of()["metadata"]["uid"]


def test_delegate_annotations_drop_ours_and_add_the_parent_references(delegate):
    assert delegate["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "team": "payments",
        keys.PARENT_NAME: "web-7d4b9c-abcde",
        keys.PARENT_NAMESPACE: "default",
        keys.PARENT_CLUSTER_NAME: "cluster1",
    }


def test_delegate_identity(delegate):
    meta = delegate["metadata"]
    assert (delegate["apiVersion"], delegate["kind"]) == ("v1", "Pod")
    assert meta["namespace"] == "default"
    assert meta["name"] == delegate_name("web-7d4b9c-abcde", proxy_of()["metadata"]["uid"])
    assert meta["name"] != "web-7d4b9c-abcde"
    assert set(meta) == {"name", "namespace", "labels", "annotations"}


def test_a_manifest_without_labels_or_annotations():
    manifest = {"metadata": {}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    delegate = delegate_pod(proxy_of(manifest), manifest, "c1")
    assert delegate["metadata"]["labels"] == {keys.PARENT_UID: proxy_of()["metadata"]["uid"]}
    assert set(delegate["metadata"]["annotations"]) == {
        keys.PARENT_NAME,
        keys.PARENT_NAMESPACE,
        keys.PARENT_CLUSTER_NAME,
    }


def test_a_manifest_without_metadata():
    manifest = {"spec": {"containers": [{"name": "c", "image": "i"}]}}
    delegate = delegate_pod(proxy_of(manifest), manifest, "c1")
    assert delegate["metadata"]["labels"] == {keys.PARENT_UID: proxy_of()["metadata"]["uid"]}


# delegate_pod: spec


def test_node_name_and_priority_are_cleared_priority_class_is_kept(delegate):
    spec = delegate["spec"]
    assert "nodeName" not in spec
    assert "priority" not in spec
    assert spec["priorityClassName"] == "high"


@pytest.mark.parametrize(
    "field",
    ["nodeSelector", "affinity", "tolerations", "topologySpreadConstraints", "schedulerName"],
)
def test_scheduling_constraints_are_kept(manifest, delegate, field):
    assert delegate["spec"][field] == manifest["spec"][field]


def test_with_use_constraints_from_spec_the_delegate_goes_without_them(manifest):
    """As upstream: the proxy pod asks them of virtual nodes; the target places freely."""
    manifest["metadata"].setdefault("annotations", {})[keys.USE_CONSTRAINTS_FROM_SPEC] = ""
    spec = delegate_pod(proxy_of(manifest), manifest, "cluster1")["spec"]
    for field in ("nodeSelector", "affinity", "tolerations", "topologySpreadConstraints"):
        assert field not in spec
    assert spec["schedulerName"] == manifest["spec"]["schedulerName"]
    assert [c["image"] for c in spec["containers"]] == ["nginx", "envoy"]


def test_the_service_account_token_volume_and_its_mounts_are_removed(delegate):
    spec = delegate["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["config", "data"]
    assert spec["initContainers"][0]["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    assert spec["containers"][0]["volumeMounts"] == [{"name": "config", "mountPath": "/etc/nginx"}]
    assert "volumeMounts" not in spec["containers"][1]


def test_containers_are_otherwise_unchanged(manifest, delegate):
    for field in ("initContainers", "containers"):
        for kept, original in zip(delegate["spec"][field], manifest["spec"][field], strict=True):
            assert {k: v for k, v in kept.items() if k != "volumeMounts"} == {
                k: v for k, v in original.items() if k != "volumeMounts"
            }


def test_a_token_mount_path_with_a_trailing_slash_is_recognised():
    manifest = manifest_of(
        containers=[
            {
                "name": "c",
                "image": "i",
                "volumeMounts": [token_mount("/var/run/secrets/kubernetes.io/serviceaccount/")],
            }
        ],
        initContainers=[],
        volumes=[{"name": TOKEN_VOLUME, "secret": {"secretName": "default-token-abcde"}}],
    )
    spec = delegate_pod(proxy_of(manifest), manifest, "c1")["spec"]
    assert "volumeMounts" not in spec["containers"][0]
    assert "volumes" not in spec


def test_other_secret_mounts_are_kept():
    mounts = [
        {"name": "tls", "mountPath": "/var/run/secrets/tls"},
        {"name": "sa", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount-extra"},
    ]
    volumes = [{"name": "tls", "secret": {"secretName": "tls"}}, {"name": "sa", "emptyDir": {}}]
    manifest = manifest_of(
        containers=[{"name": "c", "image": "i", "volumeMounts": mounts}],
        initContainers=[],
        volumes=volumes,
    )
    spec = delegate_pod(proxy_of(manifest), manifest, "c1")["spec"]
    assert spec["containers"][0]["volumeMounts"] == mounts
    assert spec["volumes"] == volumes


def test_a_spec_without_volumes():
    manifest = {"metadata": {}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    assert delegate_pod(proxy_of(manifest), manifest, "c1")["spec"] == manifest["spec"]


def test_the_manifest_is_not_mutated(manifest):
    before = copy.deepcopy(manifest)
    delegate = delegate_pod(proxy_of(manifest), manifest, "c1")
    assert manifest == before
    delegate["spec"]["containers"][0]["image"] = "changed"
    delegate["spec"]["tolerations"].append({"key": "x"})
    delegate["metadata"]["labels"]["x"] = "y"
    delegate["metadata"]["annotations"]["x"] = "y"
    assert manifest == before


def test_the_delegate_is_deterministic(manifest):
    proxy = proxy_of(manifest)
    assert delegate_pod(proxy, manifest, "c1") == delegate_pod(proxy, manifest, "c1")


# delegate_name


def test_delegate_name_is_deterministic():
    assert delegate_name("web", "uid-1") == delegate_name("web", "uid-1")


def test_delegate_name_keeps_short_names_readable():
    assert delegate_name("web-7d4b9c-abcde", "uid-1").startswith("web-7d4b9c-abcde-")


def test_delegate_name_of_a_long_name():
    name = delegate_name("a" * 253, "uid-1")
    assert len(name) == 63
    assert DNS_LABEL.fullmatch(name)


def test_delegate_name_does_not_end_the_head_with_a_dash():
    name = delegate_name("a" * 51 + "-b" * 10, "uid-1")
    assert "--" not in name
    assert DNS_LABEL.fullmatch(name)


DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
UIDS = st.uuids().map(str)
# Any 1-253 characters of [a-z0-9-.] that neither start nor end with "-" (dots included).
NAMES = st.from_regex(r"[a-z0-9.]([a-z0-9.-]{0,251}[a-z0-9.])?", fullmatch=True)
LABEL_NAMES = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,251}[a-z0-9])?", fullmatch=True)
SUBDOMAIN_NAMES = st.lists(
    st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True), min_size=1, max_size=10
).map(".".join)


@given(LABEL_NAMES, UIDS)
def test_the_delegate_name_of_a_dns_label_is_a_short_dns_label(name, uid):
    delegate = delegate_name(name, uid)
    assert len(delegate) <= 63
    assert DNS_LABEL.fullmatch(delegate), delegate
    assert delegate != name
    assert delegate == delegate_name(name, uid)


@given(SUBDOMAIN_NAMES, UIDS)
def test_the_delegate_name_of_a_pod_name_is_a_short_pod_name(name, uid):
    delegate = delegate_name(name, uid)
    assert len(delegate) <= 63
    assert DNS_SUBDOMAIN.fullmatch(delegate), delegate
    assert delegate != name


@given(NAMES, UIDS)
@example(".", "uid-1")
@example("web.v1", "uid-1")
def test_delegate_name_is_a_short_dns_label_distinct_from_the_proxy_name(name, uid):
    delegate = delegate_name(name, uid)
    assert len(delegate) <= 63
    assert DNS_LABEL.fullmatch(delegate), delegate
    assert delegate != name


@given(NAMES, UIDS, UIDS)
def test_delegate_names_differ_for_different_uids(name, uid, other):
    if uid != other:
        assert delegate_name(name, uid) != delegate_name(name, other)


# prefixed_labels


def test_prefixed_labels_keep_the_last_segment():
    assert prefixed_labels({"app": "a", "example.com/tier": "b", "a/b/c": "d"}) == {
        keys.PREFIX + "app": "a",
        keys.PREFIX + "tier": "b",
        keys.PREFIX + "c": "d",
    }


def test_prefixed_labels_of_nothing():
    assert prefixed_labels({}) == {}


def test_colliding_labels_resolve_the_same_way_whatever_their_order():
    labels = {"name": "plain", "app.kubernetes.io/name": "k8s", "example.com/name": "example"}
    expected = {keys.PREFIX + "name": "plain"}  # "name" sorts after the prefixed keys
    assert prefixed_labels(labels) == expected
    assert prefixed_labels(dict(reversed(labels.items()))) == expected


@given(st.dictionaries(st.from_regex(r"([a-z]{1,3}/)?[a-z]{1,3}", fullmatch=True), st.text()))
def test_prefixed_labels_do_not_depend_on_insertion_order(labels):
    assert prefixed_labels(labels) == prefixed_labels(dict(reversed(labels.items())))


# source_manifest


def test_a_json_manifest(manifest):
    assert source_manifest(proxy_of(manifest)) == manifest


def test_a_yaml_manifest_as_the_original_project_wrote_it(manifest):
    proxy = proxy_of()
    proxy["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST] = yaml.safe_dump(manifest)
    assert source_manifest(proxy) == manifest


def with_annotation(text: str) -> dict:
    proxy = proxy_of()
    proxy["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST] = text
    return proxy


@pytest.mark.parametrize(
    ("proxy", "message"),
    [
        (proxy_of(), "has no multicluster.admiralty.io/sourcepod-manifest annotation"),
        ({"metadata": {"name": "p"}}, "has no multicluster.admiralty.io/sourcepod-manifest"),
        (with_annotation(""), "has no multicluster.admiralty.io/sourcepod-manifest annotation"),
        (with_annotation("spec: [unclosed"), "is neither JSON nor YAML"),
        (with_annotation("just words"), "does not hold a pod with a spec"),
        (with_annotation("[1, 2]"), "does not hold a pod with a spec"),
        (with_annotation('{"kind": "ConfigMap", "data": {}}'), "does not hold a pod with a spec"),
        (with_annotation('{"spec": []}'), "does not hold a pod with a spec"),
        (
            with_annotation('{"kind": "Deployment", "spec": {"template": {}}}'),
            "holds a pod without containers",
        ),
        (with_annotation('{"spec": {"containers": []}}'), "holds a pod without containers"),
        (with_annotation('{"spec": {"containers": {}}}'), "holds a pod without containers"),
        (
            with_annotation('{"metadata": [], "spec": {"containers": [{"name": "c"}]}}'),
            "holds a pod whose metadata is no map",
        ),
    ],
)
def test_an_invalid_manifest_is_reported_clearly(proxy, message):
    with pytest.raises(InvalidManifest, match=re.escape(message)):
        source_manifest(proxy)


def test_invalid_manifest_is_a_value_error():
    assert issubclass(InvalidManifest, ValueError)


# is_proxy, controller_uid


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        ({"spec": {"schedulerName": keys.PROXY_SCHEDULER_NAME}}, True),
        ({"spec": {"schedulerName": "default-scheduler"}}, False),
        ({"metadata": {"annotations": {keys.ELECT: ""}}, "spec": {}}, False),
        ({"spec": None}, False),
        ({}, False),
    ],
)
def test_is_proxy(pod, expected):
    assert is_proxy(pod) is expected


def owned_by(*refs: dict) -> dict:
    return {"metadata": {"ownerReferences": list(refs)}}


def test_controller_uid_prefers_the_controller():
    pod = owned_by(
        {"kind": "ConfigMap", "uid": "cm"}, {"kind": "ReplicaSet", "uid": "rs", "controller": True}
    )
    assert controller_uid(pod) == "rs"


def test_controller_uid_of_an_unowned_pod():
    assert controller_uid({"metadata": {}}) is None
    assert controller_uid(owned_by()) is None


# slim_proxy, slim_delegate

FULL_POD = {
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "u",
        "resourceVersion": "7",
        "creationTimestamp": "2024-01-01T00:00:00Z",
        "deletionTimestamp": "2024-01-02T00:00:00Z",
        "labels": {"a": "b"},
        "annotations": {keys.SOURCEPOD_MANIFEST: "{}", "team": "a"},
        "ownerReferences": [{"uid": "rs", "controller": True}],
        "finalizers": [keys.FINALIZER],
        "managedFields": [{"manager": "kubectl"}],
    },
    "spec": {
        "nodeName": "admiralty-cluster-c1",
        "schedulerName": keys.PROXY_SCHEDULER_NAME,
        "containers": [{"name": "c", "image": "i"}],
    },
    "status": {"phase": "Running", "podIP": "10.0.0.1"},
}


def test_slim_proxy_keeps_what_the_scheduler_and_the_virtual_kubelet_read():
    slim = slim_proxy(FULL_POD)
    assert slim["metadata"] == {
        **{k: v for k, v in FULL_POD["metadata"].items() if k != "managedFields"},
        "annotations": {"team": "a"},  # bound: its manifest is never read again
    }
    assert slim["spec"] == {
        "nodeName": "admiralty-cluster-c1",
        "schedulerName": keys.PROXY_SCHEDULER_NAME,
    }
    assert slim["status"] == FULL_POD["status"]
    assert is_proxy(slim)
    assert controller_uid(slim) == "rs"


def test_slim_proxy_holds_the_manifest_until_the_pod_is_bound(manifest):
    proxy = proxy_of(manifest)
    unbound = {**proxy, "spec": {"schedulerName": keys.PROXY_SCHEDULER_NAME}}
    assert source_manifest(slim_proxy(unbound)) == manifest
    assert keys.SOURCEPOD_MANIFEST not in slim_proxy(proxy)["metadata"]["annotations"]
    assert keys.SOURCEPOD_MANIFEST in proxy["metadata"]["annotations"], "the pod is untouched"


def test_slim_delegate_keeps_what_the_virtual_kubelet_reads():
    pod = copy.deepcopy(FULL_POD)
    pod["metadata"]["labels"] = {"a": "b", keys.PARENT_UID: "u1"}
    slim = slim_delegate(pod)
    assert slim["metadata"] == {
        **{
            k: v
            for k, v in FULL_POD["metadata"].items()
            if k not in ("managedFields", "ownerReferences", "finalizers")
        },
        "labels": {keys.PARENT_UID: "u1"},  # whatever else its maker wrote is not kept
    }
    assert "labels" not in slim_delegate(FULL_POD)["metadata"]
    assert slim["spec"] == {"nodeName": "admiralty-cluster-c1"}
    assert slim["status"] == FULL_POD["status"]


def test_a_proxy_pod_and_its_delegate_share_their_equal_status_and_parts():
    """Each pod comes decoded on its own; what the caches keep of equal parts is one object."""
    proxy, other = copy.deepcopy(FULL_POD), copy.deepcopy(FULL_POD)
    other["metadata"]["name"], other["metadata"]["uid"] = "q", "u2"
    delegate = copy.deepcopy(FULL_POD)
    slim, slim_other = slim_proxy(proxy), slim_proxy(other)
    assert slim_delegate(delegate)["status"] is slim["status"]
    assert slim_other["metadata"]["ownerReferences"] is slim["metadata"]["ownerReferences"]
    assert slim_other["spec"] is slim["spec"]
    assert slim_other["metadata"] is not slim["metadata"]
    assert slim_other["metadata"]["name"] == "q"


@pytest.mark.parametrize("slim", [slim_proxy, slim_delegate])
def test_slim_pods_without_spec_or_status(slim):
    pod = {"metadata": {"name": "p", "uid": "u"}}
    slimmed = slim(pod)
    assert slimmed["metadata"] == {"name": "p", "uid": "u"}
    assert slimmed["spec"]["nodeName"] is None
    assert slimmed["status"] == {}


def test_labels_the_no_prefix_regexp_matches_stay_as_they_are(manifest):
    """Upstream v0.17's no-prefix-label-regexp, on key=value (e.g. Kueue's queue name)."""
    meta = manifest["metadata"]
    meta["labels"] = {"app": "web", "kueue.x-k8s.io/queue-name": "q1", "example.com/app": "x"}
    meta.setdefault("annotations", {})[keys.NO_PREFIX_LABEL_REGEXP] = r"^kueue\.x-k8s\.io/"
    labels = delegate_pod(proxy_of(manifest), manifest, "cluster1")["metadata"]["labels"]
    assert labels == {
        keys.PREFIX + "app": "x",
        "kueue.x-k8s.io/queue-name": "q1",
        keys.PARENT_UID: "0b6a5d1e-7f43-4c3a-9d0e-2f1b8c7a6e55",
    }


def test_an_invalid_no_prefix_regexp_makes_the_manifest_invalid(manifest):
    manifest["metadata"].setdefault("annotations", {})[keys.NO_PREFIX_LABEL_REGEXP] = "("
    with pytest.raises(InvalidManifest, match="missing"):
        delegate_pod(proxy_of(manifest), manifest, "cluster1")


# delegate_pod: the downward API


def label_field(key: str) -> dict:
    return {"fieldRef": {"fieldPath": f"metadata.labels['{key}']"}}


def test_a_label_read_by_the_downward_api_is_read_under_its_prefixed_key(manifest):
    """Kubernetes (1.36 at least) gives each pod of an indexed Job its index so: on a delegate
    the label is prefixed, and the unprefixed key would read as empty."""
    index = "batch.kubernetes.io/job-completion-index"
    manifest["metadata"]["labels"][index] = "2"
    manifest["spec"]["containers"][0]["env"] = [
        {"name": "JOB_COMPLETION_INDEX", "valueFrom": label_field(index)},
        {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MISSING", "valueFrom": label_field("not-a-label")},
        {"name": "PLAIN", "value": "metadata.labels['app']"},
    ]
    manifest["spec"]["initContainers"][0]["env"] = [
        {"name": "APP", "valueFrom": label_field("app")}
    ]
    items = [{"path": "app", **label_field("app.kubernetes.io/name")}]
    manifest["spec"]["volumes"] += [
        {"name": "info", "downwardAPI": {"items": items}},
        {"name": "all", "projected": {"sources": [{"downwardAPI": {"items": items}}]}},
    ]
    delegate = delegate_pod(proxy_of(manifest), manifest, "cluster1")
    spec = delegate["spec"]
    assert [e.get("valueFrom") or e["value"] for e in spec["containers"][0]["env"]] == [
        label_field(keys.PREFIX + "job-completion-index"),
        {"fieldRef": {"fieldPath": "metadata.name"}},
        label_field("not-a-label"),
        "metadata.labels['app']",
    ]
    assert delegate["metadata"]["labels"][keys.PREFIX + "job-completion-index"] == "2"
    assert spec["initContainers"][0]["env"][0]["valueFrom"] == label_field(keys.PREFIX + "app")
    prefixed = [{"path": "app", **label_field(keys.PREFIX + "name")}]
    assert spec["volumes"][-2]["downwardAPI"]["items"] == prefixed
    assert spec["volumes"][-1]["projected"]["sources"][0]["downwardAPI"]["items"] == prefixed
    assert manifest["spec"]["containers"][0]["env"][0]["valueFrom"] == label_field(index)


def test_a_label_read_by_the_downward_api_is_left_when_its_prefixed_key_holds_another(manifest):
    """Two keys that end the same way share one prefixed key: the one that lost keeps its
    reference (it reads as empty, rather than as the other label's value)."""
    manifest["metadata"]["labels"]["example.com/app"] = "other"
    manifest["spec"]["containers"][0]["env"] = [
        {"name": "A", "valueFrom": label_field("app")},
        {"name": "B", "valueFrom": label_field("example.com/app")},
    ]
    delegate = delegate_pod(proxy_of(manifest), manifest, "cluster1")
    assert delegate["metadata"]["labels"][keys.PREFIX + "app"] == "other"  # sorts last
    assert [e["valueFrom"] for e in delegate["spec"]["containers"][0]["env"]] == [
        label_field("app"),
        label_field(keys.PREFIX + "app"),
    ]


def test_a_label_kept_unprefixed_is_read_under_its_own_key(manifest):
    manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "q1"
    manifest["metadata"]["annotations"][keys.NO_PREFIX_LABEL_REGEXP] = r"^kueue\.x-k8s\.io/"
    env = [{"name": "QUEUE", "valueFrom": label_field("kueue.x-k8s.io/queue-name")}]
    manifest["spec"]["containers"][0]["env"] = env
    delegate = delegate_pod(proxy_of(manifest), manifest, "cluster1")
    assert delegate["spec"]["containers"][0]["env"] == env


# stopped_status

NOW = "2026-11-26T12:00:00Z"
JOB_TRACKING = "batch.kubernetes.io/job-tracking"


def deleted_proxy(finalizers: list[str], phase: str = "Running") -> dict:
    return {
        "metadata": {"name": "work-x", "deletionTimestamp": NOW, "finalizers": finalizers},
        "status": {
            "phase": phase,
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "t0"},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": "t0"},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "t0"},
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
            ],
        },
    }


def test_a_stopped_proxy_pod_that_others_wait_for_ends_failed_and_not_ready():
    """The Job controller's finalizer waits for a terminal phase; the strategic merge patch
    changes Ready and ContainersReady only, and leaves DisruptionTarget."""
    proxy = deleted_proxy([keys.FINALIZER, JOB_TRACKING])
    assert stopped_status(proxy, NOW) == {
        "phase": "Failed",
        "conditions": [
            {"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": NOW}
            for t in ("Ready", "ContainersReady")
        ],
    }
    assert proxy == deleted_proxy([keys.FINALIZER, JOB_TRACKING])


def test_a_stopped_proxy_pod_that_nobody_else_holds_is_left_as_it_is():
    assert stopped_status(deleted_proxy([keys.FINALIZER]), NOW) is None
    assert stopped_status(deleted_proxy([]), NOW) is None


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_terminal_proxy_pod_keeps_its_phase(phase):
    assert stopped_status(deleted_proxy([keys.FINALIZER, JOB_TRACKING], phase), NOW) is None


def test_a_stopped_proxy_pod_without_conditions():
    proxy = {"metadata": {"finalizers": [JOB_TRACKING]}, "status": {"phase": "Pending"}}
    assert stopped_status(proxy, NOW) == {"phase": "Failed"}
