"""Argo Workflows' task results, brought back from targets (pure functions, no I/O).

Argo's executor, in the ``wait`` container of every workflow pod, reports a step's outputs
(output parameters, artifacts, progress) in a WorkflowTaskResult named after the step's node,
through the API server of the cluster it runs in. For a delegate, that is the target's: Argo's
controller, in the source, would never see it, and a later step that uses the outputs would
wait for them. So before the virtual kubelet shows a finished delegate's phase on its proxy
pod, it copies the task result from the target into the proxy pod's namespace (where the
executor would have written it) and deletes it from the target.

What a target reports is checked before anything is written:

- The copy's name, namespace, workflow label, instance label and owner come from the proxy pod,
  which Argo's controller made; the node ID it names must be the one Argo derives from the
  pod's own name (a target that rewrites the pod's node-ID annotation names nothing else).
- The result must be the executor's for that Workflow: owned by its uid, labelled with its name.
- Of the result, only the step's own outputs and progress are taken; the exit code is Argo's
  controller's to read from the pod. A later step mounts the Secrets an output artifact's
  location names and sends them, or its own ambient identity, wherever that location says; so
  an artifact that names a Secret that did not follow the step's pod to its target, or that
  asks for the consumer's ambient credentials (``useSDKCreds``, ``roleARN``), is dropped, and
  what an artifact asks of the source's Argo controller (``artifactGC``: a pod it creates,
  with a service account and metadata of the artifact's choosing; ``deleted``; ``from``) is
  left out.

The owner check tells an executor's result from a namesake's (another source's workflow of the
same name in a shared target namespace); it proves nothing against a hostile target, which
reads the Workflow's uid in the delegate's environment. As in Argo, the namespace is the
boundary of trust: whoever may create pods in it can already make Argo's controller believe a
step's phase.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from multicluster.resources import Resource

GROUP = "argoproj.io"
VERSION = "v1alpha1"
WORKFLOW_TASK_RESULTS = Resource(GROUP, VERSION, "workflowtaskresults", "WorkflowTaskResult")
WORKFLOW_LABEL = f"workflows.{GROUP}/workflow"
INSTANCE_LABEL = f"workflows.{GROUP}/controller-instanceid"
NODE_ID_ANNOTATION = f"workflows.{GROUP}/node-id"
COMPLETED_LABEL = f"workflows.{GROUP}/report-outputs-completed"
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_SECRET_KEY = re.compile(r"(?i).*secret(ref)?$")
# What an output artifact may ask of the source's Argo controller rather than of the step that
# reads it: left out of artifacts brought back.
ARTIFACT_FIELDS_LEFT_OUT = ("artifactGC", "deleted", "from", "fromExpression")
# Fields that make a consuming step use its own ambient identity (cloud SDK credentials).
AMBIENT_CREDENTIALS = ("useSDKCreds", "roleARN")
MAX_DEPTH = 32  # Argo's own results nest a few levels


@dataclass(frozen=True)
class StepPod:
    """A proxy pod that runs a step of an Argo workflow."""

    namespace: str
    node_id: str  # the step's node, and the name of its task result
    workflow: dict  # the owner reference to its Workflow
    instance_id: str | None = None  # Argo's controller-instanceid label, when it has one
    secrets: frozenset[str] = field(default_factory=frozenset)  # the Secrets the pod uses

    @property
    def workflow_name(self) -> str:
        return self.workflow["name"]


def step_pod(proxy: dict) -> StepPod | None:
    """The step a proxy pod runs, when Argo's controller made it for a Workflow: it has the
    workflow label and node-ID annotation Argo gives its pods, a node ID that Argo's naming
    derives from the pod's name, and that Workflow as its controlling owner. None for any other
    pod. ``proxy``: as cached (:func:`~.proxy.slim_proxy`: ``references`` lists what it uses)."""
    meta = proxy.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    workflow, node_id = labels.get(WORKFLOW_LABEL), annotations.get(NODE_ID_ANNOTATION)
    if not isinstance(node_id, str) or not _NAME.fullmatch(node_id) or not workflow:
        return None
    if node_id not in _node_ids_named_by(meta.get("name") or "", workflow):
        return None
    owner = next((ref for ref in meta.get("ownerReferences") or () if _is_workflow(ref)), None)
    if owner is None or owner.get("name") != workflow:
        return None
    namespace = meta.get("namespace") or ""
    prefix = f"Secret:{namespace}/"
    secrets = frozenset(
        ref.removeprefix(prefix)
        for ref in proxy.get("references") or ()
        if isinstance(ref, str) and ref.startswith(prefix)
    )
    instance = labels.get(INSTANCE_LABEL)
    return StepPod(
        namespace,
        node_id,
        {k: owner[k] for k in ("apiVersion", "kind", "name", "uid")},
        instance if isinstance(instance, str) else None,
        secrets,
    )


def _node_ids_named_by(pod_name: str, workflow: str) -> set[str]:
    """The node IDs Argo's pod naming allows for a pod of that name: the pod's name itself
    (``POD_NAMES=v1``), the workflow's name (its root node's pod), or the workflow's name and
    the hash that ends the pod's name (v2, the default: ``<workflow>-<template>-<hash>`` runs
    node ``<workflow>-<hash>``)."""
    ids = {pod_name}
    if pod_name == workflow:
        ids.add(workflow)
    _, _, digits = pod_name.rpartition("-")
    if digits.isdigit() and pod_name.startswith(f"{workflow}-"):
        ids.add(f"{workflow}-{digits}")
    return ids


def _is_workflow(ref: Any) -> bool:
    return (
        isinstance(ref, dict)
        and ref.get("controller") is True
        and ref.get("apiVersion") == f"{GROUP}/{VERSION}"
        and ref.get("kind") == "Workflow"
        and isinstance(ref.get("uid"), str)
        and bool(ref["uid"])
        and isinstance(ref.get("name"), str)
    )


@dataclass
class Copy:
    """What to write in the source, and the output artifacts left out (by name)."""

    body: dict
    dropped: list[str]


def result_copy(step: StepPod, found: Any, followed: frozenset[str] | None = None) -> Copy | None:
    """The task result to write in the source for ``step``, from the one its executor wrote in
    the target (``found``, as the target answered); None when ``found`` is not that executor's
    (another name, workflow or owner, nested deeper than any result, or not an object at all).
    ``followed``: the Secrets of the step's pod that followed it to its target (default: all
    the pod uses); output artifacts naming any other are dropped."""
    if _depth(found) > MAX_DEPTH:
        return None
    meta = found.get("metadata") if isinstance(found, dict) else None
    if not isinstance(meta, dict) or meta.get("name") != step.node_id:
        return None
    labels = meta.get("labels")
    if not isinstance(labels, dict):
        return None
    if labels.get(WORKFLOW_LABEL) != step.workflow_name:
        return None
    owners = meta.get("ownerReferences")
    if not isinstance(owners, list) or not any(
        isinstance(ref, dict) and ref.get("uid") == step.workflow["uid"] for ref in owners
    ):
        return None
    copy_labels = {
        WORKFLOW_LABEL: step.workflow_name,
        # The delegate has ended: nothing more can come, and Argo waits for "true".
        COMPLETED_LABEL: "true",
    }
    if step.instance_id is not None:
        copy_labels[INSTANCE_LABEL] = step.instance_id
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "WorkflowTaskResult",
        "metadata": {
            "name": step.node_id,
            "namespace": step.namespace,
            "labels": copy_labels,
            "ownerReferences": [dict(step.workflow)],
        },
    }
    dropped: list[str] = []
    outputs = found.get("outputs")
    if isinstance(outputs, dict):
        allowed = step.secrets if followed is None else step.secrets & followed
        body["outputs"] = _outputs(outputs, allowed, dropped)
    if isinstance(found.get("progress"), str):
        body["progress"] = found["progress"]
    return Copy(body, dropped)


def _outputs(outputs: dict, allowed: frozenset[str], dropped: list[str]) -> dict:
    kept = {k: v for k, v in outputs.items() if k != "exitCode"}  # the controller's to read
    artifacts = outputs.get("artifacts")
    if isinstance(artifacts, list):
        kept["artifacts"] = []
        for artifact in artifacts:
            names = {n if isinstance(n, str) else None for n in _secret_names(artifact)}
            if isinstance(artifact, dict) and names <= allowed and not _ambient(artifact):
                safe = {k: v for k, v in artifact.items() if k not in ARTIFACT_FIELDS_LEFT_OUT}
                kept["artifacts"].append(safe)
            else:
                name = artifact.get("name") if isinstance(artifact, dict) else None
                dropped.append(name if isinstance(name, str) else "?")
    return kept


def artifact_secrets(found: Any) -> set[str]:
    """The Secrets the output artifacts of a task result name (to be checked before
    :func:`result_copy`: which of them followed the step's pod to its target)."""
    outputs = found.get("outputs") if isinstance(found, dict) else None
    artifacts = outputs.get("artifacts") if isinstance(outputs, dict) else None
    if not isinstance(artifacts, list) or _depth(found) > MAX_DEPTH:
        return set()
    return {n for a in artifacts for n in _secret_names(a) if isinstance(n, str)}


def _ambient(value: Any, depth: int = 0) -> bool:
    if depth > MAX_DEPTH:
        return True
    if isinstance(value, dict):
        if any(value.get(k) for k in AMBIENT_CREDENTIALS):
            return True
        return any(_ambient(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return any(_ambient(v, depth + 1) for v in value)
    return False


def _depth(value: Any, depth: int = 0) -> int:
    """How deep ``value`` nests (counted no further than past ``MAX_DEPTH``)."""
    if depth > MAX_DEPTH or not isinstance(value, dict | list):
        return depth
    items = value.values() if isinstance(value, dict) else value
    return max((_depth(v, depth + 1) for v in items), default=depth + 1)


def _secret_names(value: Any, key: str = "", depth: int = 0) -> Iterator[Any]:
    """The Secrets an artifact's location names: every ``...Secret`` or ``...SecretRef`` key
    selector in it (``passwordSecret``, ``accessKeySecret``, ``sshPrivateKeySecret``...); a
    location nested deeper than any Argo has is taken as naming one it cannot show."""
    if depth > 16:
        yield None  # matches no Secret the pod uses
        return
    if isinstance(value, dict):
        if _SECRET_KEY.fullmatch(key) and "name" in value:
            yield value["name"]
        for k, v in value.items():
            yield from _secret_names(v, str(k), depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _secret_names(item, key, depth + 1)


def differs(mine: dict, copy: dict) -> bool:
    """Whether the source's task result lacks anything of the copy (a merge patch is due)."""
    mine_labels = (mine.get("metadata") or {}).get("labels") or {}
    if any(mine_labels.get(k) != v for k, v in copy["metadata"]["labels"].items()):
        return True
    return any(mine.get(name) != copy[name] for name in ("outputs", "progress") if name in copy)


def owned_by(obj: dict, step: StepPod) -> bool:
    """Whether a task result found in the source is this step's Workflow's."""
    owners = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return any(isinstance(r, dict) and r.get("uid") == step.workflow["uid"] for r in owners)
