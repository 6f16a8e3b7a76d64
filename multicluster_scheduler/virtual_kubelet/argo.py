"""Argo Workflows' task results brought back from targets before a step's pod is shown finished
(what and why: :mod:`multicluster_scheduler.api.argo`).

Only proxy pods of Argo workflow steps cost anything: a read in the target, a write here and a
delete there, once, when their delegate ends. A target without Argo's CRD, or that does not let
this cluster read task results, or a result this cluster refuses, changes nothing but the
step's outputs, which do not come: the proxy pod gets a Warning event saying so, and its phase
is mirrored all the same.
"""

from __future__ import annotations

import logging

from multicluster import AlreadyExists, Cluster, Forbidden, Invalid, NotFound
from multicluster.errors import BadRequest
from multicluster.events import EventRecorder

from ..api.argo import RESULT_FIELDS, WORKFLOW_TASK_RESULTS, differs, result_copy, step_pod
from ..api.proxy import pod_reference
from ..targets.registry import TargetConnection

log = logging.getLogger(__name__)


class TaskResults:
    def __init__(self, local: Cluster, events: EventRecorder) -> None:
        self.local = local
        self.events = events

    async def carry(self, proxy: dict, connection: TargetConnection, delegate: dict) -> None:
        """Copy the step's task result from ``connection``'s cluster, where ``delegate`` ran,
        into the proxy pod's namespace, then delete it there. Errors other than those said
        above propagate: the proxy pod's phase waits for its outputs, and is retried."""
        step = step_pod(proxy)
        if step is None:
            return
        where = delegate["metadata"]["namespace"]
        try:
            found = await connection.client.get(WORKFLOW_TASK_RESULTS, step.node_id, where)
        except NotFound:
            return  # the executor reported nothing there (or Argo's CRD is not installed)
        except Forbidden:
            self._warn(
                proxy,
                "TaskResultUnreadable",
                f"target {connection.name} does not let this cluster read Argo's task results "
                f"(get workflowtaskresults.argoproj.io in namespace {where}): the outputs of "
                f"step {step.node_id} stay there",
            )
            return
        copy = result_copy(step, found)
        if copy is None:
            self._warn(
                proxy,
                "TaskResultMismatch",
                f"the task result {step.node_id} in target {connection.name} is not of workflow "
                f"{step.workflow_name}: not copied",
            )
            return
        found_uid = found["metadata"].get("uid")
        if not await self._write(proxy, step.namespace, copy, found_uid):
            return
        await connection.client.delete(
            WORKFLOW_TASK_RESULTS,
            step.node_id,
            where,
            missing_ok=True,
            preconditions={"uid": found_uid} if found_uid else None,
        )
        log.info(
            "task result brought back namespace=%s name=%s target=%s",
            step.namespace,
            step.node_id,
            connection.name,
        )

    async def _write(self, proxy: dict, namespace: str, copy: dict, found_uid: str | None) -> bool:
        """Create or update the source's task result; False when there is nothing more to do
        (the target is this cluster, or this cluster does not take it: a Warning says why)."""
        name = copy["metadata"]["name"]
        client = self.local.client
        try:
            try:
                await client.create(WORKFLOW_TASK_RESULTS, copy, namespace)
                return True
            except AlreadyExists:
                mine = await client.get(WORKFLOW_TASK_RESULTS, name, namespace)
            if found_uid and mine["metadata"].get("uid") == found_uid:
                return False  # one object: the target is this very cluster
            if differs(mine, copy):
                patch = {"metadata": {"labels": copy["metadata"]["labels"]}}
                patch |= {k: copy[k] for k in RESULT_FIELDS if k in copy}
                await client.patch(WORKFLOW_TASK_RESULTS, name, patch, namespace)
            return True
        except Forbidden:
            why = (
                f"this cluster's agent may not write Argo's task results in namespace "
                f"{namespace} (its chart is older than its image?)"
            )
        except (BadRequest, Invalid) as error:  # what the target reported does not fit here
            why = f"the API server refused it: {error}"
        self._warn(proxy, "TaskResultNotWritten", f"{why}: the outputs of step {name} are lost")
        return False

    def _warn(self, proxy: dict, reason: str, message: str) -> None:
        log.warning("%s namespace=%s pod=%s: %s", reason, *_where(proxy), message)
        self.events.emit(pod_reference(proxy), "Warning", reason, message)


def _where(proxy: dict) -> tuple[str, str]:
    meta = proxy["metadata"]
    return meta.get("namespace") or "", meta.get("name") or ""
