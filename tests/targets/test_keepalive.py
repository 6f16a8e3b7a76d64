"""Keeping delegates alive while their source is away: which pods are kept, what is recreated,
and when (pure rules, :mod:`multicluster_scheduler.api.keepalive`)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from multicluster_scheduler.api import keys
from multicluster_scheduler.api.keepalive import (
    AWAY,
    RECREATED,
    Verdict,
    heartbeat_lease,
    heartbeat_name,
    heartbeat_source,
    keepable,
    kept,
    recreated,
    verdict,
)
from multicluster_scheduler.api.proxy import delegate_name

HERE, SOURCE = "cluster2-uid", "cluster1-uid"


def delegate(source: str = SOURCE, restart: str | None = None, **meta) -> dict:
    name = delegate_name("web-1", "p-uid")
    pod = {
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": "d-uid",
            "labels": {keys.PARENT_UID: "p-uid", keys.PREFIX + "app": "web"},
            "annotations": {
                keys.PARENT_NAME: "web-1",
                keys.PARENT_NAMESPACE: "team",
                keys.PARENT_CLUSTER_NAME: source,
                "team.example.com/owner": "a",
            },
            **meta,
        },
        "spec": {"nodeName": "kwok-1", "containers": [{"name": "web", "image": "nginx"}]},
        "status": {"phase": "Running"},
    }
    if restart:
        pod["spec"]["restartPolicy"] = restart
    return pod


def test_delegates_of_other_clusters_that_restart_always_are_kept():
    assert keepable(delegate(), HERE) == SOURCE
    assert keepable(delegate(restart="Always"), HERE) == SOURCE
    assert keepable(delegate(restart="OnFailure"), HERE) is None, "Jobs: as upstream"
    assert keepable(delegate(restart="Never"), HERE) is None
    assert keepable(delegate(source=HERE), HERE) is None, "this cluster's own: it decides"
    renamed = delegate()
    renamed["metadata"]["name"] = "anything"
    assert keepable(renamed, HERE) is None, "not named as its source names delegates"


def test_a_recreated_delegate_is_the_same_pod_placed_again():
    pod = delegate()
    slim = kept(pod, HERE)
    assert "status" not in slim
    assert isinstance(slim["spec"], bytes), "serialized: a fraction of a parsed spec"
    again = recreated(slim, "2026-01-01T00:00:00Z")
    assert again["metadata"] == {
        "name": pod["metadata"]["name"],
        "namespace": "team",
        "labels": pod["metadata"]["labels"],
        "annotations": pod["metadata"]["annotations"] | {RECREATED: "2026-01-01T00:00:00Z"},
    }
    assert again["spec"] == {"containers": pod["spec"]["containers"]}, "not bound to its node"
    assert kept(delegate(source=HERE), HERE) == {
        "metadata": {"name": pod["metadata"]["name"], "namespace": "team"}
    }


@given(st.text(min_size=1, max_size=300))
def test_a_heartbeat_is_named_as_a_dns_label_whatever_the_cluster_name(cluster):
    name = heartbeat_name(cluster)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
    assert len(name) <= 63
    lease = heartbeat_lease(cluster, "team", "2026-01-01T00:00:00.000000Z")
    assert heartbeat_source(lease) == cluster


def test_a_lease_claiming_another_sources_name_is_no_heartbeat():
    lease = heartbeat_lease(SOURCE, "team", "2026-01-01T00:00:00.000000Z")
    lease["metadata"]["annotations"][keys.PARENT_CLUSTER_NAME] = "cluster3-uid"
    assert heartbeat_source(lease) is None
    assert heartbeat_source({"metadata": {"name": "x"}}) is None


def test_when_a_delegate_is_recreated():
    gone = 100.0
    assert verdict(gone, None, gone + 600) is Verdict.FORGET, "no heartbeat: not in use"
    assert verdict(gone, gone + 5, gone + 10) is Verdict.FORGET, "the source is there"
    assert verdict(gone, gone - 5, gone + 10) is Verdict.WAIT
    assert verdict(gone, gone - 5, gone + AWAY - 0.1) is Verdict.WAIT
    assert verdict(gone, gone - 5, gone + AWAY) is Verdict.RECREATE


@given(st.floats(0, 1e6), st.one_of(st.none(), st.floats(0, 1e6)), st.floats(0, 1e6))
def test_a_delegate_is_recreated_only_when_its_source_missed_a_minute(since, beat, later):
    now = since + later
    decided = verdict(since, beat, now)
    if decided is Verdict.RECREATE:
        assert beat is not None
        assert beat <= since
        assert now - since >= AWAY
