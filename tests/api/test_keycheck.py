"""Annotation keys that look like ours and are not: the rules, and the chart's policy holding the
same list of keys (its behaviour on a real API server is e2e/test_admission_warnings.py's)."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from multicluster_scheduler.api import keys
from multicluster_scheduler.api.keepalive import RECREATED
from multicluster_scheduler.api.keycheck import (
    NEAR_MISS,
    POD_ANNOTATIONS,
    UNKNOWN,
    annotation_mistakes,
    key_mistake,
    namespace_enabled,
)

POLICY = (
    Path(__file__).resolve().parents[2]
    / "charts/multicluster-scheduler/templates/admission-warnings.yaml"
)


def test_our_keys_and_everyone_elses_are_fine():
    for key in POD_ANNOTATIONS:
        assert key_mistake(key) is None, key
    for key in ("app", "kubectl.kubernetes.io/restartedAt", "workflows.argoproj.io/node-id",
                "prometheus.io/scrape", "selected", "example.com/election"):  # fmt: skip
        assert key_mistake(key) is None, key


def test_a_misspelt_key_of_ours_is_unknown_and_points_at_elect():
    for key in ("multicluster.admiralty.io/elected", "multicluster.admiralty.io/Elect"):
        mistake = key_mistake(key)
        assert mistake is not None, key
        assert mistake.kind == UNKNOWN, key
        assert mistake.message == f'annotation "{key}" is unknown: did you mean "{keys.ELECT}"?'
    other = key_mistake("multicluster.admiralty.io/no-prefix-labels")
    assert other is not None
    assert other.kind == UNKNOWN
    assert other.message.endswith("is unknown to multicluster-scheduler")


def test_a_look_alike_of_the_election_under_another_prefix_is_a_near_miss():
    for key in ("multicluster.admiralty/elect", "admiralty.io/elect", "multicluster.io/elect",
                "elect", "Elect", "multicluster-admiralty.io/elect",
                "multicluster.admiralty.com/elect", "example.com/Admiralty"):  # fmt: skip
        mistake = key_mistake(key)
        assert mistake is not None, key
        assert mistake.kind == NEAR_MISS, key
        assert mistake.message == f'annotation "{key}" is not "{keys.ELECT}"'


def test_mistakes_are_listed_by_key():
    found = annotation_mistakes(
        {"multicluster.admiralty/elect": "", "app": "x", "multicluster.admiralty.io/elected": ""}
    )
    assert [m.key for m in found] == [
        "multicluster.admiralty.io/elected",
        "multicluster.admiralty/elect",
    ]
    assert annotation_mistakes(None) == []


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz-./", max_size=40))
def test_a_key_without_admiralty_nor_elect_is_never_a_mistake(key: str):
    if "admiralty" not in key and "elect" not in key:
        assert key_mistake(key) is None


def test_the_agents_own_keys_are_known():
    assert RECREATED in POD_ANNOTATIONS
    assert keys.SOURCEPOD_MANIFEST_MAC in POD_ANNOTATIONS


def test_enabled_namespaces():
    assert namespace_enabled({"metadata": {"labels": {"multicluster-scheduler": "enabled"}}})
    assert not namespace_enabled({"metadata": {"labels": {"multicluster-scheduler": "true"}}})
    assert not namespace_enabled({"metadata": {}})


def test_the_charts_policy_knows_the_same_keys():
    text = POLICY.read_text()
    known = text[text.index("- name: known") : text.index("- name: unknown")]
    assert sorted(re.findall(r"'(multicluster\.admiralty\.io/[^']+)'", known)) == sorted(
        POD_ANNOTATIONS
    )
