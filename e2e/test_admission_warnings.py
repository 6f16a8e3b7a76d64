"""The chart's admission warnings, as ``kubectl apply`` prints them: a misspelt key of ours, a
look-alike of the election, an elected pod or pod template in a namespace that is not enabled
(for pods and every workload kind), nothing for what is right nor for pods the agent makes, and
the same verdict as :mod:`multicluster_scheduler.api.keycheck` for each key."""

from __future__ import annotations

import json

import pytest

from multicluster_scheduler.api.keycheck import POD_ANNOTATIONS, key_mistake
from multicluster_scheduler.api.keys import ELECT
from multicluster_scheduler.webhook.reinvocation import SAVED
from testbed import TestBed, wait_for
from testbed.install import Installation
from testbed.kubectl import CommandError, Kubectl

SOURCE = "cluster1"
POLICY = (
    "Warning: Validation failed for ValidatingAdmissionPolicy 'multicluster-scheduler-warnings' "
    "with binding 'multicluster-scheduler-warnings': "
)


def pod(annotations: dict[str, str], **labels: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": annotations, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def template(annotations: dict[str, str]) -> dict:
    return {
        "metadata": {"labels": {"app": "a"}, "annotations": annotations},
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "restartPolicy": "Never",
        },
    }


def workload(kind: str, annotations: dict[str, str]) -> dict:
    """A ``kind`` whose pod template carries ``annotations``."""
    group = "batch/v1" if kind in ("Job", "CronJob") else "apps/v1"
    spec: dict = {"template": template(annotations)}
    if kind == "CronJob":
        spec = {"schedule": "0 0 * * *", "jobTemplate": {"spec": spec}}
    elif kind != "Job":
        spec["selector"] = {"matchLabels": {"app": "a"}}
        spec["template"]["spec"]["restartPolicy"] = "Always"
    if kind == "StatefulSet":
        spec["serviceName"] = "a"
    return {"apiVersion": group, "kind": kind, "metadata": {"name": "a"}, "spec": spec}


def warnings(kubectl: Kubectl, manifest: dict, namespace: str, dry_run: bool = True) -> list[str]:
    """What kubectl prints as warnings when ``manifest`` is applied (server-side dry run: the
    whole admission chain, nothing stored)."""
    args = ["apply", "-f", "-", "-n", namespace] + (["--dry-run=server"] if dry_run else [])
    proc = kubectl.run(SOURCE, *args, stdin=json.dumps(manifest))
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Warning:")]
    return [line.removeprefix(POLICY) for line in lines]


@pytest.fixture(scope="module")
def namespaces(installation: Installation, testbed: TestBed, kubectl: Kubectl):
    """``warnon`` (enabled) and ``warnoff`` (not); once the policy is in force."""
    kubectl(SOURCE, "create", "namespace", "warnon")
    kubectl(SOURCE, "label", "namespace", "warnon", "multicluster-scheduler=enabled")
    kubectl(SOURCE, "create", "namespace", "warnoff")
    wait_for(
        lambda: warnings(kubectl, pod({ELECT: ""}), "warnoff") != [],
        30,
        what="the warnings policy in force",
    )
    yield
    for name in ("warnon", "warnoff"):
        kubectl(SOURCE, "delete", "namespace", name, "--wait=false")


def test_a_misspelt_key_and_a_look_alike_are_named(namespaces, kubectl: Kubectl):
    manifest = workload(
        "Deployment", {"multicluster.admiralty.io/elected": "", "multicluster.admiralty/elect": ""}
    )
    assert warnings(kubectl, manifest, "warnon") == [
        'the pod template of this Deployment has annotation "multicluster.admiralty.io/elected", '
        'unknown to multicluster-scheduler: did you mean "multicluster.admiralty.io/elect"? As it '
        "is, its pods are not elected and run in this cluster",
        'the pod template of this Deployment has annotation "multicluster.admiralty/elect", not '
        '"multicluster.admiralty.io/elect": its pods are not elected and run in this cluster',
    ]


@pytest.mark.parametrize(
    "kind", ["Pod", "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob"]
)
def test_elected_in_a_namespace_that_is_not_enabled(namespaces, kubectl: Kubectl, kind: str):
    manifest = pod({ELECT: ""}) if kind == "Pod" else workload(kind, {ELECT: ""})
    what = "pod" if kind == "Pod" else f"pod template of this {kind}"
    runs = (
        "the pod is not elected and runs" if kind == "Pod" else "its pods are not elected and run"
    )
    assert warnings(kubectl, manifest, "warnoff") == [
        f"the {what} is elected (multicluster.admiralty.io/elect) but namespace warnoff is not "
        f"labelled multicluster-scheduler=enabled: {runs} in this cluster (kubectl label "
        "namespace warnoff multicluster-scheduler=enabled)"
    ]
    assert warnings(kubectl, manifest, "warnon") == []


def test_the_agents_own_namespace_never_elects(namespaces, kubectl: Kubectl):
    assert warnings(kubectl, pod({ELECT: ""}), "admiralty") == [
        "the pod is elected (multicluster.admiralty.io/elect) but namespace admiralty is never "
        "one where pods are elected: the pod is not elected and runs in this cluster"
    ]


def test_what_is_right_and_what_the_agent_makes_warn_no_one(namespaces, kubectl: Kubectl):
    known = {key: "" for key in POD_ANNOTATIONS if key != ELECT}
    assert warnings(kubectl, workload("Deployment", {ELECT: "", **known}), "warnon") == []
    assert warnings(kubectl, pod({"app": "x"}), "warnoff") == []
    # A delegate in a target's namespace, which nobody enabled.
    delegate = pod({ELECT: "", "multicluster.admiralty.io/parent-name": "p"})
    delegate["metadata"]["labels"] = {"multicluster.admiralty.io/parent-uid": "u"}
    assert warnings(kubectl, delegate, "warnoff") == []


def test_an_elected_pod_in_an_enabled_namespace_is_a_proxy_pod_and_warns_no_one(
    namespaces, kubectl: Kubectl
):
    """Created for real: the webhook makes it a proxy pod, which the policy leaves alone."""
    assert warnings(kubectl, pod({ELECT: ""}), "warnon", dry_run=False) == []
    created = kubectl.json(SOURCE, "get", "pod", "p", "-n", "warnon")
    assert created["spec"]["schedulerName"] == "admiralty-proxy"
    kubectl(SOURCE, "delete", "pod", "p", "-n", "warnon", "--wait=false")


KEYS = [
    "multicluster.admiralty.io/elected",
    "multicluster.admiralty.io/Elect",
    "multicluster.admiralty.io/no-reservations",
    "multicluster.admiralty/elect",
    "admiralty.io/elect",
    "multicluster.io/elect",
    "Elect",
    "example.com/admiralty-elect",
    "app",
    "example.com/election",
    "kubectl.kubernetes.io/default-container",
    *POD_ANNOTATIONS,
]


@pytest.mark.parametrize("key", KEYS)
def test_the_policy_and_keycheck_agree(namespaces, kubectl: Kubectl, key: str):
    if key in SAVED:
        # Only the webhook writes the saved manifest and its MAC: brought by anyone, the pod
        # is refused before any warning (tests/webhook, e2e/test_admission_integrity.py).
        with pytest.raises(CommandError, match="did not write for you"):
            warnings(kubectl, pod({key: ""}), "warnon")
        return
    said = warnings(kubectl, pod({key: ""}), "warnon")
    if key == ELECT:
        assert said == []  # enabled: a proxy pod (dry run), left alone
        return
    mistake = key_mistake(key)
    assert len(said) == (mistake is not None), said
    if mistake is not None:
        assert f'"{key}"' in said[0]
