"""What the tests of source-side controllers share on the in-memory API server of
:mod:`multicluster.testing`: bounded waits, targets attached as the targets controller attaches
them, a target that holds one kind of request, and the Events a fake server holds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from multicluster import Informer, Resource
from multicluster.client import Call
from multicluster.errors import ServerError
from multicluster.resources import CONFIGMAPS, EVENTS, PODS
from multicluster.testing import FakeClient, FakeCluster, FakeServer
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.proxy import DELEGATE_LABEL_SELECTOR, slim_delegate
from multicluster_scheduler.api.resources import CLUSTER_SUMMARIES
from multicluster_scheduler.targets.controller import SINGLETON
from multicluster_scheduler.targets.registry import (
    DELEGATE_INDEX,
    REFERENCE_INDEX,
    TargetConnection,
    TargetRegistry,
    by_parent_uid,
    by_reference,
)

SUMMARY = {"metadata": {"name": keys.CLUSTER_SUMMARY_NAME}}


async def until(condition: Callable[[], object], timeout: float = 3.0, what: str = "") -> None:
    """Wait for ``condition`` to hold (caches follow the fake servers' watches), ``timeout``
    seconds at most."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"not in time: {what}" if what else "not in time"
        await asyncio.sleep(0.002)


async def settle(seconds: float = 0.05) -> None:
    """Time for what was set off (an Event written in the background, a watch event) to happen,
    before checking that nothing more did."""
    await asyncio.sleep(seconds)


async def attach(
    registry: TargetRegistry,
    connection: TargetConnection,
    cluster: FakeCluster,
    *,
    synced: bool = True,
) -> TargetConnection:
    """Connect ``connection`` to ``cluster`` as ``TargetsReconciler._attach`` does (its summary
    and delegates cached, with the same selectors, transform and indexers), the registry told,
    the cluster started (the manager's part) and, when ``synced``, its caches filled and the
    target Ready. A self target's cluster is the local one, running already."""
    if connection.node_name not in registry.connections:
        await registry.add(connection)
    if not cluster.server.objects(CLUSTER_SUMMARIES):
        cluster.server.add(CLUSTER_SUMMARIES, SUMMARY)
    summaries = cluster.informer(CLUSTER_SUMMARIES, field_selector=SINGLETON)
    delegates = cluster.informer(
        PODS, connection.namespace, label_selector=DELEGATE_LABEL_SELECTOR, transform=slim_delegate
    )
    delegates.add_indexer(DELEGATE_INDEX, by_parent_uid)
    delegates.add_indexer(REFERENCE_INDEX, by_reference)
    connection.cluster, connection.summaries, connection.delegates = cluster, summaries, delegates
    registry.connected(connection)  # its listeners make the informers they need
    cluster.start()
    if synced:
        assert await cluster.wait_synced(3), f"{cluster.name}: caches not filled"
        connection.set_ready(True, "Ready", "the target's ClusterSummary is current")
        registry.changed(connection)
    return connection


async def broken(informer: Informer, server: FakeServer) -> Callable[[], None]:
    """Make ``informer`` fail until the function returned is called: its watch ends, its server
    has forgotten the history it would resume from (410: it lists again), and lists fail.
    Waits until it has failed; once let go, it lists again, and is healthy."""
    reactor = server.fail_next(
        "list", informer.resource, ServerError("unavailable", status=503), times=None
    )
    server.add(CONFIGMAPS, {"metadata": {"generateName": "history-", "namespace": "default"}})
    server.compact()
    server.drop_watches()
    await until(lambda: isinstance(informer.last_error, ServerError), what="the list failing")
    assert not informer.healthy
    return lambda: server.remove_reactor(reactor)


class Holding(FakeClient):
    """A client whose ``verb`` calls on ``resource`` get no answer until :meth:`release` (other
    calls, lists and watches are answered at once): an API server that accepts some requests
    and stalls."""

    def __init__(self, server: FakeServer, *, name: str, verb: str, resource: Resource) -> None:
        super().__init__(server, name=name)
        self.verb, self.resource = verb, resource
        self.held: list[str] = []  # the names of the calls held, in order
        self.waiting = 0  # calls held now
        self._released = asyncio.Event()

    async def call(self, call: Call, **options: Any) -> Any:
        held = call.verb == self.verb and call.resource == self.resource
        if held and not self._released.is_set():
            body = options.get("body") or {}
            self.held.append(call.name or (body.get("metadata") or {}).get("name") or "")
            self.waiting += 1
            try:
                await self._released.wait()
            finally:
                self.waiting -= 1
        return await super().call(call, **options)

    def release(self) -> None:
        self._released.set()


class HoldingCluster(FakeCluster):
    """A target whose client is :class:`Holding`."""

    def __init__(self, name: str, *, verb: str, resource: Resource) -> None:
        super().__init__(name, FakeServer(name=name))
        self.client = self.holding = Holding(self.server, name=name, verb=verb, resource=resource)


def events(server: FakeServer, namespace: str | None = None) -> list[tuple[str, str, str, int]]:
    """The Events a server holds: (object's name, type, reason, count), by name."""
    return [
        (e["involvedObject"]["name"], e["type"], e["reason"], e.get("count", 1))
        for e in server.objects(EVENTS, namespace)
    ]


def named(server: FakeServer, resource: Resource, name: str, namespace: str) -> dict | None:
    """The object ``namespace/name`` as ``server`` holds it."""
    found = [o for o in server.objects(resource, namespace) if o["metadata"]["name"] == name]
    return found[0] if found else None
