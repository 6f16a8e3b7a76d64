"""The controller both the services and the ingresses controllers are: one that copies this
cluster's objects of one kind to its targets.

Both look only at objects outside kube-system and the namespaces the agent is told to leave
alone, never at copies that another source made here, and only once their caches are filled;
both leave the copies themselves to :class:`.copies.TargetCopies`. What a kind says is which
of its objects are copied now, and what else makes one be looked at again.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Required, TypedDict, Unpack

from multicluster import Cluster, Conflict, Controller, Request, Result
from multicluster.events import EventRecorder
from multicluster.informer import strip_managed_fields

from ..api.copies import is_copy
from ..targets.delegates import enabled_namespaces
from ..targets.registry import TargetRegistry
from .copies import LOOK_AGAIN, CopyKind, TargetCopies

NEVER_TOUCHED = ("kube-system",)
WORKERS = 8


class SyncOptions(TypedDict, total=False):
    """How a copying controller is set up: ``cluster_name``, this cluster's name as its copies
    give it; ``excluded_namespaces``, left alone as kube-system is; ``workers``
    (:data:`WORKERS` by default)."""

    cluster_name: Required[str]
    excluded_namespaces: tuple[str, ...]
    workers: int


class CopySync(abc.ABC):
    """Copies of this cluster's objects of ``kind`` (its "originals") in the targets of
    ``registry``; ``to_copy`` says whether a cached original is to be copied now (resyncs ask
    it). The controller and its events are named after the kind's plural (``services``,
    ``admiralty-services``)."""

    def __init__(
        self,
        kind: CopyKind,
        local: Cluster,
        registry: TargetRegistry,
        *,
        to_copy: Callable[[dict], bool],
        **options: Unpack[SyncOptions],
    ) -> None:
        plural = kind.resource.plural
        self.local = local
        self.excluded = frozenset((*NEVER_TOUCHED, *options.get("excluded_namespaces", ())))
        self.events = EventRecorder(local.client, f"admiralty-{plural}")
        self.controller = Controller(plural, self, workers=options.get("workers", WORKERS))
        self.originals = self.controller.watch(
            local, kind.resource, transform=strip_managed_fields, predicates=[self._eligible]
        )
        self.enabled = enabled_namespaces(local)
        self.copies = TargetCopies(
            kind,
            local,
            registry,
            self.controller.queue,
            cluster_name=options["cluster_name"],
            originals=self.originals,
            to_copy=to_copy,
            events=self.events,
        )
        self.enabled.add_handler(self.copies.namespace_changed)

    def _eligible(self, _event: str, original: dict, _old: dict | None) -> bool:
        return original["metadata"].get("namespace") not in self.excluded and not is_copy(original)

    def _synced(self) -> bool:
        """Whether the caches a decision reads are filled."""
        return self.originals.has_synced and self.enabled.has_synced

    async def reconcile(self, request: Request) -> Result | None:
        try:
            return await self._reconcile(request.namespace, request.name)
        except Conflict:
            # Our cache was behind the original: the event that says so brings it back here.
            return Result(requeue_after=LOOK_AGAIN)

    async def _reconcile(self, namespace: str, name: str) -> Result | None:
        if namespace in self.excluded:
            return None
        if not self._synced():
            return Result(requeue_after=LOOK_AGAIN)
        original = self.originals.get(name, namespace)
        if original is not None and is_copy(original):
            return None
        return await self._keep_copies(namespace, name, original)

    @abc.abstractmethod
    async def _keep_copies(self, namespace: str, name: str, original: dict | None) -> Result | None:
        """The kind's part of a reconcile: whether ``original`` (None once it is gone) is to be
        copied now, then its copies kept so (:meth:`.copies.TargetCopies.reconcile`)."""
