"""The Manager: starts cluster caches, waits for them, runs controllers, elects a leader.

An unreachable cluster never holds the others back: each cluster's caches get ``sync_timeout``
seconds, after which controllers start anyway and the laggard keeps retrying in the background
(reported in logs, metrics and ``/readyz``). Clusters may be added and removed while running.
With leader election, caches run on every replica (a successor is warm) and controllers that
need it run only on the leader, stopping the moment the lease is lost.

Stopping can drain (``shutdown_delay``): the leader's work stops at once and its lease is released,
``/readyz`` answers 503, but the other runnables (a webhook server) keep serving for that long
before they stop. Behind a Service, a replica told to stop is still sent requests until its
endpoints' removal has reached every client (API servers resolve webhook Services themselves);
answered meanwhile, none of them fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from . import gctune, metrics
from .client import Client
from .cluster import Cluster
from .controller import Controller
from .health import HealthServer, health_app
from .leaderelection import LeaderElectionConfig, LeaderElector

log = logging.getLogger(__name__)
Runnable = Callable[[], Coroutine[Any, Any, None]]


class LeadershipLost(RuntimeError):
    """The lease could not be renewed: the process should exit and start over."""


class Manager:
    def __init__(
        self,
        *,
        leader_election: LeaderElectionConfig | None = None,
        leader_election_cluster: Cluster | None = None,
        sync_timeout: float = 30.0,
        health_port: int | None = None,
        health_host: str = "0.0.0.0",
        tune_gc: bool = True,
        shutdown_delay: float = 0.0,
    ) -> None:
        self.leader_election = leader_election
        self._election_cluster = leader_election_cluster
        self.sync_timeout = sync_timeout
        self.health_port = health_port
        self.health_host = health_host
        self.tune_gc = tune_gc
        self.shutdown_delay = shutdown_delay
        self.draining = False
        self.clusters: dict[str, Cluster] = {}
        self._required: set[str] = set()
        self.controllers: list[Controller] = []
        self._runnables: list[tuple[Runnable, bool]] = []
        self._readiness_checks: list[Callable[[], str | None]] = []
        self._running = False
        self._stop = asyncio.Event()
        self._elector: LeaderElector | None = None
        self._health: HealthServer | None = None
        self._background: set[asyncio.Task] = set()
        self.health_address: tuple[str, int] | None = None

    # -- registration -------------------------------------------------------------------------

    def add_cluster(self, cluster: Cluster, *, required: bool | None = None) -> Cluster:
        """Register a cluster; when running, its informers start at once. ``/readyz`` waits
        for ``required`` clusters only: by default those registered before :meth:`run`, not
        those that come and go at run time (one unreachable target must not make the process
        unready)."""
        if cluster.name in self.clusters:
            raise ValueError(f"a cluster named {cluster.name!r} is already registered")
        self.clusters[cluster.name] = cluster
        if required if required is not None else not self._running:
            self._required.add(cluster.name)
        if self._running:
            cluster.start()
            self._spawn(self._report_sync(cluster))
        return cluster

    async def remove_cluster(self, name: str) -> None:
        """Stop watching a cluster: handlers detached, informers stopped, connection closed,
        and the memory of its caches given back to the system."""
        cluster = self.clusters.pop(name, None)
        self._required.discard(name)
        if cluster is None:
            return
        for controller in self.controllers:
            controller.unwatch(name)
        await cluster.stop()
        del cluster
        with contextlib.suppress(KeyError):
            metrics.CLUSTER_SYNCED.remove(name)
        await gctune.release_memory()
        log.info("removed cluster=%s", name)

    def add_controller(self, controller: Controller) -> Controller:
        self.controllers.append(controller)
        return controller

    def add_readiness_check(self, check: Callable[[], str | None]) -> None:
        """``/readyz`` answers 503 with ``check()``'s reason while it returns one."""
        self._readiness_checks.append(check)

    def add_runnable(self, run: Runnable, *, needs_leader: bool) -> None:
        """Any coroutine to run alongside controllers (e.g. a webhook server)."""
        self._runnables.append((run, needs_leader))

    @property
    def is_leader(self) -> bool:
        return self.leader_election is None or bool(self._elector and self._elector.is_leader)

    def stop(self) -> None:
        self._stop.set()

    # -- running ------------------------------------------------------------------------------

    async def run(self, *, handle_signals: bool = False) -> None:
        """Run until :meth:`stop` (or SIGTERM/SIGINT when ``handle_signals``)."""
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        self._running = True
        tasks: list[asyncio.Task] = []  # the manager ends when one of these does
        self._spawn(metrics.watch_loop_lag())
        try:
            if self.health_port is not None:
                await self._start_health(self.health_port)
            if self.tune_gc:
                gctune.tune_for_caches()
            for cluster in self.clusters.values():
                cluster.start()
            await self._wait_for_caches()
            if self.tune_gc:
                gctune.freeze_cached()
            for cluster in self.clusters.values():
                if not cluster.has_synced:
                    self._spawn(self._report_sync(cluster))
            always: list[Runnable] = [
                c.run for c in self.controllers if not c.needs_leader_election
            ]
            always += [run for run, needs_leader in self._runnables if not needs_leader]
            leader_only: list[Runnable] = [
                c.run for c in self.controllers if c.needs_leader_election
            ]
            leader_only += [run for run, needs_leader in self._runnables if needs_leader]
            tasks += [loop.create_task(run()) for run in always]
            leading = None
            if leader_only:
                leading = loop.create_task(self._lead(leader_only), name="leader-election")
                tasks.append(leading)
            stop = loop.create_task(self._stop.wait())
            done, _ = await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = None if task is stop or task.cancelled() else task.exception()
                if error is not None:
                    raise error
            if stop in done and self.shutdown_delay > 0:
                await self._drain(leading, [t for t in tasks if t is not leading])
        finally:
            self._running = False
            for task in (*tasks, *self._background):
                task.cancel()
            await asyncio.gather(*tasks, *self._background, return_exceptions=True)
            await asyncio.gather(*(c.stop() for c in self.clusters.values()))
            if self._health is not None:
                await self._health.stop()
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            log.info("manager stopped")

    async def _drain(self, leading: asyncio.Task | None, serving: list[asyncio.Task]) -> None:
        """Stop leading now (the lease is released), keep serving ``shutdown_delay`` more."""
        self.draining = True
        log.info("stopping: draining seconds=%.1f", self.shutdown_delay)
        if leading is not None:
            leading.cancel()
            await asyncio.gather(leading, return_exceptions=True)
        if serving:
            await asyncio.wait(serving, timeout=self.shutdown_delay)

    async def _wait_for_caches(self) -> None:
        async def wait(cluster: Cluster) -> None:
            if await cluster.wait_synced(self.sync_timeout):
                metrics.CLUSTER_SYNCED.labels(cluster.name).set(1)
                log.info("caches synced cluster=%s", cluster.name)
            else:
                metrics.CLUSTER_SYNCED.labels(cluster.name).set(0)
                log.warning(
                    "caches not synced after %.0fs, starting without them cluster=%s error=%s",
                    self.sync_timeout,
                    cluster.name,
                    cluster.last_error(),
                )

        await asyncio.gather(*(wait(c) for c in self.clusters.values()))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _report_sync(self, cluster: Cluster) -> None:
        await cluster.wait_synced()
        metrics.CLUSTER_SYNCED.labels(cluster.name).set(1)
        log.info("caches synced cluster=%s", cluster.name)

    async def _lead(self, runs: list[Runnable]) -> None:
        async def lead() -> None:
            await asyncio.gather(*(run() for run in runs))

        if self.leader_election is None:
            await lead()
            return
        cluster = self._election_cluster or next(iter(self.clusters.values()), None)
        if cluster is None:
            raise ValueError("leader election needs a cluster to hold its Lease")
        # A client of its own: renewals must not queue behind the controllers' requests (its
        # own rate limit and connections), or a busy leader loses its lease to no one.
        client = Client(
            cluster.config,
            name=f"{cluster.name}-leader-election",
            qps=5,
            burst=10,
            max_connections=2,
        )
        self._elector = LeaderElector(client, self.leader_election)
        try:
            await self._elector.run(lead)
        finally:
            await client.close()
        if not self._stop.is_set():
            raise LeadershipLost(
                f"lost lease {self.leader_election.namespace}/{self.leader_election.name}"
            )

    # -- health -------------------------------------------------------------------------------

    async def _start_health(self, port: int) -> None:
        self._health = HealthServer(health_app(self.unready_reason), self.health_host, port)
        await self._health.start()
        self.health_address = self._health.address

    def unready_reason(self) -> str | None:
        """Why this replica is not ready (``/readyz`` answers 503 with it), or None."""
        if self.draining:
            return "shutting down"
        lagging = sorted(
            n for n, c in self.clusters.items() if n in self._required and not c.has_synced
        )
        if lagging:
            return f"caches not synced: {', '.join(lagging)}"
        for check in self._readiness_checks:
            reason = check()
            if reason:
                return reason
        return None
