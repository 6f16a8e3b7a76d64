"""A delegate never runs as the service account the source cluster itself uses in the target:
with it, whoever creates elected pods would get everything the source may do there."""

from __future__ import annotations

import pytest

from multicluster_scheduler.scheduler.controller import runs_as_identity
from multicluster_scheduler.targets.registry import TargetConnection


def target(identity: str | None, namespace: str | None = "team-a") -> TargetConnection:
    kind = "Target" if namespace else "ClusterTarget"
    return TargetConnection(kind, "c2", namespace, identity=identity)


def manifest(**spec) -> dict:
    return {"spec": {"containers": [{"name": "c"}], **spec}}


@pytest.mark.parametrize(
    "spec", [{"serviceAccountName": "c1"}, {"serviceAccount": "c1"}], ids=["name", "legacy field"]
)
def test_a_pod_naming_the_source_identity_is_refused_there(spec):
    why = runs_as_identity(manifest(**spec), target("system:serviceaccount:team-a:c1"), "team-a")
    assert why == (
        "c2: the delegate would run as the service account this cluster uses there (team-a/c1)"
    )


def test_the_default_account_counts_when_it_is_the_identity():
    identity = "system:serviceaccount:team-a:default"
    assert runs_as_identity(manifest(), target(identity), "team-a") is not None


@pytest.mark.parametrize(
    ("identity", "namespace", "spec"),
    [
        ("system:serviceaccount:team-a:c1", "team-a", {"serviceAccountName": "web"}),
        ("system:serviceaccount:team-a:c1", "team-a", {}),  # "default"
        ("system:serviceaccount:admiralty:c1", "team-a", {"serviceAccountName": "c1"}),
        ("alice", "team-a", {"serviceAccountName": "alice"}),
        (None, "team-a", {"serviceAccountName": "c1"}),
    ],
)
def test_other_accounts_and_identities_are_fine(identity, namespace, spec):
    assert runs_as_identity(manifest(**spec), target(identity, None), namespace) is None
