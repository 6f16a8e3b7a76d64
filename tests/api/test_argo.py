"""Argo task results brought back from targets: which pods are steps, and what is written (each
check against what a hostile target or a tenant could send)."""

from __future__ import annotations

import copy

import pytest

from multicluster_scheduler.api.argo import (
    COMPLETED_LABEL,
    INSTANCE_LABEL,
    NODE_ID_ANNOTATION,
    WORKFLOW_LABEL,
    artifact_secrets,
    differs,
    owned_by,
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


def proxy(name="relay-produce-1234", references=(), **meta) -> dict:
    base = {
        "name": name,
        "namespace": "team",
        "labels": {WORKFLOW_LABEL: "relay"},
        "annotations": {NODE_ID_ANNOTATION: "relay-1234"},
        "ownerReferences": [OWNER],
    }
    return {"metadata": base | meta, "references": list(references)}


def reported(**changes) -> dict:
    """What an executor writes in the target (labels, owner, results)."""
    found = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "WorkflowTaskResult",
        "metadata": {
            "name": "relay-1234",
            "namespace": "team",
            "uid": "target-uid",
            "labels": {WORKFLOW_LABEL: "relay", COMPLETED_LABEL: "true"},
            "ownerReferences": [{**OWNER, "blockOwnerDeletion": False}],
        },
        "outputs": {"parameters": [{"name": "message", "value": "hello"}]},
        "phase": "Succeeded",
        "progress": "1/1",
    }
    found.update(changes)
    return found


def step(**kwargs):
    found = step_pod(proxy(**kwargs))
    assert found is not None
    return found


def test_a_pod_of_an_argo_step_is_recognised_by_argos_own_marks():
    found = step()
    assert (found.namespace, found.node_id, found.workflow_name) == ("team", "relay-1234", "relay")
    assert found.workflow == {k: OWNER[k] for k in ("apiVersion", "kind", "name", "uid")}
    assert found.instance_id is None


@pytest.mark.parametrize(
    ("name", "node_id"),
    [
        ("relay-produce-1234", "relay-1234"),  # Argo's pod names v2: the node's hash ends it
        ("relay-1234", "relay-1234"),  # v1: the node's ID
        ("relay", "relay"),  # the root node's pod
    ],
)
def test_the_node_id_is_one_argos_naming_gives_the_pod(name, node_id):
    annotations = {NODE_ID_ANNOTATION: node_id}
    assert step(name=name, annotations=annotations).node_id == node_id


@pytest.mark.parametrize(
    "meta",
    [
        {"labels": {}},
        {"annotations": {}},
        {"annotations": {NODE_ID_ANNOTATION: "../other"}},
        {"annotations": {NODE_ID_ANNOTATION: "Relay-1234"}},
        # A target that rewrote the annotation (or a tenant's pod) naming another step's node.
        {"annotations": {NODE_ID_ANNOTATION: "relay-9999"}},
        {"annotations": {NODE_ID_ANNOTATION: "relay"}},
        {"name": "other-produce-1234"},
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
    found = reported(spec={"anything": 1}, extra="dropped", message="from the target")
    found["outputs"]["exitCode"] = "0"  # the controller's to read from the pod
    made = result_copy(step(), found)
    assert made is not None
    assert made.dropped == []
    assert made.body == {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "WorkflowTaskResult",
        "metadata": {
            "name": "relay-1234",
            "namespace": "team",
            "labels": {WORKFLOW_LABEL: "relay", COMPLETED_LABEL: "true"},
            "ownerReferences": [step().workflow],
        },
        "outputs": {"parameters": [{"name": "message", "value": "hello"}]},
        "progress": "1/1",
    }


def test_argos_instance_label_is_kept_so_that_its_controller_sees_the_copy():
    labels = {WORKFLOW_LABEL: "relay", INSTANCE_LABEL: "prod"}
    made = result_copy(step(labels=labels), reported())
    assert made is not None
    assert made.body["metadata"]["labels"][INSTANCE_LABEL] == "prod"


def test_a_result_not_yet_marked_complete_is_complete_once_the_delegate_has_ended():
    found = reported()
    found["metadata"]["labels"][COMPLETED_LABEL] = "false"
    made = result_copy(step(), found)
    assert made is not None
    assert made.body["metadata"]["labels"][COMPLETED_LABEL] == "true"


@pytest.mark.parametrize(
    "metadata",
    [
        {"name": "relay-9999", "labels": {WORKFLOW_LABEL: "relay"}, "ownerReferences": [OWNER]},
        {"name": "relay-1234", "labels": {WORKFLOW_LABEL: "other"}, "ownerReferences": [OWNER]},
        {"name": "relay-1234", "ownerReferences": [OWNER]},
        # A namesake workflow's (another cluster's, or the target's own): another owner uid.
        {
            "name": "relay-1234",
            "labels": {WORKFLOW_LABEL: "relay"},
            "ownerReferences": [{**OWNER, "uid": "someone-else"}],
        },
        {"name": "relay-1234", "labels": {WORKFLOW_LABEL: "relay"}},
        {"name": "relay-1234", "labels": ["not", "a", "map"], "ownerReferences": [OWNER]},
        "not a map",
    ],
)
def test_a_result_of_another_step_workflow_or_owner_is_not_copied(metadata):
    assert result_copy(step(), reported(metadata=metadata)) is None


@pytest.mark.parametrize("found", [None, [], "x", 3, {"metadata": None}])
def test_answers_that_are_not_task_results_are_not_copied(found):
    assert result_copy(step(), found) is None


def test_results_of_the_wrong_type_are_left_out():
    made = result_copy(step(), reported(outputs="not a map", progress=["1/1"]))
    assert made is not None
    assert "outputs" not in made.body
    assert "progress" not in made.body


def artifact(name: str, secret: str | None = None) -> dict:
    location: dict = {"http": {"url": "https://target.example/x"}}
    if secret:
        location["http"]["auth"] = {"basicAuth": {"passwordSecret": {"name": secret, "key": "p"}}}
    return {"name": name, **location}


def test_output_artifacts_that_name_secrets_the_pod_does_not_use_are_dropped():
    """A hostile target naming a Secret of the source's namespace in an artifact's location: a
    later step would mount it and send it where the location says."""
    found = reported(
        outputs={
            "artifacts": [
                artifact("plain"),
                artifact("steal", "db-admin"),
                artifact("repo", "artifact-repo"),
                {"name": "deep", "s3": {"x": [{"accessKeySecret": {"name": "db-admin"}}]}},
                {"name": "odd", "git": {"sshPrivateKeySecret": {"name": {"not": "a name"}}}},
                "not a map",
            ]
        }
    )
    made = result_copy(step(references=["Secret:team/artifact-repo", "ConfigMap:team/c"]), found)
    assert made is not None
    assert [a["name"] for a in made.body["outputs"]["artifacts"]] == ["plain", "repo"]
    assert made.dropped == ["steal", "deep", "odd", "?"]


def test_differs_when_a_label_or_a_result_is_not_yet_in_the_source():
    made = result_copy(step(), reported())
    assert made is not None
    mine = copy.deepcopy(made.body)
    mine["metadata"]["uid"] = "source-uid"
    assert not differs(mine, made.body)
    pending = copy.deepcopy(mine)
    pending["metadata"]["labels"][COMPLETED_LABEL] = "false"
    assert differs(pending, made.body)
    assert differs({k: v for k, v in mine.items() if k != "outputs"}, made.body)


def test_a_result_in_the_source_is_ours_to_update_only_if_its_workflow_owns_it():
    assert owned_by(reported(), step())
    other = reported()
    other["metadata"]["ownerReferences"] = [{**OWNER, "uid": "someone-else"}]
    assert not owned_by(other, step())
    assert not owned_by({"metadata": {}}, step())


def test_only_secrets_that_followed_the_pod_may_be_named_by_its_artifacts():
    """A service-account token the pod mounts never leaves this cluster: an artifact naming it
    would have a later step send it wherever the artifact says."""
    found = reported(
        outputs={"artifacts": [artifact("repo", "artifact-repo"), artifact("t", "sa")]}
    )
    pod = step(references=["Secret:team/artifact-repo", "Secret:team/sa"])
    assert artifact_secrets(found) == {"artifact-repo", "sa"}
    made = result_copy(pod, found, followed=frozenset({"artifact-repo"}))
    assert made is not None
    assert [a["name"] for a in made.body["outputs"]["artifacts"]] == ["repo"]
    assert made.dropped == ["t"]


def test_artifacts_asking_for_ambient_credentials_are_dropped_and_controller_fields_left_out():
    azure = {"name": "az", "azure": {"endpoint": "https://evil", "useSDKCreds": True}}
    role = {"name": "s3", "s3": {"bucket": "b", "roleARN": "arn:aws:iam::1:role/x"}}
    gc = {
        **artifact("gc"),
        "artifactGC": {"serviceAccountName": "admin", "podMetadata": {"annotations": {"a": "b"}}},
        "deleted": True,
        "from": "{{steps.other.outputs.artifacts.x}}",
    }
    made = result_copy(step(), reported(outputs={"artifacts": [azure, role, gc]}))
    assert made is not None
    assert made.body["outputs"]["artifacts"] == [artifact("gc")]
    assert made.dropped == ["az", "s3"]


def test_a_result_nested_deeper_than_any_is_not_copied():
    deep: dict = {"value": "x"}
    for _ in range(40):
        deep = {"nested": deep}
    found = reported(outputs={"parameters": [{"name": "p", "value": "v", "extra": deep}]})
    assert result_copy(step(), found) is None
    assert artifact_secrets(found) == set()
