"""How many delegates the scheduler creates at once in the targets of one owner, and whose pods
go next when one of those creates ends.

A target slow to create delegates (or one that never answers) must not hold all of the
scheduler's workers: the targets of one owner (a namespace's Targets together, or one
ClusterTarget) get at most ``per_owner`` creates at once, and the pods that find them all taken
wait without a worker. A ClusterTarget serves every namespace, so one namespace's burst could
take all of its slots and queue the pods of every other namespace behind its own. So a
namespace holds at most ``per_namespace`` of one owner's slots (the others stay free for other
namespaces), and the pods waiting for a slot are let go one namespace after another, round
robin, first come first served within a namespace (docs/scheduling.md, "Sharing the
scheduler"). Every operation is O(1) per pod let go.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class _Waiting(Generic[K]):
    """Pods waiting for one owner's slots: by namespace, namespaces in turn."""

    def __init__(self) -> None:
        self.by_namespace: dict[str, dict[K, None]] = {}
        self.turns: deque[str] = deque()  # namespaces with pods waiting, next first

    def add(self, namespace: str, key: K) -> None:
        keys = self.by_namespace.get(namespace)
        if keys is None:
            keys = self.by_namespace[namespace] = {}
            self.turns.append(namespace)
        keys[key] = None

    def pop(self, namespace: str) -> K:
        keys = self.by_namespace[namespace]
        key = next(iter(keys))
        del keys[key]
        if not keys:
            del self.by_namespace[namespace]
        return key


class CreateSlots(Generic[K]):
    """Slots for creates, by owner of targets and by namespace; pods (``K``) waiting for them."""

    def __init__(self, per_owner: int, per_namespace: int) -> None:
        if per_owner < 1 or per_namespace < 1:
            raise ValueError("per_owner and per_namespace must be at least 1")
        self.per_owner = per_owner
        self.per_namespace = min(per_namespace, per_owner)
        self._creating: Counter[str] = Counter()
        self._mine: Counter[tuple[str, str]] = Counter()
        self._waiting: dict[str, _Waiting[K]] = {}

    def creating(self, owner: str, namespace: str | None = None) -> int:
        """Creates under way in ``owner``'s targets (of ``namespace``'s pods only, if given)."""
        if namespace is None:
            return self._creating[owner]
        return self._mine[(owner, namespace)]

    def take(self, owner: str, namespace: str) -> bool:
        """Take a slot for a pod of ``namespace`` if one is free to it."""
        if (
            self._creating[owner] >= self.per_owner
            or self._mine[(owner, namespace)] >= self.per_namespace
        ):
            return False
        self._creating[owner] += 1
        self._mine[(owner, namespace)] += 1
        return True

    def give_back(self, owner: str, namespace: str) -> None:
        """A create taken with :meth:`take` ended."""
        self._creating[owner] -= 1
        if self._creating[owner] <= 0:
            del self._creating[owner]
        mine = (owner, namespace)
        self._mine[mine] -= 1
        if self._mine[mine] <= 0:
            del self._mine[mine]

    def wait(self, owner: str, namespace: str, pod: K) -> None:
        """``pod`` found no slot free: it waits for :meth:`wake` (once, however often said)."""
        self._waiting.setdefault(owner, _Waiting()).add(namespace, pod)

    def waiting(self, owner: str) -> bool:
        return owner in self._waiting

    def wake(self, owner: str) -> list[K]:
        """The waiting pods that may go now, no longer waiting: as many as ``owner`` has slots
        free, namespaces in turn, none of a namespace beyond its free slots."""
        waiting = self._waiting.get(owner)
        if waiting is None:
            return []
        free = self.per_owner - self._creating[owner]
        woken: list[K] = []
        let_go: Counter[str] = Counter()
        skipped = 0  # namespaces in a row that could take no more
        turns = waiting.turns
        while free > 0 and turns and skipped < len(turns):
            namespace = turns.popleft()
            if self._mine[(owner, namespace)] + let_go[namespace] >= self.per_namespace:
                turns.append(namespace)
                skipped += 1
                continue
            skipped = 0
            woken.append(waiting.pop(namespace))
            let_go[namespace] += 1
            free -= 1
            if namespace in waiting.by_namespace:
                turns.append(namespace)
        if not turns:
            del self._waiting[owner]
        return woken
