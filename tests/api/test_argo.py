"""Argo task results brought back from targets: which pods are steps, and what is written."""

from __future__ import annotations

import copy

import pytest

from multicluster_scheduler.api.argo import (
    COMPLETED_LABEL,
    NODE_ID_ANNOTATION,
    WORKFLOW_LABEL,
    differs,
    result_copy,
    step_pod,
)

OWNER = {
    "apiVersion": "argoproj.io/v1alpha1",
    "kind": "Workflow",
    "name": "relay",
    "uid": "wf-uid",
    "controller": True,
    "blockOwnerDeletion": True,
}


def proxy(**meta) -> dict:
    base = {
        "name": "relay-produce-1",
        "namespace": "team",
        "labels": {WORKFLOW_LABEL: "relay"},
        "annotations": {NODE_ID_ANNOTATION: "relay-1234"},
        "ownerReferences": [OWNER],
    }
    return {"metadata": base | meta}


def reported(**changes) -> dict:
    """What an executor writes in the target (labels, owner, results)."""
    found = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "WorkflowTaskResult",
        "metadata": {
            "name": "relay-1234",
            "namespace": "team-there",
            "uid": "target-uid",
            "labels": {WORKFLOW_LABEL: "relay", COMPLETED_LABEL: "true"},
            "ownerReferences": [{**OWNER, "uid": "whatever-the-target-says"}],
        },
        "outputs": {"parameters": [{"name": "message", "value": "hello"}], "exitCode": "0"},
        "phase": "Succeeded",
        "progress": "1/1",
    }
    found.update(changes)
    return found


def test_a_pod_of_an_argo_step_is_recognised_by_argos_own_marks():
    step = step_pod(proxy())
    assert step is not None
    assert (step.namespace, step.node_id, step.workflow_name) == ("team", "relay-1234", "relay")
    assert step.workflow == {k: OWNER[k] for k in ("apiVersion", "kind", "name", "uid")}


@pytest.mark.parametrize(
    "meta",
    [
        {"labels": {}},
        {"annotations": {}},
        {"annotations": {NODE_ID_ANNOTATION: "../other"}},
        {"annotations": {NODE_ID_ANNOTATION: "Relay-1234"}},
        {"ownerReferences": []},
        {"ownerReferences": [{**OWNER, "controller": False}]},
        {"ownerReferences": [{**OWNER, "name": "another"}]},
        {"ownerReferences": [{**OWNER, "kind": "CronWorkflow"}]},
        {"ownerReferences": [{**OWNER, "apiVersion": "argoproj.io/v2"}]},
        {"ownerReferences": [{**OWNER, "uid": ""}]},
        {"ownerReferences": ["not a map"]},
    ],
)
def test_any_other_pod_is_not_a_step(meta):
    assert step_pod(proxy(**meta)) is None


def test_the_copy_takes_its_identity_from_the_proxy_pod_and_only_results_from_the_target():
    step = step_pod(proxy())
    assert step is not None
    found = reported(spec={"anything": 1}, extra="dropped")
    made = result_copy(step, found)
    assert made == {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "WorkflowTaskResult",
        "metadata": {
            "name": "relay-1234",
            "namespace": "team",
            "labels": {WORKFLOW_LABEL: "relay", COMPLETED_LABEL: "true"},
            "ownerReferences": [step.workflow],
        },
        "outputs": found["outputs"],
        "phase": "Succeeded",
        "progress": "1/1",
    }


@pytest.mark.parametrize(
    "changes",
    [
        {"metadata": {"name": "relay-9999", "labels": {WORKFLOW_LABEL: "relay"}}},
        {"metadata": {"name": "relay-1234", "labels": {WORKFLOW_LABEL: "other"}}},
        {"metadata": {"name": "relay-1234"}},
    ],
)
def test_a_result_of_another_step_or_workflow_is_not_copied(changes):
    step = step_pod(proxy())
    assert step is not None
    assert result_copy(step, reported(**changes)) is None


def test_results_of_the_wrong_type_and_odd_completion_labels_are_not_taken_as_they_are():
    step = step_pod(proxy())
    assert step is not None
    found = reported(outputs="not a map", phase=["Succeeded"], message=3)
    found["metadata"]["labels"][COMPLETED_LABEL] = "yes"
    made = result_copy(step, found)
    assert made is not None
    assert "outputs" not in made
    assert "phase" not in made
    assert "message" not in made
    assert made["metadata"]["labels"][COMPLETED_LABEL] == "false"


def test_differs_when_a_label_or_a_result_is_not_yet_in_the_source():
    step = step_pod(proxy())
    assert step is not None
    made = result_copy(step, reported())
    assert made is not None
    mine = copy.deepcopy(made) | {"metadata": {**made["metadata"], "uid": "source-uid"}}
    assert not differs(mine, made)
    pending = copy.deepcopy(mine)
    pending["metadata"]["labels"][COMPLETED_LABEL] = "false"
    assert differs(pending, made)
    assert differs({k: v for k, v in mine.items() if k != "outputs"}, made)
