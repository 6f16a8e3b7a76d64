"""A target that never answers the creation of delegates holds a bounded share of the
scheduler's workers: at most ``MAX_CREATES_PER_NAMESPACE`` of its namespace's pods wait on it
(``MAX_CREATES_PER_OWNER`` of all namespaces' pods, for a ClusterTarget), each at most
``CREATE_TIMEOUT``; the others wait without holding a worker, each asked again as soon as one of
those creates ends, and other namespaces' pods are placed meanwhile, through the same
ClusterTarget too.

On the fake API server of :mod:`multicluster.testing` (see ``test_scheduler_controller``), the
silent target is a fake cluster whose client takes pod creations and answers them only when the
test lets it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from multicluster.resources import EVENTS, PODS
from multicluster.testing import FakeClient, FakeCluster, FakeServer
from multicluster_scheduler.api.proxy import delegate_name
from multicluster_scheduler.scheduler import controller as scheduler_module
from tests.scheduler.test_scheduler_controller import (
    World,
    condition_seen,
    elected,
    make_world,
    node,
    uid_of,
    until,
)

__all__ = ["make_world"]  # the fixture, imported to be used here (not an unused import)

EVIL, GOOD = "mallory", "good"


class Silent(FakeClient):
    """A client whose pod creations get no answer until :meth:`answer` (reads and other writes
    are answered at once): a target's API server that accepts connections and stalls."""

    def __init__(self, server: FakeServer, *, name: str) -> None:
        super().__init__(server, name=name)
        self.asked: list[str] = []  # the delegates whose creation it was asked, in order
        self.stalled: list[asyncio.Event] = []
        self.most = 0  # creations stalled at once, at most

    async def create(
        self, resource: Any, body: dict, namespace: str | None = None, **kw: Any
    ) -> dict:
        if resource == PODS and not kw.get("subresource"):
            self.asked.append(body["metadata"]["name"])
            answer = asyncio.Event()
            self.stalled.append(answer)
            self.most = max(self.most, len(self.stalled))
            try:
                await answer.wait()
            finally:
                self.stalled.remove(answer)
        return await super().create(resource, body, namespace, **kw)

    def answer(self, count: int = 1) -> None:
        """Let the ``count`` oldest stalled creations through."""
        for answer in self.stalled[:count]:
            answer.set()


class SilentCluster(FakeCluster):
    def __init__(self, name: str) -> None:
        super().__init__(name, FakeServer(name=name))
        self.client = self.silent = Silent(self.server, name=name)


def delegate_of(world: World, name: str, ns: str) -> str:
    return delegate_name(name, uid_of(world.proxy(name, ns)))


async def test_a_silent_target_holds_at_most_so_many_workers_of_its_namespace(
    make_world: Callable[..., Awaitable[World]],
) -> None:
    most = scheduler_module.MAX_CREATES_PER_NAMESPACE  # a namespaced Target: one namespace
    # Fewer workers than pods waiting on the silent target: a pod that held a worker while it
    # waited for its turn would leave none for the other namespace.
    world = await make_world(namespaces=(EVIL, GOOD), workers=most + 2)
    target = SilentCluster("evil")
    silent = target.silent
    await world.connect("evil", node("evil-1", cpu="100"), ns=EVIL, cluster=target)
    await world.connect("c2", node("c2-1", cpu="100"), ns=GOOD)
    world.run_workers()
    evil = [f"m{i}" for i in range(20)]
    for name in evil:
        await world.submit(elected(name, EVIL))
    for i in range(5):
        await world.submit(elected(f"g{i}", GOOD))
    await until(lambda: len(world.delegates("c2", GOOD)) == 5)  # the others are placed meanwhile
    await until(lambda: len(silent.stalled) == most)
    await asyncio.sleep(0.05)
    assert silent.asked == [delegate_of(world, name, EVIL) for name in evil[:most]]
    assert silent.most == most, "the others wait without asking the target"
    assert world.delegates("evil", EVIL) == []

    # One create ends: the first pod turned away is asked again at once (not after the
    # CREATE_TIMEOUT backstop), and takes the slot given back.
    silent.answer()
    await until(lambda: len(silent.asked) == most + 1)
    assert silent.asked[most] == delegate_of(world, evil[most], EVIL), "first come, first served"
    await until(lambda: len(silent.stalled) == most)
    assert [p["metadata"]["name"] for p in world.delegates("evil", EVIL)] == [silent.asked[0]]

    # Each end gives its slot back and asks one waiting pod again, in their order.
    silent.answer(most)
    await until(lambda: len(silent.asked) == 2 * most + 1)
    expected = [delegate_of(world, name, EVIL) for name in evil[: 2 * most + 1]]
    assert silent.asked == expected
    await until(lambda: len(silent.stalled) == most)
    await asyncio.sleep(0.05)
    assert len(silent.asked) == 2 * most + 1
    assert silent.most == most


async def test_a_creation_that_takes_too_long_moves_the_pod_on(
    make_world: Callable[..., Awaitable[World]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler_module, "CREATE_TIMEOUT", 0.2)
    world = await make_world(namespaces=(EVIL,))
    target = SilentCluster("evil")
    silent = target.silent
    await world.connect("evil", node("evil-1"), ns=EVIL, cluster=target)
    await world.submit(elected("m0", EVIL))
    result = await asyncio.wait_for(world.reconcile("m0", EVIL), 2)
    assert result is not None
    assert result.requeue
    assert silent.stalled == [], "given up"
    why = "evil: cannot create the delegate: no answer in 0s"
    await until(lambda: world.local.server.objects(EVENTS, EVIL))
    events = [(e["reason"], e["message"]) for e in world.local.server.objects(EVENTS, EVIL)]
    assert events == [("FailedCreateDelegate", why)]
    await world.reconcile("m0", EVIL)  # the target is excluded for a while
    assert len(silent.asked) == 1
    condition = await condition_seen(world, "m0", EVIL)
    assert condition["message"] == (
        f"0/1 targets are available: 1 target(s) rejected the delegate. {why}"
    )


async def test_a_pod_woken_for_a_slot_it_does_not_take_leaves_it_to_the_next(
    make_world: Callable[..., Awaitable[World]],
) -> None:
    """The pod asked again when a create ends may no longer need a slot (deleted meanwhile, or
    placed in another owner's target): the slot goes to the next pod waiting within a second,
    not after the ``CREATE_TIMEOUT`` backstop."""
    most = scheduler_module.MAX_CREATES_PER_NAMESPACE
    world = await make_world(namespaces=(EVIL,), workers=most + 2)
    target = SilentCluster("evil")
    silent = target.silent
    await world.connect("evil", node("evil-1", cpu="100"), ns=EVIL, cluster=target)
    world.run_workers()
    names = [f"m{i}" for i in range(most + 3)]
    for name in names:
        await world.submit(elected(name, EVIL))
    await until(lambda: len(silent.stalled) == most)
    await asyncio.sleep(0.05)
    first_waiting = names[most]
    await world.local.client.delete(PODS, first_waiting, EVIL)  # it needs no slot any more
    gone_or_going = world.proxy(first_waiting, EVIL)
    await until(lambda: world.proxy(first_waiting, EVIL) is not gone_or_going)
    silent.answer()
    await until(lambda: len(silent.asked) == most + 1, timeout=3.0)
    assert silent.asked[most] == delegate_of(world, names[most + 1], EVIL)


async def test_one_namespace_never_holds_every_slot_of_a_cluster_target(
    make_world: Callable[..., Awaitable[World]],
) -> None:
    """A ClusterTarget serves every namespace: one namespace's burst, stalled there, holds
    ``MAX_CREATES_PER_NAMESPACE`` of its slots, and another namespace's pods take the others at
    once; when a slot frees while both wait, the namespaces take turns."""
    per_owner = scheduler_module.MAX_CREATES_PER_OWNER
    per_namespace = scheduler_module.MAX_CREATES_PER_NAMESPACE
    world = await make_world(namespaces=(EVIL, GOOD), workers=per_owner + 4)
    target = SilentCluster("shared")
    silent = target.silent
    await world.connect("shared", node("shared-1", cpu="100"), ns=None, cluster=target)
    world.run_workers()
    evil = [f"m{i}" for i in range(30)]
    for name in evil:
        await world.submit(elected(name, EVIL))
    await until(lambda: len(silent.stalled) == per_namespace)
    await asyncio.sleep(0.05)
    assert len(silent.stalled) == per_namespace, "the burst leaves slots to other namespaces"
    good = [f"g{i}" for i in range(5)]
    for name in good:
        await world.submit(elected(name, GOOD))
    await until(lambda: len(silent.stalled) == per_owner)
    spare = per_owner - per_namespace
    assert silent.asked[per_namespace:] == [delegate_of(world, n, GOOD) for n in good[:spare]]

    # Both namespaces wait: each slot given back goes to them in turn.
    silent.answer(per_owner)
    await until(lambda: len(silent.asked) == 2 * per_owner)
    later = silent.asked[per_owner:]
    mine = {delegate_of(world, n, GOOD) for n in good}
    assert sum(name in mine for name in later) == len(good) - spare, "the rest of GOOD's pods"
    await until(lambda: len(silent.stalled) == per_owner)
