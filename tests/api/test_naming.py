"""The naming rule of docs/reference.md ("Names the agent gives") on known vectors, and the
properties the rule exists for."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicluster_scheduler.api.naming import unique_name, virtual_node_name


@pytest.mark.parametrize(
    ("parts", "name"),
    [
        (["default", "foo"], "default-foo"),
        (["default", "foo-bar"], "default-foo-bar-b1f5f88a38"),
        (["default-foo", "bar"], "default-foo-bar-ce0b03a405"),
        (
            ["verylongnamespaceverylongnamespace", "verylongnameverylongnameverylongname"],
            "verylongnamespaceverylongnamespace-verylongnameveryl-79f7165434",
        ),
    ],
)
def test_vectors(parts, name):
    assert unique_name(parts) == name


def test_vector_with_constant_parts():
    assert unique_name(["my-ns", "c1"], ("admiralty", "namespace")) == (
        "admiralty-namespace-my-ns-c1-5492da9b77"
    )


def test_virtual_node_names_of_the_user_guide():
    assert virtual_node_name("c1", "default") == "admiralty-namespace-default-c1"
    assert virtual_node_name("c2", "default") == "admiralty-namespace-default-c2"
    assert virtual_node_name("c1") == "admiralty-cluster-c1"
    # A ClusterTarget has one variable part: a dash in it is no ambiguity.
    assert virtual_node_name("us-east") == "admiralty-cluster-us-east"


label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)


@given(namespace=label, name=label)
def test_names_are_valid_label_values(namespace, name):
    node = virtual_node_name(name, namespace)
    assert len(node) <= 63
    assert not node.endswith("-")


@given(a=st.tuples(label, label), b=st.tuples(label, label))
def test_different_targets_never_share_a_node(a, b):
    if a != b:
        assert virtual_node_name(a[1], a[0]) != virtual_node_name(b[1], b[0])
