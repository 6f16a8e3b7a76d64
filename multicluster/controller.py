"""A Controller: watches in any number of clusters feed one workqueue; N workers reconcile.

Events become Requests through handlers (filtered by predicates); workers take Requests from
the queue and call the reconciler. The retry policy lives here: an exception or
``Result(requeue=True)`` retries with per-item backoff, ``requeue_after`` schedules a retry,
success forgets the item's failures.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Iterable

from . import metrics
from .cluster import Cluster
from .errors import ApiError, NamespaceTerminating
from .handler import EnqueueObject, EventHandler
from .informer import Informer, Registration
from .predicate import Predicate
from .reconcile import Reconciler, Request, Result
from .resources import Resource
from .workqueue import ShutDown, WorkQueue

log = logging.getLogger(__name__)


class Controller:
    def __init__(
        self,
        name: str,
        reconciler: Reconciler,
        *,
        workers: int = 2,
        needs_leader_election: bool = True,
        queue: WorkQueue[Request] | None = None,
        flow: Callable[[Request], Hashable] | None = None,
    ) -> None:
        """``flow``: requests are handed to workers fairly between flows (``by_namespace``:
        between namespaces), see :class:`~.workqueue.WorkQueue`."""
        self.name = name
        self.reconciler = reconciler
        self.workers = workers
        self.needs_leader_election = needs_leader_election
        self.queue: WorkQueue[Request] = queue or WorkQueue(name, flow=flow)
        self._watches: dict[str, list[Registration]] = {}
        self._ok = metrics.RECONCILE_TOTAL.labels(name, "success")
        self._errors = metrics.RECONCILE_ERRORS.labels(name)
        self._error_total = metrics.RECONCILE_TOTAL.labels(name, "error")
        self._time = metrics.RECONCILE_TIME.labels(name)

    def __repr__(self) -> str:
        return f"<Controller {self.name}>"

    def watch(
        self,
        cluster: Cluster,
        resource: Resource,
        *,
        namespace: str | None = None,
        handler: EventHandler | None = None,
        predicates: Iterable[Predicate] = (),
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Callable[[dict], dict] | None = None,
    ) -> Informer:
        """Enqueue Requests for events of ``resource`` in ``cluster``; return the informer."""
        informer = cluster.informer(
            resource,
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            transform=transform,
        )
        mapper = handler or EnqueueObject()
        checks = tuple(predicates)
        queue = self.queue
        name = cluster.name

        def on_event(event: str, obj: dict, old: dict | None, initial: bool) -> None:
            for check in checks:
                if not check(event, obj, old):
                    return
            for request in mapper.requests(name, obj):
                queue.add(request, low_priority=initial)

        self._watches.setdefault(name, []).append(informer.add_handler(on_event))
        return informer

    def unwatch(self, cluster_name: str) -> None:
        """Forget every watch in a cluster (when it is removed)."""
        for registration in self._watches.pop(cluster_name, ()):
            registration.remove()

    @property
    def informers(self) -> list[Informer]:
        return [r.informer for watches in self._watches.values() for r in watches]

    def clusters(self) -> list[str]:
        return list(self._watches)

    async def run(self) -> None:
        """Run the workers until cancelled; the queue is drained of new work on exit."""
        log.info("starting controller=%s workers=%d", self.name, self.workers)
        workers = [
            asyncio.create_task(self._worker(), name=f"{self.name}-worker-{i}")
            for i in range(self.workers)
        ]
        try:
            await asyncio.gather(*workers)
        finally:
            self.queue.shut_down()
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _worker(self) -> None:
        queue = self.queue
        while True:
            try:
                request = await queue.get()
            except ShutDown:
                return
            try:
                await self._process(request)
            except Exception:  # the queue's own calls: one item must never end a worker
                log.exception("worker failed controller=%s request=%s", self.name, request)
            finally:
                queue.done(request)

    async def _process(self, request: Request) -> None:
        started = time.perf_counter()
        try:
            result = await self.reconciler.reconcile(request)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._errors.inc()
            self._error_total.inc()
            failures = self.queue.failures(request)
            level = logging.ERROR if failures >= 5 else logging.WARNING
            if isinstance(e, NamespaceTerminating):  # the object goes with its namespace
                level = logging.INFO
            log.log(
                level,
                "reconcile failed controller=%s request=%s failures=%d error=%s",
                self.name,
                request,
                failures + 1,
                e,
                exc_info=not _expected(e),
            )
            self.queue.add_rate_limited(request)
            return
        finally:
            self._time.observe(time.perf_counter() - started)
        result = result or _DONE
        if result.requeue_after > 0:
            self.queue.forget(request)
            self.queue.add_after(request, result.requeue_after)
            metrics.RECONCILE_TOTAL.labels(self.name, "requeue_after").inc()
        elif result.requeue:
            self.queue.add_rate_limited(request)
            metrics.RECONCILE_TOTAL.labels(self.name, "requeue").inc()
        else:
            self.queue.forget(request)
            self._ok.inc()


_DONE = Result()


def _expected(error: Exception) -> bool:
    """API errors are expected in a distributed system: no traceback needed."""
    return isinstance(error, ApiError)
