"""The source controller's reconcile against an in-memory API server (with a garbage collector
of owner references, as kube-controller-manager's): service accounts shared by several sources,
conditional patches, bindings someone else made that grant the same, and the cleanup that lets
Sources go when the controller is turned off. (The real thing: e2e/test_sources.py.)"""

from __future__ import annotations

import copy
import itertools

import pytest

from multicluster import (
    AlreadyExists,
    Cluster,
    ClusterConfig,
    Conflict,
    NotFound,
    Request,
    Result,
)
from multicluster.resources import (
    CLUSTER_ROLE_BINDINGS,
    EVENTS,
    ROLE_BINDINGS,
    SERVICEACCOUNTS,
)
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.resources import CLUSTER_SOURCES, SOURCES
from multicluster_scheduler.sources.controller import (
    FinalizerCleanup,
    SourcesReconciler,
    finalizer_cleanup_controller,
    sources_controller,
)
from multicluster_scheduler.sources.desired import (
    RBAC_GROUP,
    binding_names,
    desired_bindings,
)

NS = "ns"
NOW = "2024-01-01T00:00:00Z"


def merge_patch(target, patch):
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def matches(selector: str | None, obj: dict) -> bool:
    labels = obj["metadata"].get("labels") or {}
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        if key not in labels or (value and labels[key] != value):
            return False
    return True


class FakeApi:
    """Objects of every resource, written through to the cluster's informers whose selector
    they match; DELETE honours preconditions and finalizers; :meth:`collect` is the garbage
    collector (owner references in one cluster)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.objects: dict[tuple, dict] = {}
        self.writes: list[tuple[str, str, str]] = []
        self.missing_namespaces: set[str] = set()
        self._versions = itertools.count(100)
        self._uids = itertools.count(1)

    def _key(self, resource, namespace, name) -> tuple:
        return (resource, namespace if resource.namespaced else None, name)

    def _mirror(self, resource, obj: dict, gone: bool = False) -> None:
        meta = obj["metadata"]
        cache_key = f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]
        for informer in self.cluster.informers:
            if informer.resource is not resource:
                continue
            if not gone and matches(informer.label_selector, obj):
                informer.store.put(cache_key, copy.deepcopy(obj))
            else:
                informer.store.delete(cache_key)

    def _save(self, resource, obj: dict) -> dict:
        meta = obj["metadata"]
        key = self._key(resource, meta.get("namespace"), meta["name"])
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.objects.pop(key, None)
            self._mirror(resource, obj, gone=True)
            return copy.deepcopy(obj)
        meta["resourceVersion"] = str(next(self._versions))
        self.objects[key] = obj
        self._mirror(resource, obj)
        return copy.deepcopy(obj)

    def add(self, resource, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        obj["metadata"].setdefault("uid", f"uid-{next(self._uids)}")
        return self._save(resource, obj)

    def find(self, resource, name, namespace=None) -> dict | None:
        return self.objects.get(self._key(resource, namespace, name))

    def _existing(self, resource, name, namespace) -> dict:
        found = self.find(resource, name, namespace)
        if found is None:
            raise NotFound(f"{resource.kind} {namespace}/{name}")
        return found

    async def get(self, resource, name, namespace=None):
        return copy.deepcopy(self._existing(resource, name, namespace))

    async def create(self, resource, body, namespace=None, **_):
        if resource is EVENTS:
            return body
        namespace = namespace or body["metadata"].get("namespace")
        self.writes.append(("create", resource.kind, body["metadata"]["name"]))
        if namespace in self.missing_namespaces:
            raise NotFound(f"namespaces {namespace} not found")
        if self.find(resource, body["metadata"]["name"], namespace) is not None:
            raise AlreadyExists(body["metadata"]["name"])
        return self.add(resource, body)

    async def patch(self, resource, name, patch, namespace=None, *, subresource=None, **_):
        self.writes.append(("patch", resource.kind, name))
        old = self._existing(resource, name, namespace)
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            raise Conflict(f"{resource.kind} {name}: the object has been modified")
        new = merge_patch(old, patch)
        new["metadata"]["uid"] = old["metadata"]["uid"]
        return self._save(resource, new)

    async def delete(
        self, resource, name, namespace=None, *, preconditions=None, missing_ok=False, **_
    ):
        self.writes.append(("delete", resource.kind, name))
        old = self.find(resource, name, namespace)
        if old is None:
            if missing_ok:
                return None
            raise NotFound(name)
        for field, value in (preconditions or {}).items():
            if old["metadata"][field] != value:
                raise Conflict(f"precondition {field} failed")
        old = copy.deepcopy(old)
        old["metadata"]["deletionTimestamp"] = NOW
        return self._save(resource, old)

    def collect(self) -> None:
        """Garbage collection: an object whose owners are all gone is deleted; one that keeps
        an owner loses its references to the others (and keeps its uid)."""
        while True:
            live = {o["metadata"]["uid"] for o in self.objects.values()}
            changed = False
            for (resource, _ns, _name), obj in list(self.objects.items()):
                refs = obj["metadata"].get("ownerReferences") or []
                if not refs:
                    continue
                kept = [r for r in refs if r["uid"] in live]
                if not kept:
                    gone = copy.deepcopy(obj)
                    gone["metadata"]["deletionTimestamp"] = NOW
                    self._save(resource, gone)
                    changed = True
                elif len(kept) < len(refs):
                    updated = copy.deepcopy(obj)
                    updated["metadata"]["ownerReferences"] = kept
                    self._save(resource, updated)
                    changed = True
            if not changed:
                return


def make_cluster() -> tuple[Cluster, FakeApi]:
    cluster = Cluster("local", ClusterConfig("https://127.0.0.1:1", None))
    api = FakeApi(cluster)
    cluster.client = api  # type: ignore[assignment]
    return cluster, api


def source(name: str, sa: str | None = "c1", user: str | None = None) -> dict:
    spec: dict = {}
    if sa:
        spec["serviceAccountName"] = sa
    if user:
        spec["userName"] = user
    return {"metadata": {"name": name, "namespace": NS}, "spec": spec}


def cluster_source(name: str, sa: tuple[str, str] = (NS, "c1")) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {"serviceAccount": {"namespace": sa[0], "name": sa[1]}},
    }


class World:
    def __init__(self) -> None:
        self.cluster, self.api = make_cluster()
        self.reconciler = SourcesReconciler(self.cluster)

    def add(self, obj: dict) -> dict:
        resource = SOURCES if obj["metadata"].get("namespace") else CLUSTER_SOURCES
        return self.api.add(resource, obj)

    def get(self, name: str, namespace: str | None = NS) -> dict | None:
        resource = SOURCES if namespace else CLUSTER_SOURCES
        return self.api.find(resource, name, namespace)

    def set_spec(self, name: str, spec: dict, namespace: str | None = NS) -> None:
        resource = SOURCES if namespace else CLUSTER_SOURCES
        obj = copy.deepcopy(self.get(name, namespace))
        obj["spec"] = spec
        obj["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        self.api._save(resource, obj)

    async def reconcile(self, name: str, namespace: str | None = NS) -> Result | None:
        return await self.reconciler.reconcile(Request("local", namespace or "", name))

    async def delete(self, name: str, namespace: str | None = NS) -> None:
        """kubectl delete, then the agent's reconcile (the finalizer), then the collector."""
        resource = SOURCES if namespace else CLUSTER_SOURCES
        await self.api.delete(resource, name, namespace)
        await self.reconcile(name, namespace)
        assert self.get(name, namespace) is None
        self.api.collect()

    def account(self, name: str = "c1", namespace: str = NS) -> dict | None:
        return self.api.find(SERVICEACCOUNTS, name, namespace)

    def ready(self, name: str, namespace: str | None = NS) -> tuple[str, str]:
        (condition,) = self.get(name, namespace)["status"]["conditions"]
        return condition["status"], condition["reason"]


def owner_uids(obj: dict) -> set[str]:
    return {r["uid"] for r in obj["metadata"].get("ownerReferences") or ()}


@pytest.fixture
def world() -> World:
    return World()


# -- one service account, several sources ---------------------------------------------------


async def test_two_sources_share_a_service_account_and_it_outlives_the_first(world: World):
    first, second = world.add(source("s1")), world.add(source("s2"))
    await world.reconcile("s1")
    await world.reconcile("s2")
    account = world.account()
    assert owner_uids(account) == {first["metadata"]["uid"], second["metadata"]["uid"]}
    assert not any(r.get("controller") for r in account["metadata"]["ownerReferences"])
    assert world.ready("s1") == world.ready("s2") == ("True", "Bound")

    await world.delete("s1")
    kept = world.account()
    assert kept is not None, "garbage-collected with the first Source: tokens of s2 are dead"
    assert kept["metadata"]["uid"] == account["metadata"]["uid"]
    assert owner_uids(kept) == {second["metadata"]["uid"]}
    # Reconciling the survivor changes nothing.
    await world.reconcile("s2")
    assert world.account()["metadata"]["resourceVersion"] == kept["metadata"]["resourceVersion"]

    await world.delete("s2")
    assert world.account() is None


async def test_a_cluster_source_and_a_source_share_a_service_account(world: World):
    cs = world.add(cluster_source("cs"))
    s = world.add(source("s"))
    await world.reconcile("cs", None)
    await world.reconcile("s")
    uid = world.account()["metadata"]["uid"]
    assert owner_uids(world.account()) == {cs["metadata"]["uid"], s["metadata"]["uid"]}
    await world.delete("cs", None)
    assert world.account()["metadata"]["uid"] == uid
    assert owner_uids(world.account()) == {s["metadata"]["uid"]}


async def test_a_source_made_second_shares_an_account_it_sees_first_from_the_api(world: World):
    """Two workers race: the account exists but is not in the cache yet (AlreadyExists)."""
    world.add(source("s1"))
    s2 = world.add(source("s2"))
    await world.reconcile("s1")
    for informer in world.reconciler.made.values():
        informer.store.delete(f"{NS}/c1")
    await world.reconcile("s2")
    assert s2["metadata"]["uid"] in owner_uids(world.account())


async def test_a_source_that_stops_naming_a_shared_account_lets_go_of_it(world: World):
    s1, s2 = world.add(source("s1")), world.add(source("s2"))
    await world.reconcile("s1")
    await world.reconcile("s2")
    world.set_spec("s1", {"serviceAccountName": "c2"})
    await world.reconcile("s1")
    assert owner_uids(world.account()) == {s2["metadata"]["uid"]}
    assert owner_uids(world.account("c2")) == {s1["metadata"]["uid"]}
    # Deleting s1 now leaves c1 to s2; deleting s2 collects it.
    await world.delete("s1")
    assert world.account("c2") is None
    assert world.account() is not None
    await world.delete("s2")
    assert world.account() is None


async def test_an_account_is_never_left_without_an_owner(world: World):
    s1 = world.add(source("s1"))
    await world.reconcile("s1")
    world.set_spec("s1", {"serviceAccountName": "c2"})
    await world.reconcile("s1")
    # Nobody else names c1: it stays owned by s1 (garbage collection would never delete an
    # object without owners), and goes with it.
    assert owner_uids(world.account()) == {s1["metadata"]["uid"]}
    # Once another source names it and owns it too, s1 (brought back by the account's event)
    # lets go.
    s3 = world.add(source("s3"))
    await world.reconcile("s3")
    requests = world.reconciler.users_of("local", world.account())
    assert Request("local", NS, "s1") in requests
    await world.reconcile("s1")
    assert owner_uids(world.account()) == {s3["metadata"]["uid"]}


async def test_service_account_events_reach_every_source_naming_or_owning_it(world: World):
    world.add(source("s1"))
    world.add(source("s2"))
    world.add(cluster_source("cs"))
    world.add(source("other", sa="c9"))
    await world.reconcile("s1")
    requests = world.reconciler.users_of("local", world.account())
    assert set(requests) == {
        Request("local", NS, "s1"),
        Request("local", NS, "s2"),
        Request("local", "", "cs"),
    }
    assert len(requests) == len(set(requests))


async def test_someone_elses_service_account_is_used_never_owned(world: World):
    theirs = world.api.add(SERVICEACCOUNTS, {"metadata": {"name": "c1", "namespace": NS}})
    world.add(source("s1"))
    world.add(source("s2"))
    await world.reconcile("s1")
    await world.reconcile("s2")
    account = world.account()
    assert account["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
    assert not account["metadata"].get("ownerReferences")
    assert not account["metadata"].get("labels")
    assert world.ready("s2") == ("True", "Bound")


async def test_sharing_is_conditional_on_the_version_read(world: World):
    world.add(source("s1"))
    world.add(source("s2"))
    await world.reconcile("s1")
    # The cache holds an older version of the account than the server: a conflict, retried.
    stale = copy.deepcopy(world.account())
    stale["metadata"]["resourceVersion"] = "1"
    for informer in world.reconciler.made.values():
        if informer.resource is SERVICEACCOUNTS and informer.get("c1", NS):
            informer.store.put(f"{NS}/c1", stale)
    assert await world.reconcile("s2") == Result(requeue=True)
    assert len(owner_uids(world.account())) == 1


# -- bindings ---------------------------------------------------------------------------------


async def test_a_binding_repair_is_conditional_on_the_version_read(world: World):
    world.add(source("s1"))
    await world.reconcile("s1")
    name = binding_names(world.get("s1"))[0]
    # Someone edits our RoleBinding; our cache still holds an older version of it.
    server = world.api.find(ROLE_BINDINGS, name, NS)
    cached = copy.deepcopy(server)
    cached["subjects"] = [{"kind": "User", "apiGroup": RBAC_GROUP, "name": "mallory"}]
    cached["metadata"]["resourceVersion"] = "1"
    world.reconciler.made[ROLE_BINDINGS, keys.SOURCE_NAME_LABEL].store.put(f"{NS}/{name}", cached)
    assert await world.reconcile("s1") == Result(requeue=True)
    assert (
        world.api.find(ROLE_BINDINGS, name, NS)["metadata"]["resourceVersion"]
        == (server["metadata"]["resourceVersion"])
    )


def foreign(binding, **changes) -> dict:
    body = copy.deepcopy(binding.body)
    body["metadata"] = {k: v for k, v in body["metadata"].items() if k in ("name", "namespace")}
    body.update(changes)
    return body


async def test_bindings_made_by_hand_as_the_guide_shows_are_bound_by_others(world: World):
    s = world.add(source("s1"))
    for binding in desired_bindings({**s, "metadata": {**s["metadata"]}}):
        world.api.add(binding.resource, foreign(binding))
    await world.reconcile("s1")
    assert world.ready("s1") == ("True", "BoundByOthers")
    message = world.get("s1")["status"]["conditions"][0]["message"]
    assert "made by someone else" in message
    for resource, namespace, name in (
        (ROLE_BINDINGS, NS, "admiralty-source-s1"),
        (CLUSTER_ROLE_BINDINGS, None, f"admiralty-source-{NS}-s1-cluster-summary-viewer"),
    ):
        made = world.api.find(resource, name, namespace)
        assert not made["metadata"].get("labels")  # left as it is
        assert not made["metadata"].get("ownerReferences")
        assert ("patch", resource.kind, name) not in world.api.writes
    # Deleting the Source leaves them too.
    await world.delete("s1")
    assert world.api.find(CLUSTER_ROLE_BINDINGS, name) is not None


async def test_a_binding_by_others_that_grants_something_else_is_a_conflict(world: World):
    s = world.add(source("s1"))
    role_binding = desired_bindings(s)[0]
    world.api.add(
        ROLE_BINDINGS,
        foreign(role_binding, subjects=[{"kind": "User", "apiGroup": RBAC_GROUP, "name": "x"}]),
    )
    assert await world.reconcile("s1") == Result(requeue_after=30.0)
    assert world.ready("s1") == ("False", "BindingConflict")


# -- the controller turned off: cleanup of finalizers ------------------------------------------


def turned_off(on: World) -> tuple[Cluster, FakeApi, FinalizerCleanup]:
    """The same objects, after the agent restarted with --source-controller=false: a fresh
    cluster whose only informers are the cleanup's."""
    cluster, api = make_cluster()
    api.objects, api._versions = on.api.objects, on.api._versions
    cleanup = FinalizerCleanup(cluster)
    for (resource, _ns, _name), obj in list(api.objects.items()):
        api._mirror(resource, obj)
    return cluster, api, cleanup


async def test_with_the_controller_off_deleted_sources_lose_the_finalizer_and_their_binding():
    on = World()
    on.add(source("s1"))
    on.add(source("s2"))
    await on.reconcile("s1")
    await on.reconcile("s2")
    theirs = on.api.add(
        CLUSTER_ROLE_BINDINGS,
        {
            "metadata": {"name": "someone-elses", "labels": {"app": "x"}},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "view"},
            "subjects": [],
        },
    )
    crb1 = binding_names(on.get("s1"))[1]
    crb2 = binding_names(on.get("s2"))[1]
    assert on.api.find(CLUSTER_ROLE_BINDINGS, crb1) is not None

    cluster, api, cleanup = turned_off(on)
    # Only what it needs is cached: labeled Sources and our ClusterRoleBindings.
    assert {(i.resource, i.label_selector) for i in cluster.informers} == {
        (SOURCES, f"{keys.HAS_FINALIZER}=true"),
        (CLUSTER_ROLE_BINDINGS, keys.SOURCE_NAME_LABEL),
    }

    # A Source not being deleted keeps its finalizer and what was made for it.
    assert await cleanup.reconcile(Request("local", NS, "s2")) is None
    assert keys.FINALIZER in api.find(SOURCES, "s2", NS)["metadata"]["finalizers"]
    assert api.find(CLUSTER_ROLE_BINDINGS, crb2) is not None

    # Deleted: its ClusterRoleBinding goes, then the finalizer, then the Source.
    await api.delete(SOURCES, "s1", NS)
    assert api.find(SOURCES, "s1", NS) is not None  # held by the finalizer
    await cleanup.reconcile(Request("local", NS, "s1"))
    assert api.find(SOURCES, "s1", NS) is None
    assert api.find(CLUSTER_ROLE_BINDINGS, crb1) is None
    assert api.find(CLUSTER_ROLE_BINDINGS, crb2) is not None
    left = api.find(CLUSTER_ROLE_BINDINGS, "someone-elses")
    assert left["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
    api.collect()
    assert api.find(ROLE_BINDINGS, "admiralty-source-s1", NS) is None
    assert api.find(SERVICEACCOUNTS, "c1", NS) is not None  # still s2's


async def test_with_the_controller_off_a_binding_by_others_is_left_and_the_source_goes():
    on = World()
    s = on.add(source("s1"))
    viewer = desired_bindings(s)[1]
    on.api.add(CLUSTER_ROLE_BINDINGS, foreign(viewer))
    await on.reconcile("s1")
    _cluster, api, cleanup = turned_off(on)
    await api.delete(SOURCES, "s1", NS)
    # A stale cache: the first removal of the finalizer conflicts and is retried.
    stale = copy.deepcopy(api.find(SOURCES, "s1", NS))
    stale["metadata"]["resourceVersion"] = "1"
    cleanup.sources.store.put(f"{NS}/s1", stale)
    assert await cleanup.reconcile(Request("local", NS, "s1")) == Result(requeue=True)
    api._mirror(SOURCES, api.find(SOURCES, "s1", NS))
    assert await cleanup.reconcile(Request("local", NS, "s1")) is None
    assert api.find(SOURCES, "s1", NS) is None
    assert api.find(CLUSTER_ROLE_BINDINGS, viewer.name) is not None


def test_the_cleanup_controller_watches_only_labeled_sources():
    cluster, _api = make_cluster()
    controller = finalizer_cleanup_controller(cluster)
    assert [(i.resource, i.label_selector) for i in controller.informers] == [
        (SOURCES, f"{keys.HAS_FINALIZER}=true")
    ]
    # The full controller, by contrast, watches what it makes.
    full = sources_controller(make_cluster()[0])
    assert SERVICEACCOUNTS in {i.resource for i in full.informers}
