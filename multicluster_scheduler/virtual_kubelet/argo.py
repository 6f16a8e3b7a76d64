"""Argo Workflows' task results brought back from targets before a step's pod is shown finished
(what, why and what is checked: :mod:`multicluster_scheduler.api.argo`).

Only proxy pods of Argo workflow steps cost anything: a read in the target, a write here and a
delete there, once, when their delegate ends. A target without a task result for the step (no
executor reported there) changes nothing. One that has a result this cluster cannot take (the
target does not let it read task results, the result is not the step's, or this cluster
refuses it) fails the step, with a Warning event on its proxy pod that says why: Argo would
otherwise wait for its outputs for ever. Output artifacts that name Secrets that did not follow
the step's pod, or that ask for the consumer's ambient credentials, are left out, with a
Warning.
"""

from __future__ import annotations

import logging

import orjson

from multicluster import AlreadyExists, ApiError, Cluster, Forbidden, NotFound
from multicluster.errors import BadResponse
from multicluster.events import EventRecorder
from multicluster.resources import SECRETS

from ..api.argo import (
    WORKFLOW_TASK_RESULTS,
    StepPod,
    artifact_secrets,
    differs,
    owned_by,
    result_copy,
    step_pod,
)
from ..api.follow import is_followed
from ..api.proxy import pod_reference
from ..targets.registry import TargetConnection

log = logging.getLogger(__name__)
NOT_COPIED = "TaskResultNotCopied"  # the proxy pod's reason, and its Warning's
# Larger than any step's outputs Argo keeps in a Workflow's status (etcd takes 1.5 MiB objects).
MAX_RESULT_BYTES = 1024 * 1024


class TaskResults:
    def __init__(self, local: Cluster, events: EventRecorder) -> None:
        self.local = local
        self.events = events

    async def carry(self, proxy: dict, connection: TargetConnection) -> str | None:
        """Copy the step's task result from ``connection``'s cluster into the proxy pod's
        namespace, then delete it there. Returns why the step must fail instead, if it must.
        Other errors (the target unreachable, a server error) propagate: the proxy pod's phase
        waits for its outputs, and is retried."""
        step = step_pod(proxy)
        if step is None:
            return None
        try:
            found = await connection.client.get(WORKFLOW_TASK_RESULTS, step.node_id, step.namespace)
        except NotFound:
            return None  # the executor reported nothing there (or Argo's CRD is not installed)
        except Forbidden:
            return self._fail(
                proxy,
                f"target {connection.name} does not let this cluster read Argo's task results "
                f"(get workflowtaskresults.argoproj.io in namespace {step.namespace}): the "
                f"outputs of step {step.node_id} cannot be brought back",
            )
        except BadResponse as error:  # not JSON, or larger than any result
            return self._fail(proxy, f"target {connection.name} answered no task result: {error}")
        followed = await self._followed(step, artifact_secrets(found) & step.secrets)
        copy = result_copy(step, found, followed)
        if copy is None:
            return self._fail(
                proxy,
                f"the task result {step.node_id} in target {connection.name} is not the one "
                f"the executor of workflow {step.workflow_name} writes: not copied",
            )
        if copy.dropped:
            self._warn(
                proxy,
                "ArtifactsDropped",
                f"output artifacts {', '.join(copy.dropped)} of step {step.node_id} name Secrets "
                "that did not follow its pod, or ask for the ambient credentials of the step "
                "that reads them: left out",
            )
        found_uid = found["metadata"].get("uid")
        problem, same = await self._write(step, copy.body, found_uid)
        if problem:
            return self._fail(proxy, problem)
        if not same:
            await self._delete_there(connection, step, found_uid)
        return None

    async def _followed(self, step: StepPod, names: set[str]) -> frozenset[str]:
        """Those of the Secrets (of the step's pod) that follow delegates: a service-account
        token, say, never leaves this cluster, and an artifact naming it would have a later step
        send it wherever the artifact says."""
        followed = set()
        for name in names:
            try:
                secret = await self.local.client.get(SECRETS, name, step.namespace)
            except NotFound:
                continue
            if is_followed(secret):
                followed.add(name)
        return frozenset(followed)

    async def _write(self, step: StepPod, body: dict, found_uid: object) -> tuple[str | None, bool]:
        """Create or update the source's task result: (why not, if it could not be written;
        whether the target's is this very object, the target being this cluster)."""
        name, namespace = step.node_id, step.namespace
        try:
            size = len(orjson.dumps(body))
        except TypeError as error:  # nested past what orjson writes
            return f"the task result of step {name} cannot be written: {error}", False
        if size > MAX_RESULT_BYTES:
            return f"the task result of step {name} is larger than 1 MiB", False
        client = self.local.client
        try:
            try:
                await client.create(WORKFLOW_TASK_RESULTS, body, namespace)
                return None, False
            except AlreadyExists:
                mine = await client.get(WORKFLOW_TASK_RESULTS, name, namespace)
            if found_uid and (mine.get("metadata") or {}).get("uid") == found_uid:
                return None, True  # one object: the target is this very cluster
            if not owned_by(mine, step):
                return f"a task result {name} of another workflow exists here", False
            if differs(mine, body):
                patch = {"metadata": {"labels": body["metadata"]["labels"]}}
                patch |= {k: body[k] for k in ("outputs", "progress") if k in body}
                await client.patch(WORKFLOW_TASK_RESULTS, name, patch, namespace)
            return None, False
        except Forbidden:
            return (
                f"this cluster's agent may not write Argo's task results in namespace "
                f"{namespace} (its chart is older than its image?)"
            ), False
        except ApiError as error:
            if 400 <= error.status < 500 and error.status != 429:
                return f"the API server refused the task result of step {name}: {error}", False
            raise

    async def _delete_there(self, connection: TargetConnection, step: StepPod, uid: object) -> None:
        try:
            await connection.client.delete(
                WORKFLOW_TASK_RESULTS,
                step.node_id,
                step.namespace,
                missing_ok=True,
                preconditions={"uid": uid} if isinstance(uid, str) and uid else None,
            )
        except ApiError as error:  # left there; the Workflow's garbage there, if any, is theirs
            log.info("task result not deleted in target=%s: %s", connection.name, error)
            return
        log.info(
            "task result brought back namespace=%s name=%s target=%s",
            step.namespace,
            step.node_id,
            connection.name,
        )

    def _fail(self, proxy: dict, message: str) -> str:
        self._warn(proxy, NOT_COPIED, message)
        return message

    def _warn(self, proxy: dict, reason: str, message: str) -> None:
        meta = proxy["metadata"]
        log.warning(
            "%s namespace=%s pod=%s: %s", reason, meta.get("namespace"), meta.get("name"), message
        )
        self.events.emit(pod_reference(proxy), "Warning", reason, message)
