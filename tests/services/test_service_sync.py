"""The services controller's reconcile, against in-memory API servers: reroute, copies in each
target, conflicts, deletion with the finalizer, and targets that are slow, broken or unknown.
(The real thing, with kubectl, API servers and Endpoints, is e2e/test_services.py.)"""

from __future__ import annotations

import asyncio
import copy as _copy
from collections.abc import Callable

import pytest
from merge_patch import merge_patch

from multicluster import AlreadyExists, Cluster, ClusterConfig, Conflict, Forbidden, NotFound
from multicluster.resources import EVENTS, PODS, SERVICES
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.proxy import PROXY_FIELD_SELECTOR
from multicluster_scheduler.scheduler.controller import proxy_informer
from multicluster_scheduler.services import copies as copies_module
from multicluster_scheduler.services.controller import ServiceSync
from multicluster_scheduler.services.copies import LOOK_AGAIN, RECHECK, RETRY_CONFLICT
from multicluster_scheduler.targets.delegates import DelegateLookup
from multicluster_scheduler.targets.registry import TargetConnection, TargetRegistry
from multicluster_scheduler.virtual_kubelet.pods import PodSync

NS = "ns"
CLUSTER = "cluster1-uid"


class FakeApi:
    """Services of one cluster, written through to the informer a test watches them with."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict] = {}
        self.writes: list[tuple[str, str]] = []
        self.refuse: Exception | None = None
        self.mirrors: list[tuple[object, Callable[[dict], bool]]] = []
        self._version = 100
        self._uid = 0

    def _save(self, obj: dict) -> dict:
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.objects.pop(key, None)
            for informer, _wanted in self.mirrors:
                informer.store.delete(f"{key[0]}/{key[1]}")
            return obj
        self._version += 1
        meta["resourceVersion"] = str(self._version)
        self.objects[key] = obj
        for informer, wanted in self.mirrors:
            if wanted(obj):
                informer.store.put(f"{key[0]}/{key[1]}", _copy.deepcopy(obj))
        return _copy.deepcopy(obj)

    def add(self, obj: dict) -> dict:
        obj = _copy.deepcopy(obj)
        self._uid += 1
        obj["metadata"].setdefault("uid", f"uid-{self._uid}")
        return self._save(obj)

    def _existing(self, namespace: str, name: str) -> dict:
        found = self.objects.get((namespace, name))
        if found is None:
            raise NotFound(f"{namespace}/{name}")
        return found

    def _write(self, verb: str, name: str) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.writes.append((verb, name))

    async def get(self, resource, name, namespace=None):
        return _copy.deepcopy(self._existing(namespace, name))

    async def create(self, resource, body, namespace=None):
        if resource is EVENTS:
            return body
        self._write("create", body["metadata"]["name"])
        if (namespace, body["metadata"]["name"]) in self.objects:
            raise AlreadyExists(body["metadata"]["name"])
        return self.add(body)

    async def update(self, resource, body):
        meta = body["metadata"]
        self._write("update", meta["name"])
        old = self._existing(meta["namespace"], meta["name"])
        if meta.get("resourceVersion") != old["metadata"]["resourceVersion"]:
            raise Conflict(meta["name"])
        body = _copy.deepcopy(body)
        body["metadata"]["uid"] = old["metadata"]["uid"]
        return self._save(body)

    async def patch(self, resource, name, patch, namespace=None):
        self._write("patch", name)
        old = self._existing(namespace, name)
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            raise Conflict(name)
        return self._save(merge_patch(old, patch))

    async def delete(self, resource, name, namespace=None, *, preconditions=None, missing_ok=False):
        self._write("delete", name)
        old = self.objects.get((namespace, name))
        if old is None:
            if missing_ok:
                return None
            raise NotFound(name)
        if preconditions and preconditions.get("uid") != old["metadata"]["uid"]:
            raise Conflict(name)
        old["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
        return self._save(old)


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def emit(self, obj: dict, event_type: str, reason: str, message: str) -> None:
        self.seen.append((obj["metadata"]["name"], event_type, reason))


def cluster(name: str) -> tuple[Cluster, FakeApi]:
    made = Cluster(name, ClusterConfig("https://127.0.0.1:1", None))
    api = FakeApi()
    made.client = api  # type: ignore[assignment]
    return made, api


def synced(informer) -> None:
    informer._synced.set()
    informer.last_error = None  # listed: healthy (its healthy handlers are told)


def service(name: str = "nginx", selector: dict | None = None, **annotations) -> dict:
    return {
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {
            "selector": {"app": "nginx"} if selector is None else selector,
            "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}],
            "type": "ClusterIP",
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"],
        },
    }


def proxy(name: str, **labels: str) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": name,
            "labels": labels,
            "finalizers": [keys.FINALIZER],  # as the webhook leaves it
        },
        "spec": {"schedulerName": "admiralty-proxy"},
    }


class World:
    """A source cluster with targets: c1 (self), c2, and any more a test connects."""

    def __init__(self) -> None:
        self.local, self.api = cluster("local")
        self.registry = TargetRegistry()
        self.sync = ServiceSync(self.local, self.registry, cluster_name=CLUSTER)
        self.events = Events()
        self.sync.events = self.sync.copies.events = self.events  # type: ignore[assignment]
        self.api.mirrors.append((self.sync.services, lambda _o: True))
        synced(self.sync.services)
        synced(self.sync.proxies)
        synced(self.sync.enabled)
        self.enable(NS)
        self.targets: dict[str, FakeApi] = {}
        self.connect("c1", self.local)

    def enable(self, namespace: str) -> None:
        """``namespace`` labelled multicluster-scheduler=enabled."""
        self.sync.enabled.store.put(namespace, {"metadata": {"name": namespace}})

    def connect(
        self, name: str, target: Cluster | None = None, *, cluster_target: bool = False
    ) -> TargetConnection:
        api = None
        if target is None:
            target, api = cluster(name)
        connection = TargetConnection(
            kind="ClusterTarget" if cluster_target else "Target",
            name=name,
            namespace=None if cluster_target else NS,
            cluster=target,
            ready=True,
        )
        self.registry.connections[connection.node_name] = connection
        self.registry.connected(connection)
        if api is not None:
            copies = self.sync.copies.informers[connection.node_name]
            api.mirrors.append(
                (copies, lambda o: keys.PARENT_UID in (o["metadata"].get("labels") or {}))
            )
            synced(copies)
            self.targets[name] = api
        return connection

    def add_proxy(self, pod: dict) -> None:
        self.sync.proxies.store.put(f"{NS}/{pod['metadata']['name']}", pod)

    async def reconcile(self, name: str = "nginx"):
        return await self.sync.reconcile(self.sync.copies.request(NS, name))

    def original(self, name: str = "nginx") -> dict | None:
        return self.api.objects.get((NS, name))


@pytest.fixture
async def world():
    made = World()
    made.connect("c2")
    yield made
    for connection in list(made.registry.connections.values()):
        made.registry.disconnected(connection)  # their resync timers go


async def test_a_pod_naming_our_scheduler_without_our_finalizer_reroutes_nothing(world: World):
    """A pod anyone could write (``schedulerName: admiralty-proxy``, no webhook) is no proxy
    pod: the Service that selects it is left as its user wrote it."""
    by_hand = proxy("nginx-1", app="nginx")
    by_hand["metadata"]["finalizers"] = []
    world.add_proxy(by_hand)
    world.api.add(service())
    assert await world.reconcile() is None
    assert world.original()["spec"]["selector"] == {"app": "nginx"}


async def test_the_guides_service_is_rerouted_and_copied_to_c2_only(world: World):
    world.add_proxy(proxy("nginx-1", app="nginx", **{"pod-template-hash": "abc"}))
    world.api.add(service())
    assert await world.reconcile() is None
    rerouted = world.original()
    assert rerouted["spec"]["selector"] == {keys.PREFIX + "app": "nginx"}
    assert rerouted["metadata"]["annotations"][keys.ORIGINAL_SELECTOR] == '{"app":"nginx"}'
    assert rerouted["metadata"]["finalizers"] == [keys.FINALIZER]
    assert ("nginx", "Normal", "Rerouted") in world.events.seen
    c2 = world.targets["c2"]
    made = c2.objects[(NS, "nginx")]
    assert made["spec"]["selector"] == {keys.PREFIX + "app": "nginx"}
    assert "clusterIP" not in made["spec"]
    assert made["metadata"]["annotations"][keys.PARENT_CLUSTER_NAME] == CLUSTER
    assert made["metadata"]["labels"][keys.PARENT_UID] == rerouted["metadata"]["uid"]
    assert ("create", "nginx") not in world.api.writes, "self target: the service is there"

    writes = (list(world.api.writes), list(c2.writes))
    assert await world.reconcile() is None
    assert (world.api.writes, c2.writes) == writes, "nothing more to do: no write at all"


async def test_a_namespace_that_opts_out_has_no_global_service_any_more(world: World):
    """A tenant of a namespace that never opted in writes nothing into targets through us: its
    Services are neither rerouted nor copied; copies made while it was enabled go."""
    world.add_proxy(proxy("nginx-1", app="nginx"))
    world.api.add(service())
    assert await world.reconcile() is None
    c2 = world.targets["c2"]
    assert (NS, "nginx") in c2.objects
    world.sync.enabled.store.delete(NS)  # the label removed
    assert await world.reconcile() is None
    assert (NS, "nginx") not in c2.objects, "its copy deleted"
    assert keys.FINALIZER not in (world.original()["metadata"].get("finalizers") or ())
    world.api.add(service("other", **{keys.GLOBAL: "true"}))
    assert await world.reconcile("other") is None
    assert (NS, "other") not in c2.objects, "a global Service of such a namespace: not copied"


async def test_changes_reach_the_copy_and_a_deleted_copy_comes_back(world: World):
    world.api.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    await world.reconcile("db")
    c2 = world.targets["c2"]
    assert world.original("db")["spec"]["selector"] == {"role": "db"}, "no proxy: not rerouted"
    ports = [{"port": 5432, "protocol": "TCP"}]
    await world.api.patch(SERVICES, "db", {"spec": {"ports": ports}}, NS)
    await world.reconcile("db")
    assert c2.objects[(NS, "db")]["spec"]["ports"] == ports
    assert c2.writes[-1] == ("update", "db")
    await c2.delete(SERVICES, "db", NS)
    await world.reconcile("db")
    assert c2.objects[(NS, "db")]["spec"]["ports"] == ports


async def test_a_service_that_is_not_ours_is_never_overwritten(world: World):
    c2 = world.targets["c2"]
    theirs = c2.add(service("db", {"app": "theirs"}))
    world.api.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    assert (await world.reconcile("db")).requeue_after == RETRY_CONFLICT
    assert (await world.reconcile("db")).requeue_after == RETRY_CONFLICT
    assert c2.objects[(NS, "db")] == theirs
    assert world.events.seen == [("db", "Warning", "CopyConflict")], "said once"


async def test_another_source_clusters_copy_is_not_overwritten(world: World):
    c2 = world.targets["c2"]
    theirs = service("db", {"role": "db"}, **{keys.IS_DELEGATE: "", keys.GLOBAL: "true"})
    theirs["metadata"]["labels"] = {keys.PARENT_UID: "elsewhere"}
    theirs["metadata"]["annotations"] |= {
        keys.PARENT_NAME: "db",
        keys.PARENT_NAMESPACE: NS,
        keys.PARENT_CLUSTER_NAME: "another-source",
    }
    kept = c2.add(theirs)
    world.api.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    assert (await world.reconcile("db")).requeue_after == RETRY_CONFLICT
    assert c2.objects[(NS, "db")] == kept
    assert c2.writes == []


async def test_global_false_keeps_the_reroute_and_drops_the_copies(world: World):
    world.add_proxy(proxy("nginx-1", app="nginx"))
    world.api.add(service())
    await world.reconcile()
    await world.api.patch(
        SERVICES, "nginx", {"metadata": {"annotations": {keys.GLOBAL: "false"}}}, NS
    )
    assert await world.reconcile() is None
    assert world.original()["spec"]["selector"] == {keys.PREFIX + "app": "nginx"}
    assert not world.original()["metadata"].get("finalizers")
    assert (NS, "nginx") not in world.targets["c2"].objects


async def test_deleting_the_original_deletes_its_copies_then_the_finalizer(world: World):
    world.add_proxy(proxy("nginx-1", app="nginx"))
    world.api.add(service())
    await world.reconcile()
    await world.api.delete(SERVICES, "nginx", NS)
    assert world.original() is not None, "held by our finalizer"
    assert await world.reconcile() is None
    assert (NS, "nginx") not in world.targets["c2"].objects
    assert world.original() is None, "finalizer removed, service gone"


async def test_a_finalizer_someone_put_on_a_copy_keeps_the_original_from_nobody(world: World):
    """A user of the target adds a finalizer of their own to our copy: once its deletion is
    accepted, the original goes (before, it stayed Terminating until they removed theirs)."""
    world.add_proxy(proxy("nginx-1", app="nginx"))
    world.api.add(service())
    await world.reconcile()
    c2 = world.targets["c2"]
    await c2.patch(SERVICES, "nginx", {"metadata": {"finalizers": ["eve.example/hold"]}}, NS)
    await world.api.delete(SERVICES, "nginx", NS)
    assert await world.reconcile() is None
    assert c2.objects[(NS, "nginx")]["metadata"].get("deletionTimestamp"), "deletion accepted"
    assert world.original() is None, "finalizer removed, service gone"


async def test_a_target_answering_409_to_deletes_keeps_no_original_terminating(world: World):
    """A uid precondition that fails means the copy is gone: what has its name is not ours. A
    target that always says so (hostile, or replaced the object) must not hold the original."""
    world.add_proxy(proxy("nginx-1", app="nginx"))
    world.api.add(service())
    await world.reconcile()
    c2 = world.targets["c2"]

    async def conflict(*_args, **_kwargs):
        raise Conflict("the object has been modified")

    c2.delete = conflict  # type: ignore[method-assign]
    await world.api.delete(SERVICES, "nginx", NS)
    await world.reconcile()
    assert world.original() is None, "finalizer removed, service gone"


async def test_a_service_no_longer_global_loses_its_copies_and_finalizer(world: World):
    world.api.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    await world.reconcile("db")
    await world.api.patch(SERVICES, "db", {"metadata": {"annotations": {keys.GLOBAL: None}}}, NS)
    await world.reconcile("db")
    assert (NS, "db") not in world.targets["c2"].objects
    meta = world.original("db")["metadata"]
    assert not meta.get("finalizers")
    assert keys.HAS_FINALIZER not in meta.get("labels", {})


async def test_copies_whose_original_is_gone_are_deleted(world: World):
    c2 = world.targets["c2"]
    orphan = service("old", {"app": "old"})
    orphan["metadata"]["labels"] = {keys.PARENT_UID: "gone"}
    orphan["metadata"]["annotations"] = {
        keys.IS_DELEGATE: "",
        keys.PARENT_NAME: "old",
        keys.PARENT_NAMESPACE: NS,
        keys.PARENT_CLUSTER_NAME: CLUSTER,
    }
    c2.add(orphan)
    another = _copy.deepcopy(orphan)
    another["metadata"]["name"] = "another"
    another["metadata"]["annotations"] |= {
        keys.PARENT_NAME: "another",
        keys.PARENT_CLUSTER_NAME: "another-source",
    }
    c2.add(another)
    await world.reconcile("old")
    await world.reconcile("another")
    assert (NS, "old") not in c2.objects
    assert (NS, "another") in c2.objects, "another source's copy"


async def test_one_broken_target_does_not_hold_back_the_others(world: World):
    world.connect("c3")
    world.targets["c3"].refuse = Forbidden("no")
    world.api.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    result = await world.reconcile("db")
    assert result.requeue
    assert (NS, "db") in world.targets["c2"].objects
    assert ("db", "Warning", "CopyFailed") in world.events.seen


async def test_a_target_that_holds_requests_holds_two_workers_at_most(world: World):
    """Copies a hostile target claims are ours, whose DELETEs it holds: two reconciles wait on
    it; the others return at once (to back off) and other originals are not held back."""
    c2 = world.targets["c2"]
    held = asyncio.Event()
    waiting = 0

    async def hold(*_args, **_kwargs):
        nonlocal waiting
        waiting += 1
        await held.wait()

    for i in range(5):
        forged = service(f"forged-{i}")
        forged["metadata"]["labels"] = {keys.PARENT_UID: "any"}
        forged["metadata"]["annotations"] = {
            keys.IS_DELEGATE: "",
            keys.PARENT_NAME: f"forged-{i}",
            keys.PARENT_NAMESPACE: NS,
            keys.PARENT_CLUSTER_NAME: CLUSTER,
        }
        c2.add(forged)
    c2.delete = hold  # type: ignore[method-assign]
    held_back = [asyncio.create_task(world.reconcile(f"forged-{i}")) for i in range(2)]
    await until(lambda: waiting == 2)
    for i in range(2, 5):
        assert (await world.reconcile(f"forged-{i}")).requeue, "no slot: back off"
    assert waiting == 2
    world.connect("c3", cluster_target=True)
    world.api.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    assert (await world.reconcile("db")).requeue, "c2's copy waits for a slot"
    assert (NS, "db") in world.targets["c3"].objects, "another owner's target is not held back"
    held.set()
    assert [await t for t in held_back] == [None, None]


async def test_events_of_a_copy_that_keeps_failing_wait_for_its_backoff(world: World):
    """A target that keeps changing a copy whose writes fail would otherwise have it retried
    at the rate of its events, not with backoff."""
    connection = next(c for c in world.registry.connections.values() if c.name == "c2")
    on_copy = world.sync.copies._handlers[connection.node_name][0].handler
    queue = world.sync.controller.queue
    copy = service("old")
    copy["metadata"]["annotations"] = {
        keys.PARENT_NAME: "old",
        keys.PARENT_NAMESPACE: NS,
        keys.PARENT_CLUSTER_NAME: CLUSTER,
    }
    request = world.sync.copies.request(NS, "old")
    on_copy("MODIFIED", copy, None, False)
    assert len(queue) == 1
    queue.done(await queue.get())
    queue.add_rate_limited(request)  # it failed: retried later
    await asyncio.sleep(0)
    for _ in range(100):
        on_copy("MODIFIED", copy, None, False)
    assert len(queue) == 0, "not before its backoff"
    queue.forget(request)
    on_copy("MODIFIED", copy, None, False)
    assert len(queue) == 1


async def test_a_global_external_name_service_is_never_copied(world: World):
    alias = service("alias", **{keys.GLOBAL: "true"})
    alias["spec"] = {"type": "ExternalName", "externalName": "kubernetes.default.svc"}
    world.api.add(alias)
    assert await world.reconcile("alias") is None
    assert (NS, "alias") not in world.targets["c2"].objects
    assert ("alias", "Warning", "NotCopied") in world.events.seen
    assert not world.original("alias")["metadata"].get("finalizers")


async def test_unknown_targets_are_retried_but_never_hold_a_finalizer(world: World):
    unknown = world.connect("c4")
    world.sync.copies.informers[unknown.node_name]._synced.clear()
    world.api.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    assert (await world.reconcile("db")).requeue_after == RECHECK
    assert world.targets["c4"].writes == []
    await world.api.delete(SERVICES, "db", NS)
    assert await world.reconcile("db") is None
    assert world.original("db") is None


async def test_copies_and_excluded_namespaces_are_never_touched(world: World):
    copy = service("x", **{keys.IS_DELEGATE: "", keys.GLOBAL: "true"})
    world.api.add(copy)
    world.add_proxy(proxy("nginx-1", app="nginx"))
    assert await world.reconcile("x") is None
    assert world.api.writes == [], "a copy made by another source is not ours to change"
    system = ServiceSync(world.local, world.registry, cluster_name=CLUSTER)
    assert await system.reconcile(system.copies.request("kube-system", "kube-dns")) is None


async def test_proxy_pods_enqueue_the_services_that_select_them(world: World):
    world.api.add(service("nginx"))
    world.api.add(service("other", {"app": "other"}))
    world.api.add(service("rerouted", {keys.PREFIX + "app": "nginx"}))
    requests = world.sync._services_selecting("local", proxy("p", app="nginx"))
    assert [r.name for r in requests] == ["nginx"]


async def test_undone_by_hand_once_no_proxy_pod_matches(world: World):
    """docs/services.md, "Undo": the selector back, our annotations off."""
    world.add_proxy(proxy("nginx-1", app="nginx"))
    world.api.add(service())
    await world.reconcile()
    world.sync.proxies.store.delete(f"{NS}/nginx-1")
    undo = {
        "metadata": {
            "annotations": {
                keys.CILIUM_GLOBAL_SERVICE: None,
                keys.GLOBAL: None,
                keys.ORIGINAL_SELECTOR: None,
            }
        },
        "spec": {"selector": {"app": "nginx", keys.PREFIX + "app": None}},
    }
    await world.api.patch(SERVICES, "nginx", undo, NS)
    assert await world.reconcile() is None
    meta = world.original()["metadata"]
    assert world.original()["spec"]["selector"] == {"app": "nginx"}
    assert not meta.get("finalizers")
    assert (NS, "nginx") not in world.targets["c2"].objects


async def test_a_stale_cache_is_a_reason_to_look_again_not_an_error(world: World):
    world.add_proxy(proxy("nginx-1", app="nginx"))
    world.api.add(service())
    world.api.objects[(NS, "nginx")]["metadata"]["resourceVersion"] = "newer"
    assert (await world.reconcile()).requeue_after == LOOK_AGAIN
    assert world.original()["spec"]["selector"] == {"app": "nginx"}


def test_one_watch_of_proxy_pods_serves_the_virtual_kubelet_and_services():
    local, _api = cluster("local")
    registry = TargetRegistry()
    pods = PodSync(local, DelegateLookup(registry, proxy_informer(local), CLUSTER))
    sync = ServiceSync(local, registry, cluster_name=CLUSTER)
    assert sync.proxies is pods.proxies
    watches = [
        i
        for i in local.informers
        if i.resource is PODS and i.field_selector == PROXY_FIELD_SELECTOR
    ]
    assert len(watches) == 1


async def test_what_others_add_to_a_copy_is_kept_and_causes_no_write(world: World):
    world.api.add(service("lb", {"role": "lb"}, **{keys.GLOBAL: "true"}))
    await world.reconcile("lb")
    c2 = world.targets["c2"]
    added = {
        "metadata": {
            "labels": {"team.example.com/owner": "ops"},
            "annotations": {"metallb.universe.tf/ip-allocated-from-pool": "pool-b"},
        },
        "spec": {"internalTrafficPolicy": "Local", "loadBalancerClass": "example.com/lb"},
    }
    await c2.patch(SERVICES, "lb", added, NS)
    version = c2.objects[(NS, "lb")]["metadata"]["resourceVersion"]
    writes = list(c2.writes)
    assert await world.reconcile("lb") is None
    assert c2.writes == writes, "nothing of ours changed: no write"

    await world.api.patch(SERVICES, "lb", {"metadata": {"labels": {"tier": "web"}}}, NS)
    await world.reconcile("lb")
    made = c2.objects[(NS, "lb")]
    assert made["metadata"]["resourceVersion"] != version
    assert made["metadata"]["labels"]["tier"] == "web"
    assert made["metadata"]["labels"]["team.example.com/owner"] == "ops"
    assert made["metadata"]["annotations"]["metallb.universe.tf/ip-allocated-from-pool"] == (
        "pool-b"
    )
    assert made["spec"]["loadBalancerClass"] == "example.com/lb"
    assert made["spec"]["internalTrafficPolicy"] == "Local"

    await world.api.patch(SERVICES, "lb", {"metadata": {"labels": {"tier": None}}}, NS)
    await world.reconcile("lb")
    assert "tier" not in c2.objects[(NS, "lb")]["metadata"]["labels"], "ours: removed"


def orphan(name: str = "old") -> dict:
    made = service(name, {"app": name})
    made["metadata"]["labels"] = {keys.PARENT_UID: "gone"}
    made["metadata"]["annotations"] = {
        keys.IS_DELEGATE: "",
        keys.PARENT_NAME: name,
        keys.PARENT_NAMESPACE: NS,
        keys.PARENT_CLUSTER_NAME: CLUSTER,
    }
    return made


def drain(world: World) -> set[str]:
    """Names of the requests queued (the queue is left empty)."""
    queue = world.sync.controller.queue
    names = {r.name for r in (*queue._queue, *queue._low)}
    queue.clear()
    return names


async def until(check: Callable[[], bool], timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def test_copies_are_looked_at_again_periodically(monkeypatch):
    """Even with no event and no change of readiness, an orphaned copy is found."""
    monkeypatch.setattr(copies_module, "RESYNC_PERIOD", 0.05)
    made = World()
    try:
        made.connect("c2")
        drain(made)  # the first resync, once the copies are cached
        made.targets["c2"].add(orphan())  # the cache has it; no event was handled
        queued: set[str] = set()
        await until(lambda: bool(queued.update(drain(made)) or queued))
        assert queued == {"old"}
        await made.reconcile("old")
        assert (NS, "old") not in made.targets["c2"].objects
    finally:
        for connection in list(made.registry.connections.values()):
            made.registry.disconnected(connection)


async def test_copies_are_looked_at_again_when_their_informer_recovers(world: World):
    c2 = next(c for c in world.registry.connections.values() if c.name == "c2")
    copies = world.sync.copies.informers[c2.node_name]
    drain(world)
    copies.last_error = ConnectionError("watch broken")
    world.targets["c2"].add(orphan())
    assert drain(world) == set(), "not while it is broken"
    copies.last_error = None
    assert drain(world) == {"old"}


async def test_resyncs_stop_when_the_target_goes(world: World):
    c3 = world.connect("c3")
    copies = world.sync.copies.informers[c3.node_name]
    drain(world)
    world.registry.disconnected(c3)
    copies.last_error = ConnectionError("watch broken")
    copies.last_error = None
    assert drain(world) == set(), "no longer looked at"
    assert c3.node_name not in world.sync.copies._handlers


async def test_warnings_go_with_the_original(world: World):
    world.targets["c2"].add(service("db", {"app": "theirs"}))
    world.api.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    assert (await world.reconcile("db")).requeue_after == RETRY_CONFLICT
    assert world.sync.copies._warned
    await world.api.delete(SERVICES, "db", NS)
    assert await world.reconcile("db") is None
    assert world.original("db") is None
    assert world.sync.copies._warned == {}, "nothing kept for an original that is gone"
