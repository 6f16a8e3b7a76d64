"""Keeps the cluster's ClusterSummary ``singleton`` current, cheaply under churn.

Pod events keep a ledger of requests per node up to date, and they and node events enqueue the
one summary. The single worker recomputes it from the node cache and that ledger (a pass over
nodes, not over 10,000s of pods), writes only when the result differs from the summary it sees
(so a deleted or edited summary is restored; server-side apply: one request, create or update),
and not sooner than ``min_interval`` after its last write (asked earlier, it comes back then,
holding no worker, while more events coalesce): at most about one write a second, however busy
the cluster.
"""

from __future__ import annotations

import logging
import re
import time

from prometheus_client import Counter

from multicluster import Cluster, Controller, EnqueueMapped, Request, Result, metrics
from multicluster.informer import DELETED, object_key
from multicluster.resources import NODES, PODS

from ..api import keys
from ..api.resources import CLUSTER_SUMMARIES
from ..api.summary import slim_node
from .compute import RequestedLedger, slim_pod, summarize_nodes

log = logging.getLogger(__name__)
FIELD_MANAGER = "multicluster-scheduler-summary"
SINGLETON = f"metadata.name={keys.CLUSTER_SUMMARY_NAME}"
# Proxy pods run on virtual nodes, which summaries leave out: not even cached.
NOT_PROXIES = f"spec.schedulerName!={keys.PROXY_SCHEDULER_NAME}"
SUMMARY_WRITES = Counter(
    "multicluster_scheduler_summary_writes_total",
    "ClusterSummary writes (at most about one a second, however busy the cluster).",
    registry=metrics.REGISTRY,
)


class SummaryReconciler:
    def __init__(
        self, cluster: Cluster, *, exclude: re.Pattern | None = None, min_interval: float = 1.0
    ) -> None:
        self.cluster = cluster
        self.exclude = exclude
        self.min_interval = min_interval
        self._written_at = float("-inf")
        self.nodes = cluster.informer(NODES, transform=slim_node)
        self.pods = cluster.informer(PODS, field_selector=NOT_PROXIES, transform=slim_pod)
        self.requested = RequestedLedger()
        self.pods.add_handler(self._count)
        self.summaries = cluster.informer(CLUSTER_SUMMARIES, field_selector=SINGLETON)

    def _count(self, event: str, pod: dict, _old: dict | None, _initial: bool) -> None:
        self.requested.update(object_key(pod), None if event == DELETED else pod)

    async def reconcile(self, request: Request) -> Result | None:
        wait = self._written_at + self.min_interval - time.monotonic()
        if wait > 0:
            return Result(requeue_after=wait)
        summary = summarize_nodes(self.nodes.list(), self.requested.by_node, self.exclude)
        current = self.summaries.get(keys.CLUSTER_SUMMARY_NAME)
        if current is not None and all(current.get(k) == v for k, v in summary.items()):
            return None
        body = {
            "apiVersion": CLUSTER_SUMMARIES.api_version,
            "kind": CLUSTER_SUMMARIES.kind,
            "metadata": {"name": keys.CLUSTER_SUMMARY_NAME},
            **summary,
        }
        await self.cluster.client.patch(
            CLUSTER_SUMMARIES,
            keys.CLUSTER_SUMMARY_NAME,
            body,
            patch_type="apply",
            field_manager=FIELD_MANAGER,
            force=True,
        )
        self._written_at = time.monotonic()
        SUMMARY_WRITES.inc()
        log.info(
            "cluster summary written cluster=%s nodes=%d groups=%d",
            self.cluster.name,
            sum(g["count"] for g in summary["nodeGroups"]),
            len(summary["nodeGroups"]),
        )
        return None


def summary_controller(cluster: Cluster, *, exclude: re.Pattern | None = None) -> Controller:
    reconciler = SummaryReconciler(cluster, exclude=exclude)
    controller = Controller("summary", reconciler, workers=1)
    singleton = EnqueueMapped(lambda name, _obj: (Request(name, "", keys.CLUSTER_SUMMARY_NAME),))
    controller.watch(cluster, NODES, handler=singleton, transform=slim_node)
    controller.watch(
        cluster, PODS, handler=singleton, field_selector=NOT_PROXIES, transform=slim_pod
    )
    controller.watch(cluster, CLUSTER_SUMMARIES, handler=singleton, field_selector=SINGLETON)
    return controller
