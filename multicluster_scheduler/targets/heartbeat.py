"""A source's heartbeats in its targets (source side, leader only): every
:data:`..api.keepalive.HEARTBEAT_PERIOD` seconds, in each namespace of each connected target
where this cluster places delegates, its heartbeat Lease is renewed, so that the target's agent
can tell a source that is away (and keep its delegates alive) from one that is there (and
decides itself what becomes of a deleted delegate). :mod:`..api.keepalive` says why.

The namespaces: a namespaced Target's own; for a ClusterTarget, those where the target holds
delegates of this cluster. Self targets need none (the source is the target). A target whose
Source role does not grant Leases (a chart older than this one) answers 403: its delegates are
simply not kept alive while this cluster is away, as before, and the agent says so once.
When a Target is deleted, its heartbeats are deleted before its delegates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from multicluster import AlreadyExists, ApiError, Cluster, Forbidden, NotFound
from multicluster.kubetime import format_micro_time
from multicluster.resources import LEASES

from ..api.keepalive import HEARTBEAT_PERIOD, heartbeat_lease, heartbeat_name
from ..api.proxy import parent_cluster
from .registry import TargetConnection, TargetRegistry

log = logging.getLogger(__name__)
RENEW_TIMEOUT = 5.0
MAX_NAMESPACES = 1000  # heartbeats per ClusterTarget: each is a write every period


def _micro_now() -> str:
    return format_micro_time()


class SourceHeartbeat:
    def __init__(self, local: Cluster, registry: TargetRegistry, cluster_name: str) -> None:
        self.local = local
        self.registry = registry
        self.cluster_name = cluster_name
        self._refused: set[str] = set()  # targets (nodes) whose answer was 403, said once
        registry.on_removing(self._removing)

    def namespaces(self, connection: TargetConnection) -> set[str]:
        """Where ``connection``'s target holds, or may hold, delegates of this cluster."""
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
                and parent_cluster(delegate) == (self.cluster_name)
            ):
                found.add(namespace)
            if len(found) >= MAX_NAMESPACES:
                break
        return found

    async def _removing(self, connection: TargetConnection) -> None:
        """A Target is deleted: its heartbeats go first, so that the delegates deleted with it
        are not taken for ones deleted while this cluster is away."""
        if connection.cluster is None or connection.cluster is self.local:
            return
        client = connection.cluster.client
        name = heartbeat_name(self.cluster_name)
        try:
            async with asyncio.timeout(RENEW_TIMEOUT):
                for namespace in sorted(self.namespaces(connection)):
                    await client.delete(LEASES, name, namespace, missing_ok=True)
        except (ApiError, TimeoutError) as e:
            log.info(
                "heartbeat not deleted with its target target=%s error=%s",
                connection.node_name,
                e or "timed out",
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
            if c.cluster is not None and c.cluster is not self.local and c.delegates_synced
        ]
        await asyncio.gather(*(self._beat(c) for c in connections))

    async def _beat(self, connection: TargetConnection) -> None:
        node = connection.node_name
        try:
            async with asyncio.timeout(RENEW_TIMEOUT):
                for namespace in sorted(self.namespaces(connection)):
                    await self._renew(connection, namespace)
        except Forbidden:
            if node not in self._refused:
                self._refused.add(node)
                log.info(
                    "no heartbeat in target %s: this cluster may not write Leases there (a "
                    "Source role of an older chart); its delegates there are not kept alive "
                    "while this cluster is away",
                    node,
                )
            return
        except (ApiError, TimeoutError) as e:
            log.debug("heartbeat not renewed target=%s error=%s", node, e or "timed out")
            return
        self._refused.discard(node)

    async def _renew(self, connection: TargetConnection, namespace: str) -> None:
        client = connection.cluster.client  # type: ignore[union-attr]
        now = _micro_now()
        name = heartbeat_name(self.cluster_name)
        try:
            await client.patch(LEASES, name, {"spec": {"renewTime": now}}, namespace)
        except NotFound:
            lease = heartbeat_lease(self.cluster_name, namespace, now)
            with contextlib.suppress(AlreadyExists):
                await client.create(LEASES, lease, namespace)
