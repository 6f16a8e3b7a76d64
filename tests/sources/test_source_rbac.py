"""What the source controller makes for a Source or ClusterSource, and what it does about the
bindings it finds: pure decisions, no cluster."""

from __future__ import annotations

import argparse
import copy
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicluster import Forbidden, Invalid, NotFound
from multicluster.gc import finalizer_patch
from multicluster.resources import CLUSTER_ROLE_BINDINGS, ROLE_BINDINGS
from multicluster_scheduler import agent
from multicluster_scheduler.api import keys
from multicluster_scheduler.sources.controller import explained, problem_from
from multicluster_scheduler.sources.desired import (
    RBAC_GROUP,
    Action,
    InvalidSubject,
    NoSubject,
    binding_action,
    binding_names,
    binding_patch,
    condition_changed,
    desired_bindings,
    desired_service_account,
    is_ours,
    made_by_us,
    orphaned_by,
    owner_key,
    owner_labels,
    ready_condition,
    same_subjects,
    share_patch,
    source_key,
    subjects,
    unshare_patch,
)

LABEL_VALUE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]")


def source(name="c1", namespace="ns", sa="c1", user=None) -> dict:
    spec = {}
    if sa:
        spec["serviceAccountName"] = sa
    if user:
        spec["userName"] = user
    return {"metadata": {"name": name, "namespace": namespace, "uid": "u-1"}, "spec": spec}


def cluster_source(name="c1", sa=("admiralty", "c1"), user=None) -> dict:
    spec: dict = {}
    if sa:
        spec["serviceAccount"] = {"namespace": sa[0], "name": sa[1]}
    if user:
        spec["userName"] = user
    return {"metadata": {"name": name, "uid": "u-2"}, "spec": spec}


def server_side(binding) -> dict:
    """A binding as the API server returns it: defaulted, with extra metadata."""
    body = copy.deepcopy(binding.body)
    body["metadata"].update(
        uid="b-1", resourceVersion="7", creationTimestamp="2024-01-01T00:00:00Z"
    )
    for subject in body["subjects"]:
        if subject["kind"] == "ServiceAccount":
            subject["apiGroup"] = ""
    return body


def test_a_source_gets_the_guides_bindings():
    role_binding, viewer = desired_bindings(source())
    assert role_binding.resource is ROLE_BINDINGS
    assert (role_binding.namespace, role_binding.name) == ("ns", "admiralty-source-c1")
    assert role_binding.body["roleRef"] == {
        "apiGroup": RBAC_GROUP,
        "kind": "ClusterRole",
        "name": "multicluster-scheduler-source",
    }
    assert role_binding.body["subjects"] == [
        {"kind": "ServiceAccount", "name": "c1", "namespace": "ns"}
    ]
    assert role_binding.body["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "multicluster.admiralty.io/v1alpha1",
            "kind": "Source",
            "name": "c1",
            "uid": "u-1",
            "controller": True,
        }
    ]
    assert viewer.resource is CLUSTER_ROLE_BINDINGS
    assert (viewer.namespace, viewer.name) == (
        None,
        "admiralty-source-ns-c1-cluster-summary-viewer",
    )
    assert viewer.body["roleRef"]["name"] == "multicluster-scheduler-cluster-summary-viewer"
    # A cluster-scoped object must not be owned by a namespaced one: the finalizer cleans up.
    assert "ownerReferences" not in viewer.body["metadata"]
    for binding in (role_binding, viewer):
        assert binding.body["metadata"]["labels"] == {
            keys.SOURCE_NAMESPACE_LABEL: "ns",
            keys.SOURCE_NAME_LABEL: "c1",
        }


def test_a_cluster_source_gets_two_owned_cluster_role_bindings():
    source_role, viewer = desired_bindings(cluster_source())
    assert [b.resource for b in (source_role, viewer)] == [CLUSTER_ROLE_BINDINGS] * 2
    assert source_role.name == "admiralty-clustersource-c1"
    assert viewer.name == "admiralty-clustersource-c1-cluster-summary-viewer"
    assert source_role.body["roleRef"]["name"] == keys.SOURCE_CLUSTER_ROLE
    assert viewer.body["roleRef"]["name"] == keys.CLUSTER_SUMMARY_VIEWER_CLUSTER_ROLE
    for binding in (source_role, viewer):
        assert binding.body["subjects"] == [
            {"kind": "ServiceAccount", "name": "c1", "namespace": "admiralty"}
        ]
        (ref,) = binding.body["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"]) == ("ClusterSource", "c1", "u-2")
        assert binding.body["metadata"]["labels"] == {keys.CLUSTER_SOURCE_NAME_LABEL: "c1"}


def test_service_accounts_are_made_where_the_source_says():
    account = desired_service_account(source(sa="robot"))
    assert account["metadata"]["name"] == "robot"
    assert account["metadata"]["namespace"] == "ns"
    assert account["metadata"]["ownerReferences"][0]["kind"] == "Source"
    # The original created a ClusterSource's service account with an empty namespace.
    account = desired_service_account(cluster_source(sa=("team-a", "robot")))
    assert (account["metadata"]["namespace"], account["metadata"]["name"]) == ("team-a", "robot")
    assert account["metadata"]["ownerReferences"][0]["kind"] == "ClusterSource"
    assert desired_service_account(source(sa=None, user="alice")) is None


def test_a_service_account_we_made_is_shared_by_every_source_naming_it():
    first, second = source("a"), {**source("b"), "metadata": {**source("b")["metadata"]}}
    second["metadata"]["uid"] = "u-b"
    made = desired_service_account(first)
    made["metadata"].update(uid="sa-1", resourceVersion="7")
    assert made_by_us(made)
    (ref,) = made["metadata"]["ownerReferences"]
    assert "controller" not in ref  # one owner among possibly many
    assert share_patch(made, first) is None  # already an owner
    patch = share_patch(made, second)
    assert patch == {
        "metadata": {
            "ownerReferences": [ref, {**ref, "name": "b", "uid": "u-b"}],
            "resourceVersion": "7",
        }
    }
    shared = copy.deepcopy(made)
    shared["metadata"]["ownerReferences"] = patch["metadata"]["ownerReferences"]
    assert not orphaned_by(shared, first)
    assert unshare_patch(shared, first) == {
        "metadata": {
            "ownerReferences": [{**ref, "name": "b", "uid": "u-b"}],
            "resourceVersion": "7",
        }
    }
    assert orphaned_by(made, first)  # its last owner: never removed
    assert unshare_patch(made, second) is None
    # Someone else's account: never owned.
    theirs = {"metadata": {"name": "c1", "namespace": "ns", "resourceVersion": "3"}}
    assert not made_by_us(theirs)
    assert share_patch(theirs, first) is None


def test_releasing_a_source_removes_only_our_finalizer_and_its_label():
    releasing = source()
    releasing["metadata"].update(
        resourceVersion="9",
        finalizers=["example.com/other", keys.FINALIZER],
        labels={keys.HAS_FINALIZER: "true", "app": "x"},
    )
    assert finalizer_patch(releasing, keys.FINALIZER, False, keys.HAS_FINALIZER) == {
        "metadata": {
            "finalizers": ["example.com/other"],
            "labels": {keys.HAS_FINALIZER: None},
            "resourceVersion": "9",
        }
    }


def test_subjects_a_service_account_a_user_or_both():
    assert subjects(source(sa=None, user="alice")) == [
        {"kind": "User", "apiGroup": RBAC_GROUP, "name": "alice"}
    ]
    both = subjects(cluster_source(user="alice"))
    assert [s["kind"] for s in both] == ["ServiceAccount", "User"]
    with pytest.raises(NoSubject, match=r"spec.serviceAccountName or spec.userName"):
        subjects(source(sa=None))
    with pytest.raises(NoSubject, match=r"spec.serviceAccount or spec.userName"):
        desired_bindings(cluster_source(sa=None, user=""))


@pytest.mark.parametrize(
    "user",
    [
        "system:anonymous",
        "system:unauthenticated",
        "system:kube-controller-manager",
        "system:serviceaccount:kube-system:admin",  # another namespace's account
        "system:serviceaccount:ns",
        "system:serviceaccount:ns:a:b",
    ],
)
def test_a_source_may_not_name_kubernetes_own_users(user):
    """``system:anonymous`` would have given everyone, unauthenticated, the ClusterSummary and
    the source role in the namespace."""
    with pytest.raises(InvalidSubject, match="one of Kubernetes' own users"):
        subjects(source(sa=None, user=user))


def test_service_accounts_written_as_users_are_fine_where_the_source_may_name_them():
    assert subjects(source(sa=None, user="system:serviceaccount:ns:robot"))[0]["name"] == (
        "system:serviceaccount:ns:robot"
    )
    anywhere = cluster_source(sa=None, user="system:serviceaccount:kube-system:robot")
    assert subjects(anywhere)[0]["kind"] == "User"
    with pytest.raises(InvalidSubject):
        subjects(cluster_source(sa=None, user="system:anonymous"))
    assert subjects(source(sa=None, user="systemic"))[0]["name"] == "systemic"


def test_binding_names_follow_the_guide():
    assert binding_names(source("c1", "default")) == (
        "admiralty-source-c1",
        "admiralty-source-default-c1-cluster-summary-viewer",
    )
    assert binding_names(cluster_source("c1")) == (
        "admiralty-clustersource-c1",
        "admiralty-clustersource-c1-cluster-summary-viewer",
    )


@given(st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?", fullmatch=True))
def test_owner_labels_are_valid_label_values_and_map_back(name):
    for made_for in (source(name=name), cluster_source(name=name)):
        labels = owner_labels(made_for)
        for value in labels.values():
            assert LABEL_VALUE.fullmatch(value), value
        assert owner_key(labels) == source_key(made_for)
    assert source_key(source(name=name)) != source_key(cluster_source(name=name))


def test_long_names_do_not_collide_in_labels():
    a, b = "x" * 70 + "a", "x" * 70 + "b"
    assert owner_labels(source(name=a)) != owner_labels(source(name=b))


def test_ownership_is_read_from_labels():
    mine = server_side(desired_bindings(source())[0])
    assert is_ours(mine, source())
    assert not is_ours(mine, source(namespace="other"))
    assert not is_ours(mine, cluster_source())
    assert owner_key({"app": "x"}) is None


def test_binding_actions():
    wanted = desired_bindings(source())[0]
    made = server_side(wanted)
    assert binding_action(None, wanted, source()) is Action.CREATE
    assert binding_action(made, wanted, source()) is Action.KEEP

    # Not ours: left alone, whether it grants the same (made by hand, as the guide shows) or not.
    by_hand = copy.deepcopy(made)
    del by_hand["metadata"]["labels"]
    assert binding_action(by_hand, wanted, source()) is Action.BOUND_BY_OTHERS
    for change in (
        lambda b: b["subjects"].append({"kind": "User", "name": "mallory"}),
        lambda b: b["roleRef"].update(name="view"),
        lambda b: b["metadata"].update(deletionTimestamp="2024-01-01T00:00:00Z"),
    ):
        foreign = copy.deepcopy(by_hand)
        change(foreign)
        assert binding_action(foreign, wanted, source()) is Action.FOREIGN

    edited = copy.deepcopy(made)
    edited["subjects"].append({"kind": "User", "apiGroup": RBAC_GROUP, "name": "mallory"})
    assert binding_action(edited, wanted, source()) is Action.UPDATE

    orphaned = copy.deepcopy(made)
    orphaned["metadata"]["ownerReferences"] = []
    assert binding_action(orphaned, wanted, source()) is Action.UPDATE

    wrong_role = copy.deepcopy(made)
    wrong_role["roleRef"]["name"] = "cluster-admin"
    assert binding_action(wrong_role, wanted, source()) is Action.RECREATE

    deleting = copy.deepcopy(wrong_role)
    deleting["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    assert binding_action(deleting, wanted, source()) is Action.WAIT


def test_subjects_compare_as_the_api_server_means_them():
    sa = {"kind": "ServiceAccount", "name": "c1", "namespace": "ns"}
    user = {"kind": "User", "name": "alice"}  # apiGroup defaulted
    assert same_subjects([sa, user], [{**user, "apiGroup": RBAC_GROUP}, {**sa, "apiGroup": ""}])
    assert not same_subjects([sa], [sa, user])
    assert not same_subjects([sa], [{**sa, "namespace": "other"}])
    assert same_subjects(None, [])


def test_patch_restores_subjects_and_replaces_a_stale_owner():
    wanted = desired_bindings(source())[0]
    made = server_side(wanted)
    made["subjects"] = [{"kind": "User", "apiGroup": RBAC_GROUP, "name": "mallory"}]
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "keep", "uid": "k"}
    stale = {**wanted.body["metadata"]["ownerReferences"][0], "uid": "old"}
    made["metadata"]["ownerReferences"] = [other, stale]
    patch = binding_patch(made, wanted)
    assert patch["subjects"] == wanted.body["subjects"]
    assert patch["metadata"]["ownerReferences"] == [
        other,
        *wanted.body["metadata"]["ownerReferences"],
    ]
    assert patch["metadata"]["labels"] == owner_labels(source())
    # The owner list is replaced as a whole: only if nobody changed it since it was read.
    assert patch["metadata"]["resourceVersion"] == "7"
    assert "roleRef" not in patch
    # A Source's ClusterRoleBinding never gets an owner reference, not even by a patch.
    viewer = desired_bindings(source())[1]
    assert "ownerReferences" not in binding_patch(server_side(viewer), viewer)["metadata"]


def test_ready_condition_moves_its_time_only_on_a_status_change():
    first = ready_condition(False, "NoSubject", "m", 1, [])
    again = ready_condition(False, "BindingConflict", "m2", 2, [first])
    assert again["lastTransitionTime"] == first["lastTransitionTime"]
    assert condition_changed(first, again)
    assert not condition_changed(again, ready_condition(False, "BindingConflict", "m2", 2, [again]))
    assert condition_changed(None, first)
    assert ready_condition(True, "Bound", "", 2, [again])["status"] == "True"


def test_errors_only_users_can_fix_become_reasons():
    assert problem_from(Forbidden("x"), "create it").reason == "Forbidden"
    assert problem_from(Invalid("x"), "create it").reason == "Invalid"
    assert problem_from(NotFound("x"), "create it") is None
    with pytest.raises(Exception, match="may not write it") as caught, explained("write it"):
        raise Forbidden("no")
    assert caught.value.reason == "Forbidden"
    with pytest.raises(NotFound), explained("write it"):
        raise NotFound("gone")


@pytest.mark.parametrize(("flag", "enabled"), [("false", False), ("true", True), ("False", False)])
def test_source_controller_flag(flag, enabled):
    parser = argparse.ArgumentParser()
    agent.add_arguments(parser)
    args = parser.parse_args(["--namespace", "admiralty", f"--source-controller={flag}"])
    assert agent.settings_from(args).source_controller is enabled
