"""The targets a source cluster schedules to, as live connections other components use.

The targets controller keeps one :class:`TargetConnection` per Target and ClusterTarget; the
virtual kubelet (one node per target) and, later, the scheduler read them. Listeners hear of
targets added and removed; each connection's ``changed`` event fires when its readiness or
summary may have changed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from multicluster import Cluster, Informer

from ..api import keys
from ..api.naming import virtual_node_name


@dataclass
class TargetConnection:
    kind: str  # Target or ClusterTarget
    name: str
    namespace: str | None
    cluster: Cluster | None = None
    summaries: Informer | None = None
    ready: bool = False
    reason: str = "Connecting"
    message: str = ""
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def node_name(self) -> str:
        return virtual_node_name(self.name, self.namespace)

    @property
    def labels(self) -> dict[str, str]:
        if self.namespace:
            return {keys.TARGET_NAMESPACE_LABEL: self.namespace, keys.TARGET_NAME_LABEL: self.name}
        return {keys.CLUSTER_TARGET_NAME_LABEL: self.name}

    def summary(self) -> dict | None:
        if self.summaries is None:
            return None
        return self.summaries.get(keys.CLUSTER_SUMMARY_NAME)


Listener = Callable[[TargetConnection], Awaitable[None]]


class TargetRegistry:
    def __init__(self) -> None:
        self.connections: dict[str, TargetConnection] = {}
        self._added: list[Listener] = []
        self._removed: list[Listener] = []

    def on_added(self, listener: Listener) -> None:
        self._added.append(listener)

    def on_removed(self, listener: Listener) -> None:
        self._removed.append(listener)

    async def add(self, connection: TargetConnection) -> None:
        self.connections[connection.node_name] = connection
        for listener in self._added:
            await listener(connection)

    async def remove(self, node_name: str) -> TargetConnection | None:
        connection = self.connections.pop(node_name, None)
        if connection is not None:
            for listener in self._removed:
                await listener(connection)
        return connection
