"""What a proxy pod shows of its delegate: status and annotations mirrored as merge patches, and
the Failed status of a proxy pod whose delegate is lost."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicluster.testing import merge_patch
from multicluster_scheduler.api import keys
from multicluster_scheduler.virtual_kubelet.status import (
    MIRRORED_STATUS,
    annotation_patch,
    status_patch,
)

STARTED = "2024-05-01T10:00:00Z"


def pod(status: dict | None = None, annotations: dict | None = None) -> dict:
    meta: dict = {"name": "web", "namespace": "default", "uid": "u"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "status": status} if status is not None else {"metadata": meta}


def condition(kind: str, status: str = "True") -> dict:
    return {"type": kind, "status": status, "lastTransitionTime": STARTED}


def running(name: str = "web") -> dict:
    return {
        "name": name,
        "ready": True,
        "started": True,
        "restartCount": 0,
        "image": "nginx",
        "state": {"running": {"startedAt": STARTED}},
    }


def waiting(name: str = "web", reason: str = "ContainerCreating") -> dict:
    return {
        "name": name,
        "ready": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": reason}},
    }


def terminated(name: str = "job") -> dict:
    return {
        "name": name,
        "ready": False,
        "restartCount": 0,
        "state": {
            "terminated": {
                "exitCode": 0,
                "reason": "Completed",
                "startedAt": STARTED,
                "finishedAt": "2024-05-01T10:01:00Z",
            }
        },
    }


RUNNING = {
    "phase": "Running",
    "conditions": [
        condition("Initialized"),
        condition("Ready"),
        condition("ContainersReady"),
        condition("PodScheduled"),
    ],
    "hostIP": "192.168.1.10",
    "hostIPs": [{"ip": "192.168.1.10"}],
    "podIP": "10.244.1.7",
    "podIPs": [{"ip": "10.244.1.7"}],
    "startTime": STARTED,
    "initContainerStatuses": [terminated("init")],
    "containerStatuses": [running("web"), running("sidecar")],
    "qosClass": "Burstable",
}

PROXY_PENDING = {
    "phase": "Pending",
    "conditions": [condition("PodScheduled")],
    "qosClass": "BestEffort",
}


def mirrored(status: dict) -> dict:
    return {k: v for k, v in status.items() if k in MIRRORED_STATUS}


# status_patch


def test_no_patch_when_the_proxy_already_mirrors_the_delegate():
    assert status_patch(pod(copy.deepcopy(RUNNING)), pod(RUNNING)) is None


def test_fields_that_are_not_mirrored_do_not_count():
    proxy = {**RUNNING, "qosClass": "BestEffort", "nominatedNodeName": "n"}
    assert status_patch(pod(proxy), pod(RUNNING)) is None


@pytest.mark.parametrize(
    "delegate",
    [
        pod(),
        pod({}),
        pod({"phase": "Pending"}),
        pod({"phase": "Pending", "containerStatuses": []}),
        pod(
            {
                "phase": "Pending",
                "conditions": [condition("PodScheduled", "False")],
                "reason": "Unschedulable",
            }
        ),
    ],
)
def test_no_patch_while_the_delegate_is_pending_without_container_statuses(delegate):
    assert status_patch(pod(PROXY_PENDING), delegate) is None


def test_a_pending_delegate_with_container_statuses_is_mirrored():
    delegate = {
        "phase": "Pending",
        "conditions": [condition("PodScheduled")],
        "hostIP": "192.168.1.10",
        "startTime": STARTED,
        "containerStatuses": [waiting()],
    }
    patch = status_patch(pod(PROXY_PENDING), pod(delegate))
    assert patch == {
        "hostIP": "192.168.1.10",
        "startTime": STARTED,
        "containerStatuses": [waiting()],
    }


def test_a_running_delegate_is_mirrored():
    patch = status_patch(pod(PROXY_PENDING), pod(RUNNING))
    assert patch == mirrored(RUNNING)
    assert merge_patch(PROXY_PENDING, patch) == {**RUNNING, "qosClass": "BestEffort"}


def test_a_proxy_without_status_gets_the_delegate_s():
    assert status_patch(pod(), pod(RUNNING)) == mirrored(RUNNING)


def test_only_what_changed_is_patched():
    delegate = copy.deepcopy(RUNNING)
    delegate["containerStatuses"][1]["restartCount"] = 1
    assert status_patch(pod(RUNNING), pod(delegate)) == {
        "containerStatuses": delegate["containerStatuses"]
    }


def test_lists_are_replaced_whole():
    delegate = {**RUNNING, "conditions": [condition("Ready", "False")]}
    assert status_patch(pod(RUNNING), pod(delegate)) == {
        "conditions": [condition("Ready", "False")]
    }


def test_a_finished_delegate_is_mirrored():
    delegate = {
        **RUNNING,
        "phase": "Succeeded",
        "containerStatuses": [terminated("web"), terminated("sidecar")],
    }
    assert status_patch(pod(RUNNING), pod(delegate)) == {
        "phase": "Succeeded",
        "containerStatuses": delegate["containerStatuses"],
    }


def test_an_evicted_delegate_is_mirrored_with_its_reason_and_message():
    delegate = {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node was low on resource: memory.",
        "startTime": STARTED,
        "containerStatuses": [terminated("web")],
    }
    patch = status_patch(pod(RUNNING), pod(delegate))
    assert patch["phase"] == "Failed"
    assert patch["reason"] == "Evicted"
    assert patch["message"] == "The node was low on resource: memory."


def test_fields_removed_on_the_delegate_become_null():
    delegate = {
        k: v for k, v in RUNNING.items() if k not in ("podIP", "podIPs", "initContainerStatuses")
    }
    proxy = {**RUNNING, "message": "old", "reason": "Old"}
    patch = status_patch(pod(proxy), pod(delegate))
    assert patch == {
        "podIP": None,
        "podIPs": None,
        "initContainerStatuses": None,
        "message": None,
        "reason": None,
    }
    assert merge_patch(proxy, patch) == delegate


def test_the_inputs_are_not_mutated():
    proxy, delegate = pod(copy.deepcopy(PROXY_PENDING)), pod(copy.deepcopy(RUNNING))
    status_patch(proxy, delegate)
    assert proxy == pod(PROXY_PENDING)
    assert delegate == pod(RUNNING)


def test_the_proxy_pod_keeps_the_disruption_target_condition_the_eviction_api_wrote():
    """The Eviction API marks a pod DisruptionTarget before deleting it, and a Job's pod failure
    policy reads it: the mirror keeps it, as a kubelet does."""
    evicted = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    have = {**copy.deepcopy(RUNNING), "conditions": [*RUNNING["conditions"], evicted]}
    assert status_patch(pod(have), pod(RUNNING)) is None
    ready = [{**c, "status": "False"} if c["type"] == "Ready" else c for c in RUNNING["conditions"]]
    patch = status_patch(pod(have), pod({**RUNNING, "conditions": ready}))
    assert patch == {"conditions": [*ready, evicted]}


def test_the_delegate_s_own_disruption_target_condition_wins():
    mine = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    theirs = {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
    have = {**RUNNING, "conditions": [*RUNNING["conditions"], mine]}
    want = {**RUNNING, "conditions": [*RUNNING["conditions"], theirs]}
    assert status_patch(pod(have), pod(want)) == {"conditions": want["conditions"]}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=8,
)
# Mirrored fields are strings or lists, which a merge patch replaces whole.
STATUSES = st.dictionaries(
    st.sampled_from([*MIRRORED_STATUS, "qosClass", "nominatedNodeName"]),
    st.sampled_from(["Pending", "Running", "Failed"]) | st.text(max_size=5) | st.lists(JSON),
)


@given(STATUSES, STATUSES)
def test_applying_the_patch_mirrors_the_delegate(have, want):
    patch = status_patch(pod(have), pod(want))
    if patch is None:
        started = want.get("phase", "Pending") != "Pending" or want.get("containerStatuses")
        assert not started or mirrored(have) == mirrored(want)
    else:
        assert set(patch) <= set(MIRRORED_STATUS)
        assert mirrored(merge_patch(have, patch)) == mirrored(want)
        assert merge_patch(have, patch).get("qosClass") == have.get("qosClass")


# annotation_patch


def test_annotations_the_target_adds_outside_our_prefix_flow_back_and_are_remembered():
    proxy = pod(annotations={"same": "1", keys.SOURCEPOD_MANIFEST: "{}"})
    delegate = pod(
        annotations={
            "same": "1",
            "added": "x",
            keys.PARENT_NAME: "web",
            keys.PARENT_CLUSTER_NAME: "c1",
            keys.PREFIX + "anything": "y",
        }
    )
    assert annotation_patch(proxy, delegate) == {
        "added": "x",
        keys.MIRRORED_ANNOTATIONS: "added",
    }


def test_an_annotation_the_target_added_may_change_there_and_here():
    proxy = pod(annotations={"added": "x", keys.MIRRORED_ANNOTATIONS: "added"})
    delegate = pod(annotations={"added": "y", "more": "z"})
    assert annotation_patch(proxy, delegate) == {
        "added": "y",
        "more": "z",
        keys.MIRRORED_ANNOTATIONS: "added,more",
    }
    assert annotation_patch(
        pod(annotations={"added": "x", keys.MIRRORED_ANNOTATIONS: "added"}),
        pod(annotations={"added": "y"}),
    ) == {"added": "y"}


def test_the_proxy_pods_own_annotations_are_never_changed_from_the_target():
    """A hostile target rewriting Argo's node ID (so that Argo maps the pod to another step) or
    a deletion cost; and a user's change on the proxy pod, which the delegate lacks."""
    own = {
        "workflows.argoproj.io/node-id": "relay-1234",
        "controller.kubernetes.io/pod-deletion-cost": "100",
        "changed-here": "new",
    }
    delegate = pod(
        annotations={
            "workflows.argoproj.io/node-id": "relay-9999",
            "controller.kubernetes.io/pod-deletion-cost": "-1000",
            "changed-here": "old",
        }
    )
    assert annotation_patch(pod(annotations=own), delegate) is None
    forged = {**own, keys.MIRRORED_ANNOTATIONS: "other"}
    assert annotation_patch(pod(annotations=forged), delegate) is None


def test_no_annotation_patch_when_nothing_differs():
    annotations = {"same": "1", keys.PARENT_NAME: "other"}
    assert annotation_patch(pod(annotations={"same": "1"}), pod(annotations=annotations)) is None


@pytest.mark.parametrize("annotations", [None, {}])
def test_no_annotation_patch_from_a_delegate_without_annotations(annotations):
    assert annotation_patch(pod(annotations={"a": "b"}), pod(annotations=annotations)) is None


def test_annotations_missing_on_the_delegate_are_left_alone():
    assert annotation_patch(pod(annotations={"a": "b"}), pod(annotations={"c": "d"})) == {
        "c": "d",
        keys.MIRRORED_ANNOTATIONS: "c",
    }


def test_a_proxy_without_annotations():
    assert annotation_patch(pod(), pod(annotations={"a": "b"})) == {
        "a": "b",
        keys.MIRRORED_ANNOTATIONS: "a",
    }


def test_what_a_sources_controller_reads_as_a_pods_report_is_not_copied_back():
    """Argo's controllers before v3.6 read a step's outputs from this annotation of its pod."""
    delegate = pod(
        annotations={
            "workflows.argoproj.io/outputs": '{"artifacts": []}',
            "not-a-string": 3,
            "fine": "x",
        }
    )
    assert annotation_patch(pod(), delegate) == {"fine": "x", keys.MIRRORED_ANNOTATIONS: "fine"}
