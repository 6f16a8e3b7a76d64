"""The whole contract of business logic: a Request in, a Result (or an exception) out.

A Request names an object by cluster, namespace and name; the reconciler reads the current
state (usually from informer caches) and moves the world towards the desired state. Retries,
backoff and concurrency belong to the controller, never to the reconciler.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol


class Request(NamedTuple):
    cluster: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return (
            f"{self.cluster}/{self.namespace}/{self.name}"
            if self.namespace
            else (f"{self.cluster}/{self.name}")
        )


def by_namespace(request: Request) -> str:
    """A Request's flow for fair queuing (:class:`~.workqueue.WorkQueue`): its namespace, so
    that no namespace's burst holds up another's work (cluster-scoped objects: one flow)."""
    return request.namespace


@dataclass(frozen=True)
class Result:
    """``requeue``: try again with backoff; ``requeue_after``: try again after that many seconds."""

    requeue: bool = False
    requeue_after: float = 0.0


class Reconciler(Protocol):
    """What a Controller calls: every controller of the product is an object of this shape."""

    async def reconcile(self, request: Request) -> Result | None: ...


ReconcileFunc = Callable[[Request], Awaitable["Result | None"]]


class Func:
    """A plain coroutine function as a :class:`Reconciler` (a short example, a test)."""

    def __init__(self, func: ReconcileFunc) -> None:
        self.func = func

    def __repr__(self) -> str:
        return f"<Func {getattr(self.func, '__qualname__', self.func)!r}>"

    async def reconcile(self, request: Request) -> Result | None:
        return await self.func(request)
