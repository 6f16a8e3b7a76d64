"""What a tenant with namespaced rights, or a target it points at, may make the source cluster
show, tried as an attacker would (issue 19, attacks 6 and 8):

- Targets of one namespace become cluster-scoped Nodes and Leases: however many Targets a
  tenant makes, at most the limit (chart value ``targets.maxPerNamespace``) get a virtual node;
  the others say ``TooManyTargets``, and deleting one lets the next in.
- A target's ClusterSummary is written by whoever runs that cluster: the labels and resources it
  claims do not turn a virtual node into a control-plane node, another target's node, or a
  machine with 10^18 CPUs.
- Sources of different namespaces whose names joined with ``-`` read the same (``b-c`` in ``a``
  and ``c`` in ``a-b``) get bindings of their own, each to its own service account; bindings an
  older agent made under the old names are replaced.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from e2e.scenarios import (
    SOURCE,
    TARGET,
    as_tenant,
    disconnect,
    grant_source,
    grant_tenant,
    kubeconfig_for,
    tenant_target,
    virtual_nodes,
)
from e2e.scenarios import target_ready as ready
from e2e.test_install import render
from multicluster_scheduler.api.keys import PREFIX
from testbed import TestBed, wait_for
from testbed.install import Installation
from testbed.kubectl import Kubectl

GROUP = "multicluster.admiralty.io/v1alpha1"
DEFAULT_LIMIT = 10  # the chart's targets.maxPerNamespace, and the agent's default


# -- helpers ------------------------------------------------------------------------------------


def leases_of(kubectl: Kubectl, nodes: set[str]) -> set[str]:
    leases = kubectl.json(SOURCE, "get", "leases", "-n", "kube-node-lease")["items"]
    return {lease["metadata"]["name"] for lease in leases} & nodes


def node_name(namespace: str, target: str) -> str:
    return f"admiralty-namespace-{namespace}-{target}"  # no dash in either: no hash


def targets_by_name(kubectl: Kubectl, namespace: str) -> dict[str, dict]:
    found = kubectl.json(SOURCE, "get", "targets", "-n", namespace)["items"]
    return {t["metadata"]["name"]: t for t in found}


# -- 6a. Targets per namespace --------------------------------------------------------------------


def test_the_chart_passes_its_limit_of_targets_per_namespace_to_the_agent(bin_dir):
    for values, limit in (((), DEFAULT_LIMIT), (("targets.maxPerNamespace=3",), 3)):
        docs = render(bin_dir, *values)
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--max-targets-per-namespace={limit}" in args, args


def test_a_tenant_gets_at_most_the_limit_of_virtual_nodes_however_many_targets_it_makes(
    installation: Installation, kubectl: Kubectl, namespace: str
):
    """30 self Targets made at once by a tenant of one namespace: the 10 oldest (by
    creationTimestamp, then name) get a Node and a Lease, the 20 others none and say why;
    deleting one of the 10 lets the next one in, without restart."""
    grant_tenant(kubectl, namespace)
    names = [f"t{i:02d}" for i in range(30)]
    manifests = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": GROUP,
                "kind": "Target",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"self": True},
            }
            for name in names
        ],
    }
    try:
        as_tenant(kubectl, namespace, "create", "-f", "-", stdin=json.dumps(manifests))
        settled = wait_for(
            lambda: (
                len(found := targets_by_name(kubectl, namespace)) == len(names)
                and all(
                    ready(t).get("status") == "True" or ready(t).get("reason") == "TooManyTargets"
                    for t in found.values()
                )
                and found
            ),
            90,
            what="every Target Ready or refused",
        )
        first = sorted(
            settled.values(),
            key=lambda t: (t["metadata"]["creationTimestamp"], t["metadata"]["name"]),
        )
        admitted = {t["metadata"]["name"] for t in first[:DEFAULT_LIMIT]}
        time.sleep(3)  # nodes of refused Targets, if any, would be made by now
        nodes = {n["metadata"]["name"] for n in virtual_nodes(kubectl, namespace)}
        assert len(nodes) <= DEFAULT_LIMIT, (
            f"{len(nodes)} virtual nodes for {len(names)} Targets of one namespace "
            f"(limit {DEFAULT_LIMIT})"
        )
        assert nodes == {node_name(namespace, t) for t in admitted}
        assert leases_of(kubectl, {node_name(namespace, t) for t in names}) == nodes
        found = targets_by_name(kubectl, namespace)
        for name in names:
            condition = ready(found[name])
            if name in admitted:
                assert condition["status"] == "True", (name, condition)
                continue
            assert (condition["status"], condition["reason"]) == ("False", "TooManyTargets")
            assert "targets.maxPerNamespace" in condition["message"]
            assert f"{DEFAULT_LIMIT} " in condition["message"], condition["message"]
        refused = sorted(set(names) - admitted)
        events = kubectl.json(
            SOURCE,
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            f"involvedObject.name={refused[-1]},reason=TooManyTargets",
        )["items"]
        assert [e["type"] for e in events] == ["Warning"], events

        # The tenant deletes one of the admitted: the oldest refused one gets in, no other.
        gone = sorted(admitted)[3]
        as_tenant(kubectl, namespace, "delete", "target", gone)
        nxt = refused[0]
        wait_for(
            lambda: (
                ready(targets_by_name(kubectl, namespace).get(nxt) or {}).get("status") == "True"
                and {n["metadata"]["name"] for n in virtual_nodes(kubectl, namespace)}
                == {node_name(namespace, t) for t in (admitted - {gone}) | {nxt}}
            ),
            60,
            what=f"{nxt} in, in place of {gone}",
        )
        after = targets_by_name(kubectl, namespace)
        assert ready(after[refused[1]])["reason"] == "TooManyTargets"
    finally:
        kubectl(SOURCE, "delete", "targets", "--all", "-n", namespace, "--wait=false")
        wait_for(
            lambda: not virtual_nodes(kubectl, namespace), 90, what="the namespace's nodes gone"
        )


# -- 6b. What a target's summary puts on its virtual node -----------------------------------------

RESERVED = {
    "node-role.kubernetes.io/control-plane": "",
    "node.kubernetes.io/exclude-disruption": "true",
    "node-restriction.kubernetes.io/trusted": "true",
    "k8s.io/anything": "x",
    "kubernetes.io/role": "control-plane",
    f"{PREFIX}cluster-target-name": "impostor",
    "virtual-kubelet.io/provider-extra": "x",
}
WELL_KNOWN = {
    "topology.kubernetes.io/region": "evil",
    "kubernetes.io/os": "linux",
    "node.kubernetes.io/instance-type": "huge",
    "example.com/team": "blue",
    "tier": "gold",
}


def hostile_summary() -> dict:
    """Two node groups of two nodes: 16 CPUs allocatable in all; the totals claim 10^18 CPUs of
    capacity and 900 allocatable."""
    group = {
        "labels": {**RESERVED, **WELL_KNOWN},
        "taints": [],
        "count": 1,
        "allocatable": {"cpu": "8", "memory": "30Gi", "pods": "110"},
        "requested": {},
        "largestFree": {"cpu": "8", "memory": "30Gi", "pods": "110"},
    }
    return {
        "apiVersion": GROUP,
        "kind": "ClusterSummary",
        "metadata": {"name": "singleton"},
        "capacity": {"cpu": "1E", "memory": "64Gi", "pods": "220"},
        "allocatable": {"cpu": "900", "memory": "60Gi", "pods": "220"},
        "nodeGroups": [group, {**group, "labels": {**group["labels"], "disk": "ssd"}}],
    }


def test_a_hostile_summary_gives_its_virtual_node_no_reserved_label_and_no_absurd_capacity(
    installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str
):
    """cluster2 stands for a cluster the tenant runs: its agent is stopped, and its admin writes
    the ClusterSummary. The tenant's Target in cluster1 reads it."""
    agent = installation.agents[TARGET][0]
    grant_tenant(kubectl, namespace)
    grant_source(kubectl, namespace)
    token = kubectl(TARGET, "create", "token", "c1", "-n", namespace, "--duration=1h").strip()
    installation.hold(agent)
    node = node_name(namespace, "evil")
    try:
        kubectl(TARGET, "replace", "-f", "-", stdin=json.dumps(hostile_summary()))
        tenant_target(kubectl, namespace, kubeconfig_for(testbed, token))

        def read() -> dict | None:
            proc = kubectl.run(SOURCE, "get", "node", node, "-o", "json", check=False)
            if proc.returncode != 0:
                return None
            found = json.loads(proc.stdout)
            labels = found["metadata"].get("labels") or {}
            status = found.get("status") or {}
            summary_read = labels.get("example.com/team") == "blue"
            return found if summary_read and status.get("allocatable") else None

        found = wait_for(read, 60, what="the virtual node with the summary's labels")
        labels = found["metadata"]["labels"]
        for key, value in WELL_KNOWN.items():
            assert labels.get(key) == value, (key, labels)
        planted = {k: labels[k] for k in RESERVED if k in labels and labels[k] == RESERVED[k]}
        status = found["status"]
        # 10^18 CPUs is no machine; 900 allocatable is not what its 16-CPU node groups hold.
        claimed = {
            f"{kind} cpu": status[kind]["cpu"]
            for kind in ("capacity", "allocatable")
            if "cpu" in status[kind]
        }
        assert (planted, claimed) == ({}, {}), (
            f"reserved labels from the summary on the virtual node: {planted}; "
            f"resources it claimed: {claimed}"
        )
        assert labels["kubernetes.io/role"] == "cluster"
        assert f"{PREFIX}cluster-target-name" not in labels
        # What passed stays: a node without them would look empty.
        assert status["capacity"]["memory"] == "64Gi"
        assert status["allocatable"]["pods"] == "220"
    finally:
        disconnect(kubectl, namespace)
        installation.release(agent)  # its summary controller rewrites the summary
        wait_for(
            lambda: (
                kubectl.json(TARGET, "get", "clustersummary", "singleton")
                .get("allocatable", {})
                .get("cpu")
                != "900"
            ),
            60,
            what="cluster2's own summary back",
        )
        wait_for(lambda: not virtual_nodes(kubectl, namespace), 60, what="the virtual node gone")


# -- 8. Source binding names -------------------------------------------------------------------


def source(name: str, namespace: str, account: str) -> dict:
    return {
        "apiVersion": GROUP,
        "kind": "Source",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"serviceAccountName": account},
    }


def cluster_source(name: str, namespace: str, account: str) -> dict:
    return {
        "apiVersion": GROUP,
        "kind": "ClusterSource",
        "metadata": {"name": name},
        "spec": {"serviceAccount": {"name": account, "namespace": namespace}},
    }


@pytest.fixture
def dashed_namespaces(kubectl: Kubectl):
    """``a`` and ``a-b`` in cluster2 (random ``a``), deleted afterwards."""
    a = f"t{uuid.uuid4().hex[:8]}"
    names = (a, f"{a}-b")
    for name in names:
        kubectl(TARGET, "create", "namespace", name)
    yield names
    for name in names:
        kubectl(TARGET, "delete", "sources", "--all", "-n", name, "--wait=false")
    kubectl(TARGET, "delete", "clustersource", a, f"{a}-cluster-summary-viewer",
            "--ignore-not-found", "--wait=false")  # fmt: skip
    for name in names:
        kubectl(TARGET, "delete", "namespace", name, "--wait=false")


def viewer_bindings(kubectl: Kubectl, label: str) -> list[dict]:
    bindings = kubectl.json(TARGET, "get", "clusterrolebindings", "-l", label)["items"]
    viewer = "multicluster-scheduler-cluster-summary-viewer"
    return [b for b in bindings if b["roleRef"]["name"] == viewer]


def may_read_summaries(kubectl: Kubectl, namespace: str, account: str) -> bool:
    user = f"system:serviceaccount:{namespace}:{account}"
    answer = kubectl.run(
        TARGET, "--as", user, "auth", "can-i", "list", "clustersummaries", check=False
    )
    return answer.stdout.strip() == "yes"


def test_sources_whose_names_join_alike_get_bindings_of_their_own(
    installation: Installation, kubectl: Kubectl, dashed_namespaces: tuple[str, str]
):
    """Source ``b-c`` in ``a`` and Source ``c`` in ``a-b``; ClusterSources ``a`` and
    ``a-cluster-summary-viewer``. An agent of an earlier version had made ``b-c``'s viewer
    binding under the old name, which ``c``'s would take too."""
    a, ab = dashed_namespaces
    old_name = f"admiralty-source-{a}-b-c-cluster-summary-viewer"
    kubectl.apply(
        TARGET,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {
                "name": old_name,
                "labels": {f"{PREFIX}source-namespace": a, f"{PREFIX}source-name": "b-c"},
            },
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "multicluster-scheduler-cluster-summary-viewer",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "first", "namespace": a}],
        },
    )
    for manifest in (
        source("b-c", a, "first"),
        source("c", ab, "second"),
        cluster_source(a, a, "third"),
        cluster_source(f"{a}-cluster-summary-viewer", a, "fourth"),
    ):
        kubectl.apply(TARGET, manifest)

    def conditions() -> dict[str, dict]:
        found = {
            "b-c": kubectl.json(TARGET, "get", "source", "b-c", "-n", a),
            "c": kubectl.json(TARGET, "get", "source", "c", "-n", ab),
            a: kubectl.json(TARGET, "get", "clustersource", a),
            "viewer": kubectl.json(TARGET, "get", "clustersource", f"{a}-cluster-summary-viewer"),
        }
        return {k: ready(v) for k, v in found.items()}

    wait_for(lambda: all(c.get("reason") for c in conditions().values()), 30, what="reports")
    time.sleep(2)  # a conflict, if any, is reported by now
    settled = {k: (c["status"], c["reason"], c["message"]) for k, c in conditions().items()}
    assert all(c[:2] == ("True", "Bound") for c in settled.values()), json.dumps(settled, indent=1)

    of_b_c = f"{PREFIX}source-namespace={a},{PREFIX}source-name=b-c"
    wait_for(
        lambda: old_name not in {b["metadata"]["name"] for b in viewer_bindings(kubectl, of_b_c)},
        20,
        what="the binding of the old name replaced",
    )
    one = viewer_bindings(kubectl, of_b_c)
    two = viewer_bindings(kubectl, f"{PREFIX}source-namespace={ab},{PREFIX}source-name=c")
    assert len(one) == len(two) == 1, (one, two)
    assert one[0]["metadata"]["name"] != two[0]["metadata"]["name"]
    assert old_name not in {one[0]["metadata"]["name"], two[0]["metadata"]["name"]}
    assert one[0]["subjects"] == [{"kind": "ServiceAccount", "name": "first", "namespace": a}]
    assert two[0]["subjects"] == [{"kind": "ServiceAccount", "name": "second", "namespace": ab}]
    assert may_read_summaries(kubectl, a, "first")
    assert may_read_summaries(kubectl, ab, "second")

    for name, account in ((a, "third"), (f"{a}-cluster-summary-viewer", "fourth")):
        label = f"{PREFIX}cluster-source-name={name}"
        made = kubectl.json(TARGET, "get", "clusterrolebindings", "-l", label)["items"]
        assert len(made) == 2, [b["metadata"]["name"] for b in made]
        for binding in made:
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": account, "namespace": a}
            ]
    assert may_read_summaries(kubectl, a, "fourth")


# -- from the review: a Source naming Kubernetes' own users ---------------------------------------


def test_a_source_naming_the_anonymous_user_binds_nothing(
    installation: Installation, kubectl: Kubectl, namespace: str
):
    """Olga may create Sources and bind the source role in one namespace of cluster2. A Source
    for ``system:anonymous`` made the agent bind the summary viewer role cluster-wide to it:
    anyone, unauthenticated, could read the ClusterSummary (and the namespace's pods)."""
    manifest = {
        "apiVersion": GROUP,
        "kind": "Source",
        "metadata": {"name": "anon", "namespace": namespace},
        "spec": {"userName": "system:anonymous"},
    }
    kubectl.apply(TARGET, manifest)

    def refused() -> dict:
        found = ready(kubectl.json(TARGET, "get", "source", "anon", "-n", namespace))
        return found if found.get("reason") == "Invalid" else {}

    condition = wait_for(refused, 30, what="the Source Invalid")
    print(condition["message"])
    assert "one of Kubernetes' own users" in condition["message"]
    bindings = kubectl.json(TARGET, "get", "clusterrolebindings")["items"]
    assert not [
        b["metadata"]["name"]
        for b in bindings
        if any(s.get("name") == "system:anonymous" for s in b.get("subjects") or ())
    ]
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": "system:anonymous",
            "groups": ["system:unauthenticated"],
            "resourceAttributes": {
                "group": "multicluster.admiralty.io",
                "resource": "clustersummaries",
                "verb": "list",
            },
        },
    }
    answer = json.loads(kubectl(TARGET, "create", "-o", "json", "-f", "-",
                                stdin=json.dumps(review)))  # fmt: skip
    assert answer["status"].get("allowed") is not True, answer["status"]
    kubectl(TARGET, "delete", "source", "anon", "-n", namespace, "--wait=false")
