"""Pure pieces of the targets controller: secret references, slim secrets, conditions, the
failover clock, which Targets of a namespace are connected; and the limit of Targets per
namespace through the controller, over an in-memory API server."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from multicluster import (
    BadResponse,
    CacheFull,
    Controller,
    Forbidden,
    NotFound,
    Request,
    ResponseTooLarge,
    Unauthorized,
    Unreachable,
)
from multicluster.resources import EVENTS
from multicluster_scheduler import agent
from multicluster_scheduler.api.naming import virtual_node_name
from multicluster_scheduler.api.resources import CLUSTER_TARGETS, TARGETS
from multicluster_scheduler.targets.controller import (
    TargetsReconciler,
    classify,
    ready_condition,
    secret_reference,
    slim_secret,
)
from multicluster_scheduler.targets.limits import (
    DEFAULT_MAX_PER_NAMESPACE,
    TargetLimits,
    TargetSlots,
    admitted,
    too_many_message,
)
from multicluster_scheduler.targets.registry import TargetConnection, TargetRegistry
from tests.sources.test_source_controller import make_cluster


def test_secret_reference_of_targets_and_cluster_targets():
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


def test_secrets_are_cached_without_their_data():
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


def test_conditions_keep_their_transition_time_while_unchanged():
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


def test_errors_map_to_reasons():
    assert classify(Unauthorized("x"))[0] == "Unauthorized"
    assert classify(Forbidden("x"))[0] == "Forbidden"
    assert "summary-viewer" in classify(Forbidden("x"))[1]
    assert classify(Unreachable("x"))[0] == "Unreachable"
    # A target without our CRDs answers 404 for ClusterSummaries: not installed, not unreachable.
    assert classify(NotFound("x"))[0] == "SummaryMissing"
    # Answers no API server gives (too large, not JSON): not a network problem.
    assert classify(ResponseTooLarge("x"))[0] == "InvalidResponse"
    assert classify(BadResponse("x"))[0] == "InvalidResponse"


def test_failover_is_due_once_the_target_has_been_away_long_enough():
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


def test_virtual_node_labels_stay_valid_label_values_for_long_target_names():
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
    created: dict[str, str], limit: int, random
):
    targets = [_target(name, when) for name, when in created.items()]
    allowed = admitted(targets, limit)
    assert len(allowed) == min(limit, len(targets))
    key = {name: (when, name) for name, when in created.items()}
    refused = set(created) - allowed
    assert all(key[a] < key[r] for a in allowed for r in refused)
    random.shuffle(targets)
    assert admitted(targets, limit) == allowed, "the order the cache lists them in is no matter"


def test_the_refusal_names_the_limit_and_where_to_change_it():
    message = too_many_message(10)
    assert "10 older Targets" in message
    assert "targets.maxPerNamespace" in message
    assert "--max-targets-per-namespace" in message
    assert "ClusterTargets do not count" in message
    assert "connects no namespaced Target" in too_many_message(0)


def test_the_limit_is_an_agent_flag_and_a_chart_value(monkeypatch):
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
    chart = Path(__file__).parents[1] / "charts" / "multicluster-scheduler"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    assert values["targets"]["maxPerNamespace"] == DEFAULT_MAX_PER_NAMESPACE
    template = (chart / "templates" / "deployment.yaml").read_text()
    assert "--max-targets-per-namespace={{ .Values.targets.maxPerNamespace | int }}" in template


def test_cache_limits_are_agent_flags_and_chart_values(monkeypatch):
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
    chart = Path(__file__).parents[1] / "charts" / "multicluster-scheduler"
    values = yaml.safe_load((chart / "values.yaml").read_text())["targets"]
    assert (values["cachePerNamespaceMiB"], values["cachePerClusterTargetMiB"]) == (32, 256)
    template = (chart / "templates" / "deployment.yaml").read_text()
    assert "--target-cache-mib={{ .Values.targets.cachePerNamespaceMiB | int }}" in template
    assert (
        "--cluster-target-cache-mib={{ .Values.targets.cachePerClusterTargetMiB | int }}"
        in template
    )


def test_a_namespaces_targets_share_their_slots_and_each_cluster_target_has_its_own():
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
    assert slots._used == {}, "... even when the request fails"


def test_a_namespaces_targets_share_one_cache_budget_and_each_cluster_target_has_its_own():
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


def test_a_full_cache_says_which_limit_to_raise():
    reason, message = classify(CacheFull("LIST pods: over 32 MiB"), "team-a")
    assert reason == "CacheFull"
    assert "targets.cachePerNamespaceMiB" in message
    assert "targets.cachePerClusterTargetMiB" in classify(CacheFull("x"), None)[1]


class Targets:
    """The targets controller over an in-memory API server: self Targets only (their
    connection is this cluster: nothing to reach)."""

    def __init__(self, limit: int) -> None:
        self.cluster, self.api = make_cluster()
        self.events: list[tuple[str, str, str]] = []
        create = self.api.create

        async def record(resource, body, namespace=None, **kwargs):
            if resource is EVENTS:
                involved = body["involvedObject"]["name"]
                self.events.append((involved, body["type"], body["reason"]))
            return await create(resource, body, namespace, **kwargs)

        self.api.create = record  # type: ignore[method-assign]
        self.registry = TargetRegistry()
        self.reconciler = TargetsReconciler(
            self.cluster,
            None,  # type: ignore[arg-type]
            self.registry,
            limits=TargetLimits(max_per_namespace=limit),
        )
        self.controller = Controller("targets", self.reconciler)
        self.reconciler.controller = self.controller
        self.reconciler.secrets._synced.set()  # as listed: there are none
        self.created = 0

    def add(self, name: str, namespace: str = "ns") -> None:
        self.created += 1
        when = f"2026-01-01T00:{self.created // 60:02d}:{self.created % 60:02d}Z"
        self.api.add(TARGETS, _target(name, when, namespace))

    async def reconcile(self, name: str, namespace: str = "ns") -> None:
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

    def ready(self, name: str, namespace: str = "ns") -> tuple[str, str]:
        target = self.api.find(TARGETS, name, namespace)
        (condition,) = target["status"]["conditions"]
        return condition["status"], condition["reason"]

    def nodes(self) -> set[str]:
        return set(self.registry.connections)


async def test_targets_past_the_limit_get_no_connection_and_the_next_gets_in_when_one_goes():
    world = Targets(limit=2)
    for name in ("a", "b", "c", "d"):
        world.add(name)
    for name in ("d", "c", "b", "a"):  # youngest first: the answer is the same
        await world.reconcile(name)
    await world.drain()
    assert world.nodes() == {virtual_node_name("a", "ns"), virtual_node_name("b", "ns")}
    assert world.ready("a")[1] == world.ready("b")[1] == "Connecting"
    assert world.ready("c") == world.ready("d") == ("False", "TooManyTargets")
    refused = [e for e in world.events if e[2] == "TooManyTargets"]
    assert sorted(refused) == [
        ("c", "Warning", "TooManyTargets"),
        ("d", "Warning", "TooManyTargets"),
    ]
    # Reconciling again changes nothing and records nothing more.
    writes = len(world.events)
    await world.reconcile("d")
    assert len(world.events) == writes
    # A Target of another namespace counts there, not here.
    world.add("e", "other")
    await world.reconcile("e", "other")
    assert virtual_node_name("e", "other") in world.nodes()

    await world.api.delete(TARGETS, "a", "ns")
    await world.reconcile("a")
    assert await world.drain() == ["c"], "the next one, queued without restart; no other"
    assert world.nodes() == {
        virtual_node_name(n, ns) for n, ns in (("b", "ns"), ("c", "ns"), ("e", "other"))
    }
    assert world.ready("c")[1] == "Connecting"
    assert world.ready("d") == ("False", "TooManyTargets")
    # The sweep of nodes left by targets nobody saw go keeps the admitted ones only.
    for informer in (world.reconciler.targets, world.reconciler.cluster_targets):
        informer._synced.set()  # as listed
    assert world.registry.target_nodes() == world.nodes()


async def test_a_limit_of_zero_connects_no_namespaced_target_and_any_cluster_target():
    world = Targets(limit=0)
    world.add("a")
    await world.reconcile("a")
    world.api.add(CLUSTER_TARGETS, {"metadata": {"name": "c"}, "spec": {"self": True}})
    await world.reconcile("c", "")
    assert world.nodes() == {virtual_node_name("c")}
    assert world.ready("a") == ("False", "TooManyTargets")
