"""deploymentcopy: copy the Deployments of one namespace of cluster1 to cluster2.

Copies are kept up to date and deleted with their original: the original holds a finalizer
until its copy is gone (cross-cluster garbage collection), and the copy points back at it
with parent references, so an event on either side reconciles the original.

    python -m examples.deploymentcopy --contexts cluster1,cluster2 --namespace default
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
    Result,
    add_finalizer,
    remove_finalizer,
)
from multicluster.gc import is_deleting
from multicluster.resources import DEPLOYMENTS

from ..cli import contexts, parser, setup_logging

REFS = ParentReferences()


class DeploymentCopier:
    def __init__(self, source: Cluster, destination: Cluster, namespace: str) -> None:
        self.source = source
        self.destination = destination
        self.originals = source.informer(DEPLOYMENTS, namespace)
        self.copies = destination.informer(DEPLOYMENTS, namespace)

    async def reconcile(self, request: Request) -> Result | None:
        original = self.originals.get(request.name, request.namespace)
        copy = self.copies.get(request.name, request.namespace)
        if copy is not None and original is not None and not REFS.is_child_of(copy, original):
            return None  # a Deployment of the same name that is not ours: leave it alone
        if original is None or is_deleting(original):
            if copy is not None and not is_deleting(copy):
                await self._delete_copy(copy)
            if original is not None and copy is None:
                await remove_finalizer(self.source.client, DEPLOYMENTS, original, REFS.finalizer)
            return None
        original = await add_finalizer(self.source.client, DEPLOYMENTS, original, REFS.finalizer)
        desired = self._copy_of(original)
        if copy is None:
            await self.destination.client.create(DEPLOYMENTS, desired)
        elif _differs(copy, desired):
            desired["metadata"]["resourceVersion"] = copy["metadata"]["resourceVersion"]
            await self.destination.client.update(DEPLOYMENTS, desired)
        return None

    def _copy_of(self, original: dict) -> dict:
        meta = original["metadata"]
        copy = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "labels": dict(meta.get("labels") or {}),
            },
            "spec": original["spec"],
        }
        return REFS.set_parent(copy, original, self.source.name)

    async def _delete_copy(self, copy: dict) -> None:
        meta = copy["metadata"]
        await self.destination.client.delete(
            DEPLOYMENTS, meta["name"], meta["namespace"], missing_ok=True
        )


def _differs(copy: dict, desired: dict) -> bool:
    return copy["spec"] != desired["spec"] or copy["metadata"].get("labels") != desired[
        "metadata"
    ].get("labels")


async def main() -> None:
    args = parser(__doc__).parse_args()
    setup_logging()
    source_context, destination_context = contexts(args)[:2]
    manager = Manager()
    source = manager.add_cluster(Cluster.from_kubeconfig(source_context, args.kubeconfig))
    destination = manager.add_cluster(Cluster.from_kubeconfig(destination_context, args.kubeconfig))
    copier = DeploymentCopier(source, destination, args.namespace)
    controller = Controller("deploymentcopy", copier, needs_leader_election=False)
    controller.watch(source, DEPLOYMENTS, namespace=args.namespace)
    controller.watch(destination, DEPLOYMENTS, namespace=args.namespace, handler=EnqueueParent())
    manager.add_controller(controller)
    await manager.run(handle_signals=True)


if __name__ == "__main__":
    asyncio.run(main())
