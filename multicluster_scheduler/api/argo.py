"""Argo Workflows' task results, brought back from targets (pure functions, no I/O).

Argo's executor, in the ``wait`` container of every workflow pod, reports a step's outputs
(output parameters, artifacts, progress) in a WorkflowTaskResult named after the step's node,
through the API server of the cluster it runs in. For a delegate, that is the target's: Argo's
controller, in the source, would never see it, and a later step that uses the outputs would
fail. So before the virtual kubelet shows a finished delegate's phase on its proxy pod, it
copies the task result from the target into the proxy pod's namespace (where the executor would
have written it) and deletes it from the target.

Everything written comes from the proxy pod, which Argo's controller made, except the step's
own results (phase, message, outputs, progress), which the target ran and reports anyway: the
copy's name is the proxy pod's node ID, its workflow label and owner the proxy pod's Workflow.
A target cannot write the result of another step, of another workflow or in another namespace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from multicluster.resources import Resource

GROUP = "argoproj.io"
VERSION = "v1alpha1"
WORKFLOW_TASK_RESULTS = Resource(GROUP, VERSION, "workflowtaskresults", "WorkflowTaskResult")
WORKFLOW_LABEL = f"workflows.{GROUP}/workflow"
NODE_ID_ANNOTATION = f"workflows.{GROUP}/node-id"
COMPLETED_LABEL = f"workflows.{GROUP}/report-outputs-completed"
# What a task result reports of its step (Argo's NodeResult), each with the type it must have.
RESULT_FIELDS: dict[str, type] = {"phase": str, "message": str, "outputs": dict, "progress": str}
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


@dataclass(frozen=True)
class StepPod:
    """A proxy pod that runs a step of an Argo workflow."""

    namespace: str
    node_id: str  # the step's node, and the name of its task result
    workflow: dict  # the owner reference to its Workflow

    @property
    def workflow_name(self) -> str:
        return self.workflow["name"]


def step_pod(proxy: dict) -> StepPod | None:
    """The step a proxy pod runs, when Argo's controller made it for a Workflow: it has the
    workflow label and node-ID annotation Argo gives its pods, and that Workflow as its
    controlling owner. None for any other pod."""
    meta = proxy.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    workflow, node_id = labels.get(WORKFLOW_LABEL), annotations.get(NODE_ID_ANNOTATION)
    if not isinstance(node_id, str) or not _NAME.fullmatch(node_id) or not workflow:
        return None
    owner = next(
        (
            ref
            for ref in meta.get("ownerReferences") or ()
            if isinstance(ref, dict)
            and ref.get("controller") is True
            and ref.get("apiVersion") == f"{GROUP}/{VERSION}"
            and ref.get("kind") == "Workflow"
            and ref.get("name") == workflow
            and ref.get("uid")
        ),
        None,
    )
    if owner is None:
        return None
    reference = {k: owner[k] for k in ("apiVersion", "kind", "name", "uid")}
    return StepPod(meta.get("namespace") or "", node_id, reference)


def result_copy(step: StepPod, found: dict) -> dict | None:
    """The task result to write in the source for ``step``, from the one its executor wrote in
    the target (``found``); None when ``found`` is not this step's (another workflow's label)."""
    meta = found.get("metadata") or {}
    labels = meta.get("labels") or {}
    if meta.get("name") != step.node_id or labels.get(WORKFLOW_LABEL) != step.workflow_name:
        return None
    completed = labels.get(COMPLETED_LABEL)
    copy: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "WorkflowTaskResult",
        "metadata": {
            "name": step.node_id,
            "namespace": step.namespace,
            "labels": {
                WORKFLOW_LABEL: step.workflow_name,
                # Argo waits for "true" before it uses the outputs; "false" from a target whose
                # executor did not finish is kept, and Argo's own timeout applies.
                COMPLETED_LABEL: "true" if completed == "true" else "false",
            },
            "ownerReferences": [dict(step.workflow)],
        },
    }
    for name, kind in RESULT_FIELDS.items():
        value = found.get(name)
        if isinstance(value, kind):
            copy[name] = value
    return copy


def differs(mine: dict, copy: dict) -> bool:
    """Whether the source's task result lacks anything of the copy (a merge patch is due)."""
    mine_labels = (mine.get("metadata") or {}).get("labels") or {}
    if any(mine_labels.get(k) != v for k, v in copy["metadata"]["labels"].items()):
        return True
    return any(mine.get(name) != copy.get(name) for name in RESULT_FIELDS if name in copy)
