"""The product as users run it: ``helm install`` of the chart's Deployment, from the image
``./dev image`` builds, in clusters with a real node each (kubelet and containerd,
:mod:`testbed.realnode`); then, on that installation, what users do and what they live through.

- This machine's settings untouched while real nodes run pods.
- Two agent pods per cluster on the real node, as uid 65532 on a read-only root filesystem,
  ready by their probes, one leading; the API server calls the webhook through the chart's
  Service with the CA the agent made.
- The user guide end to end: ``join`` (the target's address as pods see it), nginx over both
  clusters, the region patch, ``expose``.
- ``kubectl logs`` and ``exec`` on proxy pods: the API server calls the kubelet API served
  from the leading agent's pod.
- An Argo workflow with Argo's real executor in the containers: output parameters pass from
  cluster1 to cluster2 and back.
- ``helm upgrade`` rolls the agents while elected pods keep being created: none is refused.
- The leading pod killed: the other leads within the Lease's duration; deleted: at once.
- ``helm uninstall`` after the documented clean-up leaves nothing of ours but what the docs say
  stays (the CRDs, and the ClusterSummary each cluster published).

One test bed and one installation serve the whole module, in this order (each test leaves the
installation as it found it). Skipped, saying why, where real nodes cannot run.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from e2e.scenarios import (
    REGION,
    SOURCE,
    TARGET,
    all_running,
    delegates,
    nginx,
    nothing_left,
    proxies,
    running_and_ready,
)
from multicluster_scheduler.api.keys import PREFIX
from testbed import TestBed, wait_for
from testbed.host import machine_settings
from testbed.incluster import InClusterInstallation
from testbed.install import NAMESPACE, RELEASE
from testbed.kubectl import CommandError, Kubectl
from testbed.realnode import HOST_ADDRESS, REAL_NODE_KEY

# On a fresh machine the module's set-up builds kubelet, containerd and the image first (./dev
# test does it before pytest).
pytestmark = pytest.mark.timeout(1200)
ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = (SOURCE, TARGET)
GUIDE = "guide"  # the namespace of the guide's objects, in both clusters
LEASE_DURATION = 15.0  # the chart's agent.leaderElection.leaseDuration
RETRY_PERIOD = 2.0
ECHO_CLUSTER = ("sh", "-c", "echo $CLUSTER")  # kwok runs it here, with the cluster's name


@pytest.fixture(scope="module")
def bed(real_node_testbed) -> TestBed:
    return real_node_testbed[0]


@pytest.fixture(scope="module")
def kube(bed: TestBed) -> Kubectl:
    return Kubectl(bed.kubeconfig, bed.bin_dir)


@pytest.fixture(scope="module")
def installed(real_node_testbed, kube: Kubectl):
    bed, image = real_node_testbed
    installation = InClusterInstallation(bed, image)
    installation.install()
    print(
        "\nhelm install --wait (2 replicas Ready): "
        + ", ".join(f"{c} {s:.1f}s" for c, s in installation.install_seconds.items())
    )
    yield installation
    if installation.installed:
        installation.uninstall()


def cli(*args: str, kubeconfig: Path) -> str:
    """The ``multicluster-scheduler`` command, as users run it from their machine."""
    proc = subprocess.run(
        [sys.executable, "-m", "multicluster_scheduler.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONPATH=str(ROOT)),
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def joined(installed: InClusterInstallation, bed: TestBed, kube: Kubectl):
    """Namespace ``guide`` in both clusters, cluster1 joined to cluster2 (target c2) and to
    itself (c1) with ``multicluster-scheduler join``, elected pods enabled; undone afterwards as
    the docs say (before uninstalling)."""
    for context in CLUSTERS:
        kube(context, "create", "namespace", GUIDE)
    # The agent in cluster1's pods reaches cluster2's API server where pods see this machine.
    server = f"https://{HOST_ADDRESS}:{bed[TARGET].apiserver_port}"
    started = time.monotonic()
    print(
        cli(
            "join",
            f"--source-context={SOURCE}",
            f"--target-context={TARGET}",
            f"--namespace={GUIDE}",
            "--name=c1",
            "--target-name=c2",
            f"--server={server}",
            kubeconfig=bed.kubeconfig,
        )
    )
    print(
        cli(
            "join",
            f"--source-context={SOURCE}",
            f"--target-context={SOURCE}",
            f"--namespace={GUIDE}",
            "--target-name=c1",
            kubeconfig=bed.kubeconfig,
        )
    )
    print(f"joined in {time.monotonic() - started:.1f}s")
    kube(SOURCE, "label", "namespace", GUIDE, "multicluster-scheduler=enabled")
    yield [f"admiralty-namespace-{GUIDE}-c1", f"admiralty-namespace-{GUIDE}-c2"]
    clean_up(kube)


def clean_up(kube: Kubectl) -> None:
    """The docs' steps before uninstalling: workloads, the label, Targets and their Secret, the
    Source; then the namespaces."""
    if kube.run(SOURCE, "get", "namespace", GUIDE, check=False).returncode != 0:
        return
    for kind in ("deployments", "services", "pods"):
        kube(SOURCE, "delete", kind, "--all", "-n", GUIDE, "--wait=false")
    wait_for(lambda: nothing_left(kube, GUIDE), 90, what="no proxy pod nor delegate left")
    kube(SOURCE, "label", "namespace", GUIDE, "multicluster-scheduler-")
    kube(SOURCE, "delete", "targets", "--all", "-n", GUIDE, "--timeout=60s")
    kube(SOURCE, "delete", "secret", "c2", "-n", GUIDE, "--ignore-not-found")
    kube(TARGET, "delete", "sources", "--all", "-n", GUIDE, "--timeout=60s")
    for context in CLUSTERS:
        kube(context, "delete", "namespace", GUIDE, "--timeout=120s", timeout=150)


def agent_pods(installed: InClusterInstallation, context: str) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in installed.ready_pods(context)}


def metric(kube: Kubectl, context: str, pod: str, name: str) -> float:
    """A counter of one agent pod, read through the API server's pod proxy (port 8080)."""
    text = kube(
        context, "get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}:8080/proxy/metrics"
    )
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_agents_run_in_their_pods(installed: InClusterInstallation, kube: Kubectl):
    for context in CLUSTERS:
        pods = agent_pods(installed, context)
        assert len(pods) == 2, f"2 replicas Ready in {context}: {sorted(pods)}"
        for name, pod in pods.items():
            assert pod["spec"]["nodeName"] == f"{context}-real-node"
            (container,) = pod["status"]["containerStatuses"]
            assert container["image"].endswith(installed.image.rpartition("/")[2])
            assert container["restartCount"] == 0, f"{name} restarted"
            exec_ = ("exec", name, "-n", NAMESPACE, "--")
            assert kube(context, *exec_, "id", "-u").strip() == "65532"
            wrote = kube.run(context, *exec_, "touch", "/written", check=False)
            assert "Read-only file system" in wrote.stderr
        assert installed.leader(context) in pods
        # The webhook is the chart's Service (no URL), its endpoints the two pods.
        configuration = kube.json(context, "get", "mutatingwebhookconfiguration", RELEASE)
        client = configuration["webhooks"][0]["clientConfig"]
        assert client["service"]["name"] == RELEASE
        assert "url" not in client
        secret = kube.json(context, "get", "secret", f"{RELEASE}-webhook-ca", "-n", NAMESPACE)
        assert base64.b64decode(client["caBundle"]) == base64.b64decode(secret["data"]["ca.crt"])
        slices = kube.json(
            context,
            "get",
            "endpointslices",
            "-n",
            NAMESPACE,
            "-l",
            f"kubernetes.io/service-name={RELEASE}",
        )["items"]
        addresses = {a for s in slices for e in s["endpoints"] for a in e["addresses"]}
        assert addresses == {p["status"]["podIP"] for p in pods.values()}
        log = kube(context, "logs", installed.leader(context), "-n", NAMESPACE)
        assert "became leader" in log
        assert "Forbidden" not in log, log
        assert " 403 " not in log, log


def test_the_machine_is_left_as_it_was(installed, bed: TestBed):
    """Real nodes running, with pods: this machine's kernel settings, interfaces, addresses,
    routes, iptables and mounts are what they were before (their namespaces hold the rest)."""
    now = machine_settings()
    changed = {k: (v, now.get(k)) for k, v in bed.machine_before.items() if now.get(k) != v}
    assert changed == {}


def test_the_user_guide_in_cluster(installed, joined: list[str], kube: Kubectl):
    nodes = joined
    started = time.monotonic()
    kube.apply(SOURCE, nginx(), "-n", GUIDE)
    wait_for(lambda: all_running(kube, GUIDE, 10), 120, interval=0.25, what="10 proxy pods Running")
    deployed = time.monotonic()
    print(f"the guide's nginx: 10 proxy pods Running {deployed - started:.1f}s after apply")
    found = proxies(kube, GUIDE)
    assert {p["spec"]["nodeName"] for p in found} == set(nodes), "over both clusters"
    placed = delegates(kube, SOURCE, GUIDE) + delegates(kube, TARGET, GUIDE)
    assert len(placed) == 10
    assert all(running_and_ready(d) for d in placed)
    assert not any(d["spec"]["nodeName"].endswith("real-node") for d in placed)
    by_uid = {p["metadata"]["uid"] for p in found}
    assert {d["metadata"]["labels"][PREFIX + "parent-uid"] for d in placed} == by_uid

    # Advanced Scheduling: the guide's patch sends everything to the eu region (cluster2).
    patch = {"spec": {"template": {"spec": {"nodeSelector": {REGION: "eu"}}}}}
    kube(SOURCE, "-n", GUIDE, "patch", "deployment", "nginx", "-p", json.dumps(patch))

    def moved() -> bool:
        found = proxies(kube, GUIDE)
        return (
            len(found) == 10
            and all(running_and_ready(p) and p["spec"]["nodeName"] == nodes[1] for p in found)
            and not delegates(kube, SOURCE, GUIDE)
            and len(delegates(kube, TARGET, GUIDE)) == 10
        )

    wait_for(moved, 120, interval=0.5, what="all delegates in cluster2")
    patched = time.monotonic()
    print(f"moved to eu in {patched - deployed:.1f}s")

    # Service Reroute and Globalization.
    kube(SOURCE, "-n", GUIDE, "expose", "deployment", "nginx")

    def copied() -> dict | None:
        proc = kube.run(TARGET, "get", "service", "nginx", "-n", GUIDE, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    copy = wait_for(copied, 30, what="the Service copied to cluster2")
    original = kube.json(SOURCE, "get", "service", "nginx", "-n", GUIDE)
    assert original["spec"]["selector"] == {PREFIX + "app": "nginx"}
    assert original["metadata"]["annotations"]["io.cilium/global-service"] == "true"
    assert copy["spec"]["selector"] == {PREFIX + "app": "nginx"}
    print(f"service rerouted and copied in {time.monotonic() - patched:.1f}s")
    kube(SOURCE, "-n", GUIDE, "delete", "service", "nginx", "--timeout=30s")
    kube(SOURCE, "-n", GUIDE, "delete", "deployment", "nginx")
    wait_for(lambda: nothing_left(kube, GUIDE), 90, what="no proxy nor delegate left")


def elected_pod(name: str, region: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": GUIDE,
            "annotations": {PREFIX + "elect": ""},
        },
        "spec": {
            "nodeSelector": {REGION: region},
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }


def test_logs_and_exec_on_proxy_pods(installed, joined, kube: Kubectl, bed: TestBed):
    """The API server calls the kubelet API of the virtual node at the leading agent's pod; the
    agent relays to the delegate's cluster (kwok answers there, saying which cluster it is)."""
    for name, region in (("debug-there", "eu"), ("debug-here", "us")):
        kube.apply(SOURCE, elected_pod(name, region))
    for name, context in (("debug-there", TARGET), ("debug-here", SOURCE)):
        wait_for(
            lambda n=name: running_and_ready(kube.json(SOURCE, "get", "pod", n, "-n", GUIDE)),
            60,
            what=f"{name} Running",
        )
        logged = kube(SOURCE, "logs", name, "-n", GUIDE, "-c", "main", "--tail=1")
        assert logged.startswith(f"{context} line"), logged
        ran = kube(SOURCE, "exec", name, "-n", GUIDE, "-c", "main", "--", *ECHO_CLUSTER)
        assert ran == f"{context}\n"
    leader = installed.leader(SOURCE)
    relayed = metric(kube, SOURCE, leader, "multicluster_scheduler_kubelet_api_requests_total{")
    assert relayed >= 4
    kube(SOURCE, "delete", "pods", "debug-there", "debug-here", "-n", GUIDE)


# What Argo's install gives a workflow's service account so its executor can report a step's
# outputs (WorkflowTaskResults): wherever the executor runs, so in every target too.
ARGO_EXECUTOR_RBAC = """apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: argo-executor}
rules:
- apiGroups: [argoproj.io]
  resources: [workflowtaskresults]
  verbs: [create, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: argo-executor}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: argo-executor}
subjects: [{kind: ServiceAccount, name: default}]
"""


def argo_workflow(image: str) -> str:
    """A DAG of three elected steps on the real nodes (Argo's executor runs in containers): one
    in cluster1 writes an output parameter; the next, in cluster2, gets it as an argument and
    writes its reply; the last, in cluster1 again, prints that reply."""
    toleration = f"{{key: {REAL_NODE_KEY}, operator: Exists, effect: NoSchedule}}"
    write = "import sys; open('/tmp/out', 'w').write(' '.join(sys.argv[1:]))"
    return f"""apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {{name: relay}}
spec:
  entrypoint: main
  podMetadata: {{annotations: {{{PREFIX}elect: ""}}}}
  tolerations: [{toleration}]
  templates:
  - name: main
    dag:
      tasks:
      - name: produce
        template: write
        arguments:
          parameters:
          - {{name: region, value: us}}
          - {{name: text, value: made in cluster1}}
      - name: reply
        depends: produce
        template: write
        arguments:
          parameters:
          - {{name: region, value: eu}}
          - name: text
            value: "cluster2 got: {{{{tasks.produce.outputs.parameters.out}}}}"
      - name: finish
        depends: reply
        template: print
        arguments:
          parameters:
          - {{name: text, value: "{{{{tasks.reply.outputs.parameters.out}}}}"}}
  - name: write
    inputs: {{parameters: [{{name: region}}, {{name: text}}]}}
    nodeSelector: {{{REAL_NODE_KEY}: "true", {REGION}: "{{{{inputs.parameters.region}}}}"}}
    container:
      image: {image}
      imagePullPolicy: Never
      command: [python3, -c, "{write}", "{{{{inputs.parameters.text}}}}"]
    outputs:
      parameters:
      - {{name: out, valueFrom: {{path: /tmp/out}}}}
  - name: print
    inputs: {{parameters: [{{name: text}}]}}
    nodeSelector: {{{REAL_NODE_KEY}: "true", {REGION}: us}}
    container:
      image: {image}
      imagePullPolicy: Never
      command: [python3, -c, "import sys; print(sys.argv[1])", "{{{{inputs.parameters.text}}}}"]
"""


def test_an_argo_workflow_with_its_real_executor_passes_outputs_between_clusters(
    real_node_testbed, installed, joined, kube: Kubectl, bed: TestBed
):
    """Argo's controller in cluster1, its executor (argoexec, built from its module) in the
    pods' containers on the real nodes. Outputs go both ways: a step's output parameter, which
    its executor reports where it runs, reaches the next step in the other cluster, and the
    reply of the step in cluster2 comes back (its task result brought to cluster1 by the
    agent) for the last step, whose real container prints it (``kubectl logs`` on its proxy
    pod). Cluster2 has Argo's WorkflowTaskResult CRD and the executor's RBAC, as Argo asks of
    every cluster where its executor runs."""
    _, image = real_node_testbed
    nodes = joined
    crd = bed[SOURCE].argo_bin / "crds" / "argoproj.io_workflowtaskresults.yaml"
    kube(TARGET, "apply", "-f", str(crd))
    for context, region in ((SOURCE, "us"), (TARGET, "eu")):
        kube.apply(context, ARGO_EXECUTOR_RBAC, "-n", GUIDE)
        kube(context, "label", "node", f"{context}-real-node", f"{REGION}={region}")
    started = time.monotonic()
    kube.apply(SOURCE, argo_workflow(image), "-n", GUIDE)

    def finished() -> dict | None:
        found = kube.json(SOURCE, "get", "workflow", "relay", "-n", GUIDE)
        phase = (found.get("status") or {}).get("phase")
        return found if phase in ("Succeeded", "Failed", "Error") else None

    try:
        done = wait_for(finished, 180, interval=0.5, what="workflow relay to end")
        print(
            f"\nArgo workflow on real nodes: {done['status']['phase']} "
            f"in {time.monotonic() - started:.1f}s"
        )
        steps = {n["displayName"]: n for n in done["status"]["nodes"].values()}
        assert done["status"]["phase"] == "Succeeded", steps
        outputs = {
            name: [(p["name"], p["value"]) for p in steps[name]["outputs"]["parameters"]]
            for name in ("produce", "reply")
        }
        assert outputs == {
            "produce": [("out", "made in cluster1")],
            "reply": [("out", "cluster2 got: made in cluster1")],
        }
        where = {name: steps[name]["hostNodeName"] for name in ("produce", "reply", "finish")}
        assert where == {"produce": nodes[0], "reply": nodes[1], "finish": nodes[0]}
        by_step = {
            p["metadata"]["annotations"].get("workflows.argoproj.io/node-name"): p["metadata"]
            for p in proxies(kube, GUIDE)
        }
        (delegate,) = (
            d
            for d in delegates(kube, TARGET, GUIDE)
            if d["metadata"]["annotations"][PREFIX + "parent-name"]
            == by_step["relay.reply"]["name"]
        )
        assert delegate["spec"]["nodeName"] == f"{TARGET}-real-node"
        # The reply's task result came back to cluster1 (where Argo read it) and is gone from
        # cluster2, where its executor wrote it.
        left = kube.json(TARGET, "get", "workflowtaskresults", "-n", GUIDE)["items"]
        assert left == []
        # What the last step's real container printed, from its proxy pod.
        logged = kube(SOURCE, "logs", by_step["relay.finish"]["name"], "-n", GUIDE, "-c", "main")
        assert "cluster2 got: made in cluster1" in logged.splitlines()
    finally:
        kube(SOURCE, "delete", "workflow", "relay", "-n", GUIDE, "--ignore-not-found")
        wait_for(lambda: nothing_left(kube, GUIDE), 90, what="no proxy nor delegate left")
        for context in (SOURCE, TARGET):
            kube(context, "label", "node", f"{context}-real-node", f"{REGION}-")
            kube(context, "delete", "-n", GUIDE, "-f", "-", stdin=ARGO_EXECUTOR_RBAC)
        kube(TARGET, "delete", "-f", str(crd))


def test_helm_upgrade_rolls_the_agents_without_failed_admissions(
    installed: InClusterInstallation, joined, kube: Kubectl, bed: TestBed
):
    """Elected pods keep being created while the agents roll (a pod template change): the
    webhook, behind the Service, answers every one of them."""
    before = set(agent_pods(installed, SOURCE))
    rest = bed[SOURCE].rest
    results: list[tuple[float, int, str]] = []
    stop = threading.Event()

    def create_pods() -> None:
        i = 0
        while not stop.is_set():
            pod = elected_pod(f"roll-{i}", "eu")
            pod["spec"]["containers"][0]["image"] = "nginx"
            try:
                status, body = rest.request(
                    "POST", f"/api/v1/namespaces/{GUIDE}/pods", pod, timeout=30
                )
                results.append((time.monotonic(), status, body.decode(errors="replace")[:300]))
            except OSError as e:
                results.append((time.monotonic(), 0, repr(e)))
            i += 1
            stop.wait(0.25)

    creator = threading.Thread(target=create_pods, name="elected-pods", daemon=True)
    creator.start()
    try:
        time.sleep(2)
        seconds = installed.upgrade(SOURCE, "agent.podAnnotations.rolled=yes")
        # The old pods may still be stopping: keep creating until they are gone.
        wait_for(
            lambda: not (before & {p["metadata"]["name"] for p in installed.pods(SOURCE)}),
            120,
            interval=0.5,
            what="the old agent pods gone",
        )
        time.sleep(2)
    finally:
        stop.set()
        creator.join(30)
    refused = [(status, body) for _, status, body in results if status != 201]
    print(
        f"helm upgrade --wait took {seconds:.1f}s; {len(results)} elected pods created during "
        f"the roll, {len(refused)} refused"
    )
    assert refused == [], refused[:3]
    after = agent_pods(installed, SOURCE)
    assert len(after) == 2
    assert not set(after) & before, "both replicas replaced"
    created = [p for p in proxies(kube, GUIDE) if p["metadata"]["name"].startswith("roll-")]
    assert len(created) == len(results), "every admitted pod became a proxy pod"
    wait_for(lambda: installed.leader(SOURCE) in after, 30, what="a new pod leading")
    kube(SOURCE, "delete", "pods", "-n", GUIDE, "--all", "--wait=false")
    wait_for(lambda: nothing_left(kube, GUIDE), 120, what="the roll's pods gone")


def container_id(pod: dict) -> str:
    (container,) = pod["status"]["containerStatuses"]
    return container["containerID"].split("://", 1)[1]


def test_the_other_pod_leads_when_the_leader_is_killed(
    installed: InClusterInstallation, joined, kube: Kubectl, bed: TestBed
):
    """Killed: the pod deleted and its process SIGKILLed at once (a crash that also takes the
    pod, say its node): nothing releases the Lease, so the other waits for it to expire. Then
    deleted as users and evictions do: the stopping replica releases the Lease at once."""
    pods = agent_pods(installed, SOURCE)
    leader = installed.leader(SOURCE)
    (other,) = set(pods) - {leader}
    bed[SOURCE].real_node.ctr("tasks", "kill", "--signal", "SIGKILL", container_id(pods[leader]))
    killed = time.monotonic()
    kube(SOURCE, "delete", "pod", leader, "-n", NAMESPACE, "--grace-period=0", "--force")
    wait_for(lambda: installed.leader(SOURCE) == other, LEASE_DURATION + 15, interval=0.2)
    takeover = time.monotonic() - killed
    print(f"leader {leader} killed; {other} leads {takeover:.1f}s later")
    assert takeover <= LEASE_DURATION + RETRY_PERIOD + 3
    assert takeover >= LEASE_DURATION - 5, "the dead leader's Lease is respected until it expires"
    # The new leader places pods.
    kube.apply(SOURCE, elected_pod("after-takeover", "eu"))
    wait_for(
        lambda: running_and_ready(kube.json(SOURCE, "get", "pod", "after-takeover", "-n", GUIDE)),
        60,
        what="a pod placed by the new leader",
    )
    kube(SOURCE, "delete", "pod", "after-takeover", "-n", GUIDE)
    wait_for(lambda: len(agent_pods(installed, SOURCE)) == 2, 90, what="a replacement ready")

    (follower,) = set(agent_pods(installed, SOURCE)) - {other}
    deleted = time.monotonic()
    kube(SOURCE, "delete", "pod", other, "-n", NAMESPACE, "--wait=false")
    # The released Lease goes to whichever candidate asks first: the follower, or the deleted
    # pod's replacement starting meanwhile.
    wait_for(lambda: installed.leader(SOURCE) not in ("", other), LEASE_DURATION, interval=0.1)
    handover = time.monotonic() - deleted
    print(f"leader {other} deleted; {installed.leader(SOURCE)} leads {handover:.1f}s later")
    assert handover <= RETRY_PERIOD + 3
    wait_for(lambda: len(agent_pods(installed, SOURCE)) == 2, 90, what="a replacement ready")
    # A pod going away disturbs no other: the follower reached its API server all along (a
    # node's network that lost its gateway for half a minute failed this).
    time.sleep(max(0.0, deleted + 15 - time.monotonic()))  # past a 5 s request timeout, twice
    since = f"--since={int(time.monotonic() - deleted) + 1}s"
    log = kube(SOURCE, "logs", follower, "-n", NAMESPACE, since)
    assert "no answer" not in log, log
    assert follower in agent_pods(installed, SOURCE)


def ours(kube: Kubectl, context: str) -> list[str]:
    """What of ours is left in a cluster, beyond what the docs say uninstalling keeps."""
    left = kube(
        context,
        "get",
        "all,secrets,configmaps,leases,serviceaccounts,roles,rolebindings,"
        "poddisruptionbudgets,endpointslices",
        "-n",
        NAMESPACE,
        "-o",
        "name",
    ).split()
    left = [n for n in left if not n.endswith(("/default", "/kube-root-ca.crt"))]
    for kind in (
        "mutatingwebhookconfigurations",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
        "clusterroles",
        "clusterrolebindings",
    ):
        left += [n for n in kube(context, "get", kind, "-o", "name").split() if RELEASE in n]
    left += [
        n
        for n in kube(context, "get", "leases,rolebindings", "-A", "-o", "name").split()
        if "admiralty" in n or RELEASE in n
    ]
    left += kube(context, "get", "nodes", "-l", "virtual-kubelet.io/provider", "-o", "name").split()
    for csr in kube.json(context, "get", "csr")["items"]:
        if csr["spec"]["username"].startswith(f"system:serviceaccount:{NAMESPACE}:"):
            left.append("certificatesigningrequest/" + csr["metadata"]["name"])
    return left


def test_helm_uninstall_leaves_nothing_of_ours(
    installed: InClusterInstallation, kube: Kubectl, bed: TestBed
):
    clean_up(kube)  # the docs' steps first, while the agents run
    installed.uninstall()
    for context in CLUSTERS:
        wait_for(
            lambda c=context: not installed.pods(c),
            90,
            what=f"the agent pods gone from {context}",
        )
        wait_for(lambda c=context: not ours(kube, c), 60, interval=1, what=f"{context} clean")
        # What the docs say stays: the CRDs, and this cluster's ClusterSummary with them.
        crds = kube(context, "get", "crd", "-o", "name")
        assert "targets.multicluster.admiralty.io" in crds
        summaries = kube(context, "get", "clustersummaries", "-o", "name").split()
        print(f"{context}: after helm uninstall, left: CRDs, {summaries}")
        node = bed[context].real_node
        wait_for(
            lambda n=node: not agent_tasks(n),
            60,
            what=f"no agent container running on {context}'s real node",
        )
    with pytest.raises(CommandError):
        kube(SOURCE, "get", "namespace", GUIDE)


def agent_tasks(node) -> list[str]:
    """Containers of the agent's image with a running process on a real node."""
    found = []
    for line in node.ctr("tasks", "list").splitlines()[1:]:
        task, _, status = line.split()
        if status == "RUNNING" and RELEASE in node.ctr("containers", "info", task):
            found.append(task)
    return found
