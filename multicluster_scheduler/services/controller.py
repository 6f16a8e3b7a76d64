"""The services controller (source side, leader only): Services reach delegates wherever they run.

Proxy pods never serve traffic. A Service of this cluster whose selector matches a proxy pod of
its namespace is *rerouted*: its selector is rewritten to the prefixed keys delegates carry and
it is made global (:mod:`..api.services` says exactly how). It is looked at again whenever it
changes (``kubectl apply`` of its manifest brings the old selector back: it is rerouted again)
and whenever a proxy pod appears or is relabelled in its namespace.

Only Services of namespaces labelled ``multicluster-scheduler=enabled`` are looked at: in any
other namespace a Service is neither rerouted nor copied (and copies it had are deleted), so
that a tenant of a namespace that never opted in writes nothing into targets through us.

Every global Service (rerouted, or annotated ``multicluster.admiralty.io/global=true`` by its
user) is copied to each connected target that serves its namespace, self targets excepted (the
Service is there already); :mod:`.copies` says how copies are kept, and deleted.
"""

from __future__ import annotations

import logging
from typing import Unpack

from multicluster import Cluster, EnqueueMapped, Request, Result, is_deleting
from multicluster.informer import ADDED, MODIFIED
from multicluster.resources import PODS, SERVICES

from ..api import services as services_api
from ..api.copies import is_copy
from ..api.proxy import PROXY_FIELD_SELECTOR, slim_proxy
from ..api.services import (
    is_external_name,
    is_global,
    no_prefix,
    reroute_patch,
    rerouted_selector,
    selects,
    service_reference,
    unprefixed_selector,
)
from ..targets.delegates import is_proxy
from ..targets.registry import TargetRegistry
from .copies import CopyKind
from .sync import CopySync, SyncOptions

log = logging.getLogger(__name__)
SERVICE_COPIES = CopyKind(SERVICES, services_api)


def _labels_changed(event: str, pod: dict, old: dict | None) -> bool:
    """Proxy pods matter when they appear or are relabelled (their status changes often)."""
    if event == ADDED:
        return True
    return (
        event == MODIFIED
        and old is not None
        and old["metadata"].get("labels") != pod["metadata"].get("labels")
    )


class ServiceSync(CopySync):
    def __init__(
        self, local: Cluster, registry: TargetRegistry, **options: Unpack[SyncOptions]
    ) -> None:
        super().__init__(
            SERVICE_COPIES,
            local,
            registry,
            to_copy=lambda service: (
                is_global(service)
                and not is_external_name(service)
                and self._eligible("", service, None)
            ),
            **options,
        )
        self.services = self.originals
        # The same informer as the scheduler's and the virtual kubelet's: one watch of proxies.
        self.proxies = self.controller.watch(
            local,
            PODS,
            field_selector=PROXY_FIELD_SELECTOR,
            transform=slim_proxy,
            predicates=[_labels_changed],
            handler=EnqueueMapped(self._services_selecting),
        )

    # -- what is looked at --------------------------------------------------------------------

    def _services_selecting(self, _cluster: str, pod: dict) -> list[Request]:
        meta = pod["metadata"]
        namespace = meta["namespace"]
        if namespace in self.excluded:
            return []
        labels = meta.get("labels") or {}
        return [
            self.copies.request(namespace, service["metadata"]["name"])
            for service in self.services.list(namespace)
            if not is_copy(service)
            and selects(
                unprefixed_selector((service.get("spec") or {}).get("selector") or {}), labels
            )
        ]

    # -- reconcile ----------------------------------------------------------------------------

    async def _keep_copies(self, namespace: str, name: str, service: dict | None) -> Result | None:
        enabled = self.enabled.get(namespace) is not None
        if service is not None and enabled and not is_deleting(service):
            service = await self._reroute(service)
            if service is None:
                return None  # deleted meanwhile: its event brings it back here
        wanted = service is not None and enabled and is_global(service)
        if service is not None and wanted and is_external_name(service):
            wanted = False
            self._say_not_copied(service)
        return await self.copies.reconcile(namespace, name, service, wanted)

    def _say_not_copied(self, service: dict) -> None:
        """A Warning on a global ExternalName Service (said again, it is counted)."""
        self.events.emit(
            service_reference(service),
            "Warning",
            "NotCopied",
            "an ExternalName Service is not copied to targets: it selects no pod, and its copy "
            "would send a target's traffic to whatever name it gives",
        )

    async def _reroute(self, service: dict) -> dict | None:
        meta = service["metadata"]
        proxies = [p for p in self.proxies.list(meta["namespace"]) if is_proxy(p)]
        try:
            patch = reroute_patch(service, (p["metadata"].get("labels") or {} for p in proxies))
        except ValueError as e:
            self.events.emit(
                service_reference(service),
                "Warning",
                "InvalidNoPrefixLabelRegexp",
                f"not rerouted: {e}",
            )
            return service
        if patch is None:
            return service
        before = (service.get("spec") or {}).get("selector") or {}
        unprefixed = no_prefix(service)
        updated = await self.copies.patch(service, patch)
        if updated is None:
            return None
        after = rerouted_selector(before, unprefixed)
        log.info(
            "service rerouted namespace=%s name=%s selector=%s rerouted=%s",
            meta["namespace"],
            meta["name"],
            before,
            after,
        )
        self.events.emit(
            service_reference(updated),
            "Normal",
            "Rerouted",
            f"selector {_show(unprefixed_selector(before))} selects proxy pods: rewritten to "
            f"{_show(after)} to select their delegates, and the service made global",
        )
        return updated


def _show(selector: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
