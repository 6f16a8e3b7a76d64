"""Pure pieces of the targets controller: secret references, slim secrets, conditions."""

from __future__ import annotations

from multicluster import Forbidden, NotFound, Unauthorized, Unreachable
from multicluster_scheduler.targets.controller import (
    classify,
    ready_condition,
    secret_reference,
    slim_secret,
)


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
