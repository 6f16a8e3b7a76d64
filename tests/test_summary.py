"""Cluster summaries from nodes and pods: totals, node groups, requests as the scheduler counts."""

from __future__ import annotations

import re
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from multicluster_scheduler.api.summary import pod_requests, slim_node
from multicluster_scheduler.summary.compute import (
    RequestedLedger,
    slim_pod,
    summarize,
    summarize_nodes,
)


def node(name, cpu="8", memory="32Gi", pods="110", labels=None, taints=None):
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


def pod(node_name, cpu="1", memory="1Gi", phase="Running", init=None, overhead=None):
    return slim_pod(
        {
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "nodeName": node_name,
                "containers": [
                    {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
                ],
                "initContainers": init or [],
                "overhead": overhead or {},
            },
            "status": {"phase": phase},
        }
    )


def test_totals_exclude_virtual_nodes_and_groups_ignore_hostnames():
    nodes = [
        node("a", labels={"topology.kubernetes.io/region": "eu"}),
        node("b", labels={"topology.kubernetes.io/region": "eu"}),
        node("c", cpu="4", labels={"topology.kubernetes.io/region": "us"}),
        node(
            "admiralty-namespace-default-c2",
            cpu="1000",
            labels={"type": "virtual-kubelet", "virtual-kubelet.io/provider": "admiralty"},
        ),
    ]
    summary = summarize(nodes, [pod("a"), pod("a", phase="Succeeded"), pod("b", cpu="500m")])
    assert summary["allocatable"] == {"cpu": "20", "memory": "96Gi", "pods": "330"}
    assert summary["capacity"] == summary["allocatable"]
    eu, us = summary["nodeGroups"]
    assert eu["labels"] == {"topology.kubernetes.io/region": "eu"}
    assert eu["count"] == 2
    assert eu["requested"] == {"cpu": "1500m", "memory": "2Gi", "pods": "2"}
    assert eu["largestFree"] == {"cpu": "7500m", "memory": "31Gi", "pods": "109"}
    assert us["count"] == 1
    assert us["requested"] == {}


def test_taints_split_groups_but_transient_ones_do_not():
    gpu = [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]
    not_ready = [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
    summary = summarize([node("a", taints=gpu), node("b"), node("c", taints=not_ready)], [])
    assert [(g["count"], g["taints"]) for g in summary["nodeGroups"]] == [
        (2, []),
        (1, [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]),
    ]


def test_exclusion_pattern_merges_groups():
    nodes = [
        node("a", labels={"example.com/build": "1"}),
        node("b", labels={"example.com/build": "2"}),
    ]
    assert len(summarize(nodes, [])["nodeGroups"]) == 2
    assert len(summarize(nodes, [], re.compile(r"^example\.com/"))["nodeGroups"]) == 1


def test_requests_count_init_containers_sidecars_and_overhead():
    init = [
        {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}},
        {"name": "migrate", "resources": {"requests": {"cpu": "2", "memory": "64Mi"}}},
    ]
    requests = pod_requests(pod("a", cpu="1", memory="1Gi", init=init, overhead={"cpu": "50m"}))
    # init peak 2 + sidecar 0.1 > app 1 + sidecar 0.1; plus overhead.
    assert requests["cpu"] == Fraction("2.15")
    assert requests["memory"] == 2**30
    assert requests["pods"] == 1


def test_same_inputs_give_identical_summaries():
    nodes = [node("b"), node("a")]
    assert summarize(nodes, [pod("a")]) == summarize(list(reversed(nodes)), [pod("a")])


def test_slim_pods_of_one_template_on_one_node_share_spec_and_status():
    one, two = (
        slim_pod(
            {
                "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
                "spec": {
                    "nodeName": "a",
                    "containers": [{"resources": {"requests": {"cpu": "1"}}}],
                },
                "status": {"phase": "Running"},
            }
        )
        for name in ("p1", "p2")
    )
    assert one["spec"] is two["spec"]
    assert one["status"] is two["status"]
    assert (one["metadata"]["name"], two["metadata"]["name"]) == ("p1", "p2")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5),  # which pod
            st.sampled_from(["a", "b", None]),  # its node (None: unbound)
            st.sampled_from(["Pending", "Running", "Succeeded", "Failed", None]),
            st.sampled_from(["100m", "250m", "1", "1500m", "0"]),
            st.booleans(),  # deleted
        ),
        max_size=40,
    )
)
def test_the_ledger_kept_event_by_event_equals_a_recount_of_the_pods(events):
    ledger = RequestedLedger()
    pods: dict[str, dict] = {}
    for index, where, phase, cpu, deleted in events:
        key = f"ns/p{index}"
        if deleted:
            pods.pop(key, None)
            ledger.update(key, None)
            continue
        found = slim_pod(
            {
                "metadata": {"name": f"p{index}", "namespace": "ns"},
                "spec": {
                    "nodeName": where,
                    "containers": [{"resources": {"requests": {"cpu": cpu}}}],
                },
                "status": {"phase": phase},
            }
        )
        pods[key] = found
        ledger.update(key, found)
    nodes = [node("a"), node("b")]
    assert summarize_nodes(nodes, ledger.by_node) == summarize(nodes, list(pods.values()))
    assert all(totals for totals in ledger.by_node.values()), "no empty entries kept"
