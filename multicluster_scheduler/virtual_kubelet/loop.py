"""One loop per target owns its virtual node: creates it, renews its Lease every 10 s (so the
controller manager never declares it unreachable while the agent runs), writes its status when
the target's readiness or summary changes and at least every minute, and deletes it when the
target goes. Being the only writer of the node's status, it never fights another.

A change of the target's summary wakes the loop, but renews no Lease that is not due: with
dozens of Targets reaching one cluster, each change of its summary would otherwise be a Lease
write per Target."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from multicluster import ApiError, Client, Conflict, Informer, NotFound, Resource
from multicluster.informer import DELETED
from multicluster.kubetime import format_micro_time
from multicluster.resources import LEASES, NODES

from ..api import keys
from ..targets.registry import TargetConnection, TargetRegistry
from .node import node_labels, node_object, node_status, status_differs
from .pods import PodSync

log = logging.getLogger(__name__)
LEASE_NAMESPACE = "kube-node-lease"
CLUSTER_ROLES = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False
)
LEASE_DURATION = 40


def _micro_now() -> str:
    return format_micro_time()


@dataclass(frozen=True)
class NodeSettings:
    """What every virtual node of this agent says of itself: where its kubelet API answers
    (``address``, ``port``), the ``owner`` that takes it away with the release, and the
    kubelet ``features`` it announces (None: all)."""

    address: str
    port: int
    owner: dict | None = None
    features: list[str] | None = None


class NodeLoop:
    """One virtual node: created, its labels, status and Lease kept, and created again if it
    is deleted behind its back (``nodes``, the cache of nodes, says so at once)."""

    def __init__(
        self,
        client: Client,
        connection: TargetConnection,
        settings: NodeSettings,
        *,
        nodes: Informer | None = None,
        lease_interval: float = 10.0,
        status_interval: float = 60.0,
    ) -> None:
        self.client = client
        self.settings = settings
        self.owner = settings.owner
        self.nodes = nodes
        self.connection = connection
        self.name = connection.node_name
        self.lease_interval = lease_interval
        self.status_interval = status_interval
        self._node: dict | None = None
        self._lease: dict | None = None
        self._lease_renewed = 0.0  # time.monotonic() of the last renewal
        self._status_written = 0.0

    async def run(self) -> None:
        while True:
            try:
                await self._sync()
            except NotFound:
                self._node = self._lease = None  # deleted behind our back: recreate it
            except ApiError as e:
                log.warning("virtual node sync failed node=%s error=%s", self.name, e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.connection.changed.wait(), self._until_renewal())
            self.connection.changed.clear()

    def _until_renewal(self) -> float:
        """Seconds until the Lease is due (a tenth of the interval at least: a renewal that
        failed is tried again soon, not at once)."""
        due = self._lease_renewed + self.lease_interval - time.monotonic()
        return min(self.lease_interval, max(self.lease_interval / 10, due))

    def _lease_due(self) -> bool:
        return self._lease is None or (
            time.monotonic() - self._lease_renewed >= self.lease_interval
        )

    def _gone(self) -> bool:
        """Whether the node was deleted behind our back, as the cache of nodes says."""
        nodes = self.nodes
        return (
            nodes is not None
            and nodes.has_synced
            and nodes.last_error is None
            and nodes.get(self.name) is None
        )

    async def _sync(self) -> None:
        summary = self.connection.summary()
        if self._node is not None and self._gone():
            self._node = self._lease = None  # read again (the cache may only be behind)
        if self._node is None:
            try:
                self._node = await self.client.get(NODES, self.name)
            except NotFound:
                self._node = await self.client.create(
                    NODES,
                    node_object(
                        self.name,
                        self.connection.labels,
                        summary,
                        self.owner,
                        self.connection.excluded_labels,
                    ),
                )
                log.info("virtual node created node=%s", self.name)
        labels = node_labels(
            self.name, self.connection.labels, summary, self.connection.excluded_labels
        )
        meta = self._node["metadata"]
        patch: dict = {}
        current = meta.get("labels") or {}
        if current != labels:  # exactly these, as upstream: a label the summary dropped goes
            patch["labels"] = {**{k: None for k in current if k not in labels}, **labels}
        if self.owner and self.owner not in (meta.get("ownerReferences") or []):
            patch["ownerReferences"] = [self.owner]
        if patch:
            self._node = await self.client.patch(
                NODES, self.name, {"metadata": patch}, patch_type="strategic"
            )
        if self._lease_due():
            await self._renew_lease(meta["uid"])
        desired = node_status(
            summary,
            self.connection.ready,
            self.connection.reason,
            self.connection.message,
            address=self.settings.address,
            port=self.settings.port,
            previous=self._node.get("status"),
            features=self.settings.features,
        )
        due = time.monotonic() - self._status_written >= self.status_interval
        if due or status_differs(self._node.get("status"), desired):
            self._node = await self.client.patch(
                NODES,
                self.name,
                {"status": desired},
                patch_type="strategic",
                subresource="status",
            )
            self._status_written = time.monotonic()

    async def _renew_lease(self, node_uid: str) -> None:
        spec = {
            "holderIdentity": self.name,
            "leaseDurationSeconds": LEASE_DURATION,
            "renewTime": _micro_now(),
        }
        if self._lease is None:
            try:
                self._lease = await self.client.get(LEASES, self.name, LEASE_NAMESPACE)
            except NotFound:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": self.name,
                        "namespace": LEASE_NAMESPACE,
                        "ownerReferences": [
                            {
                                "apiVersion": "v1",
                                "kind": "Node",
                                "name": self.name,
                                "uid": node_uid,
                            }
                        ],
                    },
                    "spec": spec,
                }
                self._lease = await self.client.create(LEASES, body, LEASE_NAMESPACE)
                self._lease_renewed = time.monotonic()
                return
        self._lease["spec"] = {**(self._lease.get("spec") or {}), **spec}
        try:
            self._lease = await self.client.update(LEASES, self._lease)
            self._lease_renewed = time.monotonic()
        except Conflict:
            self._lease = None  # read it again next time
        except NotFound:  # gone with its node, maybe: both are read again next time
            self._node = self._lease = None

    async def delete(self) -> None:
        """Delete the node (its Lease goes with it: it is owned by the node)."""
        await self.client.delete(NODES, self.name, missing_ok=True)
        log.info("virtual node deleted node=%s", self.name)


class VirtualKubelet:
    """Starts a node loop for each target the registry adds; when the target goes, releases the
    proxy pods bound to its node, then removes the node."""

    def __init__(
        self,
        client: Client,
        registry: TargetRegistry,
        settings: NodeSettings,
        *,
        pods: PodSync | None = None,
        nodes: Informer | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.owner = settings.owner
        self.pods = pods
        self.nodes = nodes
        self.registry = registry
        self._loops: dict[str, tuple[NodeLoop, asyncio.Task]] = {}
        registry.on_added(self._added)
        registry.on_removed(self._removed)
        if nodes is not None:
            nodes.add_handler(self._node_event)

    def _node_event(self, event: str, node: dict, _old: dict | None, _initial: bool) -> None:
        """A node of ours deleted behind its loop's back: the loop makes it again now."""
        entry = self._loops.get(node["metadata"]["name"])
        if event == DELETED and entry is not None:
            entry[0].connection.changed.set()

    async def _added(self, connection: TargetConnection) -> None:
        loop = NodeLoop(self.client, connection, self.settings, nodes=self.nodes)
        task = asyncio.create_task(loop.run(), name=f"node-{connection.node_name}")
        self._loops[connection.node_name] = (loop, task)
        if self.pods is not None:
            self.pods.watch_node(connection.node_name)

    async def _removed(self, connection: TargetConnection) -> None:
        entry = self._loops.pop(connection.node_name, None)
        if entry is None:
            return
        if self.pods is not None:
            try:
                await self.pods.release(connection)
            except Exception:  # whatever its target answered, the node goes
                log.exception("target not released node=%s", connection.node_name)
            await self.pods.unwatch_node(connection.node_name)
        loop, task = entry
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        try:
            await loop.delete()
        except ApiError as e:
            log.warning("could not delete virtual node node=%s error=%s", loop.name, e)

    async def sweep(self, retry: float = 5.0) -> None:
        """Leader only, once per leadership: remove the virtual nodes of targets deleted while
        no agent led (nobody saw them go), after letting go of their proxy pods."""
        while (wanted := self.registry.target_nodes()) is None:
            await asyncio.sleep(0.5)
        while True:
            try:
                nodes, _ = await self.client.list(
                    NODES, label_selector=f"{keys.PROVIDER_KEY}={keys.PROVIDER}"
                )
                wanted = self.registry.target_nodes() or set()
                for node in nodes:
                    name = node["metadata"]["name"]
                    owners = node["metadata"].get("ownerReferences") or []
                    if name in wanted or name in self._loops:
                        continue
                    if not self.owner or self.owner.get("uid") not in {
                        o.get("uid") for o in owners
                    }:
                        continue  # not known to be ours (another installation's?)
                    if self.pods is not None:
                        await self.pods.release_node(name)
                    await self.client.delete(NODES, name, missing_ok=True)
                    log.info("virtual node of a target deleted meanwhile removed node=%s", name)
                return
            except ApiError as e:
                log.warning("virtual nodes not swept, retrying: %s", e)
                await asyncio.sleep(retry)

    async def stop(self) -> None:
        for _, task in self._loops.values():
            task.cancel()
        await asyncio.gather(*(t for _, t in self._loops.values()), return_exceptions=True)


async def release_owner(client: Client, cluster_role: str) -> dict | None:
    """An owner reference to the release's ClusterRole, or None (with a warning) without one."""
    try:
        role = await client.get(CLUSTER_ROLES, cluster_role)
    except ApiError as e:
        log.warning(
            "virtual nodes get no owner (they will outlive an uninstall): clusterrole %s: %s",
            cluster_role,
            e,
        )
        return None
    return {
        "apiVersion": CLUSTER_ROLES.api_version,
        "kind": CLUSTER_ROLES.kind,
        "name": cluster_role,
        "uid": role["metadata"]["uid"],
    }
