"""Filtering and scoring targets from their summaries: kube-scheduler's rules, applied to groups."""

from __future__ import annotations

import dataclasses
import random
import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multicluster_scheduler.api.summary import slim_node
from multicluster_scheduler.scheduler import fit
from multicluster_scheduler.scheduler.fit import (
    Candidate,
    Constraints,
    choose,
    constraints,
    fits,
    score,
    unschedulable_message,
)
from multicluster_scheduler.summary.compute import slim_pod, summarize

AFFINITY = fit.NODE_AFFINITY_MISMATCH


def node(name, cpu="4", memory="16Gi", pods="110", labels=None, taints=None):
    return slim_node(
        {
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            },
            "spec": {"taints": taints or []},
            "status": {
                "capacity": {"cpu": cpu, "memory": memory, "pods": pods},
                "allocatable": {"cpu": cpu, "memory": memory, "pods": pods},
            },
        }
    )


def running(node_name, cpu="1", memory="1Gi"):
    return slim_pod(
        {
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "nodeName": node_name,
                "containers": [{"resources": {"requests": {"cpu": cpu, "memory": memory}}}],
            },
            "status": {"phase": "Running"},
        }
    )


def summary(nodes, pods=(), version="1"):
    return {"metadata": {"name": "singleton", "resourceVersion": version}, **summarize(nodes, pods)}


def pod(requests=None, limits=None, **spec):
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "web-", "namespace": "ns"},
        "spec": {"containers": [{"name": "c", "image": "nginx", "resources": resources}], **spec},
    }


def required(*expressions):
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": list(expressions)}]
            }
        }
    }


def expression(key, operator, *values):
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def target(name="a", nodes=None, **kwargs):
    return Candidate(name, summary(nodes if nodes is not None else [node(f"{name}-1")]), **kwargs)


ZONE_A = node("n1", labels={"zone": "a", "gen": "5"})


# Constraints from a manifest.


def test_constraints_from_a_full_pod():
    manifest = pod(
        requests={"cpu": "500m"},
        limits={"cpu": "1", "memory": "1Gi"},
        nodeSelector={"disk": "ssd"},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        overhead={"memory": "64Mi"},
        affinity=required(expression("zone", "In", "a", "b")),
    )
    manifest["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ] = [{"weight": 10, "preference": {"matchExpressions": [expression("gen", "Gt", "4")]}}]
    c = constraints(manifest)
    assert c.node_selector == {"disk": "ssd"}
    assert c.required == ({"matchExpressions": [expression("zone", "In", "a", "b")]},)
    assert c.preferred == ((10, {"matchExpressions": [expression("gen", "Gt", "4")]}),)
    assert c.tolerations == ({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},)
    # Limits stand for unset requests, overhead adds, and the pod counts as one.
    assert c.requests == {
        "cpu": Fraction(1, 2),
        "memory": Fraction(2**30 + 64 * 2**20),
        "pods": Fraction(1),
    }


def test_requests_count_init_containers_sidecars_and_pod_level_resources():
    manifest = pod(
        requests={"cpu": "1"},
        initContainers=[
            {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
            {"name": "init", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}},
        ],
    )
    assert constraints(manifest).requests == {
        "cpu": Fraction(4),
        "memory": Fraction(2**30),
        "pods": Fraction(1),
    }
    manifest["spec"]["resources"] = {"requests": {"cpu": "6"}}
    assert constraints(manifest).requests["cpu"] == 6


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"metadata": {}}, "no spec"),
        (pod(requests={"cpu": "lots"}), "spec.containers[0].resources.requests"),
        (pod(nodeSelector=["disk"]), "spec.nodeSelector is not an object"),
        (pod(nodeSelector={"disk": 1}), "nodeSelector[disk]"),
        (pod(tolerations={"key": "x"}), "spec.tolerations is not a list"),
        (pod(affinity=required(expression("zone", "Near", "a"))), "unknown operator 'Near'"),
        (pod(affinity=required(expression("zone", "In"))), "In needs values"),
        (pod(affinity=required(expression("zone", "Exists", "a"))), "Exists takes no values"),
        (pod(affinity=required(expression("gen", "Gt", "1", "2"))), "exactly one value"),
        (pod(overhead={"cpu": "x"}), "spec.overhead"),
        (
            pod(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}
                    }
                }
            ),
            "must not be empty",
        ),
        (
            pod(
                affinity={
                    "nodeAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [{"preference": {}}]
                    }
                }
            ),
            "weight None",
        ),
    ],
)
def test_malformed_manifests_are_rejected_with_a_clear_message(manifest, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        constraints(manifest)


# Filtering: readiness, summaries, selectors.


def test_not_ready_and_missing_or_broken_summaries():
    c = constraints(pod())
    assert fits(c, target(ready=False)) == "target(s) not ready"
    assert fits(c, Candidate("a", None)) == "target(s) had no cluster summary"
    broken = summary([node("n1")])
    broken["nodeGroups"][0]["allocatable"]["cpu"] = "plenty"
    assert fits(c, Candidate("a", broken)) == "target(s) had an invalid cluster summary"
    assert fits(c, Candidate("a", summary([]))) == "target(s) had no nodes"


def test_a_summary_without_node_groups_is_one_group_of_unknown_labels_and_taints():
    original = {"capacity": {"cpu": "4", "pods": "10"}, "allocatable": {"cpu": "4", "pods": "10"}}
    selective = constraints(pod(requests={"cpu": "2"}, nodeSelector={"disk": "ssd"}))
    assert fits(selective, Candidate("a", original)) is None
    assert fits(constraints(pod(requests={"cpu": "5"})), Candidate("a", original)) == (
        "Insufficient cpu"
    )


def test_node_selector():
    a = target(nodes=[ZONE_A])
    assert fits(constraints(pod(nodeSelector={"zone": "a"})), a) is None
    assert fits(constraints(pod(nodeSelector={"zone": "b"})), a) == AFFINITY
    assert fits(constraints(pod(nodeSelector={"zone": "a", "gen": "4"})), a) == AFFINITY
    # Groups have no hostname: a selector on it is the target's scheduler's to judge.
    assert fits(constraints(pod(nodeSelector={"kubernetes.io/hostname": "n9"})), a) is None


@pytest.mark.parametrize(
    ("expr", "matches"),
    [
        (expression("zone", "In", "a", "b"), True),
        (expression("zone", "In", "b"), False),
        (expression("absent", "In", "a"), False),
        (expression("zone", "NotIn", "b"), True),
        (expression("zone", "NotIn", "a"), False),
        (expression("absent", "NotIn", "a"), True),
        (expression("zone", "Exists"), True),
        (expression("absent", "Exists"), False),
        (expression("absent", "DoesNotExist"), True),
        (expression("zone", "DoesNotExist"), False),
        (expression("gen", "Gt", "4"), True),
        (expression("gen", "Gt", "5"), False),
        (expression("gen", "Lt", "6"), True),
        (expression("gen", "Lt", "5"), False),
        (expression("gen", "Gt", "-1"), True),
        (expression("zone", "Gt", "1"), False),  # label not an integer
        (expression("gen", "Gt", "four"), False),  # value not an integer
        (expression("absent", "Lt", "9"), False),
        (expression("kubernetes.io/hostname", "In", "elsewhere"), True),  # cannot be judged
        (expression("kubernetes.io/hostname", "DoesNotExist"), True),
    ],
)
def test_required_node_affinity_operators(expr, matches):
    reason = fits(constraints(pod(affinity=required(expr))), target(nodes=[ZONE_A]))
    assert reason == (None if matches else AFFINITY)


def test_required_terms_are_ored_and_expressions_anded():
    a = target(nodes=[ZONE_A])
    both = required(expression("zone", "In", "a"), expression("gen", "In", "4"))
    assert fits(constraints(pod(affinity=both)), a) == AFFINITY
    terms = both["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms["nodeSelectorTerms"].append({"matchExpressions": [expression("gen", "In", "5")]})
    assert fits(constraints(pod(affinity=both)), a) is None


def test_empty_terms_match_nothing_and_match_fields_cannot_be_judged():
    a = target(nodes=[ZONE_A])

    def with_terms(*terms):
        return pod(
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": list(terms)
                    }
                }
            }
        )

    assert fits(constraints(with_terms({})), a) == AFFINITY
    assert fits(constraints(with_terms({"matchExpressions": []})), a) == AFFINITY
    by_field = {"matchFields": [expression("metadata.name", "In", "n9")]}
    assert fits(constraints(with_terms(by_field)), a) is None


def test_selector_and_affinity_must_both_hold():
    manifest = pod(nodeSelector={"zone": "a"}, affinity=required(expression("gen", "In", "4")))
    assert fits(constraints(manifest), target(nodes=[ZONE_A])) == AFFINITY


# Filtering: taints and tolerations.

GPU_TAINT = {"key": "gpu", "value": "true", "effect": "NoSchedule"}
TAINTED = node("g1", taints=[GPU_TAINT])


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}, True),
        ({"key": "gpu", "value": "true"}, True),  # operator defaults to Equal, any effect
        ({"key": "gpu", "operator": "Equal", "value": "false"}, False),
        ({"key": "gpu", "operator": "Exists"}, True),
        ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "gpu", "operator": "Exists", "effect": "PreferNoSchedule"}, False),
        ({"operator": "Exists"}, True),  # empty key with Exists tolerates everything
        ({"operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "other", "operator": "Exists"}, False),
        ({"key": "gpu", "operator": "Gt", "value": "true"}, False),  # unknown: tolerates nothing
    ],
)
def test_tolerations(toleration, tolerated):
    reason = fits(constraints(pod(tolerations=[toleration])), target(nodes=[TAINTED]))
    assert reason == (None if tolerated else "target(s) had untolerated taint {gpu: true}")


def test_soft_and_transient_taints_do_not_filter():
    soft = node("s1", taints=[{"key": "spot", "effect": "PreferNoSchedule"}])
    transient = node(
        "t1", taints=[{"key": "node.kubernetes.io/disk-pressure", "effect": "NoSchedule"}]
    )
    assert fits(constraints(pod()), target(nodes=[soft])) is None
    assert fits(constraints(pod()), target(nodes=[transient])) is None


def test_no_execute_taint_without_value():
    tainted = node("d1", taints=[{"key": "dedicated", "effect": "NoExecute"}])
    assert fits(constraints(pod()), target(nodes=[tainted])) == (
        "target(s) had untolerated taint {dedicated: }"
    )


# Filtering: resources.


def test_resources_fit_on_one_node_of_a_group():
    nodes = [node("n1", cpu="4"), node("n2", cpu="4")]
    a = target(nodes=nodes)
    assert fits(constraints(pod(requests={"cpu": "4"})), a) is None
    # 8 cpu free in the group, but at most 4 on one node.
    assert fits(constraints(pod(requests={"cpu": "5"})), a) == "Insufficient cpu"
    busy = Candidate("a", summary(nodes, [running("n1", cpu="3")]))
    assert fits(constraints(pod(requests={"cpu": "4"})), busy) is None
    busy = Candidate("a", summary(nodes, [running("n1", cpu="3"), running("n2", cpu="1")]))
    assert fits(constraints(pod(requests={"cpu": "4"})), busy) == "Insufficient cpu"


def test_assumed_placements_count_target_wide():
    a = target(nodes=[node("n1", cpu="4"), node("n2", cpu="4")])
    c = constraints(pod(requests={"cpu": "3"}))
    assert fits(c, dataclasses.replace(a, assumed={"cpu": Fraction(5)})) is None
    assert fits(c, dataclasses.replace(a, assumed={"cpu": Fraction(6)})) == "Insufficient cpu"


def test_insufficient_reasons_in_kube_schedulers_order():
    full = target(nodes=[node("n1", cpu="1", memory="1Gi", pods="0")])
    assert fits(constraints(pod(requests={"cpu": "2", "memory": "2Gi"})), full) == "Too many pods"
    roomy = target(nodes=[node("n1", cpu="1", memory="1Gi")])
    assert fits(constraints(pod(requests={"cpu": "2", "memory": "2Gi"})), roomy) == (
        "Insufficient cpu"
    )
    assert fits(constraints(pod(requests={"memory": "2Gi"})), roomy) == "Insufficient memory"
    gpu = constraints(pod(requests={"nvidia.com/gpu": "1"}))
    assert fits(gpu, roomy) == "Insufficient nvidia.com/gpu"
    assert fits(constraints(pod(requests={"nvidia.com/gpu": "0"})), roomy) is None


def test_the_group_that_got_furthest_gives_the_reason():
    plain = node("plain", labels={"zone": "b"})
    tainted = node("tainted", labels={"zone": "a"}, taints=[GPU_TAINT])
    small = node("small", labels={"zone": "a", "size": "s"}, cpu="1")
    in_zone_a = constraints(pod(requests={"cpu": "2"}, nodeSelector={"zone": "a"}))
    assert fits(in_zone_a, target(nodes=[plain, tainted])) == (
        "target(s) had untolerated taint {gpu: true}"
    )
    # "small" gets past its taints (it has none) and fails on resources: that is further.
    assert fits(in_zone_a, target(nodes=[plain, tainted, small])) == "Insufficient cpu"
    assert fits(in_zone_a, target(nodes=[small, tainted])) == "Insufficient cpu"
    assert fits(constraints(pod(nodeSelector={"zone": "c"})), target(nodes=[plain, small])) == (
        AFFINITY
    )
    assert (
        fits(constraints(pod(nodeSelector={"zone": "a"})), target(nodes=[tainted, small])) is None
    )


# Messages.


def test_unschedulable_message():
    reasons = ["Insufficient cpu", AFFINITY, AFFINITY]
    assert unschedulable_message(3, reasons) == (
        "0/3 targets are available: 1 Insufficient cpu, "
        "2 target(s) had no node matching Pod's node affinity/selector."
    )
    assert unschedulable_message(0, []) == (
        "0/0 targets are available: no target is configured for this namespace."
    )
    assert unschedulable_message(2, iter(["target(s) not ready"] * 2)) == (
        "0/2 targets are available: 2 target(s) not ready."
    )


# Scoring.


def place_replicas(c, candidates, count):
    """Place replicas one after another, as the scheduler does: assumed and siblings grow."""
    chosen = []
    for _ in range(count):
        feasible, _ = choose(c, candidates)
        best = feasible[0]
        chosen.append(best.name)
        best.siblings += 1
        for resource, amount in c.requests.items():
            best.assumed[resource] = best.assumed.get(resource, Fraction(0)) + amount
    return chosen


def test_replicas_alternate_between_look_alike_targets():
    c = constraints(pod(requests={"cpu": "100m", "memory": "128Mi"}))
    candidates = [target("b"), target("a")]
    assert place_replicas(c, candidates, 6) == ["a", "b", "a", "b", "a", "b"]


def test_replicas_alternate_even_without_assumed_capacity():
    c = constraints(pod(requests={"cpu": "100m"}))
    a, b = target("a"), target("b")
    chosen = []
    for _ in range(4):
        best = choose(c, [a, b])[0][0]
        chosen.append(best.name)
        best.siblings += 1
    assert chosen == ["a", "b", "a", "b"]


def test_replicas_alternate_between_targets_of_different_sizes():
    c = constraints(pod(requests={"cpu": "100m", "memory": "128Mi"}))
    big = target("big", nodes=[node(f"n{i}", cpu="16", memory="64Gi") for i in range(4)])
    small = target("small", nodes=[node("s1", cpu="2", memory="4Gi")])
    chosen = place_replicas(c, [big, small], 6)
    assert sorted(chosen) == ["big"] * 3 + ["small"] * 3


def test_more_free_capacity_scores_higher():
    c = constraints(pod(requests={"cpu": "1", "memory": "1Gi"}))
    nodes = [node("n1")]
    idle = Candidate("idle", summary(nodes))
    busy = Candidate("busy", summary(nodes, [running("n1", cpu="2", memory="8Gi")]))
    assert score(c, idle, 0) > score(c, busy, 0)
    feasible, _ = choose(c, [busy, idle])
    assert [t.name for t in feasible] == ["idle", "busy"]
    pending = dataclasses.replace(idle, assumed={"cpu": Fraction(3)})
    assert score(c, pending, 0) < score(c, idle, 0)


def preferring(weight_by_zone, **spec):
    manifest = pod(**spec)
    manifest["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": w, "preference": {"matchExpressions": [expression("zone", "In", z)]}}
                for z, w in weight_by_zone.items()
            ]
        }
    }
    return constraints(manifest)


def test_preferred_affinity_with_high_weight_wins_over_spread_and_capacity():
    c = preferring({"a": 100})
    favoured = target("z", nodes=[node("a1", cpu="1", memory="1Gi", labels={"zone": "a"})])
    other = target("b", nodes=[node("b1", cpu="64", memory="256Gi", labels={"zone": "b"})])
    favoured.siblings = 10
    assert [t.name for t in choose(c, [other, favoured])[0]] == ["z", "b"]


def test_preferred_affinity_counts_the_best_feasible_group():
    c = preferring({"a": 80, "b": 20}, requests={"cpu": "2"})
    # The zone "a" group is too small for the pod: only zone "b" can take it.
    mixed = target(
        "m", nodes=[node("a1", cpu="1", labels={"zone": "a"}), node("b1", labels={"zone": "b"})]
    )
    zone_a = target("n", nodes=[node("a2", labels={"zone": "a"})])
    assert score(c, zone_a, 0) > score(c, mixed, 0)
    assert fit._affinity(c._compiled, fit._evaluate(c._compiled, mixed)[1]) == pytest.approx(0.2)


def test_infeasible_candidates_score_below_feasible_ones():
    c = constraints(pod(nodeSelector={"zone": "x"}))
    assert score(c, target(), 0) == fit.INFEASIBLE_SCORE


def test_summaries_are_parsed_once(monkeypatch):
    calls = []
    parse = fit._parse_summary
    monkeypatch.setattr(fit, "_parse_summary", lambda s: calls.append(s) or parse(s))
    a = target()
    c = constraints(pod(requests={"cpu": "1"}))
    for _ in range(5):
        choose(c, [a])
    assert len(calls) == 1
    a.summary = {**a.summary, "metadata": {"resourceVersion": "2"}}
    choose(c, [a])
    assert len(calls) == 2


# Properties.

label_keys = st.sampled_from(["zone", "gen", "disk", "kubernetes.io/hostname"])
label_values = st.sampled_from(["a", "b", "4", "5"])
labels = st.dictionaries(label_keys, label_values, max_size=3)
taint = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["gpu", "spot"]),
        "value": st.sampled_from(["", "true"]),
        "effect": st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"]),
    }
)
nodes = st.lists(
    st.builds(
        lambda i, cpu, mem, lab, taints: node(
            f"n{i}", cpu=str(cpu), memory=f"{mem}Gi", labels=lab, taints=taints
        ),
        st.integers(0, 1000),
        st.integers(0, 8),
        st.integers(0, 16),
        labels,
        st.lists(taint, max_size=2, unique_by=lambda t: (t["key"], t["effect"])),
    ),
    max_size=4,
    unique_by=lambda n: n["metadata"]["name"],
)
manifests = st.builds(
    lambda cpu, selector, tolerations: pod(
        requests={"cpu": f"{cpu}m"}, nodeSelector=selector, tolerations=tolerations
    ),
    st.integers(0, 9000),
    labels,
    st.lists(
        st.fixed_dictionaries(
            {"key": st.sampled_from(["gpu", "spot", ""]), "operator": st.just("Exists")}
        ),
        max_size=2,
    ),
)
candidates = st.lists(
    st.builds(
        lambda name, ns, ready, assumed, siblings: Candidate(
            name, summary(ns), ready, {"cpu": Fraction(assumed)}, siblings
        ),
        st.sampled_from("abcdefgh"),
        nodes,
        st.booleans(),
        st.integers(0, 4),
        st.integers(0, 5),
    ),
    max_size=6,
    unique_by=lambda c: c.name,
)


@given(nodes, labels)
@settings(max_examples=200)
def test_an_unconstrained_pod_fits_any_ready_target_with_room(other_nodes, room_labels):
    roomy = node("roomy", cpu="1", memory="1Gi", labels=room_labels)
    assert fits(constraints(pod()), Candidate("a", summary([*other_nodes, roomy]))) is None


@given(manifests, candidates, st.randoms())
@settings(max_examples=200)
def test_choose_accounts_for_every_candidate_once_and_is_deterministic(manifest, targets, shuffler):
    c = constraints(manifest)
    feasible, reasons = choose(c, targets)
    names = [t.name for t in feasible] + list(reasons)
    assert sorted(names) == sorted(t.name for t in targets)
    for t in feasible:
        assert fits(c, t) is None
    for name, reason in reasons.items():
        assert fits(c, next(t for t in targets if t.name == name)) == reason
    max_siblings = max((t.siblings for t in feasible), default=0)
    scores = [score(c, t, max_siblings) for t in feasible]
    assert scores == sorted(scores, reverse=True)
    shuffled = list(targets)
    shuffler.shuffle(shuffled)
    assert [t.name for t in choose(c, shuffled)[0]] == [t.name for t in feasible]


@given(manifests, candidates, label_keys, label_values)
@settings(max_examples=200)
def test_adding_a_node_selector_never_makes_a_target_feasible(manifest, targets, key, value):
    c = constraints(manifest)
    narrower = dataclasses.replace(c, node_selector={key: value, **c.node_selector})
    for t in targets:
        if fits(c, t) is not None:
            assert fits(narrower, t) is not None


@given(manifests, candidates, st.integers(1, 4000))
@settings(max_examples=200)
def test_more_requests_or_fewer_tolerations_never_make_a_target_feasible(manifest, targets, more):
    c = constraints(manifest)
    hungrier = dataclasses.replace(
        c, requests={**c.requests, "cpu": c.requests.get("cpu", Fraction(0)) + Fraction(more, 1000)}
    )
    intolerant = dataclasses.replace(c, tolerations=())
    for t in targets:
        if fits(c, t) is not None:
            assert fits(hungrier, t) is not None
            assert fits(intolerant, t) is not None


def test_many_pods_and_targets_are_decided_quickly():
    """A rough guard on the hot path: 200 targets of 5 groups, 50 pods (about 0.1 s)."""
    rng = random.Random(0)
    zones = ["a", "b", "c", "d", "e"]
    targets = [
        target(
            f"t{i:03}",
            nodes=[
                node(f"t{i}-{j}", cpu=str(rng.randint(2, 64)), labels={"zone": zones[j % 5]})
                for j in range(10)
            ],
        )
        for i in range(200)
    ]
    c = preferring({"a": 50}, requests={"cpu": "1", "memory": "1Gi"}, nodeSelector={"zone": "b"})
    choose(c, targets)  # parse the summaries
    start = time.perf_counter()
    for _ in range(50):
        feasible, _ = choose(c, targets)
    assert len(feasible) == 200
    assert time.perf_counter() - start < 2.0


def test_constraints_are_immutable():
    c = constraints(pod())
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.node_selector = {}  # type: ignore[misc]
    assert isinstance(c, Constraints)


# -- virtual nodes an admin cordons or taints ----------------------------------------------------

PROXY_TOLERATIONS = [
    {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "admiralty"},
    {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists"},
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
]
OURS = {"key": "virtual-kubelet.io/provider", "value": "admiralty", "effect": "NoSchedule"}


def virtual_node(unschedulable: bool = False, *taints: dict) -> dict:
    return slim_node(
        {
            "metadata": {"name": "admiralty-default-c2"},
            "spec": {"unschedulable": unschedulable, "taints": [OURS, *taints]},
        }
    )


@pytest.mark.parametrize(
    ("node", "tolerations", "expected"),
    [
        (None, PROXY_TOLERATIONS, None),
        (virtual_node(), PROXY_TOLERATIONS, None),
        (virtual_node(True), PROXY_TOLERATIONS, fit.CORDONED),
        (virtual_node(True), [*PROXY_TOLERATIONS, {"key": fit.UNSCHEDULABLE_TAINT,
                                                    "operator": "Exists"}], None),
        (virtual_node(False, {"key": "drain", "value": "now", "effect": "NoSchedule"}),
         PROXY_TOLERATIONS, fit.untolerated_taint("drain", "now")),
        (virtual_node(False, {"key": "drain", "effect": "NoExecute"}),
         PROXY_TOLERATIONS, fit.untolerated_taint("drain", "")),
        (virtual_node(False, {"key": "drain", "value": "x", "effect": "PreferNoSchedule"}),
         PROXY_TOLERATIONS, None),
        (virtual_node(False, {"key": "drain", "value": "now", "effect": "NoSchedule"}),
         [*PROXY_TOLERATIONS, {"key": "drain", "value": "now"}], None),
        (virtual_node(False, {"key": "drain", "value": "now", "effect": "NoSchedule"}),
         [*PROXY_TOLERATIONS, {"key": "drain", "value": "later"}],
         fit.untolerated_taint("drain", "now")),
        (virtual_node(), None, fit.untolerated_taint(OURS["key"], OURS["value"])),
        (virtual_node(True), [{"operator": "Equal", "value": ""}], fit.CORDONED),
    ],
)  # fmt: skip
def test_a_cordoned_or_tainted_virtual_node_refuses_what_kube_scheduler_would(
    node, tolerations, expected
):
    asks = fit.proxy_constraints({"tolerations": tolerations})
    assert fit.virtual_node_refusal(node, asks) == expected


def labelled(**labels: str) -> dict:
    node = virtual_node()
    node["metadata"]["labels"] = {"virtual-kubelet.io/provider": "admiralty", **labels}
    return node


def node_affinity(*terms: dict) -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "node", "expected"),
    [
        ({"nodeSelector": {"region": "eu"}}, labelled(region="eu"), None),
        ({"nodeSelector": {"region": "eu"}}, labelled(region="us"), AFFINITY),
        ({"nodeSelector": {"kubernetes.io/hostname": "admiralty-default-c2"}},
         labelled(**{"kubernetes.io/hostname": "admiralty-default-c2"}), None),
        ({"nodeSelector": {"kubernetes.io/hostname": "admiralty-default-c1"}},
         labelled(**{"kubernetes.io/hostname": "admiralty-default-c2"}), AFFINITY),
        ({"affinity": node_affinity({"matchExpressions": [
            {"key": "region", "operator": "In", "values": ["eu", "ap"]}]})},
         labelled(region="eu"), None),
        ({"affinity": node_affinity({"matchExpressions": [
            {"key": "region", "operator": "NotIn", "values": ["eu"]}]})},
         labelled(region="eu"), AFFINITY),
        ({"affinity": node_affinity({"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["admiralty-default-c2"]}]})},
         labelled(), None),
        ({"affinity": node_affinity({"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["admiralty-default-c1"]}]})},
         labelled(), AFFINITY),
        ({"affinity": node_affinity({})}, labelled(), AFFINITY),  # an empty term matches nothing
    ],
)  # fmt: skip
def test_a_proxy_pods_own_constraints_are_judged_against_virtual_node_labels(spec, node, expected):
    asks = fit.proxy_constraints({**spec, "tolerations": PROXY_TOLERATIONS})
    assert fit.virtual_node_refusal(node, asks) == expected


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"tolerations": ["x"]}, "spec.tolerations"),
        ({"nodeSelector": {"a": 1}}, "nodeSelector"),
        ({"affinity": node_affinity({"matchExpressions": [{"key": "a", "operator": "Near"}]})},
         "unknown operator"),
    ],
)  # fmt: skip
def test_malformed_proxy_constraints_are_refused(spec, says):
    with pytest.raises(ValueError, match=says):
        fit.proxy_constraints(spec)


# A virtual node's own hostname (Argo Workflows' retry away from the failed pod's node).


def test_a_term_avoiding_a_targets_virtual_node_by_hostname_does_not_hold_for_it():
    avoid_a = required(expression("kubernetes.io/hostname", "NotIn", "a", "elsewhere"))
    c = constraints(pod(affinity=avoid_a))
    assert fits(c, target("a")) == AFFINITY
    assert fits(c, target("b")) is None
    ranked, reasons = choose(c, [target("a"), target("b")])
    assert [t.name for t in ranked] == ["b"]
    assert reasons == {"a": AFFINITY}


def test_another_term_can_still_hold_for_the_avoided_target():
    avoid_a = required(expression("kubernetes.io/hostname", "NotIn", "a"))
    terms = avoid_a["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms["nodeSelectorTerms"].append({"matchExpressions": [expression("zone", "In", "a")]})
    c = constraints(pod(affinity=avoid_a))
    assert fits(c, target("a", nodes=[ZONE_A])) is None
    assert fits(c, target("a", nodes=[node("n2", labels={"zone": "b"})])) == AFFINITY


def test_hostnames_of_real_nodes_are_still_taken_to_match():
    for operator in ("In", "NotIn"):
        real = required(expression("kubernetes.io/hostname", operator, "n9"))
        assert fits(constraints(pod(affinity=real)), target("a")) is None
