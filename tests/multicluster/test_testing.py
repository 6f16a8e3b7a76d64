"""The fake API server of :mod:`multicluster.testing` behaves as a kube-apiserver where a
controller can tell: resource versions, conflicts, status, finalizers, graceful pod deletion,
selectors, the four patches, watches (replay, 410 Gone, dropped), reactors, and a real Informer
over it."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncGenerator, Callable

import pytest

from multicluster.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Gone,
    Invalid,
    NotFound,
    ServerError,
    Unreachable,
)
from multicluster.informer import Informer
from multicluster.kubetime import parse_time
from multicluster.resources import CONFIGMAPS, NODES, PODS, Resource
from multicluster.testing import Action, FakeClient, FakeCluster, FakeServer

NS = "ns"
WIDGETS = Resource("example.com", "v1", "widgets", "Widget")


def pod(name: str, ns: str = NS, labels: dict | None = None, **spec: object) -> dict:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels or {}}, "spec": spec}


async def set_finalizers(client: FakeClient, read: dict, *finalizers: str) -> dict:
    """A merge patch of the finalizers, conditional on the version ``read`` (as controllers
    write them)."""
    meta = read["metadata"]
    patch = {
        "metadata": {"finalizers": list(finalizers), "resourceVersion": meta["resourceVersion"]}
    }
    return await client.patch(PODS, meta["name"], patch, meta["namespace"])


def names(objects: list[dict]) -> list[str]:
    return [o["metadata"]["name"] for o in objects]


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


@pytest.fixture
def client(server: FakeServer) -> FakeClient:
    return FakeClient(server, name="cluster-a")


@pytest.fixture
async def cluster() -> AsyncGenerator[FakeCluster, None]:
    made = FakeCluster("cluster-a")
    yield made
    await made.stop()


async def until(condition: Callable[[], bool], timeout: float = 3.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "not in time"
        await asyncio.sleep(0.005)


class Watching:
    """A watch read by a task of its own: cancelling a read of a watch would end it."""

    def __init__(self, events: AsyncGenerator[dict, None]) -> None:
        self.received: asyncio.Queue[dict | None] = asyncio.Queue()
        self.task = asyncio.create_task(self._read(events))
        _WATCHES.append(self)

    async def _read(self, events: AsyncGenerator[dict, None]) -> None:
        async for event in events:
            self.received.put_nowait(event)
        self.received.put_nowait(None)  # the watch ended

    async def event(self) -> dict | None:
        return await asyncio.wait_for(self.received.get(), 1.0)

    async def next(self) -> tuple[str, str]:
        event = await self.event()
        assert event is not None, "the watch ended"
        return event["type"], event["object"]["metadata"].get("name", "")

    async def nothing(self) -> None:
        await asyncio.sleep(0.05)
        assert self.received.empty()


_WATCHES: list[Watching] = []


@pytest.fixture(autouse=True)
async def _close_watches() -> AsyncGenerator[None, None]:
    yield
    for watching in _WATCHES:
        watching.task.cancel()
    await asyncio.gather(*(w.task for w in _WATCHES), return_exceptions=True)
    _WATCHES.clear()


# -- create and get -------------------------------------------------------------------------


async def test_create_sets_what_the_server_owns(client: FakeClient) -> None:
    made = await client.create(PODS, {"metadata": {"name": "a"}, "spec": {}}, NS)
    meta = made["metadata"]
    assert meta["namespace"] == NS
    assert meta["uid"]
    assert meta["generation"] == 1
    assert meta["resourceVersion"].isdigit()
    assert parse_time(meta["creationTimestamp"]) is not None
    assert (made["apiVersion"], made["kind"]) == ("v1", "Pod")
    assert await client.get(PODS, "a", NS) == made


async def test_resource_versions_are_one_increasing_counter(client: FakeClient) -> None:
    versions = [
        int((await client.create(resource, body, NS))["metadata"]["resourceVersion"])
        for resource, body in ((PODS, pod("a")), (CONFIGMAPS, pod("b")), (NODES, pod("n")))
    ]
    assert versions == sorted(versions)
    assert len(set(versions)) == 3
    items, version = await client.list(NODES)
    assert names(items) == ["n"]
    assert "namespace" not in items[0]["metadata"]
    assert version == str(versions[-1])


async def test_creating_an_existing_name_is_already_exists(client: FakeClient) -> None:
    await client.create(PODS, pod("a"))
    with pytest.raises(AlreadyExists) as caught:
        await client.create(PODS, pod("a"))
    assert caught.value.status == 409
    assert caught.value.reason == "AlreadyExists"
    assert str(caught.value) == (
        'POST /api/v1/namespaces/ns/pods/a on cluster-a: 409 pods "a" already exists'
    )


async def test_generate_name_makes_distinct_names(client: FakeClient) -> None:
    body = {"metadata": {"generateName": "web-"}}
    made = [(await client.create(PODS, body, NS))["metadata"]["name"] for _ in range(3)]
    assert len(set(made)) == 3
    assert all(n.startswith("web-") and len(n) == 9 for n in made)


async def test_create_refuses_what_the_real_server_refuses(client: FakeClient) -> None:
    with pytest.raises(ServerError, match="resourceVersion should not be set"):
        await client.create(PODS, {"metadata": {"name": "a", "resourceVersion": "3"}}, NS)
    with pytest.raises(Invalid, match="name or generateName is required"):
        await client.create(PODS, {"metadata": {}}, NS)
    with pytest.raises(BadRequest, match="does not match the namespace"):
        await client.create(PODS, pod("a", ns="other"), NS)
    with pytest.raises(ApiError) as caught:
        await client.create(PODS, {"metadata": {"name": "a"}})
    assert caught.value.status == 405


async def test_get_of_a_missing_object_is_not_found(client: FakeClient) -> None:
    with pytest.raises(NotFound) as caught:
        await client.get(PODS, "x", NS)
    assert caught.value.message == 'pods "x" not found'
    assert caught.value.body["details"] == {"name": "x", "group": "", "kind": "pods"}


async def test_nothing_a_caller_holds_is_the_store(server: FakeServer, client: FakeClient) -> None:
    body = pod("a", labels={"app": "web"})
    (seeded,) = server.add(PODS, pod("seed"))
    made = await client.create(PODS, body)
    events = Watching(client.watch(PODS, NS, resource_version=made["metadata"]["resourceVersion"]))
    await client.patch(PODS, "a", {"spec": {"x": 1}}, NS)
    event = await events.event()
    assert event is not None
    for held in (body, made, seeded, await client.get(PODS, "a", NS), event["object"]):
        held["metadata"]["labels"]["app"] = "changed"
        held["metadata"]["name"] = "changed"
    (listed, _), _ = await client.list(PODS, NS)
    listed["metadata"]["labels"]["app"] = "changed"
    server.objects(PODS)[0]["metadata"]["labels"]["app"] = "changed"
    assert names(server.objects(PODS)) == ["a", "seed"]
    assert (await client.get(PODS, "a", NS))["metadata"]["labels"] == {"app": "web"}


# -- selectors ------------------------------------------------------------------------------

LABELLED = [
    pod("a", labels={"app": "web", "tier": "front"}),
    pod("b", labels={"app": "db", "tier": "back"}),
    pod("c", labels={"app": "web"}),
    pod("d"),
]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", "abcd"),
        ("app=web", "ac"),
        ("app==web", "ac"),
        (" app = web ", "ac"),
        ("app!=web", "bd"),
        ("tier!=front", "bcd"),
        ("app in (web,db)", "abc"),
        ("app in (db)", "b"),
        ("app notin (web)", "bd"),
        ("tier", "ab"),
        ("!tier", "cd"),
        ("app=web,tier", "a"),
        ("app=web,!tier", "c"),
        ("app in (web, db),tier notin (back)", "ac"),
        ("app=nothing", ""),
    ],
)
async def test_label_selectors(client: FakeClient, selector: str, expected: str) -> None:
    client.server.add(PODS, *LABELLED)
    items, _ = await client.list(PODS, NS, label_selector=selector)
    assert "".join(names(items)) == expected


@pytest.mark.parametrize("selector", ["app in web", "a=b=c", "app in (web", "a b"])
async def test_a_malformed_label_selector_is_a_bad_request(
    client: FakeClient, selector: str
) -> None:
    with pytest.raises(BadRequest, match="unable to parse"):
        await client.list(PODS, label_selector=selector)


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("metadata.name=a", "a"),
        ("metadata.namespace=other", "e"),
        ("spec.nodeName=n1", "ab"),
        ("spec.nodeName==n1,status.phase=Running", "a"),
        ("spec.nodeName=", "ce"),
        ("status.phase!=Running", "bce"),
        ("spec.hostNetwork=true", "b"),
        ("metadata.labels.app=web", "c"),
    ],
)
async def test_field_selectors(client: FakeClient, selector: str, expected: str) -> None:
    client.server.add(
        PODS,
        {**pod("a", nodeName="n1"), "status": {"phase": "Running"}},
        {**pod("b", nodeName="n1", hostNetwork=True), "status": {"phase": "Pending"}},
        pod("c", labels={"app": "web"}),
        pod("e", ns="other"),
    )
    items, _ = await client.list(PODS, field_selector=selector)
    assert "".join(names(items)) == expected


async def test_list_pages_are_cut_from_one_snapshot(client: FakeClient) -> None:
    client.server.add(PODS, *(pod(f"p{i}") for i in range(5)))
    pages = []
    async for page in client.list_pages(PODS, NS, limit=2):
        pages.append(page)
        await client.create(PODS, pod(f"late{len(pages)}"))
    assert [names(p["items"]) for p in pages] == [["p0", "p1"], ["p2", "p3"], ["p4"]]
    assert [bool(p["metadata"].get("continue")) for p in pages] == [True, True, False]
    assert len({p["metadata"]["resourceVersion"] for p in pages}) == 1
    items, _ = await client.list(PODS, NS, limit=3)
    assert len(items) == 8


# -- update ---------------------------------------------------------------------------------


async def test_an_update_with_a_stale_resource_version_conflicts(client: FakeClient) -> None:
    read = await client.create(PODS, pod("a", image="v1"))
    await client.patch(PODS, "a", {"spec": {"image": "v2"}}, NS)
    read["spec"]["image"] = "v3"
    with pytest.raises(Conflict, match="the object has been modified") as caught:
        await client.update(PODS, read)
    assert not isinstance(caught.value, AlreadyExists)
    del read["metadata"]["resourceVersion"]  # unconditional
    assert (await client.update(PODS, read))["spec"]["image"] == "v3"
    with pytest.raises(NotFound):
        await client.update(PODS, pod("missing"))


async def test_status_is_written_only_through_its_subresource(client: FakeClient) -> None:
    made = await client.create(PODS, {**pod("a", image="v1"), "status": {"phase": "Pending"}})
    made["spec"]["image"] = "v2"
    made["status"]["phase"] = "Running"
    updated = await client.update(PODS, made)
    assert updated["spec"]["image"] == "v2"
    assert updated["status"]["phase"] == "Pending"
    assert updated["metadata"]["generation"] == 2
    updated["spec"]["image"] = "v3"
    updated["status"]["phase"] = "Running"
    written = await client.update_status(PODS, updated)
    assert written["spec"]["image"] == "v2"
    assert written["status"]["phase"] == "Running"
    assert written["metadata"]["generation"] == 2


async def test_the_generation_counts_spec_changes_only(client: FakeClient) -> None:
    await client.create(PODS, pod("a", image="v1"))
    labelled = await client.patch(PODS, "a", {"metadata": {"labels": {"x": "y"}}}, NS)
    assert labelled["metadata"]["generation"] == 1
    changed = await client.patch(PODS, "a", {"spec": {"image": "v2"}}, NS)
    assert changed["metadata"]["generation"] == 2


async def test_a_write_that_changes_nothing_is_no_write(client: FakeClient) -> None:
    made = await client.create(PODS, pod("a", image="v1"))
    events = Watching(client.watch(PODS, NS, resource_version=made["metadata"]["resourceVersion"]))
    assert await client.update(PODS, made) == made
    same = await client.patch(PODS, "a", {"spec": {"image": "v1"}}, NS)
    assert same["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"]
    await events.nothing()


# -- patch ----------------------------------------------------------------------------------


async def test_merge_patch(client: FakeClient) -> None:
    await client.create(PODS, pod("a", labels={"x": "1", "y": "2"}, args=["a", "b"], keep=1))
    patch = {"metadata": {"labels": {"x": None, "z": "3"}}, "spec": {"args": ["c"]}}
    patched = await client.patch(PODS, "a", patch, NS)
    assert patched["metadata"]["labels"] == {"y": "2", "z": "3"}
    assert patched["spec"] == {"args": ["c"], "keep": 1}


async def test_json_patch(client: FakeClient) -> None:
    await client.create(PODS, pod("a", labels={"a/b": "1"}, args=["x", "z"]))
    operations = [
        {"op": "test", "path": "/metadata/labels/a~1b", "value": "1"},
        {"op": "add", "path": "/spec/args/1", "value": "y"},
        {"op": "add", "path": "/spec/args/-", "value": "end"},
        {"op": "replace", "path": "/spec/args/0", "value": "w"},
        {"op": "remove", "path": "/metadata/labels/a~1b"},
        {"op": "copy", "from": "/spec/args", "path": "/spec/copied"},
        {"op": "move", "from": "/spec/copied", "path": "/spec/moved"},
    ]
    patched = await client.patch(PODS, "a", operations, NS, patch_type="json")
    assert patched["spec"] == {"args": ["w", "y", "z", "end"], "moved": ["w", "y", "z", "end"]}
    assert patched["metadata"]["labels"] == {}


@pytest.mark.parametrize(
    ("operations", "error"),
    [
        ([{"op": "test", "path": "/spec/image", "value": "other"}], Invalid),
        ([{"op": "replace", "path": "/spec/missing", "value": 1}], Invalid),
        ([{"op": "remove", "path": "/spec/args/5"}], Invalid),
        ([{"op": "add", "path": "/no/such/parent", "value": 1}], Invalid),
        ([{"op": "frobnicate", "path": "/spec"}], BadRequest),
        ({"op": "add"}, BadRequest),
        (b"not json", BadRequest),
    ],
)
async def test_a_json_patch_that_cannot_apply_changes_nothing(
    client: FakeClient, operations: object, error: type[ApiError]
) -> None:
    made = await client.create(PODS, pod("a", image="v1", args=[]))
    good = {"op": "replace", "path": "/spec/image", "value": "v2"}
    patch = [good, *operations] if isinstance(operations, list) else operations
    with pytest.raises(error):
        await client.patch(PODS, "a", patch, NS, patch_type="json")
    assert await client.get(PODS, "a", NS) == made


async def test_strategic_merge_patch(client: FakeClient) -> None:
    containers = [{"name": "app", "image": "v1"}, {"name": "side", "image": "s1"}]
    body = pod("a", containers=containers, tolerations=[{"key": "a"}])
    body["metadata"]["finalizers"] = ["one"]
    await client.create(PODS, {**body, "status": {"conditions": [{"type": "Ready"}]}})
    patch = {
        "metadata": {"finalizers": ["two"]},
        "spec": {
            "containers": [
                {"name": "app", "image": "v2"},
                {"name": "side", "$patch": "delete"},
                {"name": "new", "image": "n1"},
            ],
            "tolerations": [{"key": "b"}],
        },
    }
    patched = await client.patch(PODS, "a", patch, NS, patch_type="strategic")
    assert patched["spec"]["containers"] == [
        {"name": "app", "image": "v2"},
        {"name": "new", "image": "n1"},
    ]
    assert patched["spec"]["tolerations"] == [{"key": "b"}]
    assert patched["metadata"]["finalizers"] == ["one", "two"]
    removal = {"metadata": {"$deleteFromPrimitiveList/finalizers": ["one"]}}
    patched = await client.patch(PODS, "a", removal, NS, patch_type="strategic")
    assert patched["metadata"]["finalizers"] == ["two"]
    condition = {"type": "PodScheduled", "status": "True"}
    patched = await client.patch(
        PODS,
        "a",
        {"status": {"conditions": [condition]}},
        NS,
        patch_type="strategic",
        subresource="status",
    )
    assert patched["status"]["conditions"] == [{"type": "Ready"}, condition]


async def test_strategic_merge_patch_of_a_custom_resource_is_refused(client: FakeClient) -> None:
    await client.create(WIDGETS, pod("w"))
    with pytest.raises(ApiError) as caught:
        await client.patch(WIDGETS, "w", {"spec": {"x": 1}}, NS, patch_type="strategic")
    assert caught.value.status == 415


async def test_apply_creates_then_merges_and_records_its_manager(client: FakeClient) -> None:
    config = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    applied = {**config, "spec": {"size": 1, "color": "red"}}
    made = await client.patch(WIDGETS, "w", applied, NS, patch_type="apply", field_manager="me")
    (entry,) = made["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"]) == ("me", "Apply")
    assert entry["fieldsV1"] == {"f:spec": {"f:size": {}, "f:color": {}}}
    again = await client.patch(WIDGETS, "w", applied, NS, patch_type="apply", field_manager="me")
    assert again["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"]
    other = {**config, "spec": {"size": 2}}
    merged = await client.patch(WIDGETS, "w", other, NS, patch_type="apply", field_manager="you")
    assert merged["spec"] == {"size": 2, "color": "red"}
    assert [e["manager"] for e in merged["metadata"]["managedFields"]] == ["me", "you"]
    yaml_patch = b"metadata:\n  name: w\nspec:\n  size: 3\n"
    merged = await client.patch(
        WIDGETS, "w", yaml_patch, NS, patch_type="apply", field_manager="you"
    )
    assert merged["spec"]["size"] == 3
    assert len(merged["metadata"]["managedFields"]) == 2
    with pytest.raises(BadRequest, match="fieldManager"):
        await client.patch(WIDGETS, "w", other, NS, patch_type="apply")


async def test_patches_touch_status_only_through_the_subresource(client: FakeClient) -> None:
    await client.create(PODS, {**pod("a", image="v1"), "status": {"phase": "Pending"}})
    patch = {"spec": {"image": "v2"}, "status": {"phase": "Running"}}
    main = await client.patch(PODS, "a", patch, NS)
    assert (main["spec"]["image"], main["status"]["phase"]) == ("v2", "Pending")
    patch = {"spec": {"image": "v3"}, "status": {"phase": "Running"}}
    status = await client.patch(PODS, "a", patch, NS, subresource="status")
    assert (status["spec"]["image"], status["status"]["phase"]) == ("v2", "Running")
    with pytest.raises(NotFound):
        await client.patch(PODS, "a", patch, NS, subresource="scale")


async def test_a_patch_with_a_stale_resource_version_conflicts(client: FakeClient) -> None:
    read = await client.create(PODS, pod("a"))
    await client.patch(PODS, "a", {"metadata": {"labels": {"x": "y"}}}, NS)
    with pytest.raises(Conflict):
        await set_finalizers(client, read, "mine")
    fresh = await client.get(PODS, "a", NS)
    added = await set_finalizers(client, fresh, "mine")
    assert added["metadata"]["finalizers"] == ["mine"]
    with pytest.raises(NotFound):
        await client.patch(PODS, "missing", {"spec": {}}, NS)


# -- delete ---------------------------------------------------------------------------------


async def test_delete_preconditions_and_missing_ok(client: FakeClient) -> None:
    made = await client.create(PODS, pod("a"))
    meta = made["metadata"]
    with pytest.raises(Conflict, match="Precondition failed: UID"):
        await client.delete(PODS, "a", NS, preconditions={"uid": "other"})
    with pytest.raises(Conflict, match="Precondition failed: ResourceVersion"):
        await client.delete(PODS, "a", NS, preconditions={"resourceVersion": "0"})
    preconditions = {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]}
    await client.delete(PODS, "a", NS, preconditions=preconditions)
    assert client.server.objects(PODS) == []
    assert await client.delete(PODS, "a", NS, missing_ok=True) is None
    with pytest.raises(NotFound):
        await client.delete(PODS, "a", NS)


async def test_finalizers_hold_a_deleted_object_until_removed(client: FakeClient) -> None:
    body = pod("a")
    body["metadata"]["finalizers"] = ["mine"]
    made = await client.create(PODS, body)
    events = Watching(client.watch(PODS, NS, resource_version=made["metadata"]["resourceVersion"]))
    deleted = await client.delete(PODS, "a", NS)
    assert deleted is not None
    assert parse_time(deleted["metadata"]["deletionTimestamp"]) is not None
    assert deleted["metadata"]["deletionGracePeriodSeconds"] == 0
    assert await events.next() == ("MODIFIED", "a")
    again = await client.delete(PODS, "a", NS)
    assert again == await client.get(PODS, "a", NS) == deleted
    with pytest.raises(Invalid, match="no new finalizers"):
        await set_finalizers(client, deleted, "mine", "another")
    await set_finalizers(client, deleted)
    assert await events.next() == ("DELETED", "a")
    with pytest.raises(NotFound):
        await client.get(PODS, "a", NS)


async def test_a_pod_on_a_node_is_deleted_gracefully(client: FakeClient) -> None:
    await client.create(PODS, pod("a", nodeName="n1"))
    await client.create(PODS, pod("b", nodeName="n1", terminationGracePeriodSeconds=5))
    await client.create(PODS, pod("unbound"))
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    deleted = await client.delete(PODS, "a", NS)
    assert deleted is not None
    meta = deleted["metadata"]
    assert meta["deletionGracePeriodSeconds"] == 30
    when = parse_time(meta["deletionTimestamp"])
    assert when is not None
    assert dt.timedelta(seconds=29) <= when - before <= dt.timedelta(seconds=31)
    assert await client.delete(PODS, "a", NS) == deleted  # not moved
    assert await client.delete(PODS, "a", NS, grace_period_seconds=10) == deleted
    b = await client.delete(PODS, "b", NS)
    assert b is not None
    assert b["metadata"]["deletionGracePeriodSeconds"] == 5
    await client.delete(PODS, "unbound", NS)
    assert names(client.server.objects(PODS)) == ["a", "b"]
    await client.delete(PODS, "a", NS, grace_period_seconds=0)  # as a kubelet does
    assert names(client.server.objects(PODS)) == ["b"]


async def test_a_pod_with_a_finalizer_waits_for_both(client: FakeClient) -> None:
    body = pod("a", nodeName="n1")
    body["metadata"]["finalizers"] = ["mine"]
    await client.create(PODS, body)
    await client.delete(PODS, "a", NS)
    held = await client.get(PODS, "a", NS)
    await set_finalizers(client, held)
    assert names(client.server.objects(PODS)) == ["a"]  # still ending gracefully
    await client.delete(PODS, "a", NS, grace_period_seconds=0)
    assert client.server.objects(PODS) == []


# -- watch ----------------------------------------------------------------------------------


async def test_a_watch_sees_what_its_selectors_select(client: FakeClient) -> None:
    _, version = await client.list(PODS)
    events = Watching(client.watch(PODS, NS, resource_version=version, label_selector="app=web"))
    await client.create(PODS, pod("other-app", labels={"app": "db"}))
    await client.create(PODS, pod("other-ns", ns="elsewhere", labels={"app": "web"}))
    await client.create(PODS, pod("a", labels={"app": "web"}))
    assert await events.next() == ("ADDED", "a")
    await client.patch(PODS, "a", {"spec": {"x": 1}}, NS)
    assert await events.next() == ("MODIFIED", "a")
    await client.patch(PODS, "a", {"metadata": {"labels": {"app": "db"}}}, NS)
    assert await events.next() == ("DELETED", "a")
    await client.patch(PODS, "a", {"spec": {"x": 2}}, NS)
    await client.patch(PODS, "a", {"metadata": {"labels": {"app": "web"}}}, NS)
    assert await events.next() == ("ADDED", "a")
    await client.delete(PODS, "a", NS)
    assert await events.next() == ("DELETED", "a")
    await events.nothing()


async def test_a_watch_replays_its_history_and_is_gone_once_compacted(
    client: FakeClient,
) -> None:
    a = await client.create(PODS, pod("a"))
    since = a["metadata"]["resourceVersion"]
    await client.create(PODS, pod("b"))
    await client.delete(PODS, "a", NS)
    events = Watching(client.watch(PODS, NS, resource_version=since))
    assert [await events.next() for _ in range(2)] == [("ADDED", "b"), ("DELETED", "a")]
    client.server.compact()
    with pytest.raises(Gone, match="too old resource version"):
        await asyncio.wait_for(anext(client.watch(PODS, NS, resource_version=since)), 1.0)
    _, now = await client.list(PODS)
    events = Watching(client.watch(PODS, NS, resource_version=now))
    await events.nothing()


async def test_a_bounded_history_forgets_old_versions() -> None:
    client = FakeClient(FakeServer(history=2))
    versions = [(await client.create(PODS, pod(n)))["metadata"]["resourceVersion"] for n in "abcd"]
    with pytest.raises(Gone):
        await asyncio.wait_for(anext(client.watch(PODS, NS, resource_version=versions[0])), 1.0)
    events = Watching(client.watch(PODS, NS, resource_version=versions[1]))
    assert [await events.next() for _ in range(2)] == [("ADDED", "c"), ("ADDED", "d")]
    with pytest.raises(BadRequest):
        await asyncio.wait_for(anext(client.watch(PODS, NS, resource_version="abc")), 1.0)


async def test_a_watch_from_no_version_starts_with_the_objects(client: FakeClient) -> None:
    client.server.add(PODS, pod("a"), pod("b", labels={"app": "web"}))
    events = Watching(client.watch(PODS, NS, label_selector="app=web"))
    assert await events.next() == ("ADDED", "b")
    await events.nothing()


async def test_a_watch_opens_bookmarks_and_ends_when_dropped_or_on_time(
    client: FakeClient,
) -> None:
    opened: list[bool] = []
    _, version = await client.list(PODS)
    events = Watching(
        client.watch(PODS, NS, resource_version=version, on_open=lambda: opened.append(True))
    )
    await events.nothing()
    assert opened == [True]
    await client.create(PODS, pod("a"))
    client.server.bookmark()
    assert await events.next() == ("ADDED", "a")
    bookmark = await events.event()
    assert bookmark is not None
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"]["resourceVersion"] == (await client.list(PODS))[1]
    client.server.drop_watches()
    assert await events.event() is None
    quick = Watching(client.watch(PODS, NS, resource_version=version, timeout_seconds=0))
    assert await quick.next() == ("ADDED", "a")
    assert await quick.event() is None


# -- reactors and actions -------------------------------------------------------------------


async def test_fail_next_fails_one_call_then_the_server_answers(client: FakeClient) -> None:
    client.server.fail_next("create", PODS, ServerError("boom", status=500))
    await client.create(CONFIGMAPS, pod("cm"))
    with pytest.raises(ServerError, match="boom"):
        await client.create(PODS, pod("a"))
    await client.create(PODS, pod("a"))
    assert names(client.server.objects(PODS)) == ["a"]


async def test_a_reactor_fails_as_often_as_told(client: FakeClient) -> None:
    server = client.server
    always = server.fail_next("*", None, Unreachable("down"), times=None)
    for _ in range(3):
        with pytest.raises(Unreachable):
            await client.get(PODS, "a", NS)
    server.remove_reactor(always)
    server.fail_next("list", PODS, ServerError("twice", status=500), times=2)
    for _ in range(2):
        with pytest.raises(ServerError):
            await client.list(PODS)
    assert (await client.list(PODS))[0] == []


async def test_a_reaction_sees_the_call_and_may_let_it_through(client: FakeClient) -> None:
    seen: list[Action] = []

    def refuse_b(action: Action) -> ApiError | None:
        seen.append(action)
        return action.error(403, "forbidden") if action.name == "b" else None

    client.server.prepend_reactor("create", PODS, refuse_b)
    await client.create(PODS, pod("a"))
    with pytest.raises(ApiError) as caught:
        await client.create(PODS, pod("b"))
    assert caught.value.status == 403
    assert [(a.verb, a.namespace, a.name) for a in seen] == [
        ("create", NS, "a"),
        ("create", NS, "b"),
    ]


async def test_actions_record_every_call_and_writes_the_writes(client: FakeClient) -> None:
    server = client.server
    server.add(PODS, pod("seeded"))
    assert server.actions == []
    await client.create(PODS, pod("a", nodeName="n"))
    await client.get(PODS, "a", NS)
    await client.list(PODS)
    await client.patch(PODS, "a", {"status": {"phase": "Running"}}, NS, subresource="status")
    await client.delete(PODS, "missing", NS, missing_ok=True)
    verbs = [(a.verb, a.name, a.subresource, a.client) for a in server.actions]
    assert verbs == [
        ("create", "a", None, "cluster-a"),
        ("get", "a", None, "cluster-a"),
        ("list", None, None, "cluster-a"),
        ("patch", "a", "status", "cluster-a"),
        ("delete", "missing", None, "cluster-a"),
    ]
    assert [a.verb for a in server.writes] == ["create", "patch", "delete"]


async def test_two_clients_share_one_server() -> None:
    server = FakeServer()
    one, two = FakeClient(server, name="agent-1"), FakeClient(server, name="agent-2")
    made = await one.create(PODS, pod("a"))
    read = await two.get(PODS, "a", NS)
    assert read == made
    await one.patch(PODS, "a", {"spec": {"x": 1}}, NS)
    with pytest.raises(Conflict, match="on agent-2"):
        await two.update(PODS, read)
    assert [a.client for a in server.writes] == ["agent-1", "agent-1", "agent-2"]


async def test_binding_assigns_a_pod_once(client: FakeClient) -> None:
    made = await client.create(PODS, pod("a"))
    binding = {
        "metadata": {"name": "a", "namespace": NS, "uid": made["metadata"]["uid"]},
        "target": {"kind": "Node", "name": "n1"},
    }
    await client.create(PODS, binding, NS, subresource="binding", name="a")
    bound = await client.get(PODS, "a", NS)
    assert bound["spec"]["nodeName"] == "n1"
    assert bound["status"]["conditions"][0]["type"] == "PodScheduled"
    with pytest.raises(Conflict, match="already assigned"):
        await client.create(PODS, binding, NS, subresource="binding", name="a")


async def test_a_fake_client_serves_no_raw_request(client: FakeClient) -> None:
    with pytest.raises(NotFound, match="could not find the requested resource"):
        await client.request("GET", "/version")


# -- informers over the fake ----------------------------------------------------------------


def recorder(informer: Informer) -> list[tuple[str, str]]:
    events: list[tuple[str, str]] = []
    informer.add_handler(
        lambda kind, obj, old, initial: events.append((kind, obj["metadata"]["name"]))
    )
    return events


async def test_an_informer_over_a_fake_cluster_syncs_and_follows(cluster: FakeCluster) -> None:
    cluster.server.add(PODS, pod("seeded"))
    informer = cluster.informer(PODS, NS)
    events = recorder(informer)
    cluster.start()
    assert await cluster.wait_synced(2)
    assert events == [("ADDED", "seeded")]
    await cluster.client.create(PODS, pod("a"))
    await cluster.client.patch(PODS, "a", {"spec": {"x": 1}}, NS)
    await cluster.client.delete(PODS, "a", NS)
    await until(lambda: len(events) == 4)
    assert events[1:] == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert informer.healthy


async def test_an_informer_watches_again_after_watches_drop(cluster: FakeCluster) -> None:
    informer = cluster.informer(PODS, NS)
    events = recorder(informer)
    cluster.start()
    assert await cluster.wait_synced(2)
    cluster.server.drop_watches()
    await cluster.client.create(PODS, pod("a"))
    await until(lambda: events == [("ADDED", "a")])
    verbs = [a.verb for a in cluster.server.actions]
    assert verbs.count("watch") == 2
    assert verbs.count("list") == 1
    assert informer.get("a", NS) is not None


async def test_an_informer_lists_again_when_its_version_is_gone(cluster: FakeCluster) -> None:
    cluster.server.add(PODS, pod("old"))
    informer = cluster.informer(PODS, NS)
    cluster.start()
    assert await cluster.wait_synced(2)
    events = recorder(informer)
    await informer.stop()
    await cluster.client.create(PODS, pod("new"))
    await cluster.client.delete(PODS, "old", NS)
    cluster.server.compact()
    informer.start()
    await until(lambda: len(events) == 3)
    assert sorted(events[1:]) == [("ADDED", "new"), ("DELETED", "old")]
    assert [a.verb for a in cluster.server.actions].count("list") == 2
    assert [o["metadata"]["name"] for o in informer.list()] == ["new"]


async def test_an_informer_retries_a_list_a_reactor_failed(cluster: FakeCluster) -> None:
    cluster.server.fail_next("list", PODS, ServerError("once", status=500))
    informer = cluster.informer(PODS)
    cluster.start()
    assert await cluster.wait_synced(3)
    assert informer.healthy
    assert [a.verb for a in cluster.server.actions].count("list") == 2
