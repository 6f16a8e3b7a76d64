"""helloworld: log ``cluster / namespace / name`` for every pod event in several clusters.

python -m examples.helloworld --contexts cluster1,cluster2
"""

from __future__ import annotations

import asyncio

from multicluster import Cluster, Controller, Func, Manager, Request
from multicluster.resources import PODS

from ..cli import contexts, parser, setup_logging


async def reconcile(request: Request) -> None:
    print(f"{request.cluster} / {request.namespace} / {request.name}", flush=True)


async def main() -> None:
    args = parser(__doc__).parse_args()
    setup_logging()
    controller = Controller("helloworld", Func(reconcile), needs_leader_election=False)
    manager = Manager()
    for context in contexts(args):
        cluster = manager.add_cluster(Cluster.from_kubeconfig(context, args.kubeconfig))
        controller.watch(cluster, PODS)
    manager.add_controller(controller)
    await manager.run(handle_signals=True)


if __name__ == "__main__":
    asyncio.run(main())
