"""The ingresses controller (source side, leader only): Ingresses follow the global Services they
route to.

An Ingress of this cluster whose HTTP paths send traffic to a global Service of its namespace
(:func:`..api.ingresses.follows`) is copied, as the Service is, to each connected target that
serves its namespace, self targets excepted; while it is, it carries our finalizer and
``multicluster.admiralty.io/global: "true"``. :mod:`.copies` says how copies are kept, and
deleted: with the Ingress, and also (unlike upstream, which leaves them) when it stops naming a
global Service.

An Ingress is looked at when it changes, when one of its copies changes in a target, and when a
Service it names becomes global or stops being global, appears or goes (Ingresses are indexed
by the Services they name). As for Services, only Ingresses of namespaces labelled
``multicluster-scheduler=enabled`` are copied: a tenant of a namespace that never opted in
writes nothing into targets through us. Copies made by another source (``is-delegate``) are
never copied again. An Ingress that carries what the operator does not allow into targets (an
annotation, a class, a host: :func:`..api.ingresses.refusals` under the chart's
:class:`..api.ingresses.IngressPolicy`) is not copied, its copies are deleted, and Warning
events on it say what was refused and which chart value would allow it; once it is allowed, by
a change of the Ingress or of the policy (the agent looks at every Ingress when it starts), it
is copied again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Unpack

from multicluster import Cluster, EnqueueMapped, Request, Result
from multicluster.informer import ADDED, DELETED, MODIFIED, strip_managed_fields
from multicluster.resources import INGRESSES, SERVICES

from ..api.ingresses import (
    IngressCopyRules,
    IngressPolicy,
    Refusal,
    backend_services,
    follows,
    ingress_reference,
    refusal_messages,
    refusals,
)
from ..api.services import is_global
from ..targets.registry import TargetRegistry
from .copies import CopyKind
from .sync import CopySync, SyncOptions

BACKEND_INDEX = "backend-services"


def by_backend_service(ingress: dict) -> Iterable[str]:
    """``namespace/name`` of each Service an Ingress sends traffic to."""
    namespace = ingress["metadata"].get("namespace")
    return [f"{namespace}/{name}" for name in backend_services(ingress)]


def global_changed(event: str, service: dict, old: dict | None) -> bool:
    """Services matter to Ingresses when a global one appears or goes, or one becomes global or
    stops being global."""
    if event in (ADDED, DELETED):
        return is_global(service)
    return event == MODIFIED and old is not None and is_global(old) != is_global(service)


class IngressSync(CopySync):
    def __init__(
        self,
        local: Cluster,
        registry: TargetRegistry,
        *,
        policy: IngressPolicy | None = None,
        **options: Unpack[SyncOptions],
    ) -> None:
        self.policy = policy if policy is not None else IngressPolicy()
        kind = CopyKind(INGRESSES, IngressCopyRules(self.policy))
        super().__init__(kind, local, registry, to_copy=self._follows, **options)
        self.ingresses = self.originals
        self.ingresses.add_indexer(BACKEND_INDEX, by_backend_service)
        # The same informer as the services controller's: one watch of Services.
        self.services = self.controller.watch(
            local,
            SERVICES,
            transform=strip_managed_fields,
            predicates=[global_changed],
            handler=EnqueueMapped(self._ingresses_naming),
        )

    # -- what is looked at --------------------------------------------------------------------

    def _routes_to_global(self, ingress: dict) -> bool:
        namespace = ingress["metadata"]["namespace"]
        return self._eligible("", ingress, None) and follows(
            ingress, lambda name: self.services.get(name, namespace)
        )

    def _follows(self, ingress: dict) -> bool:
        return self._routes_to_global(ingress) and not refusals(ingress, self.policy)

    def _say_refused(self, ingress: dict, found: list[Refusal]) -> None:
        """Warnings on an Ingress that would follow but for what it carries, one per rule that
        refused (said again, they are counted; something else refused, another Warning)."""
        reference = ingress_reference(ingress)
        for reason, message in refusal_messages(found, self.policy):
            self.events.emit(reference, "Warning", reason, message)

    def _ingresses_naming(self, _cluster: str, service: dict) -> list[Request]:
        meta = service["metadata"]
        namespace = meta["namespace"]
        if namespace in self.excluded:
            return []
        return [
            self.copies.request(namespace, ingress["metadata"]["name"])
            for ingress in self.ingresses.by_index(BACKEND_INDEX, f"{namespace}/{meta['name']}")
        ]

    # -- reconcile ----------------------------------------------------------------------------

    def _synced(self) -> bool:
        return super()._synced() and self.services.has_synced

    async def _keep_copies(self, namespace: str, name: str, ingress: dict | None) -> Result | None:
        routes = (
            ingress is not None
            and self.enabled.get(namespace) is not None
            and self._routes_to_global(ingress)
        )
        wanted = False
        if routes and ingress is not None:
            found = refusals(ingress, self.policy)
            self._say_refused(ingress, found)
            wanted = not found
        return await self.copies.reconcile(namespace, name, ingress, wanted)
