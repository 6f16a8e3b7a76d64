"""One-off API calls from a workstation to the clusters of kubeconfig contexts.

The runtime's client does the talking; this module adds what a command needs around it: a
context opened by name, every call labelled with what it does (so an error says which step, in
which cluster, failed), and kubectl's create-or-update with its words (created, configured,
unchanged) done by server-side apply, so running a command twice changes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from multicluster import ApiError, Client, ClusterConfig, ConfigError, NotFound, Resource

from ..api.keys import GROUP
from .kubeconfig import ContextCluster, context_cluster, load_kubeconfig
from .problems import ConnectError, explain

FIELD_MANAGER = "multicluster-scheduler"
REQUEST_TIMEOUT = 15.0
POLL_INTERVAL = 0.25

T = TypeVar("T")


@dataclass
class Context:
    """A kubeconfig context opened for API calls."""

    name: str
    cluster: ContextCluster
    client: Client

    async def call(
        self, doing: str, request: Awaitable[T], *, resource: Resource | None = None
    ) -> T:
        """Await ``request``; an API error becomes a ConnectError that says what to fix."""
        try:
            return await request
        except ApiError as e:
            kind = resource.kind if resource is not None and resource.group == GROUP else None
            raise ConnectError(
                explain(
                    e,
                    doing=doing,
                    context=self.name,
                    server=self.cluster.server,
                    installed_kind=kind,
                )
            ) from e

    async def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict | None:
        """The object, or None when it does not exist."""
        where = f"{namespace}/{name}" if namespace else name
        try:
            return await self.call(
                f"read {resource.kind} {where}",
                self.client.get(resource, name, namespace),
                resource=resource,
            )
        except ConnectError as e:
            # A missing object names itself in the details; a missing kind does not.
            cause = e.__cause__
            if isinstance(cause, NotFound) and (cause.body.get("details") or {}).get("name"):
                return None
            raise

    async def delete(
        self, resource: Resource, name: str, namespace: str | None = None, uid: str | None = None
    ) -> bool:
        """Delete the object (only the one of ``uid``, when given); False when it was gone."""
        where = f"{namespace}/{name}" if namespace else name
        preconditions = {"uid": uid} if uid else None
        try:
            await self.call(
                f"delete {resource.kind} {where}",
                self.client.delete(resource, name, namespace, preconditions=preconditions),
                resource=resource,
            )
        except ConnectError as e:
            cause = e.__cause__
            if isinstance(cause, NotFound) and (cause.body.get("details") or {}).get("name"):
                return False
            raise
        return True

    async def apply(self, resource: Resource, manifest: dict) -> tuple[dict, str]:
        """Create or update ``manifest`` by server-side apply; returns the object and what
        happened: ``created``, ``configured`` or ``unchanged``."""
        meta = manifest["metadata"]
        namespace = meta.get("namespace")
        where = f"{namespace}/{meta['name']}" if namespace else meta["name"]
        before = await self.get(resource, meta["name"], namespace)
        after = await self.call(
            f"apply {resource.kind} {where}",
            self.client.patch(
                resource,
                meta["name"],
                manifest,
                namespace,
                patch_type="apply",
                field_manager=FIELD_MANAGER,
                force=True,
            ),
            resource=resource,
        )
        if before is None:
            return after, "created"
        # Not the resourceVersion: a controller may have written the status meanwhile.
        return after, "unchanged" if _content(before) == _content(after) else "configured"


def _content(obj: dict) -> dict:
    """What an apply may change: everything but the status and server-kept metadata."""
    meta = obj.get("metadata") or {}
    return {
        **{k: v for k, v in obj.items() if k not in ("metadata", "status")},
        "labels": meta.get("labels") or {},
        "annotations": meta.get("annotations") or {},
    }


def read_context(
    kubeconfig: str | None, context: str | None
) -> tuple[ContextCluster, ClusterConfig]:
    """What a context says about its cluster, and how to call it; a kubeconfig that cannot be
    used, whatever is wrong in it, is a ConnectError."""
    cluster = context_cluster(load_kubeconfig(kubeconfig), context)
    try:
        return cluster, ClusterConfig.from_kubeconfig(kubeconfig, cluster.context)
    except ConfigError as e:
        raise ConnectError(str(e)) from e
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        # What the kubernetes package's loader lets through (e.g. a user entry of the wrong shape).
        raise ConnectError(
            f"kubeconfig context {cluster.context}: cannot use its user or cluster: {e!r}"
        ) from e


@asynccontextmanager
async def open_context(kubeconfig: str | None, context: str | None) -> AsyncIterator[Context]:
    """A context of the local kubeconfig (default: the current one), closed afterwards."""
    cluster, config = read_context(kubeconfig, context)
    client = Client(config, name=cluster.context, timeout=REQUEST_TIMEOUT)
    try:
        yield Context(cluster.context, cluster, client)
    finally:
        await client.close()


async def poll(
    check: Callable[[], Awaitable[T | None]], timeout: float, interval: float = POLL_INTERVAL
) -> T | None:
    """Call ``check`` until it returns something other than None, for at most ``timeout``
    seconds (at least once); the last result otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result is not None or time.monotonic() >= deadline:
            return result
        await asyncio.sleep(min(interval, max(0.0, deadline - time.monotonic())))
