"""Which targets can take a pod, and which is best (pure functions, no I/O).

The scheduler decides from what it already holds, the proxy pod's saved manifest and each
target's ClusterSummary, so that filtering and scoring cost no API call. A target is feasible
when one of its node groups satisfies the pod's nodeSelector, required node affinity,
tolerations and requests, judged the way kube-scheduler judges a node; feasible targets are
ranked by free capacity, preferred node affinity and the spread of the owner's replicas. The
target's own scheduler has the last word (the delegate may still be unschedulable there), so
what a group cannot tell (hostnames, node fields) is taken to match, and a summary without node
groups (written by an original agent) is taken as one group of unknown labels and taints.

One hostname is known, though: the virtual node's. A required term with ``kubernetes.io/hostname
NotIn [...]`` naming a target's virtual node does not hold for that target, as kube-scheduler
would judge the proxy pod on that node. Workload controllers that steer a retry away from where
a pod failed write exactly that: Argo Workflows' ``retryStrategy.affinity.nodeAntiAffinity``
names the failed pod's node, which is the virtual node of the target it failed in.

This runs for every pod and target: a pod's constraints are compiled once, when its
``Constraints`` is built, and a summary's quantities are parsed once per summary object. The
per-target comparisons use integer nano-units (Kubernetes keeps no finer precision): exact like
fractions, and several times faster to compare.
"""

from __future__ import annotations

import math
import re
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ..api.quantity import QuantityError, add, parse_list
from ..api.summary import HIGH_CARDINALITY_LABELS, pod_requests

NOT_READY = "target(s) not ready"
NO_SUMMARY = "target(s) had no cluster summary"
INVALID_SUMMARY = "target(s) had an invalid cluster summary"
NO_NODES = "target(s) had no nodes"
NODE_AFFINITY_MISMATCH = "target(s) had no node matching Pod's node affinity/selector"
HOSTNAME = "kubernetes.io/hostname"
TOO_MANY_PODS = "Too many pods"

# Score weights: spread outweighs capacity, so that replicas alternate between look-alike
# targets; a fully matched preferred affinity outweighs both, so that it wins over spread.
CAPACITY_WEIGHT = 1.0
SPREAD_WEIGHT = 2.0
AFFINITY_WEIGHT = 4.0
INFEASIBLE_SCORE = -1.0
SCORED_RESOURCES = ("cpu", "memory")
# The order in which kube-scheduler reports insufficient resources; others follow by name.
RESOURCE_ORDER = ("pods", "cpu", "memory", "ephemeral-storage")
HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
_INT64 = re.compile(r"^[+-]?\d+$")
_SUMMARY_CACHE_SIZE = 1024


CORDONED = "target(s) were unschedulable"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def untolerated_taint(key: str, value: str) -> str:
    return f"target(s) had untolerated taint {{{key}: {value}}}"


@dataclass(frozen=True)
class ProxyConstraints:
    """What a proxy pod itself asks of a virtual node, as kube-scheduler (the proxy scheduler
    upstream) would judge it: its nodeSelector, required node affinity (hostname and
    ``matchFields`` on ``metadata.name`` included: a virtual node's are known) and tolerations.
    The webhook gives a proxy pod only the virtual nodes' own selector and tolerations, plus
    what ``proxy-pod-scheduling-constraints`` (or ``use-constraints-from-spec-…``) asks."""

    selector: tuple[tuple[str, str], ...]
    required: tuple[tuple[tuple[_Expression, ...], tuple[_Expression, ...]], ...]
    tolerations: tuple[tuple[str, str, str, str], ...]


def proxy_constraints(spec: Mapping[str, Any]) -> ProxyConstraints:
    """``spec``: the proxy pod's (ValueError if malformed)."""
    selector = tuple(
        (_string(k, "nodeSelector key"), _string(v, f"nodeSelector[{k}]"))
        for k, v in _mapping(spec.get("nodeSelector"), "spec.nodeSelector").items()
    )
    affinity = _mapping(spec.get("affinity"), "spec.affinity")
    node_affinity = _mapping(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = []
    if required is not None:
        where = "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
        required = _mapping(required, where)
        for i, term in enumerate(_list(required.get("nodeSelectorTerms"), where)):
            term = _mapping(term, f"{where}[{i}]")
            expressions, fields = (
                tuple(
                    _compile_expression(e, f"{where}[{i}].{part}[{j}]")
                    for j, e in enumerate(_list(term.get(part), f"{where}[{i}].{part}"))
                )
                for part in ("matchExpressions", "matchFields")
            )
            terms.append((expressions, fields))
    tolerations = tuple(
        _compile_toleration(t, i)
        for i, t in enumerate(_list(spec.get("tolerations"), "spec.tolerations"))
    )
    return ProxyConstraints(
        selector=selector,
        required=tuple(terms),
        tolerations=tuple(t for t in tolerations if t[0] or t[1] == "Exists"),
    )


def virtual_node_refusal(node: Mapping[str, Any] | None, wants: ProxyConstraints) -> str | None:
    """Why kube-scheduler would not put the proxy pod on the virtual node ``node``, as its
    NodeUnschedulable, NodeAffinity and TaintToleration filters judge: the node is cordoned,
    does not match the pod's node selector or required affinity, or has a NoSchedule or
    NoExecute taint the pod does not tolerate. None when it would (or when the node is not known
    yet: its target is judged on its summary alone). An admin cordons or taints a virtual node
    to stop new pods going to its target."""
    if node is None:
        return None
    spec, meta = node.get("spec") or {}, node.get("metadata") or {}
    tolerations = wants.tolerations
    if spec.get("unschedulable") is True and not any(
        _tolerates(t, (UNSCHEDULABLE_TAINT, "", "NoSchedule")) for t in tolerations
    ):
        return CORDONED
    labels = meta.get("labels") or {}
    if any(labels.get(k) != v for k, v in wants.selector):
        return NODE_AFFINITY_MISMATCH
    if wants.required:
        fields = {"metadata.name": meta.get("name") or ""}
        if not any(
            (expressions or node_fields)
            and all(e.matches(labels) for e in expressions)
            and all(e.matches(fields) for e in node_fields)
            for expressions, node_fields in wants.required
        ):
            return NODE_AFFINITY_MISMATCH
    for taint in spec.get("taints") or ():
        if not isinstance(taint, Mapping) or taint.get("effect") not in HARD_EFFECTS:
            continue
        key, value = str(taint.get("key") or ""), str(taint.get("value") or "")
        if not any(_tolerates(t, (key, value, taint["effect"])) for t in tolerations):
            return untolerated_taint(key, value)
    return None


def insufficient(resource: str) -> str:
    return TOO_MANY_PODS if resource == "pods" else f"Insufficient {resource}"


@dataclass(frozen=True)
class Constraints:
    """What a pod asks of a node; validated and compiled when built (ValueError if malformed)."""

    node_selector: dict[str, str]
    required: tuple[dict, ...]  # required nodeSelectorTerms, ORed; () when none
    preferred: tuple[tuple[int, dict], ...]  # (weight, preference term)
    tolerations: tuple[dict, ...]
    requests: dict[str, Fraction]  # effective pod requests, "pods": 1 included
    _compiled: _Compiled = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", _compile(self))


@dataclass
class Candidate:
    """A target as the scheduler sees it for one pod."""

    name: str  # the target's virtual node name
    summary: dict | None  # its ClusterSummary object, treated as immutable; None when it has none
    ready: bool = True
    assumed: dict[str, Fraction] = field(default_factory=dict)  # in flight, not yet summarized
    siblings: int = 0  # pods of the same owner already there or in flight


def constraints(manifest: dict) -> Constraints:
    """What a pod (a full pod object, as the proxy pod saves it) asks of a node."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("spec"), dict):
        raise ValueError("pod manifest has no spec")
    spec = manifest["spec"]
    affinity = _mapping(spec.get("affinity"), "spec.affinity")
    node_affinity = _mapping(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms: list = []
    if required is not None:
        where = "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
        terms = _list(_mapping(required, where).get("nodeSelectorTerms"), where)
        if not terms:
            raise ValueError(f"{where} must not be empty")
    preferred: list[tuple[Any, dict]] = []
    where = "preferredDuringSchedulingIgnoredDuringExecution"
    for i, item in enumerate(_list(node_affinity.get(where), where)):
        item = _mapping(item, f"{where}[{i}]")
        # The weight is checked where it is used (an integer, not negative).
        preferred.append((item.get("weight"), item.get("preference") or {}))
    return Constraints(
        node_selector=dict(_mapping(spec.get("nodeSelector"), "spec.nodeSelector")),
        required=tuple(terms),
        preferred=tuple(preferred),
        tolerations=tuple(_list(spec.get("tolerations"), "spec.tolerations")),
        requests=_pod_requests(spec),
    )


def fits(c: Constraints, candidate: Candidate) -> str | None:
    """None when some node group of the target can take the pod, else why not: the failure of
    the group that got furthest (selector, then taints, then resources)."""
    return _evaluate(c._compiled, candidate)[0]


def score(c: Constraints, candidate: Candidate, max_siblings: int) -> float:
    """Higher is better; ``INFEASIBLE_SCORE`` (below any feasible target) when it does not fit.
    ``max_siblings``: the most siblings any feasible candidate has."""
    reason, groups = _evaluate(c._compiled, candidate)
    if reason is not None:
        return INFEASIBLE_SCORE
    return _score(c._compiled, candidate, groups, max_siblings)


def choose(c: Constraints, candidates: list[Candidate]) -> tuple[list[Candidate], dict[str, str]]:
    """The feasible candidates, best first (ties by name), and why each other one is not."""
    compiled = c._compiled
    feasible: list[tuple[Candidate, list[_Group]]] = []
    reasons: dict[str, str] = {}
    for candidate in candidates:
        reason, groups = _evaluate(compiled, candidate)
        if reason is None:
            feasible.append((candidate, groups))
        else:
            reasons[candidate.name] = reason
    max_siblings = max((candidate.siblings for candidate, _ in feasible), default=0)
    ranked = sorted(
        (
            (-_score(compiled, cand, groups, max_siblings), cand.name, cand)
            for cand, groups in feasible
        ),
        key=lambda item: item[:2],
    )
    return [candidate for _, _, candidate in ranked], reasons


def unschedulable_message(total: int, reasons: Iterable[str]) -> str:
    """``0/3 targets are available: 1 Insufficient cpu, 2 target(s) had no node matching …``"""
    if total == 0:
        return "0/0 targets are available: no target is configured for this namespace."
    counts = Counter(reasons)
    if not counts:
        return f"0/{total} targets are available."
    details = ", ".join(f"{counts[reason]} {reason}" for reason in sorted(counts))
    return f"0/{total} targets are available: {details}."


# Compiled constraints: what the per-target checks need, in the cheapest form.


@dataclass(frozen=True, slots=True)
class _Expression:
    key: str
    operator: str
    values: frozenset[str]
    bound: int | None  # Gt and Lt; None when not an integer (then nothing matches)

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        operator = self.operator
        if operator == "In":
            return value is not None and value in self.values
        if operator == "NotIn":
            return value is None or value not in self.values
        if operator == "Exists":
            return value is not None
        if operator == "DoesNotExist":
            return value is None
        number = _int64(value)
        if number is None or self.bound is None:
            return False
        return number > self.bound if operator == "Gt" else number < self.bound


# A node selector term as its expressions that groups can judge; None for an empty term.
_Term = tuple[_Expression, ...] | None


@dataclass(frozen=True, slots=True)
class _Compiled:
    selector: tuple[tuple[str, str], ...]
    required: tuple[_Term, ...]
    # Per required term, the hostnames its ``NotIn`` expressions exclude: a target whose
    # virtual node is one of them fails that term. () when no term excludes any.
    avoided: tuple[frozenset[str], ...]
    preferred: tuple[tuple[int, _Term], ...]
    total_weight: int
    tolerations: tuple[tuple[str, str, str, str], ...]  # key, operator, value, effect
    requests: tuple[tuple[str, int], ...]  # positive amounts in nano-units, reporting order
    scored_requests: tuple[float, ...]  # SCORED_RESOURCES


def _compile(c: Constraints) -> _Compiled:
    selector = tuple(
        (_string(k, "nodeSelector key"), _string(v, f"nodeSelector[{k}]"))
        for k, v in _mapping(c.node_selector, "nodeSelector").items()
    )
    preferred = []
    for i, (weight, term) in enumerate(c.preferred):
        if not isinstance(weight, int) or isinstance(weight, bool) or weight < 0:
            raise ValueError(f"preferred term {i}: weight {weight!r} is not a non-negative integer")
        preferred.append((weight, _compile_term(term, f"preferred term {i}")))
    requests = tuple(
        sorted(
            ((r, _nano(amount)) for r, amount in c.requests.items() if amount > 0),
            key=lambda item: (_resource_rank(item[0]), item[0]),
        )
    )
    required = tuple(_compile_term(t, f"required term {i}") for i, t in enumerate(c.required))
    avoided = tuple(_avoided_hosts(term) for term in c.required)  # checked just above
    return _Compiled(
        selector=tuple((k, v) for k, v in selector if k not in HIGH_CARDINALITY_LABELS),
        required=required,
        avoided=avoided if any(avoided) else (),
        preferred=tuple(preferred),
        total_weight=sum(weight for weight, _ in preferred),
        tolerations=tuple(_compile_toleration(t, i) for i, t in enumerate(c.tolerations)),
        requests=requests,
        scored_requests=tuple(float(c.requests.get(r, 0)) for r in SCORED_RESOURCES),
    )


def _compile_term(term: Any, where: str) -> _Term:
    term = _mapping(term, where)
    expressions = _list(term.get("matchExpressions"), f"{where}.matchExpressions")
    match_fields = _list(term.get("matchFields"), f"{where}.matchFields")
    if not expressions and not match_fields:
        return None
    compiled = (
        _compile_expression(e, f"{where}.matchExpressions[{i}]") for i, e in enumerate(expressions)
    )
    return tuple(e for e in compiled if e.key not in HIGH_CARDINALITY_LABELS)


def _avoided_hosts(term: dict) -> frozenset[str]:
    """The hostnames a required term excludes (``term`` checked by ``_compile_term``)."""
    return frozenset(
        value
        for e in term.get("matchExpressions") or ()
        if e.get("key") == HOSTNAME and e.get("operator") == "NotIn"
        for value in e.get("values") or ()
    )


def _compile_expression(expression: Any, where: str) -> _Expression:
    expression = _mapping(expression, where)
    key = _string(expression.get("key"), f"{where}.key")
    operator = expression.get("operator")
    if operator not in OPERATORS:
        raise ValueError(f"{where}: unknown operator {operator!r}")
    values = [_string(v, f"{where}.values") for v in _list(expression.get("values"), where)]
    if operator in ("In", "NotIn") and not values:
        raise ValueError(f"{where}: operator {operator} needs values")
    if operator in ("Exists", "DoesNotExist") and values:
        raise ValueError(f"{where}: operator {operator} takes no values")
    if operator in ("Gt", "Lt") and len(values) != 1:
        raise ValueError(f"{where}: operator {operator} needs exactly one value")
    bound = _int64(values[0]) if operator in ("Gt", "Lt") else None
    return _Expression(key, operator, frozenset(values), bound)


def _compile_toleration(toleration: Any, index: int) -> tuple[str, str, str, str]:
    toleration = _mapping(toleration, f"spec.tolerations[{index}]")
    return tuple(  # type: ignore[return-value]
        _string(toleration.get(name) or "", f"spec.tolerations[{index}].{name}")
        for name in ("key", "operator", "value", "effect")
    )


def _pod_requests(spec: dict) -> dict[str, Fraction]:
    """Requests as kube-scheduler counts them, from a full pod spec: a container's limits stand
    for the requests it leaves unset (as API defaulting does), pod-level requests replace the
    containers' sum, overhead adds."""
    slim = {
        "containers": _slim_containers(spec, "containers"),
        "initContainers": _slim_containers(spec, "initContainers"),
    }
    total = pod_requests({"spec": slim})
    resources = _mapping(spec.get("resources"), "spec.resources")
    pod_level = _requests_or_limits(resources, "spec.resources")
    total.update(_quantities(pod_level, "spec.resources.requests"))
    return add(total, _quantities(spec.get("overhead"), "spec.overhead"))


def _slim_containers(spec: dict, kind: str) -> list[dict]:
    slim = []
    for i, container in enumerate(_list(spec.get(kind), f"spec.{kind}")):
        where = f"spec.{kind}[{i}]"
        container = _mapping(container, where)
        resources = _mapping(container.get("resources"), f"{where}.resources")
        requests = _requests_or_limits(resources, f"{where}.resources")
        _quantities(requests, f"{where}.resources.requests")
        slim.append({"requests": requests, "restartPolicy": container.get("restartPolicy")})
    return slim


def _requests_or_limits(resources: dict, where: str) -> dict:
    limits = _mapping(resources.get("limits"), f"{where}.limits")
    return {**limits, **_mapping(resources.get("requests"), f"{where}.requests")}


def _quantities(resources: Any, where: str) -> dict[str, Fraction]:
    try:
        return parse_list(_mapping(resources, where))
    except (QuantityError, AttributeError, TypeError) as error:
        raise ValueError(f"{where}: {error}") from None


def _resource_rank(resource: str) -> int:
    return RESOURCE_ORDER.index(resource) if resource in RESOURCE_ORDER else len(RESOURCE_ORDER)


def _mapping(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where} is not an object")
    return value


def _list(value: Any, where: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise ValueError(f"{where} is not a list")
    return list(value)


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: {value!r} is not a string")
    return value


def _nano(amount: Fraction | int) -> int:
    """An amount in nano-units, rounded up as Kubernetes rounds quantities finer than that."""
    return math.ceil(amount * 1_000_000_000)


def _int64(value: str | None) -> int | None:
    """As Go's strconv.ParseInt(value, 10, 64); None when that fails."""
    if value is None or not _INT64.match(value):
        return None
    number = int(value)
    return number if -(2**63) <= number < 2**63 else None


# Parsed summaries.


@dataclass(frozen=True, slots=True)
class _Group:
    labels: dict[str, str] | None  # None: unknown (a summary without node groups)
    taints: tuple[tuple[str, str, str], ...]  # key, value, effect: NoSchedule and NoExecute
    largest_free: dict[str, int]  # nano-units
    allocatable: tuple[float, ...]  # SCORED_RESOURCES
    free: tuple[float, ...]  # SCORED_RESOURCES, allocatable minus requested


@dataclass(frozen=True, slots=True)
class _Summary:
    groups: tuple[_Group, ...]
    free: dict[str, int]  # target-wide, allocatable minus requested, nano-units


_summaries: OrderedDict[int, tuple[dict, Any, _Summary | None]] = OrderedDict()


def _parsed(summary: Any) -> _Summary | None:
    """The summary parsed, None when it is malformed. Cached by identity and resourceVersion:
    summaries are treated as immutable (as informers' objects are); the cache holds a reference
    to each summary it keeps, so an id is never reused while cached."""
    if not isinstance(summary, dict):
        return None
    key = id(summary)
    metadata = summary.get("metadata")
    version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
    hit = _summaries.get(key)
    if hit is not None and hit[0] is summary and hit[1] == version:
        return hit[2]
    parsed = _parse_summary(summary)
    _summaries[key] = (summary, version, parsed)
    if len(_summaries) > _SUMMARY_CACHE_SIZE:
        _summaries.popitem(last=False)
    return parsed


def _parse_summary(summary: dict) -> _Summary | None:
    try:
        raw_groups = summary.get("nodeGroups")
        if raw_groups is None:
            allocatable = parse_list(summary.get("allocatable"))
            scored = tuple(float(allocatable.get(r, 0)) for r in SCORED_RESOURCES)
            nano = {r: _nano(amount) for r, amount in allocatable.items()}
            return _Summary((_Group(None, (), nano, scored, scored),), nano)
        groups = []
        free: dict[str, Fraction] = {}
        for group in raw_groups:
            allocatable = parse_list(group.get("allocatable"))
            requested = parse_list(group.get("requested"))
            group_free = {r: a - requested.get(r, 0) for r, a in allocatable.items()}
            for r, amount in requested.items():
                group_free.setdefault(r, -amount)
            add(free, group_free)
            taints = tuple(
                (
                    _string(t["key"], "taint key"),
                    _string(t.get("value") or "", "taint"),
                    t["effect"],
                )
                for t in group.get("taints") or ()
                if t.get("effect") in HARD_EFFECTS
            )
            labels = _mapping(group.get("labels"), "labels")
            for key, value in labels.items():
                _string(value, f"label {key}")
            groups.append(
                _Group(
                    labels=dict(labels),
                    taints=taints,
                    largest_free={
                        r: _nano(amount)
                        for r, amount in parse_list(group.get("largestFree")).items()
                    },
                    allocatable=tuple(float(allocatable.get(r, 0)) for r in SCORED_RESOURCES),
                    free=tuple(float(group_free.get(r, 0)) for r in SCORED_RESOURCES),
                )
            )
        return _Summary(tuple(groups), {r: _nano(amount) for r, amount in free.items()})
    except (ValueError, TypeError, AttributeError, KeyError):
        return None


# Per-target decisions.

_SELECTOR, _TAINTS, _RESOURCES = range(3)


def _evaluate(compiled: _Compiled, candidate: Candidate) -> tuple[str | None, list[_Group]]:
    """(None, the feasible groups), or (the reason, [])."""
    if not candidate.ready:
        return NOT_READY, []
    if candidate.summary is None:
        return NO_SUMMARY, []
    parsed = _parsed(candidate.summary)
    if parsed is None:
        return INVALID_SUMMARY, []
    if not parsed.groups:
        return NO_NODES, []
    assumed = candidate.assumed
    short = {
        r
        for r, amount in compiled.requests
        if parsed.free.get(r, 0) - (_nano(assumed[r]) if r in assumed else 0) < amount
    }
    required = compiled.required
    if compiled.avoided:
        required = tuple(
            term
            for term, hosts in zip(required, compiled.avoided, strict=True)
            if candidate.name not in hosts
        )
        if not required:
            return NODE_AFFINITY_MISMATCH, []
    feasible: list[_Group] = []
    furthest, reason = -1, NODE_AFFINITY_MISMATCH
    for group in parsed.groups:
        stage, why = _group_verdict(compiled, required, group, short)
        if why is None:
            feasible.append(group)
        elif stage > furthest:
            furthest, reason = stage, why
    return (None, feasible) if feasible else (reason, [])


def _group_verdict(
    compiled: _Compiled, required: tuple[_Term, ...], group: _Group, short: set[str]
) -> tuple[int, str | None]:
    """``required``: the required terms that still hold for the target (all of them unless one
    avoids its virtual node)."""
    labels = group.labels
    if labels is not None:
        for key, value in compiled.selector:
            if labels.get(key) != value:
                return _SELECTOR, NODE_AFFINITY_MISMATCH
        if required and not any(_term_matches(t, labels) for t in required):
            return _SELECTOR, NODE_AFFINITY_MISMATCH
        for taint in group.taints:
            if not any(_tolerates(t, taint) for t in compiled.tolerations):
                return _TAINTS, untolerated_taint(taint[0], taint[1])
    largest_free = group.largest_free
    for resource, amount in compiled.requests:
        if resource in short or largest_free.get(resource, 0) < amount:
            return _RESOURCES, insufficient(resource)
    return _RESOURCES, None


def _term_matches(term: _Term, labels: Mapping[str, str]) -> bool:
    return term is not None and all(e.matches(labels) for e in term)


def _tolerates(toleration: tuple[str, str, str, str], taint: tuple[str, str, str]) -> bool:
    """Kubernetes' Toleration.ToleratesTaint."""
    t_key, operator, t_value, t_effect = toleration
    key, value, effect = taint
    if t_effect and t_effect != effect:
        return False
    if t_key and t_key != key:
        return False
    if operator == "Exists":
        return True
    return operator in ("", "Equal") and t_value == value


def _score(
    compiled: _Compiled, candidate: Candidate, groups: list[_Group], max_siblings: int
) -> float:
    return (
        CAPACITY_WEIGHT * _capacity(compiled, candidate, groups)
        + AFFINITY_WEIGHT * _affinity(compiled, groups)
        + SPREAD_WEIGHT * _spread(candidate.siblings, max_siblings)
    )


def _capacity(compiled: _Compiled, candidate: Candidate, groups: list[_Group]) -> float:
    """LeastAllocated over the feasible groups: the share of cpu and memory left free after
    in-flight placements and this pod, averaged."""
    shares = []
    for i, resource in enumerate(SCORED_RESOURCES):
        # fsum: exact, so the order of the groups in the summary changes nothing.
        allocatable = math.fsum(g.allocatable[i] for g in groups)
        if allocatable <= 0:
            continue
        free = math.fsum(g.free[i] for g in groups) - float(candidate.assumed.get(resource, 0))
        shares.append(min(1.0, max(0.0, (free - compiled.scored_requests[i]) / allocatable)))
    return sum(shares) / len(shares) if shares else 0.0


def _affinity(compiled: _Compiled, groups: list[_Group]) -> float:
    """The share of preferred weight matched by the best feasible group."""
    if not compiled.total_weight:
        return 0.0
    best = max(
        sum(
            w
            for w, term in compiled.preferred
            if g.labels is not None and _term_matches(term, g.labels)
        )
        for g in groups
    )
    return best / compiled.total_weight


def _spread(siblings: int, max_siblings: int) -> float:
    if max_siblings <= 0:
        return 1.0
    return min(1.0, max(0.0, 1 - siblings / max_siblings))
