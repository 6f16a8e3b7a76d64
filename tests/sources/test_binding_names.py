"""Binding names never collide between sources: Source ``b-c`` in ``a`` and Source ``c`` in
``a-b`` (or ClusterSource ``x-cluster-summary-viewer`` and ClusterSource ``x``) would join to
one name; a hash tells them apart, as virtual node names do, while the user guide's names (no
``-`` in the parts) stay exactly as they are. Bindings an older agent made under the old names
are replaced (the real thing: e2e/test_target_limits.py)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicluster.resources import CLUSTER_ROLE_BINDINGS
from multicluster_scheduler.api import keys
from multicluster_scheduler.sources.desired import binding_name, binding_names
from tests.sources.test_source_controller import World


def source(name: str, namespace: str | None, account: str = "c1") -> dict:
    if namespace:
        return {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"serviceAccountName": account},
        }
    spec = {"serviceAccount": {"name": account, "namespace": "ns"}}
    return {"metadata": {"name": name}, "spec": spec}


@pytest.mark.parametrize(
    ("namespace", "name", "expected"),
    [
        (
            "default",
            "c1",
            ("admiralty-source-c1", "admiralty-source-default-c1-cluster-summary-viewer"),
        ),
        (
            None,
            "c1",
            ("admiralty-clustersource-c1", "admiralty-clustersource-c1-cluster-summary-viewer"),
        ),
        (
            "a",
            "b-c",
            ("admiralty-source-b-c", "admiralty-source-a-b-c-cluster-summary-viewer-b256e5a290"),
        ),
        (
            "a-b",
            "c",
            ("admiralty-source-c", "admiralty-source-a-b-c-cluster-summary-viewer-5ebb2cc0e4"),
        ),
        (
            None,
            "x-cluster-summary-viewer",
            (
                "admiralty-clustersource-x-cluster-summary-viewer-4649d803db",
                "admiralty-clustersource-x-cluster-summary-viewer-cluster-summary-viewer-951d82d944",
            ),
        ),
    ],
)
def test_binding_names(namespace, name, expected):
    assert binding_names(source(name, namespace)) == expected


def test_the_hash_is_of_every_part_joined_with_a_slash():
    digest = hashlib.sha256(b"admiralty/source/a/b-c/cluster-summary-viewer").hexdigest()[:10]
    assert binding_name("admiralty-source", ("a", "b-c"), "cluster-summary-viewer").endswith(digest)


def test_names_are_never_cut():
    long = "n" * 63, "s" * 253
    assert binding_names(source(long[1], long[0]))[1] == (
        f"admiralty-source-{long[0]}-{long[1]}-cluster-summary-viewer"
    )


PART = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?", fullmatch=True)


@given(st.lists(st.tuples(st.one_of(st.none(), PART), PART), min_size=2, max_size=8, unique=True))
def test_no_two_sources_share_a_cluster_scoped_binding_name(sources):
    """Every ClusterRoleBinding name (the viewer binding of each Source; both bindings of each
    ClusterSource) belongs to one source only; a Source's RoleBinding, one per namespace."""
    owner: dict[str, tuple] = {}
    role_bindings: dict[tuple[str, str], tuple] = {}
    for namespace, name in sources:
        first, viewer = binding_names(source(name, namespace))
        if namespace:
            assert role_bindings.setdefault((namespace, first), (namespace, name)) == (
                namespace,
                name,
            )
            cluster_scoped = [viewer]
        else:
            cluster_scoped = [first, viewer]
        for binding in cluster_scoped:
            assert owner.setdefault(binding, (namespace, name)) == (namespace, name), binding
        if "-" not in name and "-" not in (namespace or ""):
            guide = (
                f"admiralty-source-{namespace}-{name}"
                if namespace
                else f"admiralty-clustersource-{name}"
            )
            assert viewer == f"{guide}-cluster-summary-viewer", "the guide's names stay"


def old_viewer_binding(namespace: str, name: str, account: str) -> dict:
    """What an agent of an earlier version made: the name joined without a hash."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": f"admiralty-source-{namespace}-{name}-cluster-summary-viewer",
            "labels": {keys.SOURCE_NAMESPACE_LABEL: namespace, keys.SOURCE_NAME_LABEL: name},
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": keys.CLUSTER_SUMMARY_VIEWER_CLUSTER_ROLE,
        },
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }


async def test_sources_that_joined_alike_are_both_bound_and_the_old_binding_goes():
    world = World()
    old = old_viewer_binding("a", "b-c", "first")
    world.api.add(CLUSTER_ROLE_BINDINGS, old)
    world.add(source("b-c", "a", "first"))
    world.add(source("c", "a-b", "second"))
    await world.reconcile("c", "a-b")  # before the upgrade, this one was the conflict
    await world.reconcile("b-c", "a")
    assert world.ready("b-c", "a") == world.ready("c", "a-b") == ("True", "Bound")
    assert world.api.find(CLUSTER_ROLE_BINDINGS, old["metadata"]["name"]) is None, "replaced"
    for name, namespace, account in (("b-c", "a", "first"), ("c", "a-b", "second")):
        viewer = binding_names(source(name, namespace))[1]
        binding = world.api.find(CLUSTER_ROLE_BINDINGS, viewer)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": namespace}
        ]
    # The replacement was made before the old one was deleted: never unbound in between.
    writes = [w for w in world.api.writes if w[1] == "ClusterRoleBinding"]
    new = binding_names(source("b-c", "a"))[1]
    assert writes.index(("create", "ClusterRoleBinding", new)) < writes.index(
        ("delete", "ClusterRoleBinding", old["metadata"]["name"])
    )
    # Deleting the Source deletes its binding (the finalizer finds it by name or by labels).
    await world.delete("b-c", "a")
    assert world.api.find(CLUSTER_ROLE_BINDINGS, new) is None


async def test_a_deleted_source_whose_binding_still_has_the_old_name_takes_it_along():
    """Deleted before an upgraded agent reconciled it: the finalizer finds the binding by its
    labels, whatever its name."""
    world = World()
    old = old_viewer_binding("a", "b-c", "first")
    world.api.add(CLUSTER_ROLE_BINDINGS, old)
    world.add(
        {
            **source("b-c", "a", "first"),
            "metadata": {"name": "b-c", "namespace": "a", "finalizers": [keys.FINALIZER]},
        }
    )
    await world.delete("b-c", "a")
    assert world.api.find(CLUSTER_ROLE_BINDINGS, old["metadata"]["name"]) is None
