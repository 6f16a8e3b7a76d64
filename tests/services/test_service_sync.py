"""The services controller's reconcile, on the in-memory API servers of
:mod:`multicluster.testing`: reroute, copies in each target, conflicts, deletion with the
finalizer, and targets that are slow, broken or unknown. (The real thing, with kubectl, API
servers and Endpoints, is e2e/test_services.py.)

This cluster and its targets are fake API servers whose caches are the real informers; targets
are attached as the targets controller attaches them (c1 is this cluster, a self target). A test
creates Services, proxy pods and copies on the servers, reconciles a Service once the caches
hold what the servers do, and reads the servers: objects, writes and Events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable

import pytest

from multicluster import Informer, Request, Result
from multicluster.errors import ServerError
from multicluster.resources import EVENTS, NAMESPACES, PODS, SERVICES
from multicluster.testing import Action, FakeClient, FakeCluster, FakeServer
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.proxy import PROXY_FIELD_SELECTOR
from multicluster_scheduler.scheduler.controller import proxy_informer
from multicluster_scheduler.services import copies as copies_module
from multicluster_scheduler.services.controller import ServiceSync
from multicluster_scheduler.services.copies import LOOK_AGAIN, RECHECK, RETRY_CONFLICT
from multicluster_scheduler.targets.delegates import DelegateLookup
from multicluster_scheduler.targets.registry import TargetConnection, TargetRegistry
from multicluster_scheduler.virtual_kubelet.pods import PodSync
from tests.worlds import HoldingCluster, attach, broken, events, named, settle, until

NS = "ns"
CLUSTER = "cluster1-uid"
LOCAL = "local"


def namespace(name: str, enabled: bool = True) -> dict:
    labels = {keys.NAMESPACE_ENABLED_LABEL: keys.NAMESPACE_ENABLED_VALUE} if enabled else {}
    return {"metadata": {"name": name, "labels": labels}}


def service(name: str = "nginx", selector: dict | None = None, ns: str = NS, **annotations) -> dict:
    return {
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {
            "selector": {"app": "nginx"} if selector is None else selector,
            "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}],
            "type": "ClusterIP",
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"],
        },
    }


def proxy(name: str, **labels: str) -> dict:
    """A proxy pod, as the webhook leaves it."""
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": labels,
            "finalizers": [keys.FINALIZER],
        },
        "spec": {
            "schedulerName": keys.PROXY_SCHEDULER_NAME,
            "containers": [{"name": "web", "image": "nginx"}],
        },
    }


def orphan(name: str = "old", source: str = CLUSTER) -> dict:
    """A copy made by ``source`` whose original is gone."""
    made = service(name, {"app": name})
    made["metadata"]["labels"] = {keys.PARENT_UID: "gone"}
    made["metadata"]["annotations"] = {
        keys.IS_DELEGATE: "",
        keys.PARENT_NAME: name,
        keys.PARENT_NAMESPACE: NS,
        keys.PARENT_CLUSTER_NAME: source,
    }
    return made


def in_step(informer: Informer, stored: dict | None) -> bool:
    """Whether ``informer`` holds ``stored`` (None: nothing) as its server does."""
    if stored is None:
        return True
    held = informer.get(stored["metadata"]["name"], stored["metadata"]["namespace"])
    return (
        held is not None
        and held["metadata"]["resourceVersion"] == (stored["metadata"]["resourceVersion"])
    )


class World:
    """A source cluster (``local``) with the services controller, and targets: c1 (this
    cluster), and any more a test connects."""

    def __init__(self) -> None:
        self.local = FakeCluster(LOCAL)
        self.api = self.local.server
        self.registry = TargetRegistry()
        self.sync = ServiceSync(self.local, self.registry, cluster_name=CLUSTER)
        self.queue = self.sync.controller.queue
        self.api.add(NAMESPACES, namespace(NS))
        self.targets: dict[str, FakeCluster] = {}
        self.connections: dict[str, TargetConnection] = {}

    async def start(self) -> None:
        self.local.start()
        assert await self.local.wait_synced(3)
        await attach(self.registry, TargetConnection("Target", "c1", NS), self.local)

    async def stop(self) -> None:
        self.queue.shut_down()  # its timers too
        for target in self.targets.values():
            if isinstance(target, HoldingCluster):
                target.holding.release()
        await asyncio.gather(*(c.stop() for c in (self.local, *self.targets.values())))

    async def connect(
        self,
        name: str,
        cluster: FakeCluster | None = None,
        *,
        cluster_target: bool = False,
        synced: bool = True,
    ) -> TargetConnection:
        target = cluster or FakeCluster(name, FakeServer(name=name))
        connection = TargetConnection(
            "ClusterTarget" if cluster_target else "Target", name, None if cluster_target else NS
        )
        self.targets[name], self.connections[name] = target, connection
        return await attach(self.registry, connection, target, synced=synced)

    def copies_cache(self, target: str) -> Informer:
        return self.sync.copies.informers[self.connections[target].node_name]

    # -- what the clusters hold --

    async def add(self, obj: dict) -> dict:
        """A Service created in this cluster, once the controller's cache has it."""
        (made,) = self.api.add(SERVICES, obj)
        await until(lambda: in_step(self.sync.services, made))
        return made

    async def add_proxy(self, pod: dict) -> dict:
        (made,) = self.api.add(PODS, pod)
        await until(lambda: self.sync.proxies.get(pod["metadata"]["name"], NS) is not None)
        return made

    async def remove_proxy(self, name: str) -> None:
        """A proxy pod gone: our finalizer off (its delegate is gone), deleted."""
        await self.local.client.patch(PODS, name, {"metadata": {"finalizers": None}}, NS)
        await self.local.client.delete(PODS, name, NS)
        await until(lambda: self.sync.proxies.get(name, NS) is None)

    async def add_to(self, target: str, obj: dict) -> dict:
        """A Service created in a target, once the copies' cache has it (if it is a copy)."""
        (made,) = self.targets[target].server.add(SERVICES, obj)
        await self.settled(made["metadata"]["name"])
        return made

    def original(self, name: str = "nginx", ns: str = NS) -> dict | None:
        return named(self.api, SERVICES, name, ns)

    def copy_in(self, target: str, name: str = "nginx") -> dict | None:
        return named(self.targets[target].server, SERVICES, name, NS)

    def writes(self, target: str | None = None) -> list[tuple[str, str]]:
        """The writes of Services the target's API server (this cluster's: None) was asked."""
        server = self.targets[target].server if target else self.api
        return [(a.verb, a.name or "") for a in server.writes if a.resource == SERVICES]

    def warnings(self) -> list[tuple[str, str, str, int]]:
        return events(self.api, NS)

    async def settled(self, name: str, ns: str = NS) -> None:
        """Wait for the caches a reconcile of ``ns/name`` reads to hold what the servers do: the
        original, and its copy in each target whose copies are cached."""

        def caught_up() -> bool:
            if not in_step(self.sync.services, named(self.api, SERVICES, name, ns)):
                return False
            for target, connection in self.connections.items():
                copies = self.sync.copies.informers.get(connection.node_name)
                if copies is None or not copies.has_synced:
                    continue  # not cached: nothing to wait for
                stored = named(self.targets[target].server, SERVICES, name, ns)
                labels = (stored or {}).get("metadata", {}).get("labels") or {}
                if not in_step(copies, stored if keys.PARENT_UID in labels else None):
                    return False
            return True

        await until(caught_up, what=f"caches of {ns}/{name}")

    async def reconcile(self, name: str = "nginx", ns: str = NS) -> Result | None:
        """Reconcile ``ns/name`` once the caches hold what the servers do."""
        await self.settled(name, ns)
        return await self.sync.reconcile(Request(LOCAL, ns, name))

    async def drain(self) -> set[str]:
        """The names of the requests queued (the queue is left empty)."""
        names = set()
        while len(self.queue):
            request = await self.queue.get()
            self.queue.done(request)
            names.add(request.name)
        return names


@pytest.fixture
async def make_world() -> AsyncGenerator[Callable[[], Awaitable[World]], None]:
    made: list[World] = []

    async def make() -> World:
        world = World()
        made.append(world)
        await world.start()
        return world

    yield make
    for world in made:
        await world.stop()


@pytest.fixture
async def world(make_world: Callable[[], Awaitable[World]]) -> World:
    """This cluster and c2, a Target of namespace ns."""
    made = await make_world()
    await made.connect("c2")
    return made


# -- reroute and copies ---------------------------------------------------------------------------


async def test_a_pod_naming_our_scheduler_without_our_finalizer_reroutes_nothing(world: World):
    """A pod anyone could write (``schedulerName: admiralty-proxy``, no webhook) is no proxy
    pod: the Service that selects it is left as its user wrote it."""
    by_hand = proxy("nginx-1", app="nginx")
    by_hand["metadata"]["finalizers"] = []
    await world.add_proxy(by_hand)
    await world.add(service())
    assert await world.reconcile() is None
    assert world.original()["spec"]["selector"] == {"app": "nginx"}
    assert world.writes() == []


async def test_the_guides_service_is_rerouted_and_copied_to_c2_only(world: World):
    await world.add_proxy(proxy("nginx-1", app="nginx", **{"pod-template-hash": "abc"}))
    await world.add(service())
    assert await world.reconcile() is None
    rerouted = world.original()
    assert rerouted["spec"]["selector"] == {keys.PREFIX + "app": "nginx"}
    assert rerouted["metadata"]["annotations"][keys.ORIGINAL_SELECTOR] == '{"app":"nginx"}'
    assert rerouted["metadata"]["finalizers"] == [keys.FINALIZER]
    await until(lambda: world.warnings())
    assert [(n, t, r) for n, t, r, _ in world.warnings()] == [("nginx", "Normal", "Rerouted")]
    made = world.copy_in("c2")
    assert made is not None
    assert made["spec"]["selector"] == {keys.PREFIX + "app": "nginx"}
    assert "clusterIP" not in made["spec"]
    assert made["metadata"]["annotations"][keys.PARENT_CLUSTER_NAME] == CLUSTER
    assert made["metadata"]["labels"][keys.PARENT_UID] == rerouted["metadata"]["uid"]
    assert world.writes("c2") == [("create", "nginx")]
    assert ("create", "nginx") not in world.writes(), "self target: the service is there"

    writes = (list(world.api.writes), list(world.targets["c2"].server.writes))
    assert await world.reconcile() is None
    await settle()
    assert (world.api.writes, world.targets["c2"].server.writes) == writes, (
        "nothing more to do: no write at all"
    )


async def test_a_namespace_that_opts_out_has_no_global_service_any_more(world: World):
    """A tenant of a namespace that never opted in writes nothing into targets through us: its
    Services are neither rerouted nor copied; copies made while it was enabled go."""
    await world.add_proxy(proxy("nginx-1", app="nginx"))
    await world.add(service())
    assert await world.reconcile() is None
    assert world.copy_in("c2") is not None
    opt_out = {"metadata": {"labels": {keys.NAMESPACE_ENABLED_LABEL: None}}}
    await world.local.client.patch(NAMESPACES, NS, opt_out)
    await until(lambda: world.sync.enabled.get(NS) is None)
    assert await world.reconcile() is None
    assert world.copy_in("c2") is None, "its copy deleted"
    assert keys.FINALIZER not in (world.original()["metadata"].get("finalizers") or ())
    await world.add(service("other", **{keys.GLOBAL: "true"}))
    assert await world.reconcile("other") is None
    assert world.copy_in("c2", "other") is None, "a global Service of such a namespace: not copied"


async def test_changes_reach_the_copy_and_a_deleted_copy_comes_back(world: World):
    await world.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    await world.reconcile("db")
    assert world.original("db")["spec"]["selector"] == {"role": "db"}, "no proxy: not rerouted"
    ports = [{"port": 5432, "protocol": "TCP"}]
    await world.local.client.patch(SERVICES, "db", {"spec": {"ports": ports}}, NS)
    await world.reconcile("db")
    assert world.copy_in("c2", "db")["spec"]["ports"] == ports
    assert world.writes("c2")[-1] == ("update", "db")
    await world.targets["c2"].client.delete(SERVICES, "db", NS)
    await world.reconcile("db")
    assert world.copy_in("c2", "db")["spec"]["ports"] == ports
    assert world.writes("c2")[-1] == ("create", "db")


async def test_what_others_add_to_a_copy_is_kept_and_causes_no_write(world: World):
    await world.add(service("lb", {"role": "lb"}, **{keys.GLOBAL: "true"}))
    await world.reconcile("lb")
    added = {
        "metadata": {
            "labels": {"team.example.com/owner": "ops"},
            "annotations": {"metallb.universe.tf/ip-allocated-from-pool": "pool-b"},
        },
        "spec": {"internalTrafficPolicy": "Local", "loadBalancerClass": "example.com/lb"},
    }
    await world.targets["c2"].client.patch(SERVICES, "lb", added, NS)
    version = world.copy_in("c2", "lb")["metadata"]["resourceVersion"]
    writes = world.writes("c2")
    assert await world.reconcile("lb") is None
    assert world.writes("c2") == writes, "nothing of ours changed: no write"

    await world.local.client.patch(SERVICES, "lb", {"metadata": {"labels": {"tier": "web"}}}, NS)
    await world.reconcile("lb")
    made = world.copy_in("c2", "lb")
    assert made["metadata"]["resourceVersion"] != version
    assert made["metadata"]["labels"]["tier"] == "web"
    assert made["metadata"]["labels"]["team.example.com/owner"] == "ops"
    assert made["metadata"]["annotations"]["metallb.universe.tf/ip-allocated-from-pool"] == (
        "pool-b"
    )
    assert made["spec"]["loadBalancerClass"] == "example.com/lb"
    assert made["spec"]["internalTrafficPolicy"] == "Local"

    await world.local.client.patch(SERVICES, "lb", {"metadata": {"labels": {"tier": None}}}, NS)
    await world.reconcile("lb")
    assert "tier" not in world.copy_in("c2", "lb")["metadata"]["labels"], "ours: removed"


async def test_a_global_external_name_service_is_never_copied(world: World):
    alias = service("alias", **{keys.GLOBAL: "true"})
    alias["spec"] = {"type": "ExternalName", "externalName": "kubernetes.default.svc"}
    await world.add(alias)
    assert await world.reconcile("alias") is None
    assert world.copy_in("c2", "alias") is None
    await until(lambda: world.warnings())
    assert [(n, t, r) for n, t, r, _ in world.warnings()] == [("alias", "Warning", "NotCopied")]
    assert not world.original("alias")["metadata"].get("finalizers")


async def test_copies_and_excluded_namespaces_are_never_touched(world: World):
    await world.add(service("x", **{keys.IS_DELEGATE: "", keys.GLOBAL: "true"}))
    await world.add_proxy(proxy("nginx-1", app="nginx"))
    assert await world.reconcile("x") is None
    assert world.writes() == [], "a copy made by another source is not ours to change"
    assert world.copy_in("c2", "x") is None
    # kube-system, even labelled enabled, with a global Service and a target that serves it.
    world.api.add(NAMESPACES, namespace("kube-system"))
    await until(lambda: world.sync.enabled.get("kube-system") is not None)
    await world.connect("c3", cluster_target=True)
    await world.add(
        service("kube-dns", {"k8s-app": "kube-dns"}, "kube-system", **{keys.GLOBAL: "true"})
    )
    assert await world.reconcile("kube-dns", "kube-system") is None
    assert world.writes() == []
    assert world.writes("c3") == []


async def test_proxy_pods_enqueue_the_services_that_select_them(world: World):
    await world.add(service("nginx"))
    await world.add(service("other", {"app": "other"}))
    await world.add(service("rerouted", {keys.PREFIX + "app": "nginx"}))
    await world.drain()
    await world.add_proxy(proxy("p", app="nginx"))
    await until(lambda: len(world.queue))
    assert await world.drain() == {"nginx"}


def test_one_watch_of_proxy_pods_serves_the_virtual_kubelet_and_services():
    local = FakeCluster(LOCAL)
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


async def test_a_stale_cache_is_a_reason_to_look_again_not_an_error(world: World):
    await world.add_proxy(proxy("nginx-1", app="nginx"))
    await world.add(service())
    await world.sync.services.stop()  # the cache stays as it is
    await world.local.client.patch(SERVICES, "nginx", {"metadata": {"labels": {"a": "b"}}}, NS)
    result = await world.sync.reconcile(Request(LOCAL, NS, "nginx"))
    assert result is not None
    assert result.requeue_after == LOOK_AGAIN
    assert world.original()["spec"]["selector"] == {"app": "nginx"}
    assert world.copy_in("c2") is None


# -- conflicts ------------------------------------------------------------------------------------


async def test_a_service_that_is_not_ours_is_never_overwritten(world: World):
    theirs = await world.add_to("c2", service("db", {"app": "theirs"}))
    await world.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    assert (await world.reconcile("db")).requeue_after == RETRY_CONFLICT
    assert (await world.reconcile("db")).requeue_after == RETRY_CONFLICT
    assert world.copy_in("c2", "db") == theirs
    await until(lambda: world.warnings())
    await settle()
    assert world.warnings() == [("db", "Warning", "CopyConflict", 1)], "said once"


async def test_another_source_clusters_copy_is_not_overwritten(world: World):
    theirs = service("db", {"role": "db"}, **{keys.IS_DELEGATE: "", keys.GLOBAL: "true"})
    theirs["metadata"]["labels"] = {keys.PARENT_UID: "elsewhere"}
    theirs["metadata"]["annotations"] |= {
        keys.PARENT_NAME: "db",
        keys.PARENT_NAMESPACE: NS,
        keys.PARENT_CLUSTER_NAME: "another-source",
    }
    kept = await world.add_to("c2", theirs)
    await world.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    assert (await world.reconcile("db")).requeue_after == RETRY_CONFLICT
    assert world.copy_in("c2", "db") == kept
    assert world.writes("c2") == []


async def test_warnings_go_with_the_original(world: World):
    """Once the original is gone, nothing is kept of what was said about it: a new Service of
    that name in the same conflict is warned about again."""
    await world.add_to("c2", service("db", {"app": "theirs"}))
    first = await world.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    assert (await world.reconcile("db")).requeue_after == RETRY_CONFLICT
    await world.local.client.delete(SERVICES, "db", NS)
    assert await world.reconcile("db") is None
    assert world.original("db") is None
    again = await world.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    assert (await world.reconcile("db")).requeue_after == RETRY_CONFLICT
    await until(lambda: len(world.warnings()) == 2, what="a warning about each original")
    warned = [
        (e["involvedObject"]["uid"], e["reason"], e["count"]) for e in world.api.objects(EVENTS)
    ]
    uids = first["metadata"]["uid"], again["metadata"]["uid"]
    assert sorted(warned) == sorted((uid, "CopyConflict", 1) for uid in uids)


# -- deletion and the finalizer -------------------------------------------------------------------


def recorder(order: list[str]) -> Callable[[Action], None]:
    def record(action: Action) -> None:
        order.append(f"{action.client}: {action.verb}")

    return record


async def test_global_false_keeps_the_reroute_and_drops_the_copies(world: World):
    await world.add_proxy(proxy("nginx-1", app="nginx"))
    await world.add(service())
    await world.reconcile()
    not_global = {"metadata": {"annotations": {keys.GLOBAL: "false"}}}
    await world.local.client.patch(SERVICES, "nginx", not_global, NS)
    assert await world.reconcile() is None
    assert world.original()["spec"]["selector"] == {keys.PREFIX + "app": "nginx"}
    assert not world.original()["metadata"].get("finalizers")
    assert world.copy_in("c2") is None


async def test_deleting_the_original_deletes_its_copies_then_the_finalizer(world: World):
    await world.add_proxy(proxy("nginx-1", app="nginx"))
    await world.add(service())
    await world.reconcile()
    order: list[str] = []
    world.api.prepend_reactor("patch", SERVICES, recorder(order))
    world.targets["c2"].server.prepend_reactor("delete", SERVICES, recorder(order))
    await world.local.client.delete(SERVICES, "nginx", NS)
    assert world.original() is not None, "held by our finalizer"
    assert await world.reconcile() is None
    assert world.copy_in("c2") is None
    assert world.original() is None, "finalizer removed, service gone"
    assert order == ["c2: delete", "local: patch"]


async def test_a_finalizer_someone_put_on_a_copy_keeps_the_original_from_nobody(world: World):
    """A user of the target adds a finalizer of their own to our copy: once its deletion is
    accepted, the original goes (before, it stayed Terminating until they removed theirs)."""
    await world.add_proxy(proxy("nginx-1", app="nginx"))
    await world.add(service())
    await world.reconcile()
    hold = {"metadata": {"finalizers": ["eve.example/hold"]}}
    await world.targets["c2"].client.patch(SERVICES, "nginx", hold, NS)
    await world.local.client.delete(SERVICES, "nginx", NS)
    assert await world.reconcile() is None
    assert world.copy_in("c2")["metadata"].get("deletionTimestamp"), "deletion accepted"
    assert world.original() is None, "finalizer removed, service gone"


async def test_a_target_answering_409_to_deletes_keeps_no_original_terminating(world: World):
    """A uid precondition that fails means the copy is gone: what has its name is not ours. A
    target that always says so (hostile, or replaced the object) must not hold the original."""
    await world.add_proxy(proxy("nginx-1", app="nginx"))
    await world.add(service())
    await world.reconcile()
    c2 = world.targets["c2"].server
    c2.prepend_reactor("delete", SERVICES, lambda a: a.conflict("the object has been modified"))
    await world.local.client.delete(SERVICES, "nginx", NS)
    await world.reconcile()
    assert world.writes("c2")[-1] == ("delete", "nginx"), "asked"
    assert world.original() is None, "finalizer removed, service gone"


async def test_a_service_no_longer_global_loses_its_copies_and_finalizer(world: World):
    await world.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    await world.reconcile("db")
    assert world.copy_in("c2", "db") is not None
    assert world.original("db")["metadata"]["labels"][keys.HAS_FINALIZER]
    not_global = {"metadata": {"annotations": {keys.GLOBAL: None}}}
    await world.local.client.patch(SERVICES, "db", not_global, NS)
    await world.reconcile("db")
    assert world.copy_in("c2", "db") is None
    meta = world.original("db")["metadata"]
    assert not meta.get("finalizers")
    assert keys.HAS_FINALIZER not in meta.get("labels", {})


async def test_copies_whose_original_is_gone_are_deleted(world: World):
    await world.add_to("c2", orphan("old"))
    await world.add_to("c2", orphan("another", source="another-source"))
    await world.reconcile("old")
    await world.reconcile("another")
    assert world.copy_in("c2", "old") is None
    assert world.copy_in("c2", "another") is not None, "another source's copy"
    assert world.writes("c2") == [("delete", "old")]


async def test_undone_by_hand_once_no_proxy_pod_matches(world: World):
    """docs/services.md, "Undo": the selector back, our annotations off."""
    await world.add_proxy(proxy("nginx-1", app="nginx"))
    await world.add(service())
    await world.reconcile()
    await world.remove_proxy("nginx-1")
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
    await world.local.client.patch(SERVICES, "nginx", undo, NS)
    assert await world.reconcile() is None
    meta = world.original()["metadata"]
    assert world.original()["spec"]["selector"] == {"app": "nginx"}
    assert not meta.get("finalizers")
    assert world.copy_in("c2") is None


# -- targets that are broken, slow or unknown -----------------------------------------------------


async def test_one_broken_target_does_not_hold_back_the_others(
    make_world: Callable[[], Awaitable[World]],
):
    world = await make_world()
    await world.connect("broken")  # the first target looked at
    await world.connect("c2")
    broken_server = world.targets["broken"].server
    broken_server.prepend_reactor("create", SERVICES, lambda a: a.error(403, "no"))
    await world.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    result = await world.reconcile("db")
    assert result is not None
    assert result.requeue, "retried with backoff"
    assert world.copy_in("c2", "db") is not None
    assert world.writes("broken") == [("create", "db")]
    assert world.copy_in("broken", "db") is None
    await until(lambda: world.warnings())
    assert [(n, t, r) for n, t, r, _ in world.warnings()] == [("db", "Warning", "CopyFailed")]


async def test_a_target_that_holds_requests_holds_two_workers_at_most(
    make_world: Callable[[], Awaitable[World]],
):
    """Copies a hostile target claims are ours, whose DELETEs it holds: two reconciles wait on
    it; the others return at once (to back off) and other originals are not held back."""
    world = await make_world()
    c2 = HoldingCluster("c2", verb="delete", resource=SERVICES)
    await world.connect("c2", c2)
    for i in range(5):
        forged = orphan(f"forged-{i}")
        forged["metadata"]["labels"] = {keys.PARENT_UID: "any"}
        await world.add_to("c2", forged)
    held_back = [asyncio.create_task(world.reconcile(f"forged-{i}")) for i in range(2)]
    await until(lambda: c2.holding.waiting == 2)
    for i in range(2, 5):
        result = await world.reconcile(f"forged-{i}")
        assert result is not None
        assert result.requeue, "no slot: back off"
    assert c2.holding.held == ["forged-0", "forged-1"]
    await world.connect("c3", cluster_target=True)
    await world.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    result = await world.reconcile("db")
    assert result is not None
    assert result.requeue, "c2's copy waits for a slot"
    assert world.copy_in("c3", "db") is not None, "another owner's target is not held back"
    assert world.copy_in("c2", "db") is None
    c2.holding.release()
    assert [await asyncio.wait_for(t, 2) for t in held_back] == [None, None]
    assert world.copy_in("c2", "forged-0") is None


async def test_unknown_targets_are_retried_but_never_hold_a_finalizer(world: World):
    c4 = FakeCluster("c4", FakeServer(name="c4"))
    c4.server.fail_next("list", SERVICES, ServerError("unavailable", status=503), times=None)
    await world.connect("c4", c4, synced=False)
    await world.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    assert (await world.reconcile("db")).requeue_after == RECHECK
    assert world.writes("c4") == []
    await world.local.client.delete(SERVICES, "db", NS)
    assert await world.reconcile("db") is None
    assert world.original("db") is None


# -- copies deleted in a target by someone else ------------------------------------------------


async def delete_by_hand(world: World, target: str, name: str = "db") -> None:
    """Someone in ``target`` deletes our copy of ``name`` there; its cache sees it."""
    await FakeClient(world.targets[target].server, name="admin").delete(SERVICES, name, NS)
    await until(lambda: world.copies_cache(target).get(name, NS) is None, what="deletion seen")


async def test_a_copy_deleted_in_a_target_is_made_again_at_once_then_later_and_later(
    world: World,
):
    """The deletion's event queues its original at once the first time; the second time
    within five minutes, after a second, and a reconcile before then waits too."""
    await world.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    await world.reconcile("db")
    await world.drain()
    await delete_by_hand(world, "c2")
    assert await world.drain() == {"db"}, "at once"
    assert await world.reconcile("db") is None
    assert world.writes("c2")[-1] == ("create", "db")
    await world.settled("db")
    await world.drain()  # its creation's event

    await delete_by_hand(world, "c2")
    assert await world.drain() == set(), "not yet"
    result = await world.reconcile("db")
    assert result is not None
    assert 0.5 < result.requeue_after <= 1.0
    assert world.copy_in("c2", "db") is None
    assert keys.FINALIZER in world.original("db")["metadata"]["finalizers"], "still copied"
    await until(lambda: len(world.queue), timeout=1.5, what="queued after a second")
    assert await world.drain() == {"db"}
    assert await world.reconcile("db") is None
    assert world.writes("c2")[-1] == ("create", "db")


async def test_a_copy_deleted_by_the_controller_itself_is_not_held_back(world: World):
    """Our own deletions count for nothing: a copy no longer global, then global again, is
    made at once, however often that happens."""
    await world.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    for _ in range(3):
        await world.reconcile("db")
        assert world.writes("c2")[-1] == ("create", "db")
        await world.local.client.patch(
            SERVICES, "db", {"metadata": {"annotations": {keys.GLOBAL: None}}}, NS
        )
        await world.reconcile("db")
        assert world.copy_in("c2", "db") is None
        await until(lambda: world.copies_cache("c2").get("db", NS) is None, what="deletion seen")
        assert await world.drain() == {"db"}, "its deletion's event, at once"
        await world.local.client.patch(
            SERVICES, "db", {"metadata": {"annotations": {keys.GLOBAL: "true"}}}, NS
        )
    await world.reconcile("db")
    await delete_by_hand(world, "c2")
    assert await world.drain() == {"db"}, "someone else's first deletion: at once"


async def test_a_copy_whose_original_is_gone_or_not_global_is_not_made_again(world: World):
    await world.add_to("c2", orphan("old"))
    await world.add(service("db", {"role": "db"}))
    await world.add_to("c2", orphan("db"))  # a copy of a Service that is not global
    await delete_by_hand(world, "c2", "old")
    await delete_by_hand(world, "c2", "db")
    assert await world.drain() == {"old", "db"}
    assert await world.reconcile("old") is None
    assert await world.reconcile("db") is None
    assert world.writes("c2") == [("delete", "old"), ("delete", "db")], "by hand only"


async def test_a_target_deleting_a_copy_again_and_again_holds_up_no_other(world: World):
    await world.connect("c3")
    await world.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    await world.reconcile("db")
    await delete_by_hand(world, "c2")
    await world.reconcile("db")
    assert world.copy_in("c2", "db") is not None, "made again at once"
    await world.settled("db")
    await delete_by_hand(world, "c2")  # the second time: made again after a second
    await delete_by_hand(world, "c3")
    result = await world.reconcile("db")
    assert world.copy_in("c3", "db") is not None, "at once"
    assert world.copy_in("c2", "db") is None
    assert result is not None
    assert 0.5 < result.requeue_after <= 1


async def change_by_hand(world: World, target: str, port: int, name: str = "db") -> None:
    """Someone in ``target`` changes the port of our copy of ``name`` there; its cache sees it."""
    ports = [{"port": port, "protocol": "TCP", "targetPort": port}]
    admin = FakeClient(world.targets[target].server, name="admin")
    await admin.patch(SERVICES, name, {"spec": {"ports": ports}}, NS)
    await until(
        lambda: (
            (world.copies_cache(target).get(name, NS) or {}).get("spec", {}).get("ports") == ports
        ),
        what="change seen",
    )


async def test_a_copy_changed_in_a_target_again_and_again_is_written_back_later_and_later(
    world: World,
):
    """The change's event queues its original at once the first time; the second time within
    five minutes, after a second, and a reconcile before then waits too (before: written back
    at each change, at the pace of whoever changes it). Another target's copy changed meanwhile
    is written back at once, and so is a change of the original."""
    await world.connect("c3")
    await world.add(service("db", {"role": "db"}, **{keys.GLOBAL: "true"}))
    await world.reconcile("db")
    await world.settled("db")
    await world.drain()
    await change_by_hand(world, "c2", 6666)
    assert await world.drain() == {"db"}, "at once"
    assert await world.reconcile("db") is None
    assert world.writes("c2")[-1] == ("update", "db")
    await world.settled("db")
    await world.drain()  # its update's event

    await change_by_hand(world, "c2", 7777)
    await change_by_hand(world, "c3", 8888)
    await world.drain()  # c3's, at once
    result = await world.reconcile("db")
    assert result is not None
    assert 0.5 < result.requeue_after <= 1.0
    assert world.copy_in("c2", "db")["spec"]["ports"][0]["port"] == 7777, "not yet"
    assert world.copy_in("c3", "db")["spec"]["ports"][0]["port"] == 80, "at once"
    await world.local.client.patch(SERVICES, "db", {"metadata": {"labels": {"v": "2"}}}, NS)
    await world.settled("db")
    assert await world.reconcile("db") is None
    assert world.copy_in("c2", "db")["spec"]["ports"][0]["port"] == 80, "the original changed"


# -- copies looked at again -----------------------------------------------------------------------


async def test_events_of_a_copy_that_keeps_failing_wait_for_its_backoff(world: World):
    """A target that keeps changing a copy whose writes fail would otherwise have it retried
    at the rate of its events, not with backoff."""
    await world.add_to("c2", orphan("old"))
    request = world.sync.copies.request(NS, "old")
    c2 = world.targets["c2"].client
    await world.drain()

    async def changed(label: str) -> None:
        await c2.patch(SERVICES, "old", {"metadata": {"labels": {"changed": label}}}, NS)
        await world.settled("old")

    await changed("first")
    assert await world.drain() == {"old"}, "an event of a copy: its original looked at"
    world.queue.add_rate_limited(request)  # it failed: retried later, with backoff
    await until(lambda: len(world.queue), what="the retry")
    assert await world.drain() == {"old"}
    for i in range(100):
        await changed(str(i))
    assert len(world.queue) == 0, "not before its backoff"
    world.queue.forget(request)  # it succeeded
    await changed("last")
    assert await world.drain() == {"old"}


async def test_copies_are_looked_at_again_periodically(
    make_world: Callable[[], Awaitable[World]], monkeypatch: pytest.MonkeyPatch
):
    """Even with no event and no change of readiness, an orphaned copy is found."""
    monkeypatch.setattr(copies_module, "RESYNC_PERIOD", 0.05)
    world = await make_world()
    await world.connect("c2")
    await world.add_to("c2", orphan())
    await world.drain()  # its event, and the first resync
    queued: set[str] = set()

    async def looked_at() -> None:
        queued.update(await world.drain())

    async with asyncio.timeout(2):
        while not queued:
            await looked_at()
            await asyncio.sleep(0.01)
    assert queued == {"old"}
    await world.reconcile("old")
    assert world.copy_in("c2", "old") is None


async def test_copies_are_looked_at_again_when_their_informer_recovers(world: World):
    copies = world.copies_cache("c2")
    await world.add_to("c2", orphan())
    await world.drain()
    recover = await broken(copies, world.targets["c2"].server)
    await settle()
    assert await world.drain() == set(), "not while it is broken"
    recover()
    await until(lambda: copies.healthy, what="the informer back")
    assert await world.drain() == {"old"}


async def test_resyncs_stop_when_the_target_goes(world: World, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(copies_module, "RESYNC_PERIOD", 0.05)
    c3 = await world.connect("c3")
    copies = world.copies_cache("c3")
    await world.add_to("c3", orphan())
    world.registry.disconnected(c3)
    assert c3.node_name not in world.sync.copies.informers
    await world.drain()
    recover = await broken(copies, world.targets["c3"].server)  # still running: not ours now
    recover()
    await until(lambda: copies.healthy, what="the informer back")
    await settle(0.2)  # resync periods
    assert await world.drain() == set(), "no longer looked at"
