"""The source controller (target side): Sources and ClusterSources become RBAC.

A Source lets a source cluster place pods in its namespace; a ClusterSource, in every
namespace. For each, the service account it names is created if missing, and bound to the
``multicluster-scheduler-source`` and ``multicluster-scheduler-cluster-summary-viewer``
ClusterRoles (names as the user guide gives them; ``desired`` decides, this module acts).
Everything made is labeled with its owner and watched, so drift is repaired at once; a
binding of the same name that we did not make is never overwritten but reported.

A Source is namespaced and its summary-viewer binding cluster-scoped: Kubernetes forbids that
owner reference (the original set it anyway), so a finalizer on the Source deletes the binding
instead. The outcome is the Source's Ready condition, and an event whenever its reason changes.

A service account we made may be named by several sources (two Sources of one namespace, or
a Source and a ClusterSource): each of them is one of its owners, so it lives (and keeps its
uid, hence its tokens) as long as one of them names it.

With the controller turned off, :func:`finalizer_cleanup_controller` still lets Sources that
carry our finalizer go when they are deleted (the chart keeps the little RBAC it needs).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from multicluster import (
    AlreadyExists,
    ApiError,
    Cluster,
    Conflict,
    Controller,
    EnqueueMapped,
    Forbidden,
    Informer,
    Invalid,
    NamespaceTerminating,
    NotFound,
    Request,
    Resource,
    Result,
    index_by_owner_uid,
    is_deleting,
    strip_managed_fields,
)
from multicluster.errors import BadRequest
from multicluster.events import EventRecorder
from multicluster.gc import add_finalizer, remove_finalizer
from multicluster.resources import CLUSTER_ROLE_BINDINGS, ROLE_BINDINGS, SERVICEACCOUNTS

from ..api import keys
from ..api.resources import CLUSTER_SOURCES, SOURCES
from .desired import (
    Action,
    Binding,
    InvalidSubject,
    NoSubject,
    binding_action,
    binding_names,
    binding_patch,
    bound_message,
    condition_changed,
    desired_bindings,
    desired_service_account,
    is_ours,
    orphaned_by,
    owner_key,
    ready_condition,
    resource_of,
    service_account_key,
    service_account_of,
    share_patch,
    source_key,
    unshare_patch,
)

log = logging.getLogger(__name__)
COMPONENT = "multicluster-scheduler"
OWNER_INDEX = "owner"
OWNER_UID_INDEX = "owner-uid"
UID_INDEX = "uid"
SERVICE_ACCOUNT_INDEX = "serviceaccount"
# Problems fixed by changes we do not watch (RBAC, a namespace, someone else's binding):
# look again after a while. Others (NoSubject, Invalid) wait for the source to change.
RETRY_PROBLEM = 30.0
RETRIED_REASONS = frozenset({"Forbidden", "NamespaceNotFound", "BindingConflict"})
# Someone else's bindings are not watched: one that grants what we would is looked at again.
RECHECK_BOUND_BY_OTHERS = 30.0


class Problem(Exception):
    """Why a source is not Ready: a reason (CamelCase) and a message for users."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def problem_from(error: ApiError, doing: str) -> Problem | None:
    """API errors that only a user can fix become a reason; others are retried (a namespace
    being deleted takes the source with it)."""
    if isinstance(error, NamespaceTerminating):
        return None
    if isinstance(error, Forbidden):
        return Problem("Forbidden", f"the agent may not {doing}: {error.message}")
    if isinstance(error, Invalid | BadRequest):
        return Problem("Invalid", f"cannot {doing}: {error.message}")
    return None


@contextmanager
def explained(doing: str) -> Iterator[None]:
    """Turn an API error that only a user can fix into a :class:`Problem`; re-raise others."""
    try:
        yield
    except ApiError as e:
        problem = problem_from(e, doing)
        if problem is None:
            raise
        raise problem from e


def _by_owner(obj: dict) -> list[str]:
    key = owner_key(obj["metadata"].get("labels"))
    return [key] if key else []


def _by_uid(obj: dict) -> list[str]:
    uid = obj["metadata"].get("uid")
    return [uid] if uid else []


class SourcesReconciler:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.client = cluster.client
        self.sources = cluster.informer(SOURCES)
        self.cluster_sources = cluster.informer(CLUSTER_SOURCES)
        for informer in (self.sources, self.cluster_sources):
            informer.add_indexer(OWNER_INDEX, lambda s: [source_key(s)])
            informer.add_indexer(SERVICE_ACCOUNT_INDEX, service_account_key)
            informer.add_indexer(UID_INDEX, _by_uid)
        # What we made, and only that: one informer per resource and owner kind.
        made = [
            (SERVICEACCOUNTS, keys.SOURCE_NAME_LABEL),
            (SERVICEACCOUNTS, keys.CLUSTER_SOURCE_NAME_LABEL),
            (ROLE_BINDINGS, keys.SOURCE_NAME_LABEL),
            (CLUSTER_ROLE_BINDINGS, keys.SOURCE_NAME_LABEL),
            (CLUSTER_ROLE_BINDINGS, keys.CLUSTER_SOURCE_NAME_LABEL),
        ]
        self.made: dict[tuple, Informer] = {}
        for resource, label in made:
            informer = cluster.informer(
                resource, label_selector=label, transform=strip_managed_fields
            )
            informer.add_indexer(OWNER_INDEX, _by_owner)
            if resource is SERVICEACCOUNTS:
                informer.add_indexer(OWNER_UID_INDEX, index_by_owner_uid)
            self.made[resource, label] = informer
        self.events = EventRecorder(self.client, COMPONENT)

    # -- mapping events of what we made back to sources -------------------------------------

    def _requests(self, cluster: str, found: list[dict]) -> list[Request]:
        return [
            Request(cluster, s["metadata"].get("namespace", ""), s["metadata"]["name"])
            for s in found
        ]

    def owners_of(self, cluster: str, obj: dict) -> list[Request]:
        """The source a service account or binding we made was made for."""
        key = owner_key(obj["metadata"].get("labels"))
        if key is None:
            return []
        found = self.sources.by_index(OWNER_INDEX, key)
        return self._requests(cluster, found + self.cluster_sources.by_index(OWNER_INDEX, key))

    def users_of(self, cluster: str, obj: dict) -> list[Request]:
        """Every source that names this service account, or is one of its owners (its labels
        name only the source it was made for: one of possibly many)."""
        account = f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}"
        found = self.naming(account)
        for ref in obj["metadata"].get("ownerReferences") or ():
            if ref.get("uid"):
                found += self.sources.by_index(UID_INDEX, ref["uid"])
                found += self.cluster_sources.by_index(UID_INDEX, ref["uid"])
        return list(dict.fromkeys([*self.owners_of(cluster, obj), *self._requests(cluster, found)]))

    def naming(self, account: str) -> list[dict]:
        """Sources and ClusterSources naming service account ``namespace/name``, as cached."""
        found = self.sources.by_index(SERVICE_ACCOUNT_INDEX, account)
        return found + self.cluster_sources.by_index(SERVICE_ACCOUNT_INDEX, account)

    def _cached_service_account(self, name: str, namespace: str) -> dict | None:
        for label in (keys.SOURCE_NAME_LABEL, keys.CLUSTER_SOURCE_NAME_LABEL):
            found = self.made[SERVICEACCOUNTS, label].get(name, namespace)
            if found is not None:
                return found
        return None

    def _cached(self, resource: Resource, source: dict) -> list[dict]:
        """What we made of ``resource`` for ``source``, as cached."""
        namespaced = bool(source["metadata"].get("namespace"))
        label = keys.SOURCE_NAME_LABEL if namespaced else keys.CLUSTER_SOURCE_NAME_LABEL
        informer = self.made.get((resource, label))
        return informer.by_index(OWNER_INDEX, source_key(source)) if informer else []

    # -- reconcile ------------------------------------------------------------------------------

    async def reconcile(self, request: Request) -> Result | None:
        informer = self.sources if request.namespace else self.cluster_sources
        source = informer.get(request.name, request.namespace or None)
        if source is None:
            return None  # owned objects go by garbage collection; the finalizer did the rest
        resource = resource_of(source)
        source = {**source, "apiVersion": resource.api_version, "kind": resource.kind}
        if is_deleting(source):
            await self._release(source)
            return None
        others: list[Binding] = []  # someone else's, granting what ours would
        try:
            if resource is SOURCES:
                source = await self._ensure_finalizer(source)
            await self._release_service_accounts(source)
            try:
                wanted = desired_bindings(source)
            except NoSubject as e:
                await self._delete_stale(source, [])
                raise Problem("NoSubject", str(e)) from e
            except InvalidSubject as e:
                await self._delete_stale(source, [])
                raise Problem("Invalid", str(e)) from e
            await self._ensure_service_account(source)
            for binding in wanted:
                if await self._ensure_binding(source, binding) is Action.BOUND_BY_OTHERS:
                    others.append(binding)
            await self._delete_stale(source, wanted)
        except Problem as problem:
            await self._report(source, False, problem.reason, problem.message)
            retry = problem.reason in RETRIED_REASONS
            return Result(requeue_after=RETRY_PROBLEM) if retry else None
        except Conflict as e:  # a write conditional on what we read lost a race: read again
            log.debug("conflict, retrying source=%s: %s", source_key(source), e)
            return Result(requeue=True)
        if others:
            theirs = ", ".join(map(str, others))
            message = f"{bound_message(source)}; {theirs} made by someone else, left as it is"
            await self._report(source, True, "BoundByOthers", message)
            return Result(requeue_after=RECHECK_BOUND_BY_OTHERS)
        await self._report(source, True, "Bound", bound_message(source))
        return None

    async def _ensure_finalizer(self, source: dict) -> dict:
        """Before a Source's ClusterRoleBinding exists, the finalizer that will delete it."""
        with explained("add its finalizer to the Source"):
            updated = await add_finalizer(
                self.client, SOURCES, source, keys.FINALIZER, label=keys.HAS_FINALIZER
            )
        return {**source, **updated}

    async def _release(self, source: dict) -> None:
        """A Source is being deleted: delete its ClusterRoleBinding, then let it go (its
        RoleBinding and service account have an owner reference: garbage collection)."""
        meta = source["metadata"]
        if keys.FINALIZER not in (meta.get("finalizers") or ()):
            return
        names = {binding_names(source)[1]}
        names |= {b["metadata"]["name"] for b in self._cached(CLUSTER_ROLE_BINDINGS, source)}
        for name in sorted(names):
            try:
                binding = await self.client.get(CLUSTER_ROLE_BINDINGS, name)
            except NotFound:
                continue
            if is_ours(binding, source) and await self._delete(CLUSTER_ROLE_BINDINGS, binding):
                log.info("deleted ClusterRoleBinding %s for source=%s", name, source_key(source))
        await remove_finalizer(
            self.client, SOURCES, source, keys.FINALIZER, label=keys.HAS_FINALIZER
        )

    async def _delete(self, resource: Resource, obj: dict) -> bool:
        """Delete this very object (uid precondition); False if it is gone or was replaced."""
        meta = obj["metadata"]
        try:
            await self.client.delete(
                resource, meta["name"], meta.get("namespace"), preconditions={"uid": meta["uid"]}
            )
        except (NotFound, Conflict):
            return False
        return True

    async def _ensure_service_account(self, source: dict) -> None:
        """Create the service account if missing; if we made it (for this source or another),
        make this source one of its owners. One we did not make is used as it is."""
        wanted = desired_service_account(source)
        if wanted is None:
            return
        name, namespace = wanted["metadata"]["name"], wanted["metadata"]["namespace"]
        reading = f"read service account {namespace}/{name}"
        existing = self._cached_service_account(name, namespace)
        if existing is None:
            try:
                with explained(reading):
                    existing = await self.client.get(SERVICEACCOUNTS, name, namespace)
            except NotFound:
                pass
        if existing is None:
            doing = f"create service account {namespace}/{name}"
            try:
                with explained(doing):
                    await self.client.create(SERVICEACCOUNTS, wanted, namespace)
                self._created(source, f"ServiceAccount {namespace}/{name}")
                return
            except AlreadyExists:  # made meanwhile (another source naming it?): share it
                with explained(reading):
                    existing = await self.client.get(SERVICEACCOUNTS, name, namespace)
            except NotFound as e:
                raise Problem("NamespaceNotFound", f"cannot {doing}: {e.message}") from e
        patch = share_patch(existing, source)
        if patch is None:
            return  # ours and already owned by this source, or someone else's: never taken over
        if is_deleting(existing):
            raise Conflict(f"service account {namespace}/{name} is being deleted")
        with explained(f"add an owner reference to service account {namespace}/{name}"):
            await self.client.patch(SERVICEACCOUNTS, name, patch, namespace)
        log.info("shared ServiceAccount %s/%s with source=%s", namespace, name, source_key(source))

    async def _release_service_accounts(self, source: dict) -> None:
        """Service accounts we made that this source owns but no longer names: it stops being
        one of their owners. Never the last one: an account without owners would never be
        collected, so it stays owned by this source until another source naming it has become
        an owner too (its event brings this source back here) or this source is deleted."""
        named = service_account_of(source)
        uid = source["metadata"]["uid"]
        for label in (keys.SOURCE_NAME_LABEL, keys.CLUSTER_SOURCE_NAME_LABEL):
            informer = self.made[SERVICEACCOUNTS, label]
            for account in informer.by_index(OWNER_UID_INDEX, uid):
                meta = account["metadata"]
                namespace, name = meta["namespace"], meta["name"]
                if (namespace, name) == named or is_deleting(account):
                    continue
                patch = unshare_patch(account, source)
                if patch is None or orphaned_by(account, source):
                    continue
                doing = f"remove an owner reference from service account {namespace}/{name}"
                try:
                    with explained(doing):
                        await self.client.patch(SERVICEACCOUNTS, name, patch, namespace)
                except NotFound:
                    continue
                log.info(
                    "released ServiceAccount %s/%s, no longer named, source=%s",
                    namespace,
                    name,
                    source_key(source),
                )

    async def _ensure_binding(self, source: dict, binding: Binding) -> Action:
        resource = binding.resource
        existing = next(
            (b for b in self._cached(resource, source) if b["metadata"]["name"] == binding.name),
            None,
        )
        action = binding_action(existing, binding, source)
        with explained(f"write {binding}"):
            if action is Action.CREATE:
                try:
                    await self.client.create(resource, binding.body, binding.namespace)
                    self._created(source, str(binding))
                    return action
                except AlreadyExists:  # not in our cache: someone else's, or not seen yet
                    existing = await self.client.get(resource, binding.name, binding.namespace)
                    action = binding_action(existing, binding, source)
            if action is Action.BOUND_BY_OTHERS:
                return action  # someone else's, granting exactly this: left untouched
            if action is Action.FOREIGN:
                raise Problem(
                    "BindingConflict",
                    f"{binding} exists and was not made for this {resource_of(source).kind}: "
                    "not overwritten (delete or rename it, or disable the source controller)",
                )
            if action is Action.WAIT:
                raise Conflict(f"{binding} is being deleted")  # retried with backoff
            assert existing is not None
            if action is Action.UPDATE:
                patch = binding_patch(existing, binding)
                await self.client.patch(resource, binding.name, patch, binding.namespace)
                self._repaired(source, f"{binding}: subjects and owner restored")
            elif action is Action.RECREATE:
                await self._delete(resource, existing)
                await self.client.create(resource, binding.body, binding.namespace)
                role = binding.body["roleRef"]["name"]
                self._repaired(source, f"{binding}: recreated with roleRef ClusterRole {role}")
            return action

    async def _delete_stale(self, source: dict, wanted: list[Binding]) -> None:
        """Bindings we made for this source that it no longer asks for (it lost its subject)."""
        keep = {(b.resource, b.namespace, b.name) for b in wanted}
        for resource in (ROLE_BINDINGS, CLUSTER_ROLE_BINDINGS):
            for binding in self._cached(resource, source):
                meta = binding["metadata"]
                if (resource, meta.get("namespace"), meta["name"]) in keep or is_deleting(binding):
                    continue
                with explained(f"delete {resource.kind} {meta['name']}"):
                    await self._delete(resource, binding)

    # -- telling users ------------------------------------------------------------------------

    def _created(self, source: dict, what: str) -> None:
        log.info("created %s for source=%s", what, source_key(source))
        self.events.emit(source, "Normal", "Created", f"created {what}")

    def _repaired(self, source: dict, what: str) -> None:
        log.info("repaired %s for source=%s", what, source_key(source))
        self.events.emit(source, "Normal", "Repaired", what)

    async def _report(self, source: dict, ready: bool, reason: str, message: str) -> None:
        """Patch the Ready condition when it changed; an event when its reason changed."""
        meta = source["metadata"]
        previous = (source.get("status") or {}).get("conditions") or []
        old = next((c for c in previous if c.get("type") == "Ready"), None)
        condition = ready_condition(ready, reason, message, meta.get("generation"), previous)
        if not condition_changed(old, condition):
            return
        resource = resource_of(source)
        try:
            await self.client.patch(
                resource,
                meta["name"],
                {"status": {"conditions": [condition]}},
                meta.get("namespace"),
                subresource="status",
            )
        except NotFound:
            return
        log.info(
            "source ready=%s reason=%s source=%s message=%s",
            condition["status"],
            reason,
            source_key(source),
            message,
        )
        if old is None or old.get("reason") != reason:
            await self.events.record(source, "Normal" if ready else "Warning", reason, message)


def sources_controller(cluster: Cluster) -> Controller:
    reconciler = SourcesReconciler(cluster)
    controller = Controller("sources", reconciler, workers=2)
    controller.watch(cluster, SOURCES)
    controller.watch(cluster, CLUSTER_SOURCES)
    owners = EnqueueMapped(reconciler.owners_of)
    users = EnqueueMapped(reconciler.users_of)
    for resource, label in reconciler.made:
        controller.watch(
            cluster,
            resource,
            handler=users if resource is SERVICEACCOUNTS else owners,
            label_selector=label,
            transform=strip_managed_fields,
        )
    return controller


class FinalizerCleanup:
    """With the source controller turned off, a Source that still carries our finalizer (put
    there while it was on) would never go away, nor would its namespace: when it is deleted,
    delete the ClusterRoleBinding we made for it (found by our labels) and remove the
    finalizer. Nothing else: a Source not being deleted keeps what was made for it.

    It reads only Sources labeled ``has-finalizer=true`` and ClusterRoleBindings labeled with a
    Source's name, from caches: the chart keeps for it sources get/list/watch/patch and
    clusterrolebindings list/watch/delete, and nothing else of the source controller's RBAC."""

    def __init__(self, cluster: Cluster) -> None:
        self.client = cluster.client
        self.sources = cluster.informer(
            SOURCES, label_selector=f"{keys.HAS_FINALIZER}=true", transform=strip_managed_fields
        )
        self.bindings = cluster.informer(
            CLUSTER_ROLE_BINDINGS,
            label_selector=keys.SOURCE_NAME_LABEL,
            transform=strip_managed_fields,
        )
        self.bindings.add_indexer(OWNER_INDEX, _by_owner)

    async def reconcile(self, request: Request) -> Result | None:
        source = self.sources.get(request.name, request.namespace or None)
        if source is None or not is_deleting(source):
            return None
        meta = source["metadata"]
        if keys.FINALIZER not in (meta.get("finalizers") or ()):
            return None
        for binding in self.bindings.by_index(OWNER_INDEX, source_key(source)):
            if not is_ours(binding, source) or is_deleting(binding):
                continue
            name = binding["metadata"]["name"]
            try:
                await self.client.delete(
                    CLUSTER_ROLE_BINDINGS, name, preconditions={"uid": binding["metadata"]["uid"]}
                )
            except (NotFound, Conflict):
                continue
            log.info("deleted ClusterRoleBinding %s for source=%s", name, source_key(source))
        try:
            released = await remove_finalizer(
                self.client, SOURCES, source, keys.FINALIZER, label=keys.HAS_FINALIZER
            )
        except Conflict:
            return Result(requeue=True)
        if released is None:
            return None  # gone meanwhile
        log.info("removed the finalizer of source=%s (source controller off)", source_key(source))
        return None


def finalizer_cleanup_controller(cluster: Cluster) -> Controller:
    """What runs instead of :func:`sources_controller` when it is turned off."""
    cleanup = FinalizerCleanup(cluster)
    controller = Controller("sources-finalizer-cleanup", cleanup, workers=1)
    controller.watch(
        cluster,
        SOURCES,
        label_selector=f"{keys.HAS_FINALIZER}=true",
        transform=strip_managed_fields,
    )
    return controller
