"""A source's heartbeats in its targets (source side, leader only): every
:data:`..api.keepalive.HEARTBEAT_PERIOD` seconds, in each namespace of each connected target
where this cluster places delegates, its heartbeat Lease is renewed, so that the target's agent
can tell a source that is away (and keep its delegates alive) from one that is there (and
decides itself what becomes of a deleted delegate). :mod:`..api.keepalive` says why.

The namespaces: a namespaced Target's own; for a ClusterTarget, those where the target holds
delegates of this cluster, and for :data:`LINGER` seconds after the last one there went (so
that the target sees this cluster there after it deleted them itself), then the heartbeat is
deleted. Self targets need none (the source is the target). A target whose
Source role does not grant Leases (a chart older than this one) answers 403: its delegates are
simply not kept alive while this cluster is away, as before, and the agent says so once.
When a Target is deleted, its heartbeats are deleted before its delegates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from multicluster import AlreadyExists, ApiError, Cluster, Forbidden, NotFound
from multicluster.kubetime import format_micro_time
from multicluster.resources import LEASES

from ..api.keepalive import AWAY, HEARTBEAT_PERIOD, heartbeat_lease, heartbeat_name
from ..api.proxy import parent_cluster
from .registry import TargetConnection, TargetRegistry

log = logging.getLogger(__name__)
RENEW_TIMEOUT = 5.0  # one request
BEAT_TIMEOUT = 15.0  # all of one target's renewals (then its deletions)
REMOVAL_TIMEOUT = 10.0
CONCURRENCY = 8  # requests at once to one target
LINGER = AWAY + 2 * HEARTBEAT_PERIOD  # a namespace's heartbeat outlives its last delegate
MAX_NAMESPACES = 1000  # heartbeats per ClusterTarget: each is a write every period


def _micro_now() -> str:
    return format_micro_time()


class SourceHeartbeat:
    def __init__(self, local: Cluster, registry: TargetRegistry, cluster_name: str) -> None:
        self.local = local
        self.registry = registry
        self.cluster_name = cluster_name
        self._refused: set[str] = set()  # targets (nodes) whose answer was 403, said once
        # (node, namespace) → when a delegate of this cluster was last seen there (monotonic)
        self._last_used: dict[tuple[str, str], float] = {}
        self._seeded: set[str] = set()  # ClusterTargets whose earlier heartbeats were listed
        self._renewed: dict[tuple[str, str], float] = {}  # (node, namespace) → last renewal
        registry.on_removing(self._removing)

    def namespaces(self, connection: TargetConnection) -> set[str]:
        """Where ``connection``'s target holds delegates of this cluster now (a namespaced
        Target: its namespace, always)."""
        if connection.namespace:
            return {connection.namespace}
        delegates = connection.delegates
        if delegates is None:
            return set()
        found = set()
        for delegate in delegates.list():  # as the target sent them: anything may be missing
            namespace = (delegate.get("metadata") or {}).get("namespace")
            if (
                isinstance(namespace, str)
                and namespace
                and parent_cluster(delegate) == self.cluster_name
            ):
                found.add(namespace)
            if len(found) >= MAX_NAMESPACES:
                break
        return found

    def plan(self, connection: TargetConnection, now: float) -> tuple[set[str], set[str]]:
        """The namespaces whose heartbeat is to be renewed, and those whose heartbeat is to go.

        A ClusterTarget's namespace keeps its heartbeat for :data:`LINGER` seconds after its
        last delegate went: the delegates this cluster deleted itself (a scale to zero, say)
        must be seen deleted while it is there, or the target would take them for delegates
        deleted while it is away, and create them again."""
        node = connection.node_name
        renew: set[str] = set()
        expired: set[str] = set()
        if not connection.delegates_synced:
            # Which namespaces have delegates is not known now, but this cluster may still
            # delete some there: every heartbeat it knows is renewed, none expires.
            renew.update(ns for at, ns in self._last_used if at == node)
            if connection.namespace:
                renew.add(connection.namespace)
            return renew, expired
        for namespace in self.namespaces(connection):
            self._last_used[(node, namespace)] = now
        for (at, namespace), used in self._last_used.items():
            if at == node:
                (renew if now - used <= LINGER else expired).add(namespace)
        if connection.namespace:
            renew.add(connection.namespace)
        return renew, expired

    async def _removing(self, connection: TargetConnection) -> None:
        """A Target is deleted: its heartbeats go first, so that the delegates deleted with it
        are not taken for ones deleted while this cluster is away."""
        node = connection.node_name
        namespaces = self.namespaces(connection) | {ns for at, ns in self._last_used if at == node}
        for memo in (self._last_used, self._renewed):
            for key in [k for k in memo if k[0] == node]:
                del memo[key]
        self._refused.discard(node)
        self._seeded.discard(node)
        if connection.cluster is None or connection.cluster is self.local or not namespaces:
            return
        client = connection.cluster.client
        name = heartbeat_name(self.cluster_name)
        at_once = asyncio.Semaphore(CONCURRENCY)

        async def delete(namespace: str) -> None:
            async with at_once:
                await client.delete(LEASES, name, namespace, missing_ok=True)

        results = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REMOVAL_TIMEOUT):
                results = await asyncio.gather(
                    *(delete(ns) for ns in namespaces), return_exceptions=True
                )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors or len(results) < len(namespaces):
            log.warning(
                "heartbeats not all deleted with their target target=%s error=%s",
                node,
                errors[0] if errors else "timed out",
            )

    async def run(self) -> None:
        while True:
            try:
                await self.beat()
            except Exception:  # a heartbeat is a courtesy: it never ends the agent
                log.exception("heartbeats not renewed")
            await asyncio.sleep(HEARTBEAT_PERIOD)

    async def beat(self) -> None:
        """Renew every heartbeat once, every target at the same time, each within a limit."""
        connections = [
            c
            for c in self.registry.connections.values()
            if c.cluster is not None and c.cluster is not self.local
        ]
        await asyncio.gather(*(self._beat(c) for c in connections))

    async def _seed(self, connection: TargetConnection) -> None:
        """After this agent (re)starts, a ClusterTarget's heartbeats left from before are found
        (a scale to zero just before a restart would otherwise leave its namespace's heartbeat
        unrenewed, and its delegates recreated): they linger, and go, as if just used."""
        node = connection.node_name
        if connection.namespace or node in self._seeded:
            return
        try:
            async with asyncio.timeout(RENEW_TIMEOUT):
                found, _ = await connection.client.list(
                    LEASES, field_selector=f"metadata.name={heartbeat_name(self.cluster_name)}"
                )
        except Forbidden:
            found = []  # an older Source role: only what it uses from now on is known
        except (ApiError, TimeoutError):
            return  # tried again next time
        if not self._registered(connection):
            return
        now = time.monotonic()
        for lease in found[:MAX_NAMESPACES]:
            namespace = (lease.get("metadata") or {}).get("namespace")
            if isinstance(namespace, str) and namespace:
                self._last_used.setdefault((node, namespace), now)
        self._seeded.add(node)

    def _registered(self, connection: TargetConnection) -> bool:
        return self.registry.connections.get(connection.node_name) is connection

    async def _beat(self, connection: TargetConnection) -> None:
        """Renew ``connection``'s heartbeats, those renewed longest ago first, each request
        within :data:`RENEW_TIMEOUT` and all within :data:`BEAT_TIMEOUT` (a slow target
        renews its least recent ones next time); then delete those that lingered enough."""
        node = connection.node_name
        await self._seed(connection)
        if not self._registered(connection):
            return  # its Target went meanwhile
        renew, expired = self.plan(connection, time.monotonic())
        at_once = asyncio.Semaphore(CONCURRENCY)
        client = connection.client
        name = heartbeat_name(self.cluster_name)

        async def renew_one(namespace: str) -> None:
            async with at_once, asyncio.timeout(RENEW_TIMEOUT):
                await self._renew(connection, namespace)
            self._renewed[(node, namespace)] = time.monotonic()

        async def expire_one(namespace: str) -> None:
            async with at_once, asyncio.timeout(RENEW_TIMEOUT):
                await client.delete(LEASES, name, namespace, missing_ok=True)
            self._last_used.pop((node, namespace), None)
            self._renewed.pop((node, namespace), None)

        oldest_first = sorted(renew, key=lambda ns: self._renewed.get((node, ns), 0.0))
        results: list = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(BEAT_TIMEOUT):
                results = await asyncio.gather(
                    *(renew_one(ns) for ns in oldest_first), return_exceptions=True
                )
        if len(results) < len(renew):
            results.append(TimeoutError(f"not all {len(renew)} renewed in {BEAT_TIMEOUT:g}s"))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(BEAT_TIMEOUT):
                await asyncio.gather(*(expire_one(ns) for ns in expired), return_exceptions=True)
        self._say(connection, [r for r in results if isinstance(r, BaseException)])

    def _say(self, connection: TargetConnection, errors: list[BaseException]) -> None:
        node = connection.node_name
        if any(isinstance(e, Forbidden) for e in errors):
            if node not in self._refused:
                self._refused.add(node)
                log.info(
                    "no heartbeat in (some namespaces of) target %s: this cluster may not write "
                    "Leases there (403: a Source role of an older chart, or a policy); its "
                    "delegates there are not kept alive while this cluster is away",
                    node,
                )
            return
        self._refused.discard(node)
        stale = [
            ns
            for (at, ns), used in self._last_used.items()
            if at == node and time.monotonic() - self._renewed.get((at, ns), used) > AWAY / 2
        ]
        if errors and stale:
            log.warning(
                "heartbeats not renewed for %ds in %d namespaces of target %s (e.g. %s): %s",
                AWAY / 2,
                len(stale),
                node,
                stale[0],
                errors[0] or "timed out",
            )

    async def _renew(self, connection: TargetConnection, namespace: str) -> None:
        client = connection.client
        now = _micro_now()
        name = heartbeat_name(self.cluster_name)
        try:
            await client.patch(LEASES, name, {"spec": {"renewTime": now}}, namespace)
        except NotFound:
            if not self._registered(connection):
                return  # its Target is being deleted: its heartbeat is not made again
            lease = heartbeat_lease(self.cluster_name, namespace, now)
            with contextlib.suppress(AlreadyExists):
                await client.create(LEASES, lease, namespace)
            if not self._registered(connection):  # its Target went while it was made
                await client.delete(LEASES, name, namespace, missing_ok=True)
