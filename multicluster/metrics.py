"""Prometheus metrics of the runtime: API latency, watches, queues and reconciles.

Names follow controller-runtime's where one exists (``workqueue_depth``,
``controller_runtime_reconcile_total``…) so existing dashboards and alerts read them as is.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

API_LATENCY = Histogram(
    "rest_client_request_duration_seconds",
    "API request latency by cluster and verb.",
    ["cluster", "verb"],
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
API_ERRORS = Counter(
    "rest_client_errors_total",
    "API requests that failed, by cluster and HTTP status (or 'unreachable', 'too-large', "
    "'namespace-terminating': a create refused because its namespace is being deleted).",
    ["cluster", "code"],
    registry=REGISTRY,
)
WATCH_RESTARTS = Counter(
    "informer_watch_restarts_total",
    "Watches restarted, by cluster, resource and reason (expired, gone, error, idle).",
    ["cluster", "resource", "reason"],
    registry=REGISTRY,
)
INFORMER_EVENTS = Counter(
    "informer_events_total",
    "Watch and relist events applied to informer caches.",
    ["cluster", "resource", "type"],
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge("workqueue_depth", "Items waiting in a workqueue.", ["name"], registry=REGISTRY)
QUEUE_ADDS = Counter(
    "workqueue_adds_total", "Items added to a workqueue.", ["name"], registry=REGISTRY
)
QUEUE_RETRIES = Counter(
    "workqueue_retries_total", "Items re-added after a failure.", ["name"], registry=REGISTRY
)
RECONCILE_TOTAL = Counter(
    "controller_runtime_reconcile_total",
    "Reconciles by controller and result (success, error, requeue, requeue_after).",
    ["controller", "result"],
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "controller_runtime_reconcile_errors_total",
    "Reconciles that raised.",
    ["controller"],
    registry=REGISTRY,
)
RECONCILE_TIME = Histogram(
    "controller_runtime_reconcile_time_seconds",
    "Time spent in one reconcile.",
    ["controller"],
    registry=REGISTRY,
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
LEADER = Gauge(
    "leader_election_master_status",
    "1 while this process holds the lease.",
    ["name"],
    registry=REGISTRY,
)
CLUSTER_SYNCED = Gauge(
    "multicluster_cluster_synced",
    "1 when every informer of a cluster has synced.",
    ["cluster"],
    registry=REGISTRY,
)


LOOP_LAG = Histogram(
    "event_loop_lag_seconds",
    "How late the event loop ran a timer: time when no callback could run (CPU starved, or "
    "blocked by a callback).",
    registry=REGISTRY,
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
LAG_PERIOD = 0.5
LAG_WARNING = 1.0


async def watch_loop_lag(period: float = LAG_PERIOD, warn_after: float = LAG_WARNING) -> None:
    """Measure, every ``period``, how late the loop wakes up; log a warning past
    ``warn_after`` seconds (a renewal or a webhook answer was late by as much)."""
    loop = asyncio.get_running_loop()
    while True:
        expected = loop.time() + period
        await asyncio.sleep(period)
        lag = max(0.0, loop.time() - expected)
        LOOP_LAG.observe(lag)
        if lag >= warn_after:
            log.warning("event loop late by %.1fs: CPU starved or blocked", lag)


def exposition() -> bytes:
    """The registry in Prometheus text format."""
    return generate_latest(REGISTRY)
