"""jobs: a MultiClusterJob in the main cluster runs a Job in every cluster and reports on them.

Its status says, per cluster, whether the Job is Running, Complete or Failed, and overall
``Finished`` when every Job completed, ``Error`` as soon as one failed. Deleting the
MultiClusterJob deletes its Jobs everywhere first (a finalizer holds it meanwhile). Apply
``examples/jobs/crd.yaml`` to the main (first) cluster.

    python -m examples.jobs --contexts cluster1,cluster2 --namespace default
"""

from __future__ import annotations

import asyncio

from multicluster import (
    Cluster,
    Controller,
    EnqueueParent,
    Manager,
    ParentReferences,
    Request,
    Resource,
    add_finalizer,
    remove_finalizer,
)
from multicluster.gc import is_deleting
from multicluster.resources import JOBS

from ..cli import contexts, parser, setup_logging

MCJOBS = Resource(
    "examples.multicluster.admiralty.io", "v1alpha1", "multiclusterjobs", "MultiClusterJob"
)
REFS = ParentReferences()


def job_state(job: dict | None) -> str:
    if job is None:
        return "Pending"
    for condition in job.get("status", {}).get("conditions") or ():
        if condition.get("status") != "True":
            continue
        if condition["type"] == "Complete":
            return "Complete"
        if condition["type"] == "Failed":
            return "Failed"
    return "Running"


def overall(states: dict[str, str]) -> str:
    if any(s == "Failed" for s in states.values()):
        return "Error"
    if states and all(s == "Complete" for s in states.values()):
        return "Finished"
    return "Running"


class MultiClusterJobs:
    def __init__(self, main: Cluster, clusters: list[Cluster], namespace: str) -> None:
        self.main = main
        self.clusters = clusters
        self.parents = main.informer(MCJOBS, namespace)
        self.jobs = {c.name: c.informer(JOBS, namespace) for c in clusters}

    async def reconcile(self, request: Request) -> None:
        parent = self.parents.get(request.name, request.namespace)
        if parent is None:
            return
        children = {c.name: self._child(c, request, parent) for c in self.clusters}
        if is_deleting(parent):
            for cluster in self.clusters:
                job = children[cluster.name]
                if job is not None and not is_deleting(job):
                    await cluster.client.delete(
                        JOBS,
                        request.name,
                        request.namespace,
                        propagation_policy="Background",
                        missing_ok=True,
                    )
            if all(job is None for job in children.values()):
                await remove_finalizer(self.main.client, MCJOBS, parent, REFS.finalizer)
            return
        parent = await add_finalizer(self.main.client, MCJOBS, parent, REFS.finalizer)
        for cluster in self.clusters:
            if children[cluster.name] is None:
                job = {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": request.name, "namespace": request.namespace},
                    "spec": parent["spec"]["template"],
                }
                await cluster.client.create(JOBS, REFS.set_parent(job, parent, self.main.name))
        states = {name: job_state(job) for name, job in children.items()}
        status = {"phase": overall(states), "clusters": states}
        if parent.get("status") != status:
            await self.main.client.patch(
                MCJOBS,
                request.name,
                {"status": status},
                request.namespace,
                subresource="status",
            )

    def _child(self, cluster: Cluster, request: Request, parent: dict) -> dict | None:
        job = self.jobs[cluster.name].get(request.name, request.namespace)
        return job if job is not None and REFS.is_child_of(job, parent) else None


async def main() -> None:
    args = parser(__doc__).parse_args()
    setup_logging()
    manager = Manager()
    clusters = [
        manager.add_cluster(Cluster.from_kubeconfig(context, args.kubeconfig))
        for context in contexts(args)
    ]
    reconciler = MultiClusterJobs(clusters[0], clusters, args.namespace)
    controller = Controller("jobs", reconciler, needs_leader_election=False)
    controller.watch(clusters[0], MCJOBS, namespace=args.namespace)
    for cluster in clusters:
        controller.watch(cluster, JOBS, namespace=args.namespace, handler=EnqueueParent())
    manager.add_controller(controller)
    await manager.run(handle_signals=True)


if __name__ == "__main__":
    asyncio.run(main())
