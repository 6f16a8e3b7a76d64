"""Pure pieces of the targets controller: secret references, slim secrets, conditions, the
failover clock."""

from __future__ import annotations

from multicluster import Forbidden, NotFound, Unauthorized, Unreachable
from multicluster_scheduler.targets.controller import (
    classify,
    ready_condition,
    secret_reference,
    slim_secret,
)
from multicluster_scheduler.targets.registry import TargetConnection


def test_secret_reference_of_targets_and_cluster_targets():
    target = {
        "metadata": {"name": "c2", "namespace": "ns"},
        "spec": {"kubeconfigSecret": {"name": "s"}},
    }
    assert secret_reference(target) == "ns/s"
    cluster_target = {
        "metadata": {"name": "c2"},
        "spec": {"kubeconfigSecret": {"name": "s", "namespace": "admiralty"}},
    }
    assert secret_reference(cluster_target) == "admiralty/s"
    assert secret_reference({"metadata": {"name": "c1"}, "spec": {"self": True}}) is None


def test_helm_release_secrets_are_cached_without_data():
    meta = {"name": "x", "namespace": "ns", "resourceVersion": "1", "labels": {"a": "b"}}
    helm = slim_secret({"metadata": meta, "type": "helm.sh/release.v1", "data": {"release": "…"}})
    assert "data" not in helm
    opaque = slim_secret({"metadata": meta, "type": "Opaque", "data": {"config": "e30="}})
    assert opaque["data"] == {"config": "e30="}
    assert opaque["metadata"] == {"name": "x", "namespace": "ns", "resourceVersion": "1"}


def test_conditions_keep_their_transition_time_while_unchanged():
    first = ready_condition(False, "SecretNotFound", "m", 1, [])
    again = ready_condition(False, "KeyNotFound", "m2", 2, [first])
    assert again["lastTransitionTime"] == first["lastTransitionTime"]
    assert (again["status"], again["reason"], again["observedGeneration"]) == (
        "False",
        "KeyNotFound",
        2,
    )
    unknown = ready_condition(None, "Connecting", "", 1, [])
    assert unknown["status"] == "Unknown"


def test_errors_map_to_reasons():
    assert classify(Unauthorized("x"))[0] == "Unauthorized"
    assert classify(Forbidden("x"))[0] == "Forbidden"
    assert "summary-viewer" in classify(Forbidden("x"))[1]
    assert classify(Unreachable("x"))[0] == "Unreachable"
    # A target without our CRDs answers 404 for ClusterSummaries: not installed, not unreachable.
    assert classify(NotFound("x"))[0] == "SummaryMissing"


def test_failover_is_due_once_the_target_has_been_away_long_enough():
    connection = TargetConnection(kind="Target", name="c2", namespace="default")
    assert connection.failover_in() is None, "no failover setting: proxies wait"
    connection.failover_after = 60.0
    assert connection.set_ready(False, "Connecting", "connecting to the target")
    assert connection.failover_in() is None, "connecting (after a restart, say) is not away"
    assert connection.set_ready(False, "Unreachable", "connection refused")
    start = connection.not_ready_since
    assert start is not None
    assert connection.failover_in(now=start + 10) == 50.0
    assert connection.set_ready(True, "Ready", "the target's ClusterSummary is current")
    assert connection.not_ready_since is None
    assert connection.failover_in() is None, "Ready: nothing is due"
    assert not connection.set_ready(True, "Ready", "the target's ClusterSummary is current")
    assert connection.set_ready(False, "Unreachable", "connection refused")
    away = connection.not_ready_since
    assert away is not None
    assert away >= start
    connection.set_ready(False, "Unauthorized", "token expired")
    assert connection.not_ready_since == away, "away since it first went, whatever the reason"
    assert connection.failover_in(now=away + 59) == 1.0
    assert connection.failover_in(now=away + 61) == 0.0


def test_virtual_node_labels_stay_valid_label_values_for_long_target_names():
    name = "t" * 64
    labels = TargetConnection(kind="Target", name=name, namespace="default").labels
    assert len(labels["multicluster.admiralty.io/target-name"]) <= 63
    assert labels["multicluster.admiralty.io/target-name"] != "t" * 63
    short = TargetConnection(kind="ClusterTarget", name="c1", namespace=None).labels
    assert short == {"multicluster.admiralty.io/cluster-target-name": "c1"}
