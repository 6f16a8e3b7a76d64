"""What the end-to-end scenarios share: the user guide's topology on the test bed (cluster1 is a
source and its own target ``c1``, cluster2 a target ``c2``, connected as the guide does it, with
RBAC made by hand where the Source controller would make it), what the tests read of proxy pods
and delegates, the workloads of Kubernetes' built-in controllers with elected pod templates, the
command as users run it, faults of the test bed, and a tenant of cluster1.

The fixtures built on them (``guide``, ``regions``, ``workloads``) are in conftest.py; product
keys come from :mod:`multicluster_scheduler.api.keys`, the guide's manifests from
:mod:`testbed.guide`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from multicluster_scheduler.api.keys import API_VERSION, PREFIX, PROXY_SCHEDULER_NAME
from testbed import TestBed, guide, wait_for
from testbed.guide import REGION, condition, nginx, running_and_ready
from testbed.kubectl import Kubectl

SOURCE, TARGET = "cluster1", "cluster2"
REAL_NODES = "virtual-kubelet.io/provider!=admiralty"  # every node but virtual ones
EXIT_CODE = "testbed.multicluster-scheduler.io/exit-code"  # the test bed's kwok stages
# Kinds the guide fixture does not delete (it deletes deployments, jobs, daemonsets and pods).
MORE_KINDS = ("cronjobs", "statefulsets", "replicasets", "poddisruptionbudgets")
TENANT = "tenant"  # a user of cluster1 with Targets and Secrets in one namespace (grant_tenant)
ROOT = Path(__file__).resolve().parents[1]

__all__ = [
    "REGION",
    "condition",
    "nginx",
    "running_and_ready",
]  # the guide's, lent to the tests too


def grant_source(kubectl: Kubectl, namespace: str) -> None:
    """The guide's alternative to the Source controller: a service account and bindings."""
    kubectl.apply(
        TARGET,
        f"""apiVersion: v1
kind: ServiceAccount
metadata:
  name: c1
  namespace: {namespace}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: admiralty-source-c1
  namespace: {namespace}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: multicluster-scheduler-source
subjects:
  - kind: ServiceAccount
    name: c1
    namespace: {namespace}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: admiralty-source-{namespace}-c1-cluster-summary-viewer
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: multicluster-scheduler-cluster-summary-viewer
subjects:
  - kind: ServiceAccount
    name: c1
    namespace: {namespace}
""",
    )


def kubeconfig_for(testbed: TestBed, token: str, server: str | None = None) -> str:
    cluster = testbed[TARGET]
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "c2",
                    "cluster": {
                        "server": server or cluster.server,
                        "certificate-authority-data": base64.b64encode(
                            cluster.ca.cert_pem
                        ).decode(),
                    },
                }
            ],
            "users": [{"name": "c1", "user": {"token": token}}],
            "contexts": [{"name": "c2", "context": {"cluster": "c2", "user": "c1"}}],
            "current-context": "c2",
        }
    )


def secret(name: str, namespace: str, data: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": data,
    }


def node_ready(kubectl: Kubectl, name: str) -> str | None:
    proc = kubectl.run(SOURCE, "get", "node", name, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    for found in json.loads(proc.stdout).get("status", {}).get("conditions") or ():
        if found["type"] == "Ready":
            return found["status"]
    return None


def connect(kubectl: Kubectl, testbed: TestBed, namespace: str, timeout: float = 30) -> list[str]:
    """Targets c1 (self) and c2 in ``namespace`` of cluster1, Ready; returns their nodes."""
    grant_source(kubectl, namespace)
    token = kubectl(TARGET, "create", "token", "c1", "-n", namespace, "--duration=2h").strip()
    kubectl.apply(SOURCE, secret("c2", namespace, {"config": kubeconfig_for(testbed, token)}))
    kubectl.apply(SOURCE, guide.targets(namespace))
    nodes = [f"admiralty-namespace-{namespace}-c1", f"admiralty-namespace-{namespace}-c2"]
    for node in nodes:
        wait_for(lambda n=node: node_ready(kubectl, n) == "True", timeout, what=f"{node} Ready")
    return nodes


def disconnect(kubectl: Kubectl, namespace: str) -> None:
    kubectl(SOURCE, "delete", "targets", "--all", "-n", namespace, "--wait=false")
    kubectl(
        TARGET,
        "delete",
        "clusterrolebinding",
        f"admiralty-source-{namespace}-c1-cluster-summary-viewer",
        "--ignore-not-found",
    )


# -- proxy pods and delegates ---------------------------------------------------------------------


def pods(kubectl: Kubectl, context: str, namespace: str, *selector: str) -> list[dict]:
    return kubectl.json(context, "get", "pods", "-n", namespace, *selector)["items"]


def proxies(kubectl: Kubectl, namespace: str) -> list[dict]:
    return [
        p
        for p in pods(kubectl, SOURCE, namespace)
        if p["spec"].get("schedulerName") == PROXY_SCHEDULER_NAME
    ]


def delegates(kubectl: Kubectl, context: str, namespace: str) -> list[dict]:
    found = pods(kubectl, context, namespace, "-l", PREFIX + "parent-uid")
    return [d for d in found if not d["metadata"].get("deletionTimestamp")]


def live(items: list[dict]) -> list[dict]:
    return [
        p
        for p in items
        if not p["metadata"].get("deletionTimestamp")
        and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
    ]


def all_running(kubectl: Kubectl, namespace: str, count: int) -> bool:
    found = live(proxies(kubectl, namespace))
    return len(found) == count and all(running_and_ready(p) for p in found)


def nothing_left(kubectl: Kubectl, namespace: str) -> bool:
    if proxies(kubectl, namespace):
        return False
    return not any(
        pods(kubectl, context, namespace, "-l", PREFIX + "parent-uid")
        for context in (SOURCE, TARGET)
    )


def comparable_spec(spec: dict) -> dict:
    """A pod spec without what the documented changes remove (docs/reference.md, "Compared with
    Admiralty v0.17") and the target's own admission and scheduler add again to any pod: its
    service-account token volume and mount, the node, and the priority computed from the
    class."""
    spec = json.loads(json.dumps(spec))
    spec.pop("nodeName", None)
    spec.pop("priority", None)
    token = "/var/run/secrets/kubernetes.io/serviceaccount"
    removed = set()
    for container in spec["containers"]:
        mounts = container.get("volumeMounts") or []
        removed |= {m["name"] for m in mounts if m["mountPath"] == token}
        container["volumeMounts"] = [m for m in mounts if m["mountPath"] != token]
        if not container["volumeMounts"]:
            del container["volumeMounts"]
    spec["volumes"] = [v for v in spec.get("volumes") or () if v["name"] not in removed]
    if not spec["volumes"]:
        del spec["volumes"]
    return spec


def job_condition(kubectl: Kubectl, namespace: str, name: str) -> str | None:
    found = kubectl.json(SOURCE, "get", "job", name, "-n", namespace)
    for c in found.get("status", {}).get("conditions") or ():
        if c["type"] in ("Complete", "Failed") and c["status"] == "True":
            return c["type"]
    return None


# -- workloads -----------------------------------------------------------------------------------


@contextlib.contextmanager
def timed(what: str) -> Iterator[None]:
    """Print the seconds the block took (``pytest -s`` shows them)."""
    started = time.monotonic()
    yield
    print(f"\n{what}: {time.monotonic() - started:.1f} s")


def pod_template(
    labels: dict[str, str] | None = None, exit_code: int | None = None, **spec: Any
) -> dict:
    """An elected pod template with one container ``main``; with ``exit_code``, its pods end
    Succeeded (0) or Failed (1) a second after they run."""
    annotations = {PREFIX + "elect": ""}
    if exit_code is not None:
        annotations[EXIT_CODE] = str(exit_code)
    metadata: dict[str, Any] = {"annotations": annotations}
    if labels:
        metadata["labels"] = labels
    command = ["sleep", "infinity"] if exit_code is None else ["sh", "-c", f"exit {exit_code}"]
    container = {
        "name": "main",
        "image": "busybox",
        "command": command,
        "resources": {"requests": {"cpu": "10m", "memory": "8Mi"}},
    }
    return {"metadata": metadata, "spec": {"containers": [container], **spec}}


def job(name: str, exit_code: int | None = 0, **spec: Any) -> dict:
    """An elected Job (whose pods run until deleted when ``exit_code`` is None); ``spec`` adds
    to the Job's spec (parallelism, completions, …)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": pod_template(exit_code=exit_code, restartPolicy="Never"),
            **spec,
        },
    }


def replicated(kind: str, name: str, replicas: int, **spec: Any) -> dict:
    """An elected Deployment, ReplicaSet or StatefulSet whose pods are labelled ``app=name``."""
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": pod_template({"app": name}),
            **spec,
        },
    }


def get(kubectl: Kubectl, context: str, kind: str, name: str, namespace: str) -> dict:
    return kubectl.json(context, "get", kind, name, "-n", namespace)


def finished(kubectl: Kubectl, namespace: str, name: str) -> dict | None:
    """The Job's Complete or Failed condition, once it has one."""
    for c in get(kubectl, SOURCE, "job", name, namespace).get("status", {}).get("conditions") or ():
        if c["type"] in ("Complete", "Failed") and c["status"] == "True":
            return c
    return None


def proxies_of(kubectl: Kubectl, namespace: str, selector: str) -> list[dict]:
    """Proxy pods with these labels (pods the webhook made proxies keep their labels)."""
    return [
        p
        for p in pods(kubectl, SOURCE, namespace, "-l", selector)
        if p["spec"].get("schedulerName") == PROXY_SCHEDULER_NAME
    ]


def delegates_of(kubectl: Kubectl, namespace: str, selector: str = "") -> dict[str, list[dict]]:
    """Delegates (not being deleted) in each cluster, by context; ``selector`` is on the user's
    labels, which delegates carry under our prefix (``app=web`` → ``…/app=web``)."""
    terms = [PREFIX + "parent-uid", *(PREFIX + term for term in selector.split(",") if term)]
    return {
        context: [
            d
            for d in pods(kubectl, context, namespace, "-l", ",".join(terms))
            if not d["metadata"].get("deletionTimestamp")
        ]
        for context in (SOURCE, TARGET)
    }


def ready(items: list[dict]) -> list[dict]:
    """Pods that count as available: Running and Ready, and not being deleted."""
    return [p for p in items if running_and_ready(p) and not p["metadata"].get("deletionTimestamp")]


class PodEvents:
    """Every change to the selected pods of cluster1 from now on, in the API server's order: a
    list, then a watch from the list's resourceVersion. Polling misses what lasts less than a
    poll; this misses nothing. A context manager: the watch stops at its end."""

    def __init__(self, kubectl: Kubectl, namespace: str, selector: str) -> None:
        listed = kubectl.json(SOURCE, "get", "pods", "-n", namespace, "-l", selector)
        self.initial = {p["metadata"]["name"]: p for p in listed["items"]}
        query = urlencode(
            {
                "watch": "1",
                "resourceVersion": listed["metadata"]["resourceVersion"],
                "labelSelector": selector,
                "timeoutSeconds": "600",
            }
        )
        self.events: list[dict] = []
        path = f"/api/v1/namespaces/{namespace}/pods?{query}"
        self._watch = subprocess.Popen(
            [str(kubectl.bin_dir / "kubectl"), "--context", SOURCE, "get", "--raw", path],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=kubectl.env(),
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._watch.stdout
        for line in self._watch.stdout:
            if line.strip():
                self.events.append(json.loads(line))

    def __enter__(self) -> PodEvents:
        return self

    def __exit__(self, *_: object) -> None:
        self._watch.terminate()
        self._watch.wait()
        self._reader.join(5)

    def states(self) -> Iterator[tuple[dict, dict[str, dict]]]:
        """Each event so far, with the selected pods (by name) just after it."""
        current = dict(self.initial)
        for event in list(self.events):
            assert event["type"] in ("ADDED", "MODIFIED", "DELETED"), event
            pod = event["object"]
            if event["type"] == "DELETED":
                current.pop(pod["metadata"]["name"], None)
            else:
                current[pod["metadata"]["name"]] = pod
            yield event, current

    def extremes(self) -> tuple[int, int]:
        """The fewest pods available (:func:`ready`) and the most not being deleted, over the
        listed state and every state since."""
        states = [self.initial, *(dict(current) for _, current in self.states())]
        staying = [
            [p for p in s.values() if not p["metadata"].get("deletionTimestamp")] for s in states
        ]
        return min(len(ready(s)) for s in staying), max(len(s) for s in staying)


# -- commands, faults and tenants ------------------------------------------------------------------


def cli(kubeconfig: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The console script as users run it (``python -m`` of the same entry point)."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "multicluster_scheduler.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ) | {"KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(ROOT)},
        check=False,
    )
    print(f"$ multicluster-scheduler {' '.join(args)}  ({time.monotonic() - started:.1f}s)")
    if proc.stdout.startswith("apiVersion: v1\nkind: Secret"):
        print(f"(a Secret manifest, {len(proc.stdout)} bytes)")  # it holds a token
    else:
        print(proc.stdout, end="")
    print(proc.stderr, end="")
    return proc


def join(testbed: TestBed, *args: str, kubeconfig: Path | None = None):
    return cli(
        kubeconfig or testbed.kubeconfig,
        "join",
        "--source-context",
        SOURCE,
        "--target-context",
        TARGET,
        *args,
    )


def restart_api_server(cluster, stopped: bool = False) -> None:
    """Start (or restart) a cluster's API server and wait until it serves and its nodes are
    Ready; then restart its scheduler and controller manager. The test bed runs those without
    leader election (nothing restarts them), and after the 403s of an API server whose RBAC is
    still loading their watches may back off for minutes: not what these faults are about."""
    if not stopped:
        cluster.stop("kube-apiserver")
    cluster.start("kube-apiserver")
    cluster.wait_settled()
    for component in ("kube-scheduler", "kube-controller-manager"):
        cluster.stop(component)
        cluster.start(component)
    cluster.wait_settled()


def processes_under(directory: Path) -> list[str]:
    """Command lines of live processes that mention ``directory`` (components and supervisor)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(directory) in cmdline:
            found.append(f"{entry.name}: {cmdline[:160]}")
    return found


def cluster_name(kubectl: Kubectl) -> str:
    """The source's name on its delegates (the uid of its kube-system namespace): anyone can
    read it on any delegate or copy."""
    return kubectl.json(SOURCE, "get", "namespace", "kube-system")["metadata"]["uid"]


def service(kubectl: Kubectl, context: str, namespace: str, name: str) -> dict | None:
    proc = kubectl.run(context, "get", "service", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def endpoint_pods(kubectl: Kubectl, context: str, namespace: str, name: str) -> set[str]:
    """Names of the pods behind a Service, from its EndpointSlices."""
    slices = kubectl.json(
        context,
        "get",
        "endpointslices",
        "-n",
        namespace,
        "-l",
        f"kubernetes.io/service-name={name}",
    )["items"]
    return {
        endpoint["targetRef"]["name"]
        for item in slices
        for endpoint in item.get("endpoints") or ()
        if endpoint.get("targetRef")
    }


def target_ready(target: dict) -> dict:
    """A Target's Ready condition ({} when it has none)."""
    return condition(target, "Ready")


def as_tenant(kubectl: Kubectl, namespace: str, *args: str, stdin: str | None = None) -> str:
    return kubectl(SOURCE, "--as", TENANT, "-n", namespace, *args, stdin=stdin)


def grant_tenant(kubectl: Kubectl, namespace: str) -> None:
    """A tenant of ``namespace`` in cluster1: Targets and Secrets there, nothing else."""
    kubectl.apply(
        SOURCE,
        f"""apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {TENANT}, namespace: {namespace}}}
rules:
  - apiGroups: [multicluster.admiralty.io]
    resources: [targets]
    verbs: [get, list, watch, create, update, patch, delete]
  - apiGroups: [""]
    resources: [secrets]
    verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {TENANT}, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {TENANT}}}
subjects: [{{kind: User, apiGroup: rbac.authorization.k8s.io, name: {TENANT}}}]
""",
    )
    for verb, what in (("create", "nodes"), ("create", "clustertargets"), ("list", "targets -A")):
        answer = kubectl.run(
            SOURCE, "--as", TENANT, "auth", "can-i", verb, *what.split(), check=False
        )
        assert answer.stdout.strip() == "no", f"the tenant may {verb} {what}: not a tenant"


def tenant_target(kubectl: Kubectl, namespace: str, config: str) -> None:
    """The tenant's Secret and Target ``evil``, with kubeconfig ``config``."""
    as_tenant(kubectl, namespace, "apply", "-f", "-",
              stdin=json.dumps(secret("evil", namespace, {"config": config})))  # fmt: skip
    target = {
        "apiVersion": API_VERSION,
        "kind": "Target",
        "metadata": {"name": "evil", "namespace": namespace},
        "spec": {"kubeconfigSecret": {"name": "evil"}},
    }
    as_tenant(kubectl, namespace, "apply", "-f", "-", stdin=json.dumps(target))


def virtual_nodes(kubectl: Kubectl, namespace: str) -> list[dict]:
    selector = f"{PREFIX}target-namespace={namespace}"
    return kubectl.json(SOURCE, "get", "nodes", "-l", selector)["items"]
