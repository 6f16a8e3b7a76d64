"""A Source names its service account in free text, and the name ends up in API paths: one that
no service account can have (``Bad_Name``, ``a/b``, ``..``) is reported as Invalid before any
call, instead of reaching a subresource (``a/b``) or another object (``..`` is the namespace
itself) and being reported as whatever that call answers."""

from __future__ import annotations

import pytest

from multicluster.resources import SERVICEACCOUNTS
from multicluster_scheduler.sources.desired import InvalidSubject, NoSubject, subjects
from tests.sources.test_source_controller import NS, World, cluster_source, source


@pytest.fixture
def world() -> World:
    return World()


INVALID_NAMES = ["Bad_Name", "a/b", "..", ".", "x?watch=1", "a" * 254, "-a", "a-", "a..b", "é"]


@pytest.mark.parametrize("name", INVALID_NAMES)
def test_a_service_account_name_no_account_can_have_is_invalid(name):
    with pytest.raises(InvalidSubject, match=r"spec.serviceAccountName .* is not a valid"):
        subjects(source("s", sa=name))
    with pytest.raises(InvalidSubject, match=r"spec.serviceAccount.name .* is not a valid"):
        subjects(cluster_source("s", sa=(NS, name)))


@pytest.mark.parametrize("namespace", ["Bad_NS", "a.b", "..", "n" * 64, "a/b"])
def test_a_service_account_namespace_no_namespace_can_have_is_invalid(namespace):
    with pytest.raises(InvalidSubject, match=r"spec.serviceAccount.namespace .* not a valid"):
        subjects(cluster_source("s", sa=(namespace, "c1")))


@pytest.mark.parametrize("name", ["c1", "a.b.c", "a" * 253, "0", "x-1.y-2"])
def test_names_at_the_limits_are_valid(name):
    assert subjects(source("s", sa=name))[0]["name"] == name
    assert subjects(cluster_source("s", sa=("n" * 63, name)))[0]["namespace"] == "n" * 63


def test_an_empty_name_is_still_no_subject():
    with pytest.raises(NoSubject):
        subjects(source("s", sa=""))


@pytest.mark.parametrize("name", ["..", "a/b", "Bad_Name"])
async def test_the_source_is_invalid_and_nothing_is_called(world: World, name):
    world.add(source("odd", sa=name))
    await world.reconcile("odd")
    assert world.ready("odd") == ("False", "Invalid")
    (condition,) = world.get("odd")["status"]["conditions"]
    assert repr(name) in condition["message"]
    assert not [w for w in world.api.writes if w[1] != "Source"]


async def test_a_source_renamed_to_an_invalid_account_loses_its_bindings(world: World):
    world.add(source("s1", sa="c1"))
    await world.reconcile("s1")
    assert world.ready("s1") == ("True", "Bound")
    world.set_spec("s1", {"serviceAccountName": "../c1"})
    await world.reconcile("s1")
    assert world.ready("s1") == ("False", "Invalid")
    assert world.api.find(SERVICEACCOUNTS, "c1", NS) is not None  # kept: owned, collected later
    assert not [
        obj
        for (resource, _, _), obj in world.api.objects.items()
        if resource.kind in ("RoleBinding", "ClusterRoleBinding")
        and not obj["metadata"].get("deletionTimestamp")
    ]
