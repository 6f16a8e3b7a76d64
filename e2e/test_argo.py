"""Argo Workflows across clusters, the seed guide's headline use case: a DAG workflow whose
steps are elected runs its steps in the clusters their node selectors ask for, fans out, passes
an output from one step to the next, and Argo's retry strategy moves a failed step to another
cluster.

Argo's own controller (v4, built from its Go module: testbed.argo) runs in cluster1. Its
executor runs in containers, which fake nodes lack: the test bed's stages end a pod's
containers with the exit code its ``testbed.multicluster-scheduler.io/exit-code`` annotation
asks for, which is all a step's container does here. Outputs that only the executor reports
(output parameters, artifacts) cannot exist without it; the exit code, which Argo's controller
reads from the pod's container statuses (copied from the delegate's), is passed on instead.
"""

from __future__ import annotations

import json
import time

import pytest

from e2e.scenarios import SOURCE, TARGET, delegates, proxies
from multicluster_scheduler.api.keys import PREFIX
from testbed import wait_for
from testbed.kubectl import Kubectl

EXIT_CODE = "testbed.multicluster-scheduler.io/exit-code"
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"

# Every step elected, and its containers ending with exit code 0 unless a template says
# otherwise (template metadata wins over the workflow's podMetadata, as Argo merges them).
POD_METADATA = f"""  podMetadata:
    annotations:
      multicluster.admiralty.io/elect: ""
      {EXIT_CODE}: "0"
"""

STEP = """  - name: step
    inputs:
      parameters:
      - name: region
      - name: upstream
        value: none
    nodeSelector:
      topology.kubernetes.io/region: "{{inputs.parameters.region}}"
    container:
      image: busybox
      command: [sh, -c, "echo upstream exit code {{inputs.parameters.upstream}}"]
      resources: {requests: {cpu: 10m, memory: 16Mi}}
  - name: anywhere
    container:
      image: busybox
      command: [sh, -c, "echo {{pod.name}}"]
      resources: {requests: {cpu: 10m, memory: 16Mi}}
"""


def retried(name: str, exit_code: str) -> str:
    """A template retried once on another node (Argo's nodeAntiAffinity: away from the failed
    pod's node, here the virtual node of the target it failed in), whose containers end with
    ``exit_code`` (an Argo expression may choose it by attempt)."""
    return f"""  - name: {name}
    retryStrategy:
      limit: "1"
      retryPolicy: Always
      affinity:
        nodeAntiAffinity: {{}}
    metadata:
      annotations:
        {EXIT_CODE}: "{exit_code}"
    container:
      image: busybox
      command: [sh, -c, "exit 1"]
      resources: {{requests: {{cpu: 10m, memory: 16Mi}}}}
"""


ACROSS = (
    """apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata:
  name: across
spec:
  entrypoint: main
"""
    + POD_METADATA
    + """  templates:
  - name: main
    dag:
      tasks:
      - name: us
        template: step
        arguments: {parameters: [{name: region, value: us}]}
      - name: eu
        depends: us
        template: step
        arguments:
          parameters:
          - {name: region, value: eu}
          - {name: upstream, value: "{{tasks.us.exitCode}}"}
      - name: fan
        depends: us
        template: anywhere
        withSequence: {count: "10"}
      - name: flaky
        depends: us
        template: flaky
"""
    + STEP
    # Fails on its first attempt, wherever that is, and succeeds on the next.
    + retried("flaky", "{{=retries == '0' ? '1' : '0'}}")
)

ALWAYS_FAILS = (
    """apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata:
  name: fails
spec:
  entrypoint: broken
"""
    + POD_METADATA
    + "  templates:\n"
    + retried("broken", "1")
)


@pytest.fixture
def argo(guide, kubectl: Kubectl):
    """The guide's namespace with targets c1 and c2; its workflows deleted afterwards (their
    pods go with them, by Argo's owner references)."""
    yield guide
    namespace, _ = guide
    kubectl(SOURCE, "delete", "workflows", "--all", "-n", namespace, "--wait=false")


def workflow(kubectl: Kubectl, namespace: str, name: str) -> dict:
    return kubectl.json(SOURCE, "get", "workflow", name, "-n", namespace)


def finished(kubectl: Kubectl, namespace: str, name: str) -> dict | None:
    found = workflow(kubectl, namespace, name)
    phase = (found.get("status") or {}).get("phase")
    return found if phase in ("Succeeded", "Failed", "Error") else None


def run(kubectl: Kubectl, namespace: str, manifest: str, name: str, timeout: float) -> dict:
    """Submit a workflow and wait for it to end; print how long it took."""
    started = time.monotonic()
    kubectl.apply(SOURCE, manifest, "-n", namespace)
    done = wait_for(
        lambda: finished(kubectl, namespace, name), timeout, what=f"workflow {name} to end"
    )
    print(f"\nworkflow {name}: {done['status']['phase']} in {time.monotonic() - started:.1f}s")
    return done


def pod_nodes(status: dict) -> dict[str, dict]:
    """The workflow's Pod nodes by display name (a retried step: several, ``flaky(0)``...)."""
    return {n["displayName"]: n for n in status["nodes"].values() if n["type"] == "Pod"}


def where_delegates_ran(kubectl: Kubectl, namespace: str, workflow_name: str) -> dict[str, str]:
    """Proxy pod name -> the cluster its delegate ran in, for the workflow's pods."""
    uids = {
        p["metadata"]["uid"]: p["metadata"]["name"]
        for p in proxies(kubectl, namespace)
        if (p["metadata"].get("labels") or {}).get(WORKFLOW_LABEL) == workflow_name
    }
    found = {}
    for context in (SOURCE, TARGET):
        for delegate in delegates(kubectl, context, namespace):
            uid = delegate["metadata"]["labels"][PREFIX + "parent-uid"]
            if uid in uids:
                found[uids[uid]] = context
    return found


def delegate_command(kubectl: Kubectl, context: str, namespace: str, proxy_name: str) -> str:
    for delegate in delegates(kubectl, context, namespace):
        if delegate["metadata"]["annotations"].get(PREFIX + "parent-name") == proxy_name:
            main = next(c for c in delegate["spec"]["containers"] if c["name"] == "main")
            return json.dumps(main.get("command", []) + main.get("args", []))
    raise AssertionError(f"no delegate of {proxy_name} in {context}")


def test_a_dag_runs_its_steps_where_their_selectors_say_fans_out_and_retries_elsewhere(
    argo,
    regions,
    kubectl: Kubectl,
):
    namespace, nodes = argo
    cluster_of_node = {nodes[0]: SOURCE, nodes[1]: TARGET}
    done = run(kubectl, namespace, ACROSS, "across", timeout=180)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")

    steps = pod_nodes(done["status"])
    assert steps["us"]["hostNodeName"] == nodes[0]
    assert steps["eu"]["hostNodeName"] == nodes[1]
    assert len([name for name in steps if name.startswith("fan(")]) == 10
    # Every pod of the workflow was a proxy whose delegate ran in the cluster of its node.
    ran = where_delegates_ran(kubectl, namespace, "across")
    pod_names = {n["id"]: n for n in done["status"]["nodes"].values() if n["type"] == "Pod"}
    assert len(ran) == len(pod_names) == 14  # us, eu, 10 fan, flaky twice
    by_proxy = {
        p["metadata"]["name"]: p
        for p in proxies(kubectl, namespace)
        if p["metadata"]["labels"].get(WORKFLOW_LABEL) == "across"
    }
    for proxy_name, context in ran.items():
        assert cluster_of_node[by_proxy[proxy_name]["spec"]["nodeName"]] == context

    # The exit code of "us", read by Argo from its proxy's status (copied from its delegate in
    # cluster1), reached the step in cluster2 as an argument.
    eu_pod = next(
        name
        for name, p in by_proxy.items()
        if p["metadata"]["annotations"].get("workflows.argoproj.io/node-name") == "across.eu"
    )
    assert ran[eu_pod] == TARGET
    assert "upstream exit code 0" in delegate_command(kubectl, TARGET, namespace, eu_pod)

    # flaky failed once, and Argo's retry went to the other cluster.
    first, second = steps["flaky(0)"], steps["flaky(1)"]
    assert first["phase"] == "Failed"
    assert second["phase"] == "Succeeded"
    assert {first["hostNodeName"], second["hostNodeName"]} == set(nodes)


def test_a_step_failing_in_every_cluster_fails_the_workflow(argo, kubectl: Kubectl):
    namespace, nodes = argo
    done = run(kubectl, namespace, ALWAYS_FAILS, "fails", timeout=120)
    assert done["status"]["phase"] == "Failed"
    attempts = pod_nodes(done["status"])
    assert sorted(attempts) == ["fails(0)", "fails(1)"]
    assert all(a["phase"] == "Failed" for a in attempts.values())
    assert {a["hostNodeName"] for a in attempts.values()} == set(nodes)
    assert all(a["outputs"]["exitCode"] == "1" for a in attempts.values())
    ran = where_delegates_ran(kubectl, namespace, "fails")
    assert sorted(ran.values()) == [SOURCE, TARGET]
