"""The targets controller (:mod:`multicluster_scheduler.targets.controller`): each Target and
ClusterTarget becomes a connection in the registry, with a Ready condition and an event that say
why not; and its pure pieces (secret references, slim secrets, conditions, the failover clock,
which Targets of a namespace are connected, limits as flags and chart values).

The controller runs over an in-memory API server (:class:`~multicluster.testing.FakeCluster`),
under a Manager as in the agent. A self Target's connection is that cluster itself. A Target with
a kubeconfig gets a real :class:`~multicluster.Cluster` (the reconciler builds it: no seam takes
a fake one); its server here is a closed port of this machine, so it connects and is
Unreachable, and a summary is seen only through self Targets."""

from __future__ import annotations

import argparse
import asyncio
import base64
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from multicluster import (
    BadResponse,
    CacheFull,
    Controller,
    Forbidden,
    Manager,
    NotFound,
    Request,
    ResponseTooLarge,
    Unauthorized,
    Unreachable,
)
from multicluster.resources import EVENTS, SECRETS
from multicluster.testing import FakeCluster
from multicluster_scheduler import agent
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.naming import virtual_node_name
from multicluster_scheduler.api.resources import CLUSTER_SUMMARIES, CLUSTER_TARGETS, TARGETS
from multicluster_scheduler.targets.controller import (
    TargetsReconciler,
    classify,
    ready_condition,
    secret_reference,
    slim_secret,
    targets_controller,
)
from multicluster_scheduler.targets.limits import (
    DEFAULT_MAX_PER_NAMESPACE,
    TargetLimits,
    TargetSlots,
    admitted,
    too_many_message,
)
from multicluster_scheduler.targets.registry import TargetConnection, TargetRegistry

NS = "ns"


def test_secret_reference_of_targets_and_cluster_targets() -> None:
    target = {
        "metadata": {"name": "c2", "namespace": "ns"},
        "spec": {"kubeconfigSecret": {"name": "s"}},
    }
    assert secret_reference(target) == "ns/s"
    cluster_target = {
        "metadata": {"name": "c2"},
        "spec": {"kubeconfigSecret": {"name": "s", "namespace": "admiralty"}},
    }
    assert secret_reference(cluster_target) == "admiralty/s"
    assert secret_reference({"metadata": {"name": "c1"}, "spec": {"self": True}}) is None


def test_secrets_are_cached_without_their_data() -> None:
    """Every Secret of the cluster is watched: only the names of their keys are kept (a Target's
    Secret is read when it changes), whoever filled them with how much."""
    meta = {"name": "x", "namespace": "ns", "resourceVersion": "1", "labels": {"a": "b"}}
    for kind in ("Opaque", "helm.sh/release.v1"):
        slim = slim_secret({"metadata": meta, "type": kind, "data": {"config": "e30=" * 10**5}})
        assert slim == {
            "metadata": {"name": "x", "namespace": "ns", "resourceVersion": "1"},
            "keys": ["config"],
        }
    assert slim_secret({"metadata": meta})["keys"] == []


def test_conditions_keep_their_transition_time_while_unchanged() -> None:
    first = ready_condition(False, "SecretNotFound", "m", 1, [])
    again = ready_condition(False, "KeyNotFound", "m2", 2, [first])
    assert again["lastTransitionTime"] == first["lastTransitionTime"]
    assert (again["status"], again["reason"], again["observedGeneration"]) == (
        "False",
        "KeyNotFound",
        2,
    )
    unknown = ready_condition(None, "Connecting", "", 1, [])
    assert unknown["status"] == "Unknown"


def test_errors_map_to_reasons() -> None:
    assert classify(Unauthorized("x"))[0] == "Unauthorized"
    assert classify(Forbidden("x"))[0] == "Forbidden"
    assert "summary-viewer" in classify(Forbidden("x"))[1]
    assert classify(Unreachable("x"))[0] == "Unreachable"
    # A target without our CRDs answers 404 for ClusterSummaries: not installed, not unreachable.
    assert classify(NotFound("x"))[0] == "SummaryMissing"
    # Answers no API server gives (too large, not JSON): not a network problem.
    assert classify(ResponseTooLarge("x"))[0] == "InvalidResponse"
    assert classify(BadResponse("x"))[0] == "InvalidResponse"


def test_failover_is_due_once_the_target_has_been_away_long_enough() -> None:
    connection = TargetConnection(kind="Target", name="c2", namespace="default")
    assert connection.failover_in() is None, "no failover setting: proxies wait"
    connection.failover_after = 60.0
    assert connection.set_ready(False, "Connecting", "connecting to the target")
    assert connection.failover_in() is None, "connecting (after a restart, say) is not away"
    assert connection.set_ready(False, "Unreachable", "connection refused")
    start = connection.not_ready_since
    assert start is not None
    assert connection.failover_in(now=start + 10) == pytest.approx(50.0)
    assert connection.set_ready(True, "Ready", "the target's ClusterSummary is current")
    assert connection.not_ready_since is None
    assert connection.failover_in() is None, "Ready: nothing is due"
    assert not connection.set_ready(True, "Ready", "the target's ClusterSummary is current")
    assert connection.set_ready(False, "Unreachable", "connection refused")
    away = connection.not_ready_since
    assert away is not None
    assert away >= start
    connection.set_ready(False, "Unauthorized", "token expired")
    assert connection.not_ready_since == away, "away since it first went, whatever the reason"
    assert connection.failover_in(now=away + 59) == pytest.approx(1.0)
    assert connection.failover_in(now=away + 61) == 0.0


def test_virtual_node_labels_stay_valid_label_values_for_long_target_names() -> None:
    name = "t" * 64
    labels = TargetConnection(kind="Target", name=name, namespace="default").labels
    assert len(labels["multicluster.admiralty.io/target-name"]) <= 63
    assert labels["multicluster.admiralty.io/target-name"] != "t" * 63
    short = TargetConnection(kind="ClusterTarget", name="c1", namespace=None).labels
    assert short == {"multicluster.admiralty.io/cluster-target-name": "c1"}


# -- how many Targets of a namespace are connected -------------------------------------------


def _target(name: str, created: str, namespace: str = "ns") -> dict:
    return {
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
        "spec": {"self": True},
    }


_TIMESTAMPS = st.sampled_from(
    ["2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z", "2026-01-01T00:00:59Z", "2027-01-01T00:00:00Z"]
)


@given(
    st.dictionaries(st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True), _TIMESTAMPS),
    st.integers(0, 12),
    st.randoms(),
)
def test_the_oldest_targets_of_a_namespace_are_admitted_whatever_the_order_seen(
    created: dict[str, str], limit: int, random: Any
) -> None:
    targets = [_target(name, when) for name, when in created.items()]
    allowed = admitted(targets, limit)
    assert len(allowed) == min(limit, len(targets))
    key = {name: (when, name) for name, when in created.items()}
    refused = set(created) - allowed
    assert all(key[a] < key[r] for a in allowed for r in refused)
    random.shuffle(targets)
    assert admitted(targets, limit) == allowed, "the order the cache lists them in is no matter"


def test_the_refusal_names_the_limit_and_where_to_change_it() -> None:
    message = too_many_message(10)
    assert "10 older Targets" in message
    assert "targets.maxPerNamespace" in message
    assert "--max-targets-per-namespace" in message
    assert "ClusterTargets do not count" in message
    assert "connects no namespaced Target" in too_many_message(0)


def test_the_limit_is_an_agent_flag_and_a_chart_value(monkeypatch: pytest.MonkeyPatch) -> None:
    def parse(*argv: str) -> agent.AgentSettings:
        parser = argparse.ArgumentParser()
        agent.add_arguments(parser)
        return agent.settings_from(parser.parse_args(argv))

    monkeypatch.setenv("MCS_NAMESPACE", "admiralty")
    assert parse().max_targets_per_namespace == DEFAULT_MAX_PER_NAMESPACE == 10
    assert parse("--max-targets-per-namespace", "3").max_targets_per_namespace == 3
    monkeypatch.setenv("MCS_MAX_TARGETS_PER_NAMESPACE", "0")
    assert parse().max_targets_per_namespace == 0
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        parse("--max-targets-per-namespace", "-1")
    chart = Path(__file__).parents[2] / "charts" / "multicluster-scheduler"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    assert values["targets"]["maxPerNamespace"] == DEFAULT_MAX_PER_NAMESPACE
    template = (chart / "templates" / "deployment.yaml").read_text()
    assert "--max-targets-per-namespace={{ .Values.targets.maxPerNamespace | int }}" in template


def test_cache_limits_are_agent_flags_and_chart_values(monkeypatch: pytest.MonkeyPatch) -> None:
    def parse(*argv: str) -> agent.AgentSettings:
        parser = argparse.ArgumentParser()
        agent.add_arguments(parser)
        return agent.settings_from(parser.parse_args(argv))

    monkeypatch.setenv("MCS_NAMESPACE", "admiralty")
    defaults = parse()
    assert (defaults.target_cache_mib, defaults.cluster_target_cache_mib) == (32, 256)
    assert parse("--target-cache-mib", "8").target_cache_mib == 8
    with pytest.raises(ValueError, match="greater than 0"):
        parse("--cluster-target-cache-mib", "0")
    chart = Path(__file__).parents[2] / "charts" / "multicluster-scheduler"
    values = yaml.safe_load((chart / "values.yaml").read_text())["targets"]
    assert (values["cachePerNamespaceMiB"], values["cachePerClusterTargetMiB"]) == (32, 256)
    template = (chart / "templates" / "deployment.yaml").read_text()
    assert "--target-cache-mib={{ .Values.targets.cachePerNamespaceMiB | int }}" in template
    assert (
        "--cluster-target-cache-mib={{ .Values.targets.cachePerClusterTargetMiB | int }}"
        in template
    )


def test_a_namespaces_targets_share_their_slots_and_each_cluster_target_has_its_own() -> None:
    slots = TargetSlots(limit=2)
    with slots.slot("a", "team-a") as one, slots.slot("b", "team-a") as two:
        assert (one, two) == (True, True)
        with slots.slot("c", "team-a") as three:
            assert not three, "a third Target of team-a finds no slot"
        with slots.slot("a", "team-b") as other, slots.slot("all", None) as cluster_wide:
            assert (other, cluster_wide) == (True, True), "other owners are not held back"
        assert slots.busy("a", "team-a")
    assert not slots.busy("a", "team-a"), "slots are given back"
    with pytest.raises(RuntimeError), slots.slot("a", "team-a"):
        raise RuntimeError("a failed request")
    assert not slots.busy("a", "team-a"), "... even when the request fails"
    with slots.slot("a", "team-a") as one, slots.slot("b", "team-a") as two:
        assert (one, two) == (True, True), "... all of them"


def test_a_namespaces_targets_share_one_cache_budget_and_each_cluster_target_has_its_own() -> None:
    limits = TargetLimits(cache_per_namespace=1 << 20, cache_per_cluster_target=2 << 20)
    assert limits.budget("a", "team-a") is limits.budget("b", "team-a")
    assert limits.budget("a", "team-a") is not limits.budget("a", "team-b")
    assert limits.budget("all", None) is not limits.budget("all", None)
    assert limits.budget("all", None).limit == 2 << 20
    options = limits.cluster_options("a", "team-a")
    assert (
        options["read_limits"]
        is limits.read_limits
        is limits.cluster_options("x", None)["read_limits"]
    )


def test_a_full_cache_says_which_limit_to_raise() -> None:
    reason, message = classify(CacheFull("LIST pods: over 32 MiB"), "team-a")
    assert reason == "CacheFull"
    assert "targets.cachePerNamespaceMiB" in message
    assert "targets.cachePerClusterTargetMiB" in classify(CacheFull("x"), None)[1]


# -- a source cluster, in memory ------------------------------------------------------------


async def until(condition: Callable[[], object], timeout: float = 5.0, what: str = "") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"not in time: {what}"
        await asyncio.sleep(0.01)


def named(local: FakeCluster, resource: Any, name: str, namespace: str | None = NS) -> dict | None:
    found = local.server.objects(resource, namespace if resource.namespaced else None)
    return next((o for o in found if o["metadata"]["name"] == name), None)


def condition_of(local: FakeCluster, name: str, namespace: str | None = NS) -> tuple[str, str]:
    """The Ready condition of a Target (ClusterTarget without namespace): status and reason."""
    resource = TARGETS if namespace else CLUSTER_TARGETS
    target = named(local, resource, name, namespace) or {}
    ready = [
        c for c in (target.get("status") or {}).get("conditions") or () if c["type"] == "Ready"
    ]
    return (ready[0]["status"], ready[0]["reason"]) if ready else ("", "")


def events_of(local: FakeCluster, name: str) -> list[tuple[str, str]]:
    """The events about an object, as (type, reason), in order."""
    found = [e for e in local.server.objects(EVENTS) if e["involvedObject"]["name"] == name]
    found.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["type"], e["reason"]) for e in found]


class Targets:
    """The targets reconciler over an in-memory API server, reconciled by hand: self Targets
    only (their connection is this cluster: nothing to reach). Its controller watches nothing:
    what is queued, the reconciler queued itself."""

    def __init__(self, limit: int) -> None:
        self.local = FakeCluster("local")
        self.api = self.local.server
        self.registry = TargetRegistry()
        self.reconciler = TargetsReconciler(
            self.local,
            Manager(tune_gc=False),
            self.registry,
            limits=TargetLimits(max_per_namespace=limit),
        )
        self.controller = Controller("targets", self.reconciler)
        self.reconciler.controller = self.controller
        self.created = 0

    async def start(self) -> None:
        self.local.start()
        assert await self.local.wait_synced(3)

    def add(self, name: str, namespace: str = NS) -> None:
        self.created += 1
        when = f"2026-01-01T00:{self.created // 60:02d}:{self.created % 60:02d}Z"
        self.api.add(TARGETS, _target(name, when, namespace))

    async def reconcile(self, name: str, namespace: str = NS) -> None:
        informer = self.reconciler.targets if namespace else self.reconciler.cluster_targets
        gone = named(self.local, TARGETS if namespace else CLUSTER_TARGETS, name, namespace) is None
        await until(lambda: (informer.get(name, namespace or None) is None) == gone, what="cached")
        await self.reconciler.reconcile(Request("local", namespace, name))

    async def drain(self) -> list[str]:
        """Reconcile what the controller queued; the names."""
        done = []
        while len(self.controller.queue):
            request = await self.controller.queue.get()
            self.controller.queue.done(request)
            await self.reconciler.reconcile(request)
            done.append(request.name)
        return done

    def ready(self, name: str, namespace: str = NS) -> tuple[str, str]:
        return condition_of(self.local, name, namespace)

    def refused(self) -> list[tuple[str, str, str]]:
        return sorted(
            (e["involvedObject"]["name"], e["type"], e["reason"])
            for e in self.api.objects(EVENTS)
            if e["reason"] == "TooManyTargets"
        )

    def nodes(self) -> set[str]:
        return set(self.registry.connections)


@pytest.fixture
async def targets() -> AsyncGenerator[Callable[[int], Targets], None]:
    made: list[Targets] = []

    def make(limit: int) -> Targets:
        made.append(Targets(limit))
        return made[-1]

    yield make
    await asyncio.gather(*(t.local.stop() for t in made))


async def test_targets_past_the_limit_get_no_connection_and_the_next_gets_in_when_one_goes(
    targets: Callable[[int], Targets],
) -> None:
    world = targets(2)
    world.api.add(CLUSTER_SUMMARIES, {"metadata": {"name": keys.CLUSTER_SUMMARY_NAME}})
    await world.start()
    for name in ("a", "b", "c", "d"):
        world.add(name)
    for name in ("d", "c", "b", "a"):  # youngest first: the answer is the same
        await world.reconcile(name)
    await world.drain()
    assert world.nodes() == {virtual_node_name("a", NS), virtual_node_name("b", NS)}
    for name in ("a", "b"):  # once their connection's summary is seen
        await world.reconcile(name)
        assert world.ready(name) == ("True", "Ready")
    assert world.ready("c") == world.ready("d") == ("False", "TooManyTargets")
    assert world.refused() == [
        ("c", "Warning", "TooManyTargets"),
        ("d", "Warning", "TooManyTargets"),
    ]
    # Reconciling again changes nothing and records nothing more.
    written = len(world.api.objects(EVENTS))
    await world.reconcile("d")
    assert len(world.api.objects(EVENTS)) == written
    # A Target of another namespace counts there, not here.
    world.add("e", "other")
    await world.reconcile("e", "other")
    assert virtual_node_name("e", "other") in world.nodes()

    await world.drain()  # what their summary's events queued
    await world.local.client.delete(TARGETS, "a", NS)
    await world.reconcile("a")
    assert len(world.controller.queue) == 1
    assert await world.drain() == ["c", "c"], "the next one, queued without restart; no other"
    assert world.nodes() == {
        virtual_node_name(n, ns) for n, ns in (("b", NS), ("c", NS), ("e", "other"))
    }
    assert world.ready("c") == ("True", "Ready")
    assert world.ready("d") == ("False", "TooManyTargets")
    # The sweep of nodes left by targets nobody saw go keeps the admitted ones only.
    assert world.registry.target_nodes() == world.nodes()


async def test_a_limit_of_zero_connects_no_namespaced_target_and_any_cluster_target(
    targets: Callable[[int], Targets],
) -> None:
    world = targets(0)
    await world.start()
    world.add("a")
    await world.reconcile("a")
    world.api.add(CLUSTER_TARGETS, {"metadata": {"name": "c"}, "spec": {"self": True}})
    await world.reconcile("c", "")
    assert world.nodes() == {virtual_node_name("c")}
    assert world.ready("a") == ("False", "TooManyTargets")


# -- the controller, run by a manager -------------------------------------------------------

CLOSED = "https://127.0.0.1:1"  # nothing listens there: a connection is refused at once


def kubeconfig(server: str = CLOSED, **user: Any) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c2", "cluster": {"server": server}}],
            "users": [{"name": "me", "user": user or {"token": "t0ken"}}],
            "contexts": [{"name": "c2", "context": {"cluster": "c2", "user": "me"}}],
            "current-context": "c2",
        }
    )


def secret(text: str, key: str = "config", name: str = "c2-kubeconfig") -> dict:
    data = base64.b64encode(text.encode()).decode()
    return {"metadata": {"name": name, "namespace": NS}, "type": "Opaque", "data": {key: data}}


def target(name: str = "c2", **spec: Any) -> dict:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": spec or {"kubeconfigSecret": {"name": "c2-kubeconfig"}},
    }


class Source:
    """The source cluster's agent as far as Targets go: a manager running the targets
    controller, over an in-memory API server."""

    def __init__(self) -> None:
        self.local = FakeCluster("local")
        self.api = self.local.server
        self.manager = Manager(tune_gc=False)
        self.manager.add_cluster(self.local)
        self.registry = TargetRegistry()
        self.removed: list[str] = []

        async def removed(connection: TargetConnection) -> None:
            self.removed.append(connection.node_name)

        self.registry.on_removed(removed)
        self.controller = self.manager.add_controller(
            targets_controller(self.local, self.manager, self.registry)
        )
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self.manager.run())
        await until(lambda: self.local.has_synced, what="the manager started")

    async def stop(self) -> None:
        self.manager.stop()
        if self.task is not None:
            await asyncio.wait_for(self.task, 5)

    def connection(self, name: str = "c2") -> TargetConnection | None:
        return self.registry.connections.get(virtual_node_name(name, NS))

    def server(self, name: str = "c2") -> str | None:
        """The address the connection of Target ``name`` uses, if it has one."""
        connection = self.connection(name)
        cluster = connection.cluster if connection is not None else None
        return cluster.config.server if cluster is not None else None

    async def condition(self, reason: str, name: str = "c2") -> tuple[str, str]:
        await until(lambda: condition_of(self.local, name)[1] == reason, what=reason)
        return condition_of(self.local, name)

    def message(self, name: str = "c2") -> str:
        target = named(self.local, TARGETS, name) or {}
        (ready,) = target["status"]["conditions"]
        return ready["message"]


@pytest.fixture
async def source() -> AsyncGenerator[Source, None]:
    made = Source()
    await made.start()
    try:
        yield made
    finally:
        await made.stop()


@pytest.mark.parametrize(
    ("stored", "reason", "said"),
    [
        pytest.param(None, "SecretNotFound", "secret ns/c2-kubeconfig not found", id="missing"),
        pytest.param(
            secret(kubeconfig(), key="kubeconfig"),
            "KeyNotFound",
            "secret ns/c2-kubeconfig has no key 'config'",
            id="another key",
        ),
        pytest.param(
            {**secret(""), "data": {"config": "not base64!"}},
            "InvalidKubeconfig",
            "is not base64",
            id="not base64",
        ),
        pytest.param(
            secret("clusters: [{name: c2, cluster: {server: 1}}]"),
            "InvalidKubeconfig",
            "the server URL is not a URL",
            id="not a kubeconfig",
        ),
        pytest.param(
            secret(kubeconfig(exec={"command": "steal", "apiVersion": "v1"})),
            "InvalidKubeconfig",
            "uses exec",
            id="runs a command",
        ),
    ],
)
async def test_a_target_whose_kubeconfig_cannot_be_used_is_not_ready_and_says_why(
    source: Source, stored: dict | None, reason: str, said: str
) -> None:
    if stored is not None:
        source.api.add(SECRETS, stored)
    source.api.add(TARGETS, target())
    assert await source.condition(reason) == ("False", reason)
    assert said in source.message()
    await until(lambda: events_of(source.local, "c2"), what="an event")
    assert events_of(source.local, "c2") == [("Warning", reason)]
    connection = source.connection()
    assert connection is not None, "its node is there, NotReady"
    assert (connection.ready, connection.reason, connection.cluster) == (False, reason, None)
    assert virtual_node_name("c2", NS) not in source.manager.clusters


async def test_a_valid_kubeconfig_connects_and_an_unreachable_server_is_said(
    source: Source,
) -> None:
    source.api.add(SECRETS, secret(kubeconfig()))
    source.api.add(TARGETS, target())
    assert await source.condition("Unreachable") == ("False", "Unreachable")
    assert "127.0.0.1:1" in source.message()
    assert source.server() == CLOSED
    connection = source.connection()
    assert connection is not None
    assert source.manager.clusters[connection.node_name] is connection.cluster, "run by it"
    assert connection.delegates is not None, "its delegates are watched"
    assert (connection.ready, connection.reason) == (False, "Unreachable")
    assert events_of(source.local, "c2")[-1] == ("Warning", "Unreachable")


async def test_a_secret_that_appears_or_changes_reconnects(source: Source) -> None:
    source.api.add(TARGETS, target())
    await source.condition("SecretNotFound")
    await source.local.client.create(SECRETS, secret(kubeconfig()))
    await source.condition("Unreachable")
    assert source.server() == CLOSED
    first = source.manager.clusters[virtual_node_name("c2", NS)]
    assert first.config.server == CLOSED
    moved = "https://127.0.0.2:1"
    await source.local.client.update(SECRETS, secret(kubeconfig(moved)))
    node = virtual_node_name("c2", NS)

    def reconnected() -> bool:
        cluster = source.manager.clusters.get(node)
        return cluster is not None and cluster.config.server == moved

    await until(reconnected, what="connected to the new address")
    assert source.server() == moved
    assert not any(i.running for i in first.informers), "the old connection is closed"
    await source.local.client.delete(SECRETS, "c2-kubeconfig", NS)
    assert await source.condition("SecretNotFound") == ("False", "SecretNotFound")
    assert source.server() is None
    assert node not in source.manager.clusters


async def test_a_deleted_target_loses_its_connection(source: Source) -> None:
    source.api.add(SECRETS, secret(kubeconfig()))
    source.api.add(TARGETS, target())
    await source.condition("Unreachable")
    node = virtual_node_name("c2", NS)
    cluster = source.manager.clusters[node]
    await source.local.client.delete(TARGETS, "c2", NS)
    await until(lambda: source.connection() is None, what="the connection removed")
    assert source.removed == [node], "its removal heard"
    assert node not in source.manager.clusters
    assert not any(i.running for i in cluster.informers)


async def test_a_self_target_is_ready_once_its_summary_is_seen(source: Source) -> None:
    source.api.add(TARGETS, target(self=True))
    assert await source.condition("SummaryMissing") == ("False", "SummaryMissing")
    connection = source.connection()
    assert connection is not None
    assert connection.cluster is source.local
    summary = {"metadata": {"name": keys.CLUSTER_SUMMARY_NAME}, "capacity": {"cpu": "4"}}
    await source.local.client.create(CLUSTER_SUMMARIES, summary)
    assert await source.condition("Ready") == ("True", "Ready")
    assert connection.ready
    assert connection.summary() is not None
    assert events_of(source.local, "c2") == [
        ("Normal", "Connecting"),
        ("Warning", "SummaryMissing"),
        ("Normal", "Ready"),
    ]
