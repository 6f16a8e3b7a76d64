"""A source's heartbeats in its targets (source side, leader only): in each namespace of each
connected target where this cluster places delegates, its ``SourceHeartbeat`` is renewed every
:data:`..api.keepalive.HEARTBEAT_PERIOD` seconds and lists the delegates this cluster created
there, so that the target's agent can tell a source that is away (and keep those delegates
alive) from one that is there (and decides itself what becomes of a deleted delegate).
:mod:`..api.keepalive` says why and how.

The list is this cluster's record of what it created: a delegate's name and uid are added
from the target's answer to its creation (:meth:`SourceHeartbeat.created`, called by the
scheduler, which binds the proxy pod once it returns), never from what the target lists, so a
pod someone else made there is never in it. An entry goes when its pod is no longer in the
target (a delegate deleted, or recreated with a new uid). All writes to one heartbeat go through
one request at a time: renewals, additions and removals waiting meanwhile are merged into the
next (a JSON merge patch: ``renewTime``, ``writer`` and the entries that change). After a
restart, the first write reads the heartbeat back; entries of a heartbeat this cluster did not
write last are removed.

The namespaces: a namespaced Target's own; for a ClusterTarget, those where it created or
holds delegates, and for :data:`LINGER` seconds after the last one there went (so that the
target sees this cluster there after it deleted them itself), then the heartbeat is deleted.
Self targets need none (the source is the target). A target whose chart predates
SourceHeartbeats answers 403 or 404: its delegates are simply not kept alive while this cluster
is away, as before, and the agent says so once. When a Target is deleted, its heartbeats are
deleted before its delegates.

The previous release's heartbeats were Leases: in each namespace it renews, this cluster deletes
its own Lease once, so that a target's agent of that release sees no heartbeat (keeping alive
off) rather than one no longer renewed (a source away for good, whose deleted delegates it
would recreate).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from multicluster import ApiError, Cluster, Forbidden, NamespaceTerminating, NotFound
from multicluster.errors import Invalid
from multicluster.kubetime import format_micro_time
from multicluster.resources import LEASES

from ..api.keepalive import (
    AWAY,
    HEARTBEAT_PERIOD,
    MAX_DELEGATES,
    heartbeat_name,
    heartbeat_object,
    read_heartbeat,
)
from ..api.proxy import parent_cluster
from ..api.resources import SOURCE_HEARTBEATS
from .controller import identity_of
from .registry import TargetConnection, TargetRegistry

log = logging.getLogger(__name__)
RENEW_TIMEOUT = 5.0  # one write (with the read that may come before)
BEAT_TIMEOUT = 15.0  # all of one target's renewals (then its deletions)
REMOVAL_TIMEOUT = 10.0
RECORD_TIMEOUT = 5.0  # how long a delegate's placement waits for it to be listed
PRUNE_AFTER = 30.0  # a listed delegate not in the target's cache this long is no longer listed
CONCURRENCY = 8  # requests at once to one target
LINGER = AWAY + 2 * HEARTBEAT_PERIOD  # a namespace's heartbeat outlives its last delegate
MAX_NAMESPACES = 1000  # heartbeats per ClusterTarget: each is a write every period


def _micro_now() -> str:
    return format_micro_time()


class NoIdentity(ApiError):
    """The target does not say who this cluster is there: a heartbeat names its writer."""


class Unsupported(ApiError):
    """The target has no SourceHeartbeats (a chart older than this one)."""


@dataclass
class Beat:
    """This cluster's heartbeat in one namespace of one target, as this agent knows it."""

    listed: dict[str, str] = field(default_factory=dict)  # name → uid, as last written
    listed_at: dict[str, float] = field(default_factory=dict)  # when each was (monotonic)
    loaded: bool = False  # read back since this agent leads (or made)
    adds: dict[str, str] = field(default_factory=dict)  # for the next write
    removes: set[str] = field(default_factory=set)
    renew: bool = False
    waiters: list[asyncio.Future] = field(default_factory=list)  # of the adds
    writing: asyncio.Task | None = None
    error: BaseException | None = None  # of the last write
    legacy_gone: bool = False  # the previous release's Lease deleted


class SourceHeartbeat:
    def __init__(self, local: Cluster, registry: TargetRegistry, cluster_name: str) -> None:
        self.local = local
        self.registry = registry
        self.cluster_name = cluster_name
        self.name = heartbeat_name(cluster_name)
        self._refused: set[str] = set()  # targets (nodes) whose answer was 403/404, said once
        self._full: set[tuple[str, str]] = set()  # heartbeats that listed MAX_DELEGATES, said once
        self._unsupported: dict[str, float] = {}  # node → when it last refused (monotonic)
        # (node, namespace) → when a delegate of this cluster was last seen there (monotonic)
        self._last_used: dict[tuple[str, str], float] = {}
        self._seeded: set[str] = set()  # ClusterTargets whose earlier heartbeats were listed
        self._renewed: dict[tuple[str, str], float] = {}  # (node, namespace) → last renewal
        self._beats: dict[tuple[str, str], Beat] = {}
        registry.on_removing(self._removing)

    # -- where --------------------------------------------------------------------------------

    def namespaces(self, connection: TargetConnection) -> set[str]:
        """Where ``connection``'s target holds delegates of this cluster now (a namespaced
        Target: its namespace, always)."""
        if connection.namespace:
            return {connection.namespace}
        delegates = connection.delegates
        if delegates is None:
            return set()
        found = set()
        for delegate in delegates.list():  # as the target sent them: anything may be missing
            namespace = (delegate.get("metadata") or {}).get("namespace")
            if (
                isinstance(namespace, str)
                and namespace
                and parent_cluster(delegate) == self.cluster_name
            ):
                found.add(namespace)
            if len(found) >= MAX_NAMESPACES:
                break
        return found

    def plan(self, connection: TargetConnection, now: float) -> tuple[set[str], set[str]]:
        """The namespaces whose heartbeat is to be renewed, and those whose heartbeat is to go.

        A ClusterTarget's namespace keeps its heartbeat for :data:`LINGER` seconds after its
        last delegate went: the delegates this cluster deleted itself (a scale to zero, say)
        must be seen deleted while it is there, or the target would take them for delegates
        deleted while it is away, and create them again."""
        node = connection.node_name
        renew: set[str] = set()
        expired: set[str] = set()
        if not connection.delegates_synced:
            # Which namespaces have delegates is not known now, but this cluster may still
            # delete some there: every heartbeat it knows is renewed, none expires.
            renew.update(ns for at, ns in self._last_used if at == node)
            if connection.namespace:
                renew.add(connection.namespace)
            return renew, expired
        for namespace in self.namespaces(connection):
            self._last_used[(node, namespace)] = now
        for (at, namespace), used in self._last_used.items():
            if at == node:
                (renew if now - used <= LINGER else expired).add(namespace)
        if connection.namespace:
            renew.add(connection.namespace)
        return renew, expired

    def stale_entries(self, connection: TargetConnection, namespace: str, now: float) -> set[str]:
        """Entries of the heartbeat in ``namespace`` whose pod the target no longer holds (of
        that uid), listed more than :data:`PRUNE_AFTER` seconds ago (a pod just created may not
        be in the cache yet); none while the target's pods cannot be read."""
        beat = self._beats.get((connection.node_name, namespace))
        delegates = connection.delegates
        if beat is None or not beat.loaded or delegates is None or not connection.delegates_synced:
            return set()
        stale = set()
        for name, uid in beat.listed.items():
            if now - beat.listed_at.get(name, now) < PRUNE_AFTER:
                continue
            pod = delegates.get(name, namespace)
            if pod is None or (pod.get("metadata") or {}).get("uid") != uid:
                stale.add(name)
        return stale

    # -- listing delegates --------------------------------------------------------------------

    async def created(self, connection: TargetConnection, delegate: dict) -> None:
        """The target answered the creation of ``delegate`` (its answer): list it in this
        cluster's heartbeat there, and wait until it is (:data:`RECORD_TIMEOUT` at most), so
        that its proxy pod is bound once it is kept alive. A target without SourceHeartbeats,
        a full heartbeat, a self target: nothing is listed, nothing waits."""
        if connection.cluster is None or connection.cluster is self.local:
            return
        meta = delegate.get("metadata") or {}
        name, namespace, uid = meta.get("name"), meta.get("namespace"), meta.get("uid")
        if not (isinstance(name, str) and isinstance(namespace, str) and isinstance(uid, str)):
            return
        if not (name and namespace and uid):
            return
        node = connection.node_name
        beat = self._beats.setdefault((node, namespace), Beat())
        self._last_used[(node, namespace)] = time.monotonic()
        if beat.listed.get(name) == uid and name not in beat.removes:
            return
        if len(beat.listed.keys() | beat.adds.keys()) >= MAX_DELEGATES:
            self._say_full(node, namespace)
            return
        beat.adds[name] = uid
        beat.removes.discard(name)
        refused = self._unsupported.get(node)
        if refused is not None and time.monotonic() - refused < HEARTBEAT_PERIOD:
            return  # refused a moment ago: written with the next renewal, if it is taken then
        waiter = asyncio.get_running_loop().create_future()
        beat.waiters.append(waiter)
        self._flush(connection, namespace, beat)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(RECORD_TIMEOUT):
                await asyncio.shield(waiter)

    def _flush(self, connection: TargetConnection, namespace: str, beat: Beat) -> asyncio.Task:
        """The write of ``beat`` under way, or one started for what waits."""
        if beat.writing is None or beat.writing.done():
            beat.writing = asyncio.get_running_loop().create_task(
                self._write_all(connection, namespace, beat)
            )
        return beat.writing

    async def _write_all(self, connection: TargetConnection, namespace: str, beat: Beat) -> None:
        """Write what waits, one request at a time, until nothing does or one fails (what it
        carried waits for the next renewal)."""
        while beat.adds or beat.removes or beat.renew:
            adds, removes, waiters = beat.adds, beat.removes, beat.waiters
            beat.adds, beat.removes, beat.waiters, beat.renew = {}, set(), [], False
            try:
                async with asyncio.timeout(RENEW_TIMEOUT):
                    writer = await self._writer(connection)
                    if not beat.loaded:
                        removes |= await self._load(connection, namespace, beat, writer)
                    await self._write(connection, namespace, beat, writer, adds, removes)
            except Exception as e:  # whatever it is, the next renewal tries again
                beat.error = e
                beat.adds = adds | beat.adds
                beat.removes = (removes - beat.adds.keys()) | beat.removes
                if isinstance(e, NamespaceTerminating):
                    pass  # this namespace only: its delegates go with it
                elif isinstance(e, Unsupported | Forbidden):
                    self._unsupported[connection.node_name] = time.monotonic()
                elif isinstance(e, Invalid):
                    connection.identity = None  # who this cluster is there: asked again
                elif not isinstance(e, ApiError | TimeoutError):
                    log.exception("heartbeat not written target=%s", connection.node_name)
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(False)
                return
            beat.error = None
            self._unsupported.pop(connection.node_name, None)
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(True)

    async def _writer(self, connection: TargetConnection) -> str:
        """The user name this cluster has in the target (what the chart's policy checks, with
        its uid there, :attr:`TargetConnection.identity_uid`)."""
        if connection.identity is None:
            found = await identity_of(connection.client)
            connection.identity, connection.identity_uid = found or (None, "")
        if connection.identity is None:
            raise NoIdentity(f"target {connection.name} does not say who this cluster is there")
        return connection.identity

    async def _load(
        self, connection: TargetConnection, namespace: str, beat: Beat, writer: str
    ) -> set[str]:
        """Read back what the heartbeat lists (once this agent leads): kept if this cluster
        wrote it last; else its entries, returned, are to be removed."""
        try:
            found = await connection.client.get(SOURCE_HEARTBEATS, self.name, namespace)
        except NotFound:
            found = None
        foreign: set[str] = set()
        now = time.monotonic()
        if found is not None:
            read = read_heartbeat(found)
            if read is not None and read.source == self.cluster_name and read.writer == writer:
                beat.listed = dict(read.delegates)
                beat.listed_at = dict.fromkeys(beat.listed, now)
            else:
                listed = (found.get("spec") or {}).get("delegates")
                if isinstance(listed, dict):
                    foreign = {k for k in listed if isinstance(k, str)}
                beat.listed = dict.fromkeys(foreign, "")
                beat.listed_at = dict.fromkeys(foreign, 0.0)
        beat.loaded = True
        return foreign

    async def _write(
        self,
        connection: TargetConnection,
        namespace: str,
        beat: Beat,
        writer: str,
        adds: dict[str, str],
        removes: set[str],
    ) -> None:
        client = connection.client
        removes = {n for n in removes if n in beat.listed and n not in adds}
        room = MAX_DELEGATES - len(beat.listed.keys() - removes)
        fresh = [n for n in adds if n not in beat.listed]
        if len(fresh) > room:
            self._say_full(connection.node_name, namespace)
            dropped = set(fresh[max(room, 0) :])
            adds = {k: v for k, v in adds.items() if k not in dropped}
        now = _micro_now()
        uid = connection.identity_uid
        spec: dict = {"renewTime": now, "writer": writer, "writerUID": uid or None}
        changes: dict[str, str | None] = {**dict.fromkeys(removes), **adds}
        if changes:
            spec["delegates"] = changes
        try:
            await client.patch(SOURCE_HEARTBEATS, self.name, {"spec": spec}, namespace)
        except NotFound:
            if not self._registered(connection):
                return  # its Target is being deleted: its heartbeat is not made again
            listed = {k: v for k, v in beat.listed.items() if k not in removes and v} | adds
            body = heartbeat_object(self.cluster_name, namespace, writer, now, listed, uid)
            try:
                await client.create(SOURCE_HEARTBEATS, body, namespace)
            except NotFound as e:  # no such resource (or no such namespace)
                raise Unsupported(str(e), status=404) from e
            if not self._registered(connection):  # its Target went while it was made
                await client.delete(SOURCE_HEARTBEATS, self.name, namespace, missing_ok=True)
                return
            beat.listed = listed
        else:
            for name in removes:
                beat.listed.pop(name, None)
            beat.listed |= adds
        moment = time.monotonic()
        beat.listed_at = {k: beat.listed_at.get(k, moment) for k in beat.listed}
        for name in adds:
            beat.listed_at[name] = moment

    def _say_full(self, node: str, namespace: str) -> None:
        if (node, namespace) in self._full:
            return
        self._full.add((node, namespace))
        log.warning(
            "heartbeat full target=%s namespace=%s: %d delegates listed, the next ones there are "
            "not kept alive while this cluster is away",
            node,
            namespace,
            MAX_DELEGATES,
        )

    async def _forget_legacy(
        self, connection: TargetConnection, namespace: str, beat: Beat
    ) -> None:
        """Delete this cluster's heartbeat Lease of the previous release there, once."""
        if beat.legacy_gone:
            return
        with contextlib.suppress(Forbidden):  # a Source role that never granted Leases
            await connection.client.delete(LEASES, self.name, namespace, missing_ok=True)
        beat.legacy_gone = True

    # -- renewing -----------------------------------------------------------------------------

    async def _removing(self, connection: TargetConnection) -> None:
        """A Target is deleted: its heartbeats go first, so that the delegates deleted with it
        are not taken for ones deleted while this cluster is away."""
        node = connection.node_name
        namespaces = self.namespaces(connection) | {ns for at, ns in self._last_used if at == node}
        namespaces |= {ns for at, ns in self._beats if at == node}
        for key in [k for k in self._beats if k[0] == node]:
            beat = self._beats.pop(key)
            if beat.writing is not None:
                beat.writing.cancel()
        for memo in (self._last_used, self._renewed):
            for key in [k for k in memo if k[0] == node]:
                del memo[key]
        self._refused.discard(node)
        self._seeded.discard(node)
        self._unsupported.pop(node, None)
        self._full = {k for k in self._full if k[0] != node}
        if connection.cluster is None or connection.cluster is self.local or not namespaces:
            return
        client = connection.cluster.client
        at_once = asyncio.Semaphore(CONCURRENCY)

        async def delete(namespace: str) -> None:
            async with at_once:
                # (missing: gone already, or no such resource, a chart older than this one)
                await client.delete(SOURCE_HEARTBEATS, self.name, namespace, missing_ok=True)
                with contextlib.suppress(Forbidden):
                    await client.delete(LEASES, self.name, namespace, missing_ok=True)

        results = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REMOVAL_TIMEOUT):
                results = await asyncio.gather(
                    *(delete(ns) for ns in namespaces), return_exceptions=True
                )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors or len(results) < len(namespaces):
            log.warning(
                "heartbeats not all deleted with their target target=%s error=%s",
                node,
                errors[0] if errors else "timed out",
            )

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.beat()
                except Exception:  # a heartbeat is a courtesy: it never ends the agent
                    log.exception("heartbeats not renewed")
                await asyncio.sleep(HEARTBEAT_PERIOD)
        finally:  # leadership lost: the next leader reads the heartbeats back
            for beat in self._beats.values():
                if beat.writing is not None:
                    beat.writing.cancel()
            self._beats.clear()

    async def beat(self) -> None:
        """Renew every heartbeat once, every target at the same time, each within a limit."""
        connections = [
            c
            for c in self.registry.connections.values()
            if c.cluster is not None and c.cluster is not self.local
        ]
        await asyncio.gather(*(self._beat(c) for c in connections))

    async def _seed(self, connection: TargetConnection) -> None:
        """After this agent (re)starts, a ClusterTarget's heartbeats left from before (and the
        previous release's Leases) are found: they linger, and go, as if just used (a scale to
        zero just before a restart would otherwise leave its namespace's heartbeat unrenewed,
        and its delegates recreated)."""
        node = connection.node_name
        if connection.namespace or node in self._seeded:
            return
        found: list[dict] = []
        for resource in (SOURCE_HEARTBEATS, LEASES):
            try:
                async with asyncio.timeout(RENEW_TIMEOUT):
                    listed, _ = await connection.client.list(
                        resource, field_selector=f"metadata.name={self.name}"
                    )
            except (Forbidden, NotFound):
                listed = []  # an older chart: only what it uses from now on is known
            except (ApiError, TimeoutError):
                return  # tried again next time
            found += listed
        if not self._registered(connection):
            return
        now = time.monotonic()
        for obj in found[: 2 * MAX_NAMESPACES]:
            namespace = (obj.get("metadata") or {}).get("namespace")
            if isinstance(namespace, str) and namespace:
                self._last_used.setdefault((node, namespace), now)
        self._seeded.add(node)

    def _registered(self, connection: TargetConnection) -> bool:
        return self.registry.connections.get(connection.node_name) is connection

    async def _beat(self, connection: TargetConnection) -> None:
        """Renew ``connection``'s heartbeats (removing the entries whose pods went), those
        renewed longest ago first, each write within :data:`RENEW_TIMEOUT` and all within
        :data:`BEAT_TIMEOUT` (a slow target renews its least recent ones next time); then
        delete those that lingered enough."""
        node = connection.node_name
        await self._seed(connection)
        if not self._registered(connection):
            return  # its Target went meanwhile
        now = time.monotonic()
        renew, expired = self.plan(connection, now)
        at_once = asyncio.Semaphore(CONCURRENCY)
        client = connection.client

        async def renew_one(namespace: str) -> None:
            beat = self._beats.setdefault((node, namespace), Beat())
            async with at_once, asyncio.timeout(RENEW_TIMEOUT):
                beat.removes |= self.stale_entries(connection, namespace, now)
                beat.renew = True
                await asyncio.shield(self._flush(connection, namespace, beat))
            with contextlib.suppress(ApiError, TimeoutError):  # tried again next time
                async with at_once, asyncio.timeout(RENEW_TIMEOUT):
                    await self._forget_legacy(connection, namespace, beat)
            if beat.error is not None:
                raise beat.error
            self._renewed[(node, namespace)] = time.monotonic()

        async def expire_one(namespace: str) -> None:
            beat = self._beats.get((node, namespace))
            if beat is not None and (beat.adds or (beat.writing and not beat.writing.done())):
                return  # a delegate listed there meanwhile
            async with at_once, asyncio.timeout(RENEW_TIMEOUT):
                await client.delete(SOURCE_HEARTBEATS, self.name, namespace, missing_ok=True)
                with contextlib.suppress(Forbidden):
                    await client.delete(LEASES, self.name, namespace, missing_ok=True)
            self._last_used.pop((node, namespace), None)
            self._renewed.pop((node, namespace), None)
            self._beats.pop((node, namespace), None)

        oldest_first = sorted(renew, key=lambda ns: self._renewed.get((node, ns), 0.0))
        results: list = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(BEAT_TIMEOUT):
                results = await asyncio.gather(
                    *(renew_one(ns) for ns in oldest_first), return_exceptions=True
                )
        if len(results) < len(renew):
            results.append(TimeoutError(f"not all {len(renew)} renewed in {BEAT_TIMEOUT:g}s"))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(BEAT_TIMEOUT):
                await asyncio.gather(*(expire_one(ns) for ns in expired), return_exceptions=True)
        self._say(connection, [r for r in results if isinstance(r, BaseException)])

    def _say(self, connection: TargetConnection, errors: list[BaseException]) -> None:
        node = connection.node_name
        errors = [e for e in errors if not isinstance(e, NamespaceTerminating)]
        if any(isinstance(e, Forbidden | Unsupported) for e in errors):
            if node not in self._refused:
                self._refused.add(node)
                log.info(
                    "no heartbeat in (some namespaces of) target %s: this cluster may not write "
                    "SourceHeartbeats there (403 or 404: a chart older than this one, or a "
                    "policy); its delegates there are not kept alive while this cluster is away",
                    node,
                )
            return
        self._refused.discard(node)
        stale = [
            ns
            for (at, ns), used in self._last_used.items()
            if at == node and time.monotonic() - self._renewed.get((at, ns), used) > AWAY / 2
        ]
        if errors and stale:
            log.warning(
                "heartbeats not renewed for %ds in %d namespaces of target %s (e.g. %s): %s",
                AWAY / 2,
                len(stale),
                node,
                stale[0],
                errors[0] or "timed out",
            )
