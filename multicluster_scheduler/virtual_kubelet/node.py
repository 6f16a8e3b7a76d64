"""The virtual node of a target: what it looks like (pure functions, no I/O but a log line
whenever what a target's summary had refused changes).

Proxy pods are bound to these nodes. The provider label and NoSchedule taint keep other pods
away; the target's labels and the labels common to all its real nodes (its region, say) let
users and schedulers tell targets apart; capacity and allocatable come from its summary.

A summary is written by whoever runs the target, and a namespaced Target may point anywhere:
none of it is trusted. Labels that would make the node pass for what it is not (a control-plane
node, a node an admin vouched for under ``node-restriction.kubernetes.io/``, another target's
node) stay off: every key under ``kubernetes.io/``, ``k8s.io/`` (and their subdomains),
``virtual-kubelet.io/`` and our own prefix, except the well-known topology, arch/os and
instance-type labels; so does anything that is not a valid label. Resources must have valid
names and quantities that parse, be non-negative, stay below ceilings no real cluster reaches,
keep allocatable within capacity, and (when the summary has node groups) allocatable must be
what its groups add up to. What fails is left off the node, the rest stays, and the reason is
logged once (again only when it changes). A target can still claim any resources a real cluster
could have: see docs/targets.md.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections import OrderedDict
from fractions import Fraction
from typing import Any

from multicluster.kubetime import format_time

from .. import __version__
from ..api import keys
from ..api.quantity import is_binary, parse
from ..api.regexps import without_matching

log = logging.getLogger(__name__)
ROLE_LABEL = "kubernetes.io/role"
EXCLUDE_FROM_LB = "node.kubernetes.io/exclude-from-external-load-balancers"
# The API server (1.36+) passes kubectl's exec/attach WebSockets through to kubelets that
# declare this, instead of translating them to SPDY: our kubelet API speaks WebSocket only.
DECLARED_FEATURES = ["ExtendWebSocketsToKubelet"]

# Labels: domains (and their subdomains) a summary may not put on a virtual node, but for the
# well-known labels that tell where and on what a cluster's nodes run.
RESERVED_LABEL_DOMAINS = ("kubernetes.io", "k8s.io", "virtual-kubelet.io", keys.GROUP)
WELL_KNOWN_LABELS = frozenset(
    {
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "node.kubernetes.io/instance-type",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
    }
)
MAX_SUMMARY_LABELS = 100  # real nodes share a few dozen at most
_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

# Resources. Ceilings no real cluster reaches: Kubernetes supports 5,000 nodes, the largest
# machines have a few thousand CPUs and tens of TiB of memory. Bytes up to 1 EiB, CPUs and pods
# up to 10 million, anything else (extended resources: devices) up to 10^15.
STANDARD_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", "pods", "storage"})
RESOURCE_CEILINGS = {"cpu": Fraction(10**7), "pods": Fraction(10**7)}
BYTES_CEILING = Fraction(2**60)
OTHER_CEILING = Fraction(10**15)
MAX_RESOURCES = 64
MAX_QUANTITY_LENGTH = 64
MAX_EXPONENT = 30  # 1e999999999 would cost minutes of CPU to expand
_QUANTITY = re.compile(
    r"\+?(?:\d+(?:\.\d*)?|\.\d+)(?:Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE]([+-]?\d{1,9}))?"
)
_ATTACHABLE_VOLUMES = re.compile(r"attachable-volumes-[a-z0-9]([-a-z0-9]*[a-z0-9])?")

# What was last logged about each node's summary (bounded: nodes come and go).
_reported: OrderedDict[str, tuple[str, ...]] = OrderedDict()
MAX_REPORTED_NODES = 4096
MAX_LOGGED_PROBLEMS = 20


def _shown(value: object) -> str:
    """A value from a summary as a log line may quote it: repr (no newline), at most 80."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _in_domains(key: str, domains: tuple[str, ...]) -> bool:
    prefix = key.rpartition("/")[0]
    return any(prefix == d or prefix.endswith("." + d) for d in domains)


def is_label_key(key: object) -> bool:
    """A qualified name: an optional DNS-subdomain prefix and ``/``, then a name of 1-63."""
    if not isinstance(key, str):
        return False
    prefix, slash, name = key.rpartition("/")
    if slash and not (0 < len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return bool(_NAME.fullmatch(name))


def is_label_value(value: object) -> bool:
    return isinstance(value, str) and (value == "" or bool(_NAME.fullmatch(value)))


def label_problem(key: object, value: object) -> str | None:
    """Why a label of a summary stays off the virtual node, or None when it may go on it."""
    if not is_label_key(key):
        return f"label {_shown(key)}: not a valid label key"
    assert isinstance(key, str)
    if not is_label_value(value):
        return f"label {key}: {_shown(value)} is not a valid label value"
    if key not in WELL_KNOWN_LABELS and _in_domains(key, RESERVED_LABEL_DOMAINS):
        return f"label {key}: reserved"
    return None


def _shared_labels(summary: Any) -> dict:
    """The labels every node group carries with the same value (none when unreadable)."""
    groups = summary.get("nodeGroups") if isinstance(summary, dict) else None
    if not isinstance(groups, list) or not groups:
        return {}
    shared: dict | None = None
    for group in groups:
        labels = group.get("labels") if isinstance(group, dict) else None
        if not isinstance(labels, dict):
            return {}
        if shared is None:
            shared = dict(labels)
        else:
            shared = {k: v for k, v in shared.items() if k in labels and labels[k] == v}
    return shared or {}


def summary_labels(summary: Any) -> tuple[dict[str, str], list[str]]:
    """The labels the virtual node takes from its target's summary, and why others not."""
    kept: dict[str, str] = {}
    problems: list[str] = []
    for key, value in _shared_labels(summary).items():
        problem = label_problem(key, value)
        if problem is not None:
            problems.append(problem)
        elif len(kept) < MAX_SUMMARY_LABELS:
            kept[key] = value
        else:
            problems.append(f"label {key}: more than {MAX_SUMMARY_LABELS} labels")
    return kept, problems


def common_labels(summary: dict | None) -> dict[str, str]:
    """Labels that every real node of the target carries, with the same value, that a virtual
    node may carry."""
    return summary_labels(summary)[0]


def is_resource_name(name: object) -> bool:
    """A resource a node may offer: a standard one (``cpu``, ``hugepages-2Mi``…) or an
    extended one (``example.com/gpu``) outside Kubernetes' own domains."""
    if not isinstance(name, str):
        return False
    if "/" in name:
        return is_label_key(name) and not _in_domains(name, ("kubernetes.io", "k8s.io"))
    if name in STANDARD_RESOURCES or _ATTACHABLE_VOLUMES.fullmatch(name):
        return True
    size = name.removeprefix("hugepages-")
    return size != name and isinstance(quantity(size), Fraction)


def ceiling(resource: str) -> Fraction:
    if resource in RESOURCE_CEILINGS:
        return RESOURCE_CEILINGS[resource]
    return BYTES_CEILING if is_binary(resource) else OTHER_CEILING


def quantity(value: object) -> Fraction | str:
    """The amount of a quantity (``100m``, ``1.5Gi``, ``2e3``, or an integer), or why it is
    not one; never slow, whatever the input."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        return f"{_shown(value)} is not a quantity"
    if isinstance(value, str):
        if len(value) > MAX_QUANTITY_LENGTH:
            return f"{_shown(value)} is not a quantity"
        if value.startswith("-"):
            return f"{value} is negative"
        match = _QUANTITY.fullmatch(value)
        if match is None:
            return f"{_shown(value)} is not a quantity"
        if match.group(1) is not None and abs(int(match.group(1))) > MAX_EXPONENT:
            return f"{value} is out of any cluster's range"
    amount = parse(value)
    return f"{value} is negative" if amount < 0 else amount


def _resource_list(resources: Any, where: str, problems: list[str]) -> dict[str, Fraction]:
    """The valid entries of a resource list, as amounts; problems recorded for the others."""
    if resources is None:
        return {}
    if not isinstance(resources, dict):
        problems.append(f"{where}: not a resource list")
        return {}
    found: dict[str, Fraction] = {}
    for name, value in resources.items():
        if not is_resource_name(name):
            problems.append(f"{where} {_shown(name)}: not a resource name")
            continue
        amount = quantity(value)
        if isinstance(amount, str):
            problems.append(f"{where} {name}: {amount}")
        elif amount > ceiling(name):
            problems.append(f"{where} {name}: {value} is more than any cluster has")
        elif len(found) >= MAX_RESOURCES:
            problems.append(f"{where} {name}: more than {MAX_RESOURCES} resources")
        else:
            found[name] = amount
    return found


def _group_totals(groups: Any) -> tuple[dict[str, Fraction], set[str]] | None:
    """Allocatable summed over the node groups, and the resources some group has wrong (their
    totals cannot be checked); None when the groups themselves are unreadable."""
    if not isinstance(groups, list):
        return None
    totals: dict[str, Fraction] = {}
    broken: set[str] = set()
    for group in groups:
        if not isinstance(group, dict):
            return None
        allocatable = group.get("allocatable") or {}
        if not isinstance(allocatable, dict):
            return None
        parsed = _resource_list(allocatable, "group", [])
        broken.update(str(name) for name in allocatable if name not in parsed)
        for name, amount in parsed.items():
            totals[name] = totals.get(name, Fraction(0)) + amount
    return totals, broken


def amount_of(resources: Any, name: str) -> str:
    """An entry that passed its checks (so short), as the summary wrote it."""
    return str(resources[name]) if isinstance(resources, dict) and name in resources else "?"


def checked_resources(summary: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Capacity and allocatable of a summary, each entry as the summary wrote it, without
    those that fail a check; and why they failed."""
    problems: list[str] = []
    if summary is None:
        return {}, {}, problems
    if not isinstance(summary, dict):
        return {}, {}, ["the summary is not an object"]
    raw_capacity = summary.get("capacity")
    raw_allocatable = summary.get("allocatable")
    capacity = _resource_list(raw_capacity, "capacity", problems)
    allocatable = _resource_list(raw_allocatable, "allocatable", problems)
    for name, amount in list(allocatable.items()):
        if name not in capacity:
            problems.append(
                f"allocatable {name}: {amount_of(raw_allocatable, name)} without a valid capacity"
            )
        elif amount > capacity[name]:
            problems.append(
                f"allocatable {name}: {amount_of(raw_allocatable, name)} is more than its "
                f"capacity {amount_of(raw_capacity, name)}"
            )
        else:
            continue
        del allocatable[name]
    groups = summary.get("nodeGroups")
    if groups:
        checked = _group_totals(groups)
        for name in list(allocatable):
            if checked is None:
                problems.append(f"allocatable {name}: the node groups are unreadable")
            elif name in checked[1]:
                problems.append(f"allocatable {name}: a node group has it wrong")
            elif checked[0].get(name, Fraction(0)) != allocatable[name]:
                problems.append(
                    f"allocatable {name}: {amount_of(raw_allocatable, name)} is not what its "
                    "node groups add up to"
                )
            else:
                continue
            del allocatable[name]
    # Entries passed only from dicts: each is written back as the summary wrote it.
    return (
        {name: raw_capacity[name] for name in capacity},  # type: ignore[index]
        {name: raw_allocatable[name] for name in allocatable},  # type: ignore[index]
        problems,
    )


def summary_problems(summary: Any) -> list[str]:
    """Everything of a summary the virtual node leaves out, and why."""
    return [*summary_labels(summary)[1], *checked_resources(summary)[2]]


def report_summary(node: str, summary: Any) -> None:
    """Log what the node leaves out of its target's summary, once: again only when it changes
    (a warning, unless only reserved labels were left out, as real nodes carry some)."""
    problems = tuple(summary_problems(summary))
    previous = _reported.get(node)
    if previous == problems or (previous is None and not problems):
        return
    if not problems:
        _reported.pop(node, None)
        log.info("target summary accepted whole node=%s", node)
        return
    _reported[node] = problems
    _reported.move_to_end(node)
    while len(_reported) > MAX_REPORTED_NODES:
        _reported.popitem(last=False)
    serious = any(not p.endswith(": reserved") for p in problems)
    shown = "; ".join(problems[:MAX_LOGGED_PROBLEMS])
    if len(problems) > MAX_LOGGED_PROBLEMS:
        shown += f"; and {len(problems) - MAX_LOGGED_PROBLEMS} more"
    log.log(
        logging.WARNING if serious else logging.INFO,
        "target summary partly left off its virtual node node=%s left_off=%d problems=%r",
        node,
        len(problems),
        shown,
    )


def node_labels(
    name: str, target_labels: dict[str, str], summary: dict | None, excluded: Any = None
) -> dict[str, str]:
    """The node's labels: ours win over the summary's (which are checked, and whose problems
    are logged here: the node loop reads the summary through this first on every pass), less
    those the Target's ``excludedLabelsRegexp`` (``excluded``, compiled) matches."""
    report_summary(name, summary)
    return {
        **without_matching(common_labels(summary), excluded),
        "type": "virtual-kubelet",
        ROLE_LABEL: "cluster",
        EXCLUDE_FROM_LB: "",
        keys.PROVIDER_KEY: keys.PROVIDER,
        "kubernetes.io/hostname": name,
        **target_labels,
    }


def node_object(
    name: str,
    target_labels: dict[str, str],
    summary: dict | None,
    owner: dict | None = None,
    excluded: Any = None,
) -> dict:
    """``owner``: an owner reference to a cluster-scoped object of the release (so that
    uninstalling garbage-collects the node even if no agent is left to delete it)."""
    labels = node_labels(name, target_labels, summary, excluded)
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if owner:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "spec": {
            "taints": [{"key": keys.PROVIDER_KEY, "value": keys.PROVIDER, "effect": "NoSchedule"}]
        },
    }


def node_status(
    summary: dict | None,
    ready: bool,
    reason: str,
    message: str,
    *,
    address: str,
    port: int,
    previous: dict | None = None,
    now: dt.datetime | None = None,
    features: list[str] | None = None,
) -> dict[str, Any]:
    """The node's status; transition times carried over from ``previous`` when unchanged."""
    stamp = format_time(now)
    old = {c["type"]: c for c in (previous or {}).get("conditions") or ()}

    def condition(kind: str, status: str, why: str, text: str) -> dict:
        before = old.get(kind)
        return {
            "type": kind,
            "status": status,
            "reason": why,
            "message": text,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": before["lastTransitionTime"]
            if before and before.get("status") == status
            else stamp,
        }

    capacity, allocatable, _ = checked_resources(summary)
    resources = {"capacity": capacity, "allocatable": allocatable}
    return {
        **resources,
        "conditions": [
            condition(
                "Ready",
                "True" if ready else "False",
                "TargetReady" if ready else f"Target{reason}",
                message,
            ),
            condition("MemoryPressure", "False", "TargetHasSufficientMemory", ""),
            condition("DiskPressure", "False", "TargetHasNoDiskPressure", ""),
            condition("PIDPressure", "False", "TargetHasSufficientPID", ""),
        ],
        "addresses": [{"type": "InternalIP", "address": address}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "declaredFeatures": list(DECLARED_FEATURES if features is None else features),
        "nodeInfo": {
            "architecture": "amd64",
            "operatingSystem": "linux",
            "kubeletVersion": f"multicluster-scheduler-{__version__}",
            "kubeProxyVersion": "",
            "containerRuntimeVersion": "",
            "kernelVersion": "",
            "osImage": "",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }


def status_differs(current: dict | None, desired: dict) -> bool:
    """Whether anything users or schedulers read changed (heartbeats aside)."""
    if current is None:
        return True

    # API servers before 1.35 (and 1.35 without the NodeDeclaredFeatures gate) drop
    # declaredFeatures: compared only where the server keeps it, or every pass would rewrite
    # the status for a field that never sticks. (Where it is new, the periodic write adds it.)
    features_kept = "declaredFeatures" in current

    def essence(status: dict) -> tuple:
        conditions = sorted(
            (c.get("type"), c.get("status"), c.get("reason"), c.get("message") or "")
            for c in status.get("conditions") or ()
        )
        return (
            status.get("capacity") or {},
            status.get("allocatable") or {},
            conditions,
            status.get("addresses") or [],
            status.get("daemonEndpoints") or {},
            (status.get("declaredFeatures") or []) if features_kept else None,
        )

    return essence(current) != essence(desired)
