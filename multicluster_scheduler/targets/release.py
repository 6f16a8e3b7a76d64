"""How a proxy pod ends, in one place: its delegates are deleted, then it is let go.

A proxy pod carries our finalizer so that its delegates are deleted before it disappears. The
ways it ends all come here, whoever notices them first:

- it is deleted (by its owner, by hand): its delegates go first, then our finalizer
  (:meth:`ProxyRelease.finalize`, for a pod being placed by the scheduler and for one bound to a
  virtual node alike);
- its delegate was deleted in the target: the proxy pod is deleted so that its owner replaces it
  (:meth:`ProxyRelease.lost`);
- its target has been away past its failover setting, or is deleted: the proxy pod is let go
  (finalizer removed, pod deleted, as the node lifecycle controller evicts pods from a lost node)
  and its delegates are deleted while they can be (:meth:`ProxyRelease.fail_over`,
  :meth:`ProxyRelease.release_target`);
- a delegate is found in a target it is not placed in: that duplicate is deleted
  (:meth:`ProxyRelease.delete_duplicates`).

Nothing here retries: a step that is not done says so, and the caller's reconcile is retried by
its controller's queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from itertools import repeat

from multicluster import ApiError, Cluster, Conflict, NotFound, Result, Unreachable
from multicluster.events import EventRecorder
from multicluster.gc import remove_finalizer
from multicluster.kubetime import format_time
from multicluster.resources import PODS

from ..api import keys
from ..api.proxy import (
    DELEGATE_LABEL_SELECTOR,
    is_deleting,
    looks_like_delegate,
    parent_uid,
    pod_reference,
    stopped_status,
)
from .delegates import DelegateLookup
from .registry import TargetConnection

log = logging.getLogger(__name__)
RECHECK = 5.0
RELEASE_TIMEOUT = 5.0
RELEASE_CONCURRENCY = 32
RELEASE_PER_DELEGATE = 0.05
RELEASE_CEILING = 60.0
RELEASE_LISTED = 5000  # pods listed from a target that goes, beyond twice what its cache holds
FAILOVER_REASON = "TargetFailover"


class TooMany(Exception):
    """A target listed more pods than it could hold of ours."""


async def delete_delegate(connection: TargetConnection, delegate: dict, why: str) -> None:
    """Delete a delegate. One in a target away past its failover setting is left for when the
    target is back (its proxy pod is placed elsewhere or gone by then, and the orphan controller
    deletes it): waiting would hold the pod for as long as the target stays away."""
    try:
        await connection.delete_delegate(delegate, why)
    except Unreachable:
        if connection.failover_in() != 0:
            raise
        log.info(
            "delegate left in failed-over target for when it is back namespace=%s name=%s "
            "target=%s reason=%r",
            delegate["metadata"].get("namespace"),
            delegate["metadata"].get("name"),
            connection.node_name,
            why,
        )


class ProxyRelease:
    def __init__(self, local: Cluster, lookup: DelegateLookup, events: EventRecorder) -> None:
        self.local = local
        self.lookup = lookup
        self.registry = lookup.registry
        self.cluster_name = lookup.cluster_name
        self.events = events

    # -- delegates ----------------------------------------------------------------------------

    async def delete_duplicates(
        self, proxy: dict, connection: TargetConnection
    ) -> Exception | None:
        """Delete the delegates of ``proxy`` in targets other than ``connection``, where it is
        placed. A target that cannot be reached does not hold the pod: its error is returned
        for a retry after the pod is served, and one away past its failover setting is left
        alone (the orphan controller deletes the duplicate once it is back)."""
        namespace = proxy["metadata"]["namespace"]
        failed: Exception | None = None
        for other in self.registry.connections.values():
            if other is connection:
                continue
            live = [d for d in self.lookup.in_target(proxy, other) if not is_deleting(d)]
            if not live or other.same_place(connection, namespace):
                continue  # another Target of the same cluster and namespace sees the same pods
            for delegate in live:
                try:
                    await delete_delegate(
                        other, delegate, "its proxy pod is bound to another target"
                    )
                except ApiError as e:
                    failed = failed or e
        return failed

    # -- a proxy pod being deleted ------------------------------------------------------------

    async def finalize(
        self,
        proxy: dict,
        found: Iterable[tuple[TargetConnection, dict]],
        *,
        watched: TargetConnection | None = None,
        recheck: float = RECHECK,
    ) -> Result | None:
        """``proxy`` is being deleted: delete its delegates (``found``), and once none is left
        (those in a target away past its failover setting are not waited for), remove our
        finalizer. ``watched``: a target where a delegate may be that its cache has not seen
        yet (the one the pod is bound to): the finalizer stays until that cache is synced.
        While it waits, the pod is looked at again after ``recheck`` seconds."""
        found = list(found)
        for connection, delegate in found:
            if not is_deleting(delegate):
                await delete_delegate(connection, delegate, "its proxy pod is deleted")
        if any(connection.failover_in() != 0 for connection, _ in found):
            return Result(requeue_after=recheck)  # the delete events requeue it sooner
        if watched is not None and not watched.delegates_synced:
            return Result(requeue_after=recheck)  # a delegate may still run there
        proxy = await self._stop(proxy)
        await remove_finalizer(self.local.client, PODS, proxy, keys.FINALIZER)
        return None

    async def _stop(self, proxy: dict) -> dict:
        """Write the status a kubelet leaves on a pod it stopped, when others wait for it
        (:func:`~multicluster_scheduler.api.proxy.stopped_status`); the pod as it is then."""
        status = stopped_status(proxy, format_time())
        if status is None:
            return proxy
        meta = proxy["metadata"]
        try:
            return await self.local.client.patch(
                PODS,
                meta["name"],
                # As the cache has it (no namesake of a later day): a Conflict is retried.
                {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status},
                meta["namespace"],
                patch_type="strategic",
                subresource="status",
            )
        except NotFound:
            return proxy  # gone: removing the finalizer finds as much

    async def let_go(self, proxy: dict) -> bool:
        """Remove our finalizer and delete the proxy pod (a fresh copy is read once when the
        cached one is behind); whether it is done. A pod that another finalizer holds ends
        Failed first, as Kubernetes' pod garbage collector leaves the pods of a lost node."""
        meta = proxy["metadata"]
        for _ in range(2):
            try:
                proxy = await self._stop(proxy)
                if await remove_finalizer(self.local.client, PODS, proxy, keys.FINALIZER) is None:
                    return True  # gone
                await self.local.client.delete(
                    PODS,
                    meta["name"],
                    meta["namespace"],
                    missing_ok=True,
                    grace_period_seconds=0,
                    preconditions={"uid": meta["uid"]},
                )
                return True
            except Conflict:
                try:
                    proxy = await self.local.client.get(PODS, meta["name"], meta["namespace"])
                except NotFound:
                    return True
                if proxy["metadata"].get("uid") != meta["uid"]:
                    return True  # a namesake
            except ApiError as e:
                log.warning(
                    "proxy pod not released namespace=%s name=%s: %s",
                    meta["namespace"],
                    meta["name"],
                    e,
                )
                return False
        return False

    # -- a delegate gone, a target away -------------------------------------------------------

    async def lost(self, proxy: dict, connection: TargetConnection) -> None:
        """Its delegate was deleted in the target (by hand, a drain there, its garbage
        collector): the proxy pod is deleted, as Admiralty does, so that its owner replaces it
        and no Failed pod is left behind. Its finalizer goes on the next pass (no delegate)."""
        meta = proxy["metadata"]
        message = (
            f"the delegate of this pod in target {connection.name} was deleted outside "
            "multicluster-scheduler; this pod is deleted so that its owner replaces it"
        )
        self.events.emit(pod_reference(proxy), "Warning", "DelegateLost", message)
        try:
            await self.local.client.delete(
                PODS, meta["name"], meta["namespace"], preconditions={"uid": meta["uid"]}
            )
        except (NotFound, Conflict):
            return  # gone already, or another pod of that name now
        log.info(
            "delegate lost, proxy pod deleted namespace=%s proxy=%s target=%s",
            meta["namespace"],
            meta["name"],
            connection.node_name,
        )

    async def fail_over(self, proxy: dict, connection: TargetConnection) -> bool:
        """Release ``proxy`` from a target away past its failover setting; whether done."""
        meta = proxy["metadata"]
        message = (
            f"target {connection.name} has not been Ready for {connection.failover_after:g}s "
            f"(its failoverAfterSeconds) ({connection.reason}: {connection.message}); this pod "
            "is released so that its owner replaces it elsewhere; its delegate there is "
            "deleted when the target is back"
        )
        if not is_deleting(proxy):
            self.events.emit(pod_reference(proxy), "Warning", FAILOVER_REASON, message)
        if connection.delegates_synced:  # reachable but not Ready (a summary missing, say)
            with contextlib.suppress(ApiError, TimeoutError):
                async with asyncio.timeout(RELEASE_TIMEOUT):
                    for delegate in self.lookup.in_target(proxy, connection):
                        if not is_deleting(delegate):
                            await connection.delete_delegate(delegate, "its target failed over")
        if not await self.let_go(proxy):
            return False
        log.info(
            "proxy pod released namespace=%s name=%s target=%s reason=failover",
            meta["namespace"],
            meta["name"],
            connection.node_name,
        )
        return True

    # -- a target deleted ---------------------------------------------------------------------

    async def release_target(self, connection: TargetConnection, proxies: list[dict]) -> None:
        """The target is deleted: delete its delegates while we still can (all at once, within
        ``RELEASE_TIMEOUT``), and let go of ``proxies``, the proxy pods bound to its node, so
        that owners replace them."""
        delegates = await self._left_in(connection)
        limit = asyncio.Semaphore(RELEASE_CONCURRENCY)

        async def delete(delegate: dict) -> None:
            async with limit:
                await connection.delete_delegate(delegate, "its target is deleted")

        try:
            # Enough time for the work (a target may hold thousands), not forever if it is away,
            # and a ceiling: a hostile target's answers must not hold the removal for hours.
            async with asyncio.timeout(
                min(RELEASE_TIMEOUT + RELEASE_PER_DELEGATE * len(delegates), RELEASE_CEILING)
            ):
                results = await asyncio.gather(
                    *(delete(d) for d in delegates), return_exceptions=True
                )
        except TimeoutError as e:
            results = [e]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            log.warning(
                "delegates not all deleted with their target target=%s failed=%d error=%s",
                connection.node_name,
                len(failed),
                failed[0],
            )
        await self.let_go_all(proxies)

    async def let_go_all(self, proxies: list[dict]) -> None:
        """Let go of many proxy pods at once (those of a node that goes)."""
        limit = asyncio.Semaphore(RELEASE_CONCURRENCY)

        async def let_go(proxy: dict) -> None:
            async with limit:
                await self.let_go(proxy)

        await asyncio.gather(*(let_go(p) for p in proxies))

    async def _left_in(self, connection: TargetConnection) -> list[dict]:
        """Our delegates in a target that goes, but those of proxy pods placed in another Target
        of the same place. They are listed from its API server: the cache may not have seen the
        last ones created (the scheduler has waited for its creates under way to end). What a
        target answers is not trusted: pages are read one at a time, only the names of what
        qualifies are kept, and past a count the cache can explain, the cache is used."""
        if connection.cluster is None:
            return []
        cached = connection.delegates.list() if connection.delegates is not None else []
        most = RELEASE_LISTED + 2 * len(cached)
        left: list[dict] = []
        seen = 0
        try:
            async with asyncio.timeout(RELEASE_TIMEOUT):
                async for page in connection.cluster.client.list_pages(
                    PODS, connection.namespace, label_selector=DELEGATE_LABEL_SELECTOR
                ):
                    items = page.get("items") or ()
                    seen += len(items)
                    if seen > most:
                        raise TooMany(f"over {most} pods listed")
                    left.extend(d for d in map(self._leftover, items, repeat(connection)) if d)
                    del page, items
        except (ApiError, TimeoutError, TooMany) as e:  # away, paused, or not an API server
            log.warning(
                "delegates of a removed target not listed, using the cache target=%s error=%s",
                connection.node_name,
                e or "no answer",
            )
            left = [d for d in map(self._leftover, cached, repeat(connection)) if d]
        return left

    def _leftover(self, pod: object, connection: TargetConnection) -> dict | None:
        """The name and uid of ``pod`` if it is a delegate of ours to delete with its target."""
        meta = pod.get("metadata") if type(pod) is dict else None
        if type(meta) is not dict:
            return None
        try:
            namespace = meta.get("namespace") or ""
            if (
                meta.get("deletionTimestamp")
                or not connection.allows(namespace)
                or not looks_like_delegate(pod, self.cluster_name)  # type: ignore[arg-type]
            ):
                return None
            proxy = self.lookup.proxy(parent_uid(pod))  # type: ignore[arg-type]
        except (AttributeError, TypeError):
            return None  # fields of the wrong types: not ours
        home = self.lookup.home(proxy) if proxy is not None else None
        if home is not None and home.same_place(connection, namespace):
            return None  # seen through another Target of that cluster, where it stays
        return {"metadata": {"name": meta["name"], "namespace": namespace, "uid": meta.get("uid")}}
