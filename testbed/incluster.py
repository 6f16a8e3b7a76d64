"""The product installed as users install it: ``helm install`` of the chart's Deployment, from the
image built here, onto the test bed's real nodes.

The chart's defaults stay as they are (two replicas with leader election, the webhook behind
the chart's Service with the CA the agent makes, the kubelet API on the pod, probes, uid 65532
on a read-only root filesystem), except what any user sets: the image, and where the agent may
run (a node selector and a toleration for the real node, which keeps workloads off with a
taint). Compare :mod:`testbed.install`, where the agents run as local processes.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import yaml

from .bed import TestBed, wait_for
from .install import CHART, NAMESPACE, RELEASE, ChartTools

SELECTOR = f"app.kubernetes.io/name={RELEASE}"
ROOT = Path(__file__).resolve().parents[1]
# Where the agents run on the test bed: its real nodes (the file says why).
REAL_NODE_VALUES = ROOT / "testbed" / "realnode" / "chart-values.yaml"


def chart_values(image: str) -> dict:
    """The values a user of these clusters would set: the image, and the nodes for the agent
    (:data:`REAL_NODE_VALUES`)."""
    repository, _, tag = image.rpartition(":")
    values = yaml.safe_load(REAL_NODE_VALUES.read_text())
    return {"image": {"repository": repository, "tag": tag}, **values}


def install_command(image: str, contexts: list[str]) -> str:
    """The helm commands that install the chart as users do on the test bed's real nodes, as a
    person types them from the clone."""
    repository, _, tag = image.rpartition(":")
    quoted = " ".join(shlex.quote(c) for c in contexts)
    return (
        f"for CONTEXT in {quoted}; do\n"
        f'  helm install {RELEASE} charts/{CHART.name} --kube-context "$CONTEXT" \\\n'
        f"    --namespace {NAMESPACE} --create-namespace --wait "
        f"-f {REAL_NODE_VALUES.relative_to(ROOT)} \\\n"
        f"    --set image.repository={repository} --set image.tag={tag}\n"
        "done"
    )


class InClusterInstallation(ChartTools):
    def __init__(self, bed: TestBed, image: str) -> None:
        super().__init__(bed)
        self.image = image
        self.values_file = bed.dir / "in-cluster-values.json"
        self.installed = False
        self.install_seconds: dict[str, float] = {}

    def install(self) -> None:
        """helm install into every cluster, and wait until both replicas are ready in each."""
        self.values_file.write_text(json.dumps(chart_values(self.image), indent=2))
        for name in self.bed.clusters:
            started = time.monotonic()
            self.helm(
                name,
                "install",
                RELEASE,
                str(CHART),
                "--namespace",
                NAMESPACE,
                "--create-namespace",
                "-f",
                str(self.values_file),
                "--wait",
                "--timeout=4m",
            )
            self.installed = True
            self.install_seconds[name] = time.monotonic() - started
        for name in self.bed.clusters:
            wait_for(
                lambda n=name: self.leader(n),
                60,
                interval=0.5,
                what=f"a leader of the agents in {name}",
            )

    def pods(self, context: str) -> list[dict]:
        out = self.kubectl(context, "get", "pods", "-n", NAMESPACE, "-l", SELECTOR, "-o", "json")
        return json.loads(out)["items"]

    def ready_pods(self, context: str) -> list[dict]:
        return [
            p
            for p in self.pods(context)
            if not p["metadata"].get("deletionTimestamp")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions") or ()
            )
        ]

    def leader(self, context: str) -> str:
        """The pod that holds the agents' leader-election Lease ("" when none does)."""
        return self.lease_holder(context)

    def upgrade(self, context: str, *set_values: str) -> float:
        """``helm upgrade --reuse-values --wait`` with more values; the seconds it took."""
        started = time.monotonic()
        args = [a for v in set_values for a in ("--set", v)]
        self.helm(
            context,
            "upgrade",
            RELEASE,
            str(CHART),
            "-n",
            NAMESPACE,
            "--reuse-values",
            *args,
            "--wait",
            "--timeout=4m",
        )
        return time.monotonic() - started

    def uninstall(self) -> None:
        for name in self.bed.clusters:
            self.helm(name, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        self.installed = False
