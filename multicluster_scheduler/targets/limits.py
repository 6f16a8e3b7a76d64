"""What a tenant's Targets may cost the agent, and what the agent's Targets may cost it.

A namespaced Target is made by whoever may create Targets in one namespace, and may point at any
server. Each one becomes a Node and a Lease (cluster-scoped objects), connections, and caches of
what that server sends. So:

- at most ``max_per_namespace`` Targets of a namespace are connected, the oldest first
  (creationTimestamp, then name, the same answer on every agent after every restart); the others
  are ``TooManyTargets``, with no connection and no node, until one of those before them goes.
  ClusterTargets, made by cluster admins, are not counted;
- what the caches of a namespace's Targets hold together is at most ``cache_per_namespace``
  bytes (of JSON); each ClusterTarget has ``cache_per_cluster_target`` of its own;
- large answers of all targets are read a few at a time (:class:`multicluster.ReadLimits`);
- at most ``DEFAULT_SLOTS_PER_OWNER`` of a controller's reconciles wait on the targets of one
  namespace (or on one ClusterTarget) at once (:class:`TargetSlots`).

Self targets read the agent's own cluster through its own connection: none of this applies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from multicluster import CacheBudget, ReadLimits

MIB = 1 << 20
DEFAULT_MAX_PER_NAMESPACE = 10
DEFAULT_CACHE_PER_NAMESPACE = 32 * MIB
DEFAULT_CACHE_PER_CLUSTER_TARGET = 256 * MIB
DEFAULT_SLOTS_PER_OWNER = 2
TOO_MANY = "TooManyTargets"
CACHE_FULL = "CacheFull"


def admitted(targets: Iterable[dict], limit: int) -> set[str]:
    """Names of the Targets of one namespace that are connected: the ``limit`` oldest, by
    creationTimestamp, then name (the same answer on every agent, after every restart)."""
    ordered = sorted(
        targets,
        key=lambda t: (t["metadata"].get("creationTimestamp") or "", t["metadata"]["name"]),
    )
    return {t["metadata"]["name"] for t in ordered[:limit]}


def too_many_message(limit: int) -> str:
    """Why a Target is not connected: it comes after the namespace's first ``limit``."""
    where = (
        "(chart value targets.maxPerNamespace, agent flag --max-targets-per-namespace; "
        "ClusterTargets do not count)"
    )
    if limit == 0:
        return f"this cluster connects no namespaced Target {where}: ask for a ClusterTarget"
    return (
        f"this namespace has {limit} older Targets, the most this cluster connects per "
        f"namespace {where}: delete one of them and this one connects, or ask an "
        "administrator to raise the limit"
    )


def cache_full_message(namespace: str | None, error: Exception) -> str:
    """Why a target's objects are not all cached, and what raises the limit."""
    if namespace:
        raise_it = "chart value targets.cachePerNamespaceMiB, agent flag --target-cache-mib"
    else:
        raise_it = (
            "chart value targets.cachePerClusterTargetMiB, agent flag --cluster-target-cache-mib"
        )
    return f"the target sends more objects than this cluster caches for it ({raise_it}): {error}"


@dataclass
class TargetLimits:
    max_per_namespace: int = DEFAULT_MAX_PER_NAMESPACE
    cache_per_namespace: int = DEFAULT_CACHE_PER_NAMESPACE
    cache_per_cluster_target: int = DEFAULT_CACHE_PER_CLUSTER_TARGET
    read_limits: ReadLimits = field(default_factory=ReadLimits)
    _budgets: dict[str, CacheBudget] = field(default_factory=dict)

    def budget(self, name: str, namespace: str | None) -> CacheBudget:
        """What the caches of Target ``namespace/name`` (or ClusterTarget ``name``) may hold:
        a namespace's Targets share one budget."""
        if namespace:
            found = self._budgets.get(namespace)
            if found is None:
                found = self._budgets[namespace] = CacheBudget(
                    self.cache_per_namespace, f"the Targets of namespace {namespace}"
                )
            return found
        return CacheBudget(self.cache_per_cluster_target, f"ClusterTarget {name}")

    def cluster_options(self, name: str, namespace: str | None) -> dict:
        """Options of the connection to a target that is not this cluster."""
        return {"read_limits": self.read_limits, "budget": self.budget(name, namespace)}


def owner(name: str, namespace: str | None) -> str:
    """Who answers for a target's cost: its namespace for a Target (a tenant may make several),
    itself for a ClusterTarget."""
    return f"namespace/{namespace}" if namespace else f"clustertarget/{name}"


class TargetSlots:
    """Requests to targets under way for one controller, at most ``limit`` per owner.

    A target that answers nothing until each request times out would otherwise hold every
    worker of the controller with objects it names (copies it claims are ours, say), and every
    other tenant's objects would wait. With a slot per request, it holds ``limit`` workers at
    most; a reconcile that finds no slot free returns at once and tries again with backoff.
    """

    def __init__(self, limit: int = DEFAULT_SLOTS_PER_OWNER) -> None:
        self.limit = limit
        self._used: dict[str, int] = {}

    def busy(self, name: str, namespace: str | None) -> bool:
        return self._used.get(owner(name, namespace), 0) >= self.limit

    @contextlib.contextmanager
    def slot(self, name: str, namespace: str | None) -> Iterator[bool]:
        """Yields whether a slot was free (and is held until the block ends)."""
        key = owner(name, namespace)
        used = self._used.get(key, 0)
        if used >= self.limit:
            yield False
            return
        self._used[key] = used + 1
        try:
            yield True
        finally:
            left = self._used[key] - 1
            if left:
                self._used[key] = left
            else:
                del self._used[key]
