"""The pure scheduling functions of ``scheduler/fit.py`` against a simple, independent oracle,
on generated nodes, pods and targets.

The oracle reads the raw nodes and running pods (not the ClusterSummary the agent writes, not
fit's parsed groups) and says what DESIGN.md promises: a target is feasible when it is Ready and
some group of look-alike nodes (same labels but the hostname, same taints but the transient
ones) satisfies the pod's nodeSelector, required node affinity and tolerations, with every
resource the pod requests free on one of its nodes, and free target-wide once in-flight
placements are counted. Then: scores are deterministic, bounded and below every feasible one
for an infeasible target; more room or fewer siblings never ranks a target lower; the message
of an unschedulable pod counts every target once; and whatever a manifest or a summary holds,
the functions answer or raise ValueError, never anything else (the scheduler reports a
ValueError as the pod's condition; any other exception would fail its reconcile).

``test_fit.py`` has the rules one by one and a few properties of ``choose`` (every candidate
once, narrower constraints never widen); these do not repeat them."""

from __future__ import annotations

import copy
import dataclasses
import re
from collections import Counter
from fractions import Fraction

from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from multicluster_scheduler.api.summary import slim_node
from multicluster_scheduler.scheduler import fit
from multicluster_scheduler.scheduler.fit import (
    Candidate,
    choose,
    constraints,
    fits,
    insufficient,
    score,
    unschedulable_message,
    untolerated_taint,
)
from multicluster_scheduler.summary.compute import slim_pod, summarize

HOSTNAME = "kubernetes.io/hostname"
HARD = ("NoSchedule", "NoExecute")
MAX_SCORE = fit.CAPACITY_WEIGHT + fit.AFFINITY_WEIGHT + fit.SPREAD_WEIGHT
SETTINGS = settings(max_examples=200, deadline=None)

# -- the world: nodes, running pods, and a pod to place --------------------------------------

label_keys = st.sampled_from(["zone", "gen", "disk", HOSTNAME])
label_values = st.sampled_from(["a", "b", "4", "5", "10"])
taints = st.lists(
    st.fixed_dictionaries(
        {
            "key": st.sampled_from(["gpu", "gpu", "spot", "node.kubernetes.io/not-ready"]),
            "effect": st.sampled_from(
                ["NoSchedule", "NoExecute", "NoSchedule", "PreferNoSchedule"]
            ),
        },
        optional={"value": st.sampled_from(["", "true"])},
    ),
    max_size=2,
    unique_by=lambda t: (t["key"], t["effect"]),
)


@dataclasses.dataclass(frozen=True)
class Node:
    name: str
    labels: dict
    taints: list
    cpu: int  # millicores
    memory: int  # MiB
    pods: int
    used_cpu: int
    used_memory: int
    running: int

    def objects(self) -> tuple[dict, list[dict]]:
        node = slim_node(
            {
                "metadata": {"name": self.name, "labels": {HOSTNAME: self.name, **self.labels}},
                "spec": {"taints": self.taints},
                "status": {
                    "allocatable": {
                        "cpu": f"{self.cpu}m",
                        "memory": f"{self.memory}Mi",
                        "pods": str(self.pods),
                    }
                },
            }
        )
        share = [(self.used_cpu, self.used_memory)] + [(0, 0)] * (self.running - 1)
        pods = [
            slim_pod(
                {
                    "metadata": {"name": f"{self.name}-p{i}", "namespace": "ns"},
                    "spec": {
                        "nodeName": self.name,
                        "containers": [
                            {"resources": {"requests": {"cpu": f"{c}m", "memory": f"{m}Mi"}}}
                        ],
                    },
                    "status": {"phase": "Running"},
                }
            )
            for i, (c, m) in enumerate(share if self.running else [])
        ]
        return node, pods

    def free(self) -> dict[str, Fraction]:
        used_cpu, used_memory = (self.used_cpu, self.used_memory) if self.running else (0, 0)
        return {
            "cpu": Fraction(self.cpu - used_cpu, 1000),
            "memory": Fraction((self.memory - used_memory) * 2**20),
            "pods": Fraction(self.pods - self.running),
        }


amounts = st.sampled_from([0, 100, 500, 1000, 2000, 3000]) | st.integers(0, 4000)
small = st.sampled_from([0, 100, 500, 1000]) | st.integers(0, 4000)
large = st.sampled_from([1000, 2000, 4000]) | st.integers(0, 4000)
nodes = st.lists(
    st.builds(
        Node,
        name=st.sampled_from([f"n{i}" for i in range(8)]),
        labels=st.dictionaries(st.sampled_from(["zone", "gen", "disk"]), label_values, max_size=2),
        taints=taints,
        cpu=large,
        memory=large,
        pods=st.integers(0, 4),
        used_cpu=small,
        used_memory=small,
        running=st.sampled_from([0, 0, 1, 2]),
    ),
    min_size=1,
    max_size=5,
    unique_by=lambda n: n.name,
)


@dataclasses.dataclass
class World:
    nodes: list[Node]
    ready: bool
    assumed: dict[str, Fraction]
    siblings: int

    def summary(self) -> dict:
        objects = [n.objects() for n in self.nodes]
        summary = summarize([n for n, _ in objects], [p for _, ps in objects for p in ps])
        return {"metadata": {"name": "singleton", "resourceVersion": "1"}, **summary}

    def candidate(self, name: str = "t") -> Candidate:
        return Candidate(name, self.summary(), self.ready, dict(self.assumed), self.siblings)


worlds = st.builds(
    World,
    nodes=nodes,
    ready=st.sampled_from([True, True, True, False]),
    assumed=st.fixed_dictionaries(
        {},
        optional={
            "cpu": amounts.map(lambda m: Fraction(m, 1000)),
            "pods": st.integers(0, 2).map(Fraction),
        },
    ),
    siblings=st.integers(0, 3),
)
operators = st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"])


@st.composite
def expressions(draw) -> dict:
    operator = draw(operators)
    expression = {"key": draw(label_keys), "operator": operator}
    if operator in ("In", "NotIn"):
        expression["values"] = draw(st.lists(label_values, min_size=1, max_size=2))
    elif operator in ("Gt", "Lt"):
        expression["values"] = [draw(st.sampled_from(["4", "5", "x"]))]
    return expression


terms = st.lists(st.fixed_dictionaries({"matchExpressions": st.lists(expressions(), max_size=2)}))
tolerations = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "key": st.sampled_from(["gpu", "spot"]),
            "operator": st.sampled_from(["Exists", "Equal"]),
            "value": st.sampled_from(["", "true"]),
            "effect": st.sampled_from(["NoSchedule", "NoExecute"]),
        },
    ),
    max_size=2,
)


@st.composite
def manifests(draw) -> dict:
    spec: dict = {
        "containers": [
            {
                "name": "c",
                "resources": {
                    "requests": {
                        "cpu": f"{draw(small)}m",
                        "memory": f"{draw(small)}Mi",
                    }
                },
            }
        ],
        "nodeSelector": draw(st.dictionaries(label_keys, label_values, max_size=1)),
        "tolerations": draw(tolerations),
    }
    required = draw(st.none() | terms.filter(bool))
    preferred = draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "weight": st.integers(1, 100),
                    "preference": st.fixed_dictionaries(
                        {"matchExpressions": st.lists(expressions(), min_size=1, max_size=1)}
                    ),
                }
            ),
            max_size=2,
        )
    )
    affinity: dict = {}
    if required is not None:
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": required}
    if preferred:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    if affinity:
        spec["affinity"] = {"nodeAffinity": affinity}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


# -- the oracle ------------------------------------------------------------------------------


def expression_matches(expression: dict, labels: dict) -> bool:
    key, operator = expression["key"], expression["operator"]
    values = expression.get("values") or []
    if key == HOSTNAME:
        return True  # a group cannot tell; the target's own scheduler will
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    value, bound = labels.get(key, ""), values[0]
    if not (re.fullmatch(r"-?\d+", value) and re.fullmatch(r"-?\d+", bound)):
        return False
    return int(value) > int(bound) if operator == "Gt" else int(value) < int(bound)


def tolerated(taint: dict, toleration: dict) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    if toleration.get("operator") == "Exists":
        return True
    return toleration.get("value", "") == taint.get("value", "")


def requests_of(manifest: dict) -> dict[str, Fraction]:
    requested = manifest["spec"]["containers"][0]["resources"]["requests"]
    return {
        "cpu": Fraction(int(requested["cpu"][:-1]), 1000),
        "memory": Fraction(int(requested["memory"][:-2]) * 2**20),
        "pods": Fraction(1),
    }


def group_stage(manifest: dict, labels: dict, group_taints: list, free: dict, short: set) -> str:
    """How far one group of look-alike nodes gets: "selector", "taints", "resources", or "fits"
    (and the reason it gives when it does not)."""
    spec = manifest["spec"]
    selector = {k: v for k, v in spec["nodeSelector"].items() if k != HOSTNAME}
    if any(labels.get(k) != v for k, v in selector.items()):
        return "selector"
    terms_ = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms")
    )
    if terms_ is not None and not any(
        term["matchExpressions"]
        and all(expression_matches(e, labels) for e in term["matchExpressions"])
        for term in terms_
    ):
        return "selector"
    for taint in group_taints:
        if taint["effect"] in HARD and not any(tolerated(taint, t) for t in spec["tolerations"]):
            return "taints"
    for resource, amount in requests_of(manifest).items():
        if amount > 0 and (resource in short or free.get(resource, 0) < amount):
            return "resources"
    return "fits"


def oracle(manifest: dict, world: World) -> tuple[bool, str]:
    """(feasible, the furthest stage any group reached)."""
    if not world.ready:
        return False, "not ready"
    if not world.nodes:
        return False, "no nodes"
    requests = requests_of(manifest)
    total: Counter = Counter()
    for n in world.nodes:
        total.update(n.free())
    short = {
        r
        for r, amount in requests.items()
        if amount > 0 and total[r] - world.assumed.get(r, 0) < amount
    }
    groups: dict[tuple, list[Node]] = {}
    for n in world.nodes:
        hard = sorted(
            (t["key"], t.get("value", ""), t["effect"])
            for t in n.taints
            if not t["key"].startswith("node.kubernetes.io/")
        )
        groups.setdefault((tuple(sorted(n.labels.items())), tuple(hard)), []).append(n)
    stages = []
    for (labels, group_taints), members in groups.items():
        largest = {r: max(m.free()[r] for m in members) for r in ("cpu", "memory", "pods")}
        taint_dicts = [{"key": k, "value": v, "effect": e} for k, v, e in group_taints]
        stages.append(group_stage(manifest, dict(labels), taint_dicts, largest, short))
    order = ["selector", "taints", "resources", "fits"]
    furthest = max(stages, key=order.index)
    return furthest == "fits", furthest


# -- properties ------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(manifests(), worlds)
def test_a_target_is_feasible_exactly_when_the_oracle_finds_a_group(manifest, world):
    c = constraints(manifest)
    feasible, furthest = oracle(manifest, world)
    event(f"oracle: {'feasible' if feasible else furthest}")
    reason = fits(c, world.candidate())
    assert (reason is None) == feasible, (reason, furthest)
    if feasible:
        return
    expected = {
        "not ready": lambda r: r == fit.NOT_READY,
        "no nodes": lambda r: r == fit.NO_NODES,
        "selector": lambda r: r == fit.NODE_AFFINITY_MISMATCH,
        "taints": lambda r: r.startswith("target(s) had untolerated taint {"),
        "resources": lambda r: r in {insufficient(x) for x in ("cpu", "memory", "pods")},
    }[furthest]
    assert expected(reason), (reason, furthest)


@SETTINGS
@given(manifests(), worlds)
def test_a_named_taint_or_resource_is_one_that_really_fails(manifest, world):
    reason = fits(constraints(manifest), world.candidate())
    spec = manifest["spec"]
    if reason is not None and reason.startswith("target(s) had untolerated taint"):
        named = [
            t
            for n in world.nodes
            for t in n.taints
            if reason == untolerated_taint(t["key"], t.get("value", ""))
        ]
        assert named
        assert any(not any(tolerated(t, x) for x in spec["tolerations"]) for t in named)
    if reason in {insufficient(r) for r in ("cpu", "memory", "pods")}:
        resource = next(r for r in ("cpu", "memory", "pods") if insufficient(r) == reason)
        wanted = requests_of(manifest)[resource]
        total = sum(n.free()[resource] for n in world.nodes) - world.assumed.get(resource, 0)
        assert wanted > 0
        assert total < wanted or any(n.free()[resource] < wanted for n in world.nodes)


@SETTINGS
@given(manifests(), worlds, st.integers(0, 5))
def test_scores_are_deterministic_bounded_and_below_feasible_ones_when_infeasible(
    manifest, world, max_siblings
):
    c = constraints(manifest)
    candidate = world.candidate()
    max_siblings = max(max_siblings, candidate.siblings)
    first = score(c, candidate, max_siblings)
    assert score(c, candidate, max_siblings) == first
    # The same summary parsed afresh (no cache) scores the same.
    fresh = dataclasses.replace(candidate, summary=copy.deepcopy(candidate.summary))
    assert score(constraints(manifest), fresh, max_siblings) == first
    if fits(c, candidate) is None:
        assert 0.0 <= first <= MAX_SCORE
    else:
        assert first == fit.INFEASIBLE_SCORE < 0.0


@SETTINGS
@given(manifests(), worlds)
def test_the_order_of_node_groups_in_a_summary_does_not_matter(manifest, world):
    """Feasibility and score do not; the reason may name another failure of the same stage
    (two groups short of different resources, or with different taints), which is as true."""
    c = constraints(manifest)
    candidate = world.candidate()
    reordered = copy.deepcopy(candidate.summary)
    reordered["nodeGroups"].reverse()
    other = dataclasses.replace(candidate, summary=reordered)
    assert stage(fits(c, other)) == stage(fits(c, candidate))
    assert score(c, other, 3) == score(c, candidate, 3)


def stage(reason: str | None) -> str | None:
    if reason is None:
        return reason
    if reason.startswith("Insufficient") or reason == fit.TOO_MANY_PODS:
        return "resources"
    if "untolerated taint" in reason:
        return "taints"
    return reason


def avoided_hostnames(manifest: dict) -> set[str]:
    affinity = manifest["spec"].get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    return {
        value
        for term in required.get("nodeSelectorTerms") or ()
        for e in term.get("matchExpressions") or ()
        if e.get("key") == HOSTNAME and e.get("operator") == "NotIn"
        for value in e.get("values") or ()
    }


@SETTINGS
@given(manifests(), worlds, st.integers(1, 3000), st.integers(1, 3))
def test_more_free_room_or_fewer_siblings_never_ranks_a_target_lower(
    manifest, world, less_cpu, fewer
):
    c = constraints(manifest)
    # Two targets alike but for their room and siblings, and their names: a term that avoids
    # one of them by its virtual node's name (kubernetes.io/hostname NotIn) tells them apart.
    assume(not {"a", "b"} & avoided_hostnames(manifest))
    busy = world.candidate("a")
    roomier = dataclasses.replace(
        world.candidate("b"),
        assumed={**busy.assumed, "cpu": max(Fraction(0), busy.assumed.get("cpu", 0) - less_cpu)},
        siblings=max(0, busy.siblings - fewer),
    )
    feasible, _ = choose(c, [busy, roomier])
    names = [t.name for t in feasible]
    if "a" in names:
        assert "b" in names
        # "b" ties or wins: it comes first, or scores the same (ties go by name)
        max_siblings = max(t.siblings for t in feasible)
        assert names[0] == "b" or score(c, roomier, max_siblings) == score(c, busy, max_siblings)


reasons = st.sampled_from(
    [
        fit.NOT_READY,
        fit.NO_SUMMARY,
        fit.INVALID_SUMMARY,
        fit.NO_NODES,
        fit.NODE_AFFINITY_MISMATCH,
        untolerated_taint("gpu", "true"),
        untolerated_taint("spot", ""),
        insufficient("cpu"),
        insufficient("pods"),
        insufficient("example.com/gpu"),
        "target(s) rejected the delegate",
    ]
)


@SETTINGS
@given(st.lists(reasons, max_size=12), st.integers(0, 3))
def test_the_unschedulable_message_counts_every_target_once(found, extra):
    total = len(found) + extra  # targets without a reason (excluded elsewhere) still count
    message = unschedulable_message(total, found)
    head = f"0/{total} targets are available"
    assert message.startswith(head)
    if total == 0:
        assert "no target is configured" in message
        return
    if not found:
        assert message == head + "."
        return
    assert message.endswith(".")
    details = message[len(head) + 2 : -1].split(", ")
    counted = Counter()
    for detail in details:
        count, reason = detail.split(" ", 1)
        counted[reason] += int(count)
    assert counted == Counter(found)
    assert [d.split(" ", 1)[1] for d in details] == sorted(counted)


@SETTINGS
@given(manifests(), st.lists(worlds, max_size=4))
def test_choose_explains_every_infeasible_target_and_the_message_adds_up(manifest, many):
    c = constraints(manifest)
    candidates = [w.candidate(f"t{i}") for i, w in enumerate(many)]
    feasible, why = choose(c, candidates)
    assert len(feasible) + len(why) == len(candidates)
    if not feasible and candidates:
        message = unschedulable_message(len(candidates), why.values())
        counts = [int(m.group(1)) for m in re.finditer(r"(?:: |, )(\d+) ", message)]
        assert sum(counts) == len(candidates)


# -- whatever a manifest or a summary holds ------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
    | st.sampled_from(["In", "Exists", "Gt", "5", "100m", "1Gi", "NoSchedule", "zone"]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=10,
)
odd_specs = st.fixed_dictionaries(
    {},
    optional={
        "containers": json_values
        | st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "resources": json_values
                    | st.fixed_dictionaries(
                        {}, optional={"requests": json_values, "limits": json_values}
                    ),
                    "restartPolicy": json_values,
                },
            ),
            max_size=2,
        ),
        "initContainers": json_values,
        "overhead": json_values,
        "resources": json_values,
        "nodeSelector": json_values,
        "tolerations": json_values | st.lists(json_values | tolerations, max_size=2),
        "affinity": json_values
        | st.fixed_dictionaries(
            {
                "nodeAffinity": json_values
                | st.fixed_dictionaries(
                    {},
                    optional={
                        "requiredDuringSchedulingIgnoredDuringExecution": json_values
                        | st.fixed_dictionaries({"nodeSelectorTerms": json_values | terms}),
                        "preferredDuringSchedulingIgnoredDuringExecution": json_values,
                    },
                )
            }
        ),
    },
)
odd_scalars = st.sampled_from([5, None, ["5"], {"x": "5"}, 4.5, True, "gpu", "5"])
odd_summaries = st.fixed_dictionaries(
    {},
    optional={
        "metadata": json_values,
        "allocatable": json_values,
        "nodeGroups": json_values
        | st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "labels": json_values
                    | st.dictionaries(label_keys, label_values | odd_scalars, max_size=2),
                    "taints": json_values
                    | st.lists(
                        json_values
                        | st.fixed_dictionaries(
                            {"key": odd_scalars, "effect": st.sampled_from(HARD)},
                            optional={"value": odd_scalars},
                        ),
                        max_size=2,
                    ),
                    "allocatable": json_values,
                    "requested": json_values,
                    "largestFree": json_values,
                },
            ),
            max_size=2,
        ),
    },
)


@settings(max_examples=400, deadline=None)
@given(st.none() | json_values | odd_specs.map(lambda s: {"spec": s}))
def test_constraints_of_any_manifest_are_built_or_refused_with_a_value_error(manifest):
    try:
        constraints(manifest)
    except ValueError as e:
        message = str(e)
        assert message


@settings(max_examples=400, deadline=None)
@given(
    manifests() | odd_specs.map(lambda s: {"spec": s}),
    st.lists(odd_summaries | json_values, max_size=3),
)
def test_any_summary_a_target_publishes_is_judged_without_an_exception(manifest, summaries):
    try:
        c = constraints(manifest)
    except ValueError:
        return
    candidates = [Candidate(f"t{i}", s) for i, s in enumerate(summaries)]
    feasible, why = choose(c, candidates)
    assert len(feasible) + len(why) == len(candidates)
    for candidate in feasible:
        assert 0.0 <= score(c, candidate, 0) <= MAX_SCORE


@SETTINGS
@given(expressions(), odd_scalars, st.sampled_from(["required", "preferred", "selector"]))
def test_a_group_label_that_is_not_a_string_makes_the_summary_invalid(expression, value, where):
    spec: dict = {"containers": [{"name": "c"}]}
    if where == "selector":
        spec["nodeSelector"] = {expression["key"]: "5"}
    else:
        term = {"matchExpressions": [expression]}
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
            if where == "required"
            else {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": term}
                ]
            }
        }
    group = {
        "labels": {expression["key"]: value},
        "allocatable": {"cpu": "1", "pods": "10"},
        "largestFree": {"cpu": "1", "pods": "10"},
    }
    candidate = Candidate("t", {"metadata": {}, "nodeGroups": [group]})
    reason = fits(constraints({"spec": spec}), candidate)
    if not isinstance(value, str):
        assert reason == fit.INVALID_SUMMARY
