"""A Cluster: a named connection (REST client) and its shared informers.

Kubernetes clusters do not know their own names, so each connection is given one; Requests
carry it so a reconciler knows where an object lives. Informers are shared per resource, scope,
selectors and transform: two controllers watching pods in one cluster share one watch. A cluster
whose server is not trusted is given ``read_limits`` (what its answers may be, shared with other
such clusters) and a ``budget`` (what its informers may cache).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from .client import Client
from .config import ClusterConfig
from .informer import Informer
from .readlimits import CacheBudget, ReadLimits
from .resources import Resource

log = logging.getLogger(__name__)


class Cluster:
    def __init__(
        self,
        name: str,
        config: ClusterConfig,
        *,
        qps: float = 50.0,
        burst: int = 100,
        idle_timeout: float = 150.0,
        read_limits: ReadLimits | None = None,
        budget: CacheBudget | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.client = Client(
            config,
            name=name,
            qps=qps,
            burst=burst,
            read_limits=read_limits,
        )
        self.idle_timeout = idle_timeout
        self.budget = budget  # what its informers may cache, shared with other clusters or not
        self._informers: dict[tuple, Informer] = {}
        self._started = False

    def __repr__(self) -> str:
        return f"<Cluster {self.name} {self.config.server}>"

    @classmethod
    def from_kubeconfig(
        cls, name: str, path: str | None = None, context: str | None = None, **options: Any
    ) -> Cluster:
        """A kubeconfig context; the context defaults to the cluster's name."""
        return cls(name, ClusterConfig.from_kubeconfig(path, context or name), **options)

    @classmethod
    def from_kubeconfig_data(
        cls, name: str, data: str | bytes, context: str | None = None, **options: Any
    ) -> Cluster:
        """A kubeconfig held as text, e.g. in a Secret."""
        return cls(name, ClusterConfig.from_kubeconfig_data(data, context), **options)

    @classmethod
    def from_secret(
        cls,
        name: str,
        secret: dict,
        key: str = "config",
        context: str | None = None,
        **options: Any,
    ) -> Cluster:
        """A kubeconfig held in a Secret object (``data[key]``, base64 as the API returns it)."""
        return cls(name, ClusterConfig.from_secret(secret, key, context), **options)

    @classmethod
    def in_cluster(cls, name: str, **options: Any) -> Cluster:
        return cls(name, ClusterConfig.in_cluster(), **options)

    def informer(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Callable[[dict], dict] | None = None,
    ) -> Informer:
        """The shared informer for this resource and scope (created, and started if running)."""
        key = (resource, namespace, label_selector, field_selector, transform)
        informer = self._informers.get(key)
        if informer is None:
            informer = Informer(
                self.client,
                resource,
                namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                transform=transform,
                cluster=self.name,
                idle_timeout=self.idle_timeout,
                budget=self.budget,
            )
            self._informers[key] = informer
            if self._started:
                informer.start()
        return informer

    def forget_informer(self, informer: Informer) -> None:
        """No longer hand out ``informer`` (the next :meth:`informer` call for its scope makes
        a new one); stopping it is the caller's."""
        for key, known in list(self._informers.items()):
            if known is informer:
                del self._informers[key]

    async def remove_informer(self, informer: Informer) -> None:
        """Stop and forget an informer nobody needs any more (e.g. one per removed node)."""
        self.forget_informer(informer)
        await informer.stop()

    @property
    def informers(self) -> list[Informer]:
        return list(self._informers.values())

    def start(self) -> None:
        self._started = True
        for informer in self._informers.values():
            informer.start()

    async def stop(self) -> None:
        self._started = False
        await asyncio.gather(*(i.stop() for i in self._informers.values()))
        await self.client.close()

    @property
    def has_synced(self) -> bool:
        return all(i.has_synced for i in self._informers.values())

    async def wait_synced(self, timeout: float | None = None) -> bool:
        results = await asyncio.gather(*(i.wait_synced(timeout) for i in self._informers.values()))
        return all(results)

    def last_error(self) -> Exception | None:
        for informer in self._informers.values():
            if informer.last_error is not None:
                return informer.last_error
        return None
