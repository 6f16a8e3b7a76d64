"""Delegates' Events reflected onto their proxy pods
(:mod:`multicluster_scheduler.virtual_kubelet.event_reflector`), over in-memory API servers: a
source cluster and a target, delegates placed as the scheduler places them, Events written in the
target as its kubelet (or anyone who may write Events there) writes them."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncGenerator

import pytest

from multicluster import metrics
from multicluster.events import Correlator
from multicluster.informer import ADDED, DELETED
from multicluster.kubetime import format_time
from multicluster.resources import EVENTS
from multicluster_scheduler.targets.registry import TargetConnection
from multicluster_scheduler.virtual_kubelet import delegate_events
from multicluster_scheduler.virtual_kubelet.event_reflector import (
    INVOLVED_INDEX,
    UID_INDEX,
    EventReflector,
)
from tests.virtual_kubelet.test_pods import NS, Place, World, settle, there, until


class Reflecting(World):
    def __init__(self) -> None:
        super().__init__()
        self.reflector = EventReflector(self.local, self.lookup)
        self.running: asyncio.Task | None = None

    async def start(self, *, run: bool = True) -> None:
        await super().start(run=run)
        self.running = asyncio.create_task(self.reflector.run())

    async def stop(self) -> None:
        if self.running is not None:
            self.running.cancel()
            await asyncio.gather(self.running, return_exceptions=True)
        await super().stop()

    def reflected(self, proxy: str = "web-1") -> list[dict]:
        return [
            e
            for e in self.api.objects(EVENTS)
            if e["involvedObject"].get("name") == proxy
            and e.get("source", {}).get("component") == "admiralty-virtual-kubelet"
            and e["message"].startswith("[target ")
        ]


@pytest.fixture
async def world() -> AsyncGenerator[Reflecting, None]:
    made = Reflecting()
    try:
        yield made
    finally:
        await made.stop()


def kubelet_event(delegate: dict, name: str = "ev-1", **fields) -> dict:
    now = format_time()
    meta = delegate["metadata"]
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": NS},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": NS,
            "uid": meta["uid"],
        },
        "type": "Warning",
        "reason": "BackOff",
        "message": "Back-off restarting failed container web",
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": "kubelet", "host": "node-1"},
    }
    event.update(fields)
    return event


async def placed(world: Reflecting) -> tuple[TargetConnection, dict]:
    await world.start()
    c2 = await world.connect("c2")
    proxy = await world.proxy("web-1")
    delegate = await world.place(proxy, c2)
    await until(lambda: world.lookup.proxy_of(delegate, c2) is not None, what="bound")
    return c2, delegate


def dropped(node: str, reason: str) -> float:
    labels = {"target": node, "reason": reason}
    found = metrics.REGISTRY.get_sample_value(
        "multicluster_scheduler_delegate_events_dropped_total", labels
    )
    return found or 0.0


async def test_a_delegates_event_appears_on_its_proxy_pod_naming_its_target(world: Reflecting):
    c2, delegate = await placed(world)
    target = there(c2).client
    await target.create(EVENTS, kubelet_event(delegate), NS)
    await until(lambda: world.reflected(), what="the event reflected")
    [event] = world.reflected()
    assert event["message"] == "[target c2] Back-off restarting failed container web"
    assert event["type"] == "Warning"
    assert event["reason"] == "BackOff"
    assert event["involvedObject"]["uid"] == world.lookup.proxy_of(delegate, c2)["metadata"]["uid"]
    assert event["source"]["host"] == c2.node_name
    assert event["count"] == 1
    # Said again in the target: the count is raised, no second Event.
    await target.patch(EVENTS, "ev-1", {"count": 7, "lastTimestamp": format_time()}, NS)
    await until(lambda: world.reflected()[0]["count"] == 7, what="count 7")
    assert len(world.reflected()) == 1


async def test_an_event_about_a_pod_that_is_not_our_delegate_is_not_reflected(world: Reflecting):
    c2, delegate = await placed(world)
    target = there(c2).client
    before = dropped(c2.node_name, "invalid")
    forged = kubelet_event(delegate, "forged", message="forged")
    forged["involvedObject"]["uid"] = "not-a-delegate"  # the delegate's name, another uid
    await target.create(EVENTS, forged, NS)
    elsewhere = kubelet_event(delegate, "elsewhere", message="elsewhere")
    await target.create(EVENTS, {**elsewhere, "metadata": {"name": "x", "namespace": "other"}})
    unknown_type = kubelet_event(delegate, "odd", type="Critical", message="odd")
    await target.create(EVENTS, unknown_type, NS)
    await target.create(EVENTS, kubelet_event(delegate, "real", message="real"), NS)
    await until(lambda: world.reflected(), what="the real one reflected")
    await settle()
    assert [e["message"] for e in world.reflected()] == ["[target c2] real"]
    assert dropped(c2.node_name, "invalid") == before + 1  # "odd", about our delegate


async def test_a_burst_of_events_yields_a_bounded_number_of_writes(world: Reflecting):
    c2, delegate = await placed(world)
    target = there(c2).client
    before = dropped(c2.node_name, "proxy_rate_limit")
    for i in range(500):
        await target.create(EVENTS, kubelet_event(delegate, f"flood-{i}", message=f"m{i}"), NS)
    await until(
        lambda: dropped(c2.node_name, "proxy_rate_limit") - before >= 475, what="drops counted"
    )
    await settle()
    assert len(world.reflected()) == 25
    writes = [a for a in world.api.writes if a.resource == EVENTS]
    assert len(writes) <= 25


async def test_old_events_are_not_replayed_and_a_restart_writes_no_duplicate(world: Reflecting):
    """The watch stops (the agent stops leading, or the target reconnects), Events are written
    meanwhile, and a successor that remembers nothing watches again, beside the first: listed
    Events an hour old are history; a recent one reflected before is written again under its
    name (its count brought up to date), not a second time."""
    c2, delegate = await placed(world)
    target = there(c2).client
    await target.create(EVENTS, kubelet_event(delegate, "recent", message="recent"), NS)
    await until(lambda: world.reflected(), what="reflected")
    world.registry.disconnected(c2)
    old = format_time(dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
    await target.create(
        EVENTS, kubelet_event(delegate, "old", message="old", lastTimestamp=old), NS
    )
    await target.patch(EVENTS, "recent", {"count": 4, "lastTimestamp": format_time()}, NS)
    successor = EventReflector(world.local, world.lookup)
    world.registry.connected(c2)
    assert c2.node_name in successor.targets
    await until(lambda: world.reflected()[0]["count"] == 4, what="count 4")
    await settle()
    assert [e["message"] for e in world.reflected()] == ["[target c2] recent"]
    world.registry.disconnected(c2)
    assert not successor.targets
    await settle()  # its watch stopped


async def test_two_targets_of_one_cluster_reflect_an_event_once(world: Reflecting):
    """Both see the delegate and its events; the proxy pod's own target says it."""
    c2, delegate = await placed(world)
    await world.connect("c2-bis", Place("c2-bis", there(c2).server))
    await settle()
    await there(c2).client.create(EVENTS, kubelet_event(delegate), NS)
    await until(lambda: world.reflected(), what="reflected")
    await settle()
    assert [e["message"] for e in world.reflected()] == [
        "[target c2] Back-off restarting failed container web"
    ]


async def test_a_delegate_said_to_be_added_again_and_again_costs_no_look_each_time(
    world: Reflecting, monkeypatch: pytest.MonkeyPatch
):
    """A hostile target caches many Events about one delegate, then says the delegate is
    deleted and added again, as fast as it can: the Events cached before the delegate are
    looked at once, not once per addition (each look checks every one of them)."""
    c2, delegate = await placed(world)
    target = there(c2).client
    for i in range(40):
        await target.create(EVENTS, kubelet_event(delegate, f"ev-{i}", message=f"m{i}"), NS)
    watch = world.reflector.targets[c2.node_name]
    uid = delegate["metadata"]["uid"]
    await until(
        lambda: len(watch.informer.by_index(INVOLVED_INDEX, uid)) == 40, what="events cached"
    )
    looks = []
    observe = world.reflector._observe
    monkeypatch.setattr(world.reflector, "_observe", lambda w, s: looks.append(s) or observe(w, s))
    delegates = c2.delegates
    assert delegates is not None
    cached = delegates.by_index(UID_INDEX, uid)[0]
    for _ in range(100):
        delegates._dispatch(DELETED, cached, None, False)
        delegates._dispatch(ADDED, cached, None, False)
    assert len(looks) <= 40  # before: 4,000


async def test_only_the_messages_written_are_made_printable(
    world: Reflecting, monkeypatch: pytest.MonkeyPatch
):
    """A target floods one proxy pod with Events whose long messages a terminal would obey:
    those over the limits cost no look at each of their characters (10 times the cost of the
    rest of an Event's handling: a target's events read as fast as its limits allow kept a
    core busy)."""
    c2, delegate = await placed(world)
    target = there(c2).client
    cleaned = []
    clean = delegate_events.printable
    monkeypatch.setattr(
        delegate_events, "printable", lambda text, limit: cleaned.append(text) or clean(text, limit)
    )
    before = dropped(c2.node_name, "proxy_rate_limit")
    for i in range(200):
        message = f"{i}\x1b[2J" + "y" * 1000
        await target.create(EVENTS, kubelet_event(delegate, f"flood-{i}", message=message), NS)
    await until(
        lambda: dropped(c2.node_name, "proxy_rate_limit") - before >= 175, what="drops counted"
    )
    await settle()
    assert len(world.reflected()) == 25
    assert all("\x1b" not in e["message"] for e in world.reflected())
    assert len(cleaned) <= 2 * 25  # before: 225 (each Event, and each one written again)


async def test_the_targets_of_a_namespace_share_one_budget_for_their_events(world: Reflecting):
    """A tenant makes Targets of its namespace point at servers that send Events: what is
    cached of them all is within one budget (ten Targets had ten budgets: ten times what the
    namespace's other caches may hold)."""
    world.reflector.event_cache = 40_000
    await world.start()
    c2, c3 = await world.connect("c2"), await world.connect("c3")
    for connection in (c2, c3):
        for i in range(60):
            event = kubelet_event({"metadata": {"name": f"pod-{i}", "uid": f"u{i}"}}, f"ev-{i}")
            await there(connection).client.create(EVENTS, event, NS)
    await settle()
    informers = [world.reflector.targets[c.node_name].informer for c in (c2, c3)]
    cached = [len(i.list()) for i in informers]
    assert sum(cached) < 120  # some left out, by the budget
    assert sum(sum(i._costs.values()) for i in informers) <= 40_000


async def test_a_namespaces_targets_share_one_limit_and_all_targets_another(world: Reflecting):
    """A tenant's Targets flood their delegates' proxy pods: the writes of a namespace's Targets
    are bounded together (ten Targets had ten times the limit), and those of all targets too
    (they share this cluster's API requests with placing pods)."""
    world.reflector.target_limits = Correlator(burst=3, refill_every=3600.0)
    world.reflector.total_limits = Correlator(burst=5, refill_every=3600.0)
    c2, delegate = await placed(world)
    c3 = await world.connect("c3")
    other = await world.place(await world.proxy("web-2"), c3)
    await until(lambda: world.lookup.proxy_of(other, c3) is not None, what="bound")
    for connection, pod in ((c2, delegate), (c3, other)):
        for i in range(10):
            event = kubelet_event(pod, f"flood-{i}", message=f"m{i}")
            await there(connection).client.create(EVENTS, event, NS)
    await until(
        lambda: (
            dropped(c2.node_name, "target_rate_limit") + dropped(c3.node_name, "target_rate_limit")
            >= 17
        ),
        what="drops counted",
    )
    await settle()
    assert len(world.reflected("web-1")) + len(world.reflected("web-2")) == 3  # before: 6
    # Past the limit of all targets, however many writes a namespace has left.
    world.reflector.target_limits = Correlator(burst=100, refill_every=3600.0)
    before = dropped(c2.node_name, "total_rate_limit")
    for i in range(10):
        event = kubelet_event(delegate, f"more-{i}", message=f"more {i}")
        await there(c2).client.create(EVENTS, event, NS)
    await until(lambda: dropped(c2.node_name, "total_rate_limit") - before >= 8, what="total")
    assert len(world.reflected("web-1")) + len(world.reflected("web-2")) == 5
