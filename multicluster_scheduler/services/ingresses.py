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
never copied again. An Ingress with an annotation the agent refuses (raw configuration of an
ingress controller, URLs it would call, a Secret of another namespace:
:func:`..api.ingresses.refused_annotations`) is not copied, and a Warning event on it says why.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Unpack

from multicluster import Cluster, EnqueueMapped, Request, Result
from multicluster.informer import ADDED, DELETED, MODIFIED, strip_managed_fields
from multicluster.resources import INGRESSES, SERVICES

from ..api import ingresses as ingresses_api
from ..api.ingresses import (
    backend_services,
    follows,
    ingress_reference,
    refused_annotations,
)
from ..api.services import is_global
from ..targets.registry import TargetRegistry
from .copies import CopyKind
from .sync import CopySync, SyncOptions

BACKEND_INDEX = "backend-services"
INGRESS_COPIES = CopyKind(INGRESSES, ingresses_api)


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
        refused: re.Pattern[str] | None = None,
        **options: Unpack[SyncOptions],
    ) -> None:
        self.refused = refused
        super().__init__(INGRESS_COPIES, local, registry, to_copy=self._follows, **options)
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
        return self._routes_to_global(ingress) and not refused_annotations(ingress, self.refused)

    def _say_refused(self, ingress: dict | None, routes: bool) -> None:
        """A Warning on an Ingress that would follow but for refused annotations (said again,
        it is counted; other annotations refused, another Warning)."""
        if ingress is None:
            return
        refused = refused_annotations(ingress, self.refused) if routes else []
        if not refused:
            return
        self.events.emit(
            ingress_reference(ingress),
            "Warning",
            "AnnotationRefused",
            f"not copied to targets: annotation {', '.join(refused)} would configure the "
            "ingress controllers of target clusters beyond routing to this namespace's "
            "Services (refused by chart value ingresses.refusedAnnotations, agent flag "
            "--ingress-refused-annotations; a Secret of another namespace is always refused)",
        )

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
        self._say_refused(ingress, routes)
        wanted = routes and ingress is not None and not refused_annotations(ingress, self.refused)
        return await self.copies.reconcile(namespace, name, ingress, wanted)
