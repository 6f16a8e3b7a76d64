"""podghost: for each pod of cluster1, a PodGhost in cluster2 that mirrors its phase and node.

The ghost carries parent references to its pod; when the pod goes, so does its ghost.
Apply ``examples/podghost/crd.yaml`` to cluster2 first.

    python -m examples.podghost --contexts cluster1,cluster2 --namespace default
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
)
from multicluster.resources import PODS

from ..cli import contexts, parser, setup_logging

PODGHOSTS = Resource("examples.multicluster.admiralty.io", "v1alpha1", "podghosts", "PodGhost")
REFS = ParentReferences()


class Ghostwriter:
    def __init__(self, pods: Cluster, ghosts: Cluster, namespace: str) -> None:
        self.pods_cluster = pods
        self.ghosts_cluster = ghosts
        self.pods = pods.informer(PODS, namespace)
        self.ghosts = ghosts.informer(PODGHOSTS, namespace)

    async def reconcile(self, request: Request) -> None:
        pod = self.pods.get(request.name, request.namespace)
        ghost = self.ghosts.get(request.name, request.namespace)
        if pod is None:
            if ghost is not None:
                await self.ghosts_cluster.client.delete(
                    PODGHOSTS, request.name, request.namespace, missing_ok=True
                )
            return
        desired = REFS.set_parent(
            {
                "apiVersion": PODGHOSTS.api_version,
                "kind": PODGHOSTS.kind,
                "metadata": {"name": request.name, "namespace": request.namespace},
                "spec": {
                    "phase": pod.get("status", {}).get("phase", ""),
                    "nodeName": pod["spec"].get("nodeName", ""),
                    "containers": [c["name"] for c in pod["spec"]["containers"]],
                },
            },
            pod,
            self.pods_cluster.name,
        )
        if ghost is None:
            await self.ghosts_cluster.client.create(PODGHOSTS, desired)
        elif ghost["spec"] != desired["spec"]:
            await self.ghosts_cluster.client.patch(
                PODGHOSTS, request.name, {"spec": desired["spec"]}, request.namespace
            )


async def main() -> None:
    args = parser(__doc__).parse_args()
    setup_logging()
    pods_context, ghosts_context = contexts(args)[:2]
    manager = Manager()
    pods = manager.add_cluster(Cluster.from_kubeconfig(pods_context, args.kubeconfig))
    ghosts = manager.add_cluster(Cluster.from_kubeconfig(ghosts_context, args.kubeconfig))
    controller = Controller(
        "podghost", Ghostwriter(pods, ghosts, args.namespace), needs_leader_election=False
    )
    controller.watch(pods, PODS, namespace=args.namespace)
    controller.watch(ghosts, PODGHOSTS, namespace=args.namespace, handler=EnqueueParent())
    manager.add_controller(controller)
    await manager.run(handle_signals=True)


if __name__ == "__main__":
    asyncio.run(main())
