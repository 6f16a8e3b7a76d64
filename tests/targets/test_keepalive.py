"""Keeping delegates alive while their source is away: which pods are kept, what is recreated,
when, and on whose word (pure rules, :mod:`multicluster_scheduler.api.keepalive`)."""

from __future__ import annotations

import re

import orjson
from hypothesis import given
from hypothesis import strategies as st

from multicluster_scheduler.api import keys
from multicluster_scheduler.api.keepalive import (
    AWAY,
    MAX_DELEGATES,
    MAX_HELD_BYTES,
    RECREATED,
    Heartbeat,
    Verdict,
    account_refusal,
    groups_of,
    heartbeat_name,
    heartbeat_object,
    identities,
    keepable,
    known_writer,
    read_heartbeat,
    recreated,
    refusal,
    slim,
    unchanged,
    verdict,
)
from multicluster_scheduler.api.proxy import delegate_name
from multicluster_scheduler.api.v1alpha1 import SourceHeartbeat

HERE, SOURCE = "cluster2-uid", "cluster1-uid"
WRITER = "system:serviceaccount:team:c1"
RENEWED = "2026-01-01T00:00:00.000000Z"


def delegate(source: str = SOURCE, restart: str | None = None, **meta) -> dict:
    name = delegate_name("web-1", "p-uid")
    pod = {
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": "d-uid",
            "generation": 1,
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


def heartbeat(listed: dict[str, str] | None = None, writer: str = WRITER) -> Heartbeat:
    made = read_heartbeat(heartbeat_object(SOURCE, "team", writer, RENEWED, listed or {}))
    assert made is not None
    return made


def test_delegates_of_other_clusters_that_restart_always_are_kept():
    assert keepable(delegate(), HERE) == SOURCE
    assert keepable(delegate(restart="Always"), HERE) == SOURCE
    assert keepable(delegate(restart="OnFailure"), HERE) is None, "Jobs: as upstream"
    assert keepable(delegate(restart="Never"), HERE) is None
    assert keepable(delegate(source=HERE), HERE) is None, "this cluster's own: it decides"
    renamed = delegate()
    renamed["metadata"]["name"] = "anything"
    assert keepable(renamed, HERE) is None, "not named as its source names delegates"


def test_the_pods_cache_holds_a_spec_only_for_the_delegates_their_source_lists():
    pod = delegate()
    held = slim(pod, HERE)
    assert held == {
        "metadata": {"name": pod["metadata"]["name"], "namespace": "team", "uid": "d-uid"},
        "source": SOURCE,
        "unchanged": True,
    }
    assert slim(delegate(source=HERE), HERE, listed=True) == {
        "metadata": {"name": pod["metadata"]["name"], "namespace": "team", "uid": "d-uid"}
    }
    listed = slim(pod, HERE, listed=True)
    assert isinstance(listed["spec"], bytes), "serialized: a fraction of a parsed spec"
    assert "status" not in listed


def test_what_is_held_of_a_listed_delegate_is_bounded_whatever_is_added_to_it():
    """Whoever may edit pods in a delegate's namespace may give it 20,000 labels (1.2 MB of
    JSON; labels count no generation): the target's agent held them all, parsed (tens of
    megabytes of its memory for one pod), for each delegate its source lists there. It holds
    :data:`MAX_HELD_BYTES` at most, and says why such a pod is not created again."""
    pod = delegate()
    pod["metadata"]["labels"] |= {f"l{i}": "x" * 40 for i in range(20_000)}
    held = slim(pod, HERE, listed=True)
    assert len(orjson.dumps(held, default=bytes.decode)) < MAX_HELD_BYTES
    name = pod["metadata"]["name"]
    why = refusal(held, heartbeat({name: "d-uid"}), writer_known=True)
    assert why is not None
    assert f"over the {MAX_HELD_BYTES} this cluster holds" in why
    assert refusal(slim(delegate(), HERE, listed=True), heartbeat({name: "d-uid"}), True) is None


def test_a_recreated_delegate_is_the_same_pod_placed_again():
    pod = delegate()
    again = recreated(slim(pod, HERE, listed=True), "2026-01-01T00:00:00Z")
    assert again["metadata"] == {
        "name": pod["metadata"]["name"],
        "namespace": "team",
        "labels": pod["metadata"]["labels"],
        "annotations": pod["metadata"]["annotations"] | {RECREATED: "2026-01-01T00:00:00Z"},
    }
    assert again["spec"] == {"containers": pod["spec"]["containers"]}, "not bound to its node"


def test_a_pod_is_unchanged_while_its_generation_counts_no_change_of_its_spec():
    """Measured on Kubernetes 1.36: 1 at creation; a binding, a status, labels and annotations
    leave it; an image, a toleration, an ephemeral container add one; the start of a graceful
    deletion adds one (with deletionTimestamp)."""
    assert unchanged(delegate()) is True
    assert unchanged(delegate(generation=2)) is False, "its image changed, say"
    deleting = "2026-01-01T00:00:00Z"
    assert unchanged(delegate(generation=2, deletionTimestamp=deleting)) is True
    assert unchanged(delegate(generation=3, deletionTimestamp=deleting)) is False
    older = delegate()
    del older["metadata"]["generation"]
    assert unchanged(older) is None, "Kubernetes before 1.33 does not count"
    assert unchanged(delegate(generation=True)) is None
    assert unchanged(delegate(generation="1")) is None


@given(st.text(min_size=1, max_size=253))
def test_a_heartbeat_is_named_as_a_dns_label_whatever_the_cluster_name(cluster):
    name = heartbeat_name(cluster)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
    assert len(name) <= 63
    made = heartbeat_object(cluster, "team", WRITER, RENEWED, {"a": "uid-a"})
    SourceHeartbeat.model_validate(made)  # what the CRD accepts
    read = read_heartbeat(made)
    assert read is not None
    assert (read.source, read.writer, read.renew_time) == (cluster, WRITER, RENEWED)
    assert read.lists("a", "uid-a")


def test_what_is_not_a_heartbeat_of_the_source_it_names():
    made = heartbeat_object(SOURCE, "team", WRITER, RENEWED, {})
    assert read_heartbeat(made) is not None
    claims = heartbeat_object(SOURCE, "team", WRITER, RENEWED, {})
    claims["spec"]["source"] = "cluster3-uid"
    assert read_heartbeat(claims) is None, "named after another source"
    deleting = heartbeat_object(SOURCE, "team", WRITER, RENEWED, {})
    deleting["metadata"]["deletionTimestamp"] = RENEWED
    assert read_heartbeat(deleting) is None
    for spec in (
        None,
        [],
        {"source": SOURCE},
        {"source": SOURCE, "writer": 7},
        {"source": SOURCE, "writer": WRITER, "delegates": ["a"]},
        {"source": SOURCE, "writer": WRITER, "delegates": dict.fromkeys(range(2000), "u")},
    ):
        odd = {"metadata": {"name": heartbeat_name(SOURCE)}, "spec": spec}
        assert read_heartbeat(odd) is None, spec
    mixed = heartbeat_object(SOURCE, "team", WRITER, RENEWED, {})
    mixed["spec"]["delegates"] = {"a": "uid-a", "b": 3}
    read = read_heartbeat(mixed)
    assert read is not None
    assert dict(read.delegates) == {"a": "uid-a"}, "what is not a name to a uid is no entry"
    assert MAX_DELEGATES == 1000


def test_a_heartbeat_lists_a_pod_by_name_and_uid():
    listed = heartbeat({"web-1-abc": "d-uid"})
    assert listed.lists("web-1-abc", "d-uid")
    assert not listed.lists("web-1-abc", "another-uid"), "recreated, or made by someone else"
    assert not listed.lists("web-2-abc", "d-uid")
    assert not listed.lists("web-1-abc", None)
    assert not heartbeat({"x": ""}).lists("x", "")


def test_whom_sources_stand_for():
    source = {
        "metadata": {"name": "c1", "namespace": "team"},
        "spec": {"serviceAccountName": "c1", "userName": "cluster1"},
    }
    assert identities(source) == {WRITER, "cluster1"}
    cluster_source = {
        "metadata": {"name": "c1"},
        "spec": {"serviceAccount": {"name": "c1", "namespace": "admiralty"}},
    }
    assert identities(cluster_source) == {"system:serviceaccount:admiralty:c1"}
    deleting = {**source, "metadata": {**source["metadata"], "deletionTimestamp": RENEWED}}
    assert identities(deleting) == set(), "a Source being deleted keeps nothing alive"
    assert identities({"metadata": {"name": "x"}, "spec": {"serviceAccount": {"name": "a"}}}) == (
        set()
    )
    assert identities({"metadata": {"name": "x", "namespace": "team"}, "spec": None}) == set()


def test_a_writer_is_known_when_a_source_of_the_namespace_or_a_cluster_source_names_it():
    team = {"metadata": {"name": "c1", "namespace": "team"}, "spec": {"serviceAccountName": "c1"}}
    everywhere = {"metadata": {"name": "c3"}, "spec": {"userName": "cluster3"}}
    assert known_writer(WRITER, [team], [])
    assert known_writer("cluster3", [], [everywhere])
    assert not known_writer("alice", [team], [everywhere])
    assert not known_writer(WRITER, [], [everywhere])


def test_a_writer_is_reviewed_with_the_groups_a_service_account_has():
    assert groups_of(WRITER) == [
        "system:serviceaccounts",
        "system:serviceaccounts:team",
        "system:authenticated",
    ]
    assert groups_of("cluster1") == ["system:authenticated"]
    assert groups_of("system:serviceaccount::c1") == ["system:authenticated"]


def test_why_a_delegate_gone_while_its_source_is_away_is_not_recreated():
    pod = delegate()
    gone = slim(pod, HERE, listed=True)
    name = pod["metadata"]["name"]
    listed = heartbeat({name: "d-uid"})
    assert refusal(gone, listed, writer_known=True) is None
    unlisted = refusal(gone, heartbeat({name: "other-uid"}), writer_known=True)
    assert unlisted is not None
    assert "does not list it" in unlisted
    assert "spec unseen" in (refusal(slim(pod, HERE), listed, writer_known=True) or "")
    changed = slim(delegate(generation=2), HERE, listed=True)
    assert "changed" in (refusal(changed, listed, writer_known=True) or "")
    uncounted = delegate()
    del uncounted["metadata"]["generation"]
    assert "1.33" in (refusal(slim(uncounted, HERE, listed=True), listed, True) or "")
    stranger = refusal(gone, listed, writer_known=False)
    assert stranger is not None
    assert WRITER in stranger


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


def test_a_service_account_speaks_only_with_a_token_of_its_own_account_as_it_is_now():
    """Kubernetes' ``edit`` role grants impersonating the service accounts of its namespace (an
    impersonated request has no uid), and making tokens for them (which die with the account:
    one made again has a new uid). A user (``edit`` impersonates none) is taken at its word."""
    made = heartbeat_object(SOURCE, "team", WRITER, RENEWED, {}, "sa-uid")
    SourceHeartbeat.model_validate(made)
    read = read_heartbeat(made)
    assert read is not None
    assert read.writer_uid == "sa-uid"
    assert account_refusal(read, "sa-uid") is None
    impersonated = heartbeat()
    assert impersonated.writer_uid == ""
    assert "without a token of that account" in (account_refusal(impersonated, "sa-uid") or "")
    assert "no longer exists" in (account_refusal(read, None) or "")
    assert "an earlier service account team/c1" in (account_refusal(read, "new-uid") or "")
    assert account_refusal(heartbeat(writer="cluster1"), None) is None
    odd = heartbeat_object(SOURCE, "team", WRITER, RENEWED, {})
    odd["spec"]["writerUID"] = 7
    assert read_heartbeat(odd).writer_uid == ""  # type: ignore[union-attr]
