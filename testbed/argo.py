"""Argo Workflows' controller in a test-bed cluster: its CRDs, its configuration and its process.

The controller is the one Argo releases, built from its Go module (the ``argo`` group of
pins.toml), and runs on this machine like the cluster's other components, with a client
certificate of its own. Its executor (argoexec: the ``init`` and ``wait`` containers of every
workflow pod) runs in containers, which fake nodes do not have; the bed's stages end a pod's
containers instead, with the exit code its annotation asks for (``stages/``). Nothing here does
what Argo's controller does.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from .process import Process
from .rest import ApiError, RestClient

NAMESPACE = "argo"
CONFIGMAP = "workflow-controller-configmap"
PROCESS = "argo-workflow-controller"
MEMORY_LIMIT = "256MiB"
CRDS_DIR = "crds"
# Its metrics and telemetry servers would listen on fixed ports of every interface: off, so
# that several beds can run side by side. (Its health endpoint's fixed port, :6060, cannot be
# turned off; a second controller only logs that the port is taken.)
CONFIGURATION = {
    "metricsConfig": "enabled: false\n",
    "telemetryConfig": "enabled: false\n",
}
EXECUTOR_IMAGE = "quay.io/argoproj/argoexec:{version}"  # unless the bed has one of its own


def process(cluster: str, directory: Path, argo_bin: Path, executor_image: str) -> Process:
    """The controller of ``cluster`` (whose files are in ``directory``), watching every
    namespace, as Argo's cluster install runs it."""
    return Process(
        f"{cluster}/{PROCESS}",
        [
            str(argo_bin / "workflow-controller"),
            f"--kubeconfig={directory / f'{PROCESS}.kubeconfig'}",
            f"--namespace={NAMESPACE}",
            f"--configmap={CONFIGMAP}",
            f"--executor-image={executor_image}",
            "--loglevel=info",
        ],
        directory / "logs" / f"{PROCESS}.log",
        # One controller per cluster: no leader election (and no Lease to wait for).
        env={"GOMEMLIMIT": MEMORY_LIMIT, "LEADER_ELECTION_DISABLE": "true"},
    )


def install(rest: RestClient, cluster: str, argo_bin: Path, timeout: float = 60.0) -> None:
    """Its CRDs (established), its namespace and its configuration, through ``rest`` (the
    cluster's admin); idempotent."""
    crds = sorted((argo_bin / CRDS_DIR).glob("*.yaml"))
    if not crds:
        raise FileNotFoundError(f"{argo_bin / CRDS_DIR} holds no CRD: build the argo group")
    names = []
    for path in crds:
        crd = yaml.safe_load(path.read_text())
        names.append(crd["metadata"]["name"])
        _create(rest, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    _create(
        rest,
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    _create(
        rest,
        f"/api/v1/namespaces/{NAMESPACE}/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP, "namespace": NAMESPACE},
            "data": CONFIGURATION,
        },
    )
    deadline = time.monotonic() + timeout
    for name in names:
        while not _established(rest, name):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{cluster}: CRD {name} not established in {timeout:.0f}s")
            time.sleep(0.2)


def _create(rest: RestClient, path: str, body: dict) -> None:
    try:
        rest.create(path, body)
    except ApiError as e:
        if e.status != 409:
            raise


def _established(rest: RestClient, name: str) -> bool:
    crd = rest.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    conditions = (crd.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
