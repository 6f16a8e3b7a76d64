"""The product installed on the test bed as users install it, with agents run as local processes.

``helm install`` puts the chart into every cluster (the webhook in URL mode, since the API
server reaches the agent on 127.0.0.1, and no in-cluster replicas: fake nodes run no
containers). Each agent then runs as a local process under the chart's ServiceAccount (a token
requested for it), so RBAC is exactly the chart's; a keeper restarts any agent that dies, as its
Deployment would, unless a test holds it down. With several agents per cluster, the webhook URL
points to a balancer in front of them all, as the chart's Service is.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from testbed.netproxy import TcpBalancer

from .bed import Cluster, TestBed, free_ports, kubeconfig, wait_for
from .process import Process

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "multicluster-scheduler"
RELEASE = "multicluster-scheduler"
NAMESPACE = "admiralty"


class ChartTools:
    """helm and kubectl against the test bed, helm's state kept in the bed's folder."""

    def __init__(self, bed: TestBed) -> None:
        self.bed = bed

    def _env(self) -> dict[str, str]:
        helm_home = self.bed.dir / "helm"
        return self.bed.kubectl_env() | {
            "HELM_CACHE_HOME": str(helm_home / "cache"),
            "HELM_CONFIG_HOME": str(helm_home / "config"),
            "HELM_DATA_HOME": str(helm_home / "data"),
        }

    def run(self, *argv: str, timeout: float = 180) -> str:
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=self._env(), timeout=timeout, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{proc.stdout}{proc.stderr}")
        return proc.stdout

    def helm(self, context: str, *args: str, timeout: float = 300) -> str:
        helm = str(self.bed.bin_dir / "helm")
        return self.run(helm, "--kube-context", context, *args, timeout=timeout)

    def kubectl(self, context: str, *args: str, timeout: float = 60) -> str:
        kubectl = str(self.bed.bin_dir / "kubectl")
        return self.run(kubectl, "--context", context, *args, timeout=timeout)

    def lease_holder(self, context: str) -> str:
        """Who holds the agents' leader-election Lease in ``context`` ("" when no one does)."""
        return self.kubectl(
            context,
            "get",
            "lease",
            RELEASE,
            "-n",
            NAMESPACE,
            "--ignore-not-found",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ).strip()


class Installation(ChartTools):
    def __init__(
        self, bed: TestBed, agents_per_cluster: int = 1, agent_args: tuple[str, ...] = ()
    ) -> None:
        super().__init__(bed)
        self.agent_args = agent_args
        self.agents_per_cluster = agents_per_cluster
        self.agents: dict[str, list[Process]] = {}
        self.webhook_ports: dict[str, int] = {}
        self.health_ports: dict[str, list[int]] = {}
        self.kubelet_ports: dict[str, list[int]] = {}
        self._keeper: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.held: set[Process] = set()
        self._log_offsets: dict[Process, int] = {}
        self.balancers: dict[str, TcpBalancer] = {}
        self.installed = False

    def install(self, *extra_values: str) -> None:
        """helm install into every cluster, and agents' identities and processes defined."""
        for name, cluster in self.bed.clusters.items():
            ports = free_ports(1 + self.agents_per_cluster)
            self.webhook_ports[name] = ports[0]
            self.health_ports[name] = ports[1:]
            values = [
                f"webhook.url=https://127.0.0.1:{ports[0]}/mutate",
                "agent.replicas=0",
                *extra_values,
            ]
            self.helm(
                name,
                "install",
                RELEASE,
                str(CHART),
                "--namespace",
                NAMESPACE,
                "--create-namespace",
                "--wait",
                *[arg for value in values for arg in ("--set", value)],
            )
            self._define_agents(name, cluster, self._agent_kubeconfig(name, cluster))
        self.installed = True

    def _agent_kubeconfig(self, name: str, cluster: Cluster) -> Path:
        """A kubeconfig with a token of the chart's ServiceAccount: the agents' identity."""
        token = self.kubectl(
            name, "create", "token", RELEASE, "-n", NAMESPACE, "--duration=48h"
        ).strip()
        assert cluster.ca is not None
        config = kubeconfig(
            [
                {
                    "name": name,
                    "server": cluster.server,
                    "ca": cluster.ca.cert_pem,
                    "cert": b"",
                    "key": b"",
                }
            ]
        )
        config["users"] = [{"name": name, "user": {"token": token}}]
        path = cluster.dir / "agent.kubeconfig"
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    def _define_agents(self, name: str, cluster: Cluster, kubeconfig_path: Path) -> None:
        """The agents of cluster ``name`` (behind a balancer when there are several), and where
        each one's log of this installation starts."""
        count = self.agents_per_cluster
        webhook_ports = [self.webhook_ports[name]] if count == 1 else free_ports(count)
        self.kubelet_ports[name] = free_ports(count)
        if count > 1:
            self.balancers[name] = TcpBalancer(self.webhook_ports[name], webhook_ports)
            self.balancers[name].start()
        self.agents[name] = [
            Process(
                f"{name}/agent-{i}",
                [
                    sys.executable,
                    "-m",
                    "multicluster_scheduler.cli",
                    "agent",
                    f"--kubeconfig={kubeconfig_path}",
                    f"--namespace={NAMESPACE}",
                    f"--name={RELEASE}",
                    f"--identity={name}-agent-{i}",
                    "--webhook-host=127.0.0.1",
                    f"--webhook-port={webhook_ports[i]}",
                    "--webhook-cert-host=127.0.0.1",
                    "--health-host=127.0.0.1",
                    f"--health-port={self.health_ports[name][i]}",
                    "--kubelet-host=127.0.0.1",
                    f"--kubelet-port={self.kubelet_ports[name][i]}",
                    *self.agent_args,
                ],
                cluster.dir / "logs" / f"agent-{i}.log",
                env={"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
            )
            for i in range(count)
        ]
        for i, agent in enumerate(self.agents[name]):
            cluster.processes[f"agent-{i}"] = agent
            # Log files are shared with earlier installations of the session: remember where
            # this one's output starts.
            exists = agent.log_path.exists()
            self._log_offsets[agent] = agent.log_path.stat().st_size if exists else 0

    def start_agents(self, timeout: float = 60.0) -> None:
        """Start the agents (restarted whenever they die) and wait until they are ready."""
        self._stop.clear()
        self._keeper = threading.Thread(target=self._keep, name="agent-keeper", daemon=True)
        self._keeper.start()
        for name in self.bed.clusters:
            for port in self.health_ports[name]:
                wait_for(
                    lambda p=port: _ready(p), timeout, what=f"agent of {name} ready on :{port}"
                )

    def _keep(self) -> None:
        # Agents are started from this thread, which lives until stop_agents(): their
        # parent-death signal is bound to it.
        while not self._stop.is_set():
            with self._lock:
                for agents in self.agents.values():
                    for agent in agents:
                        if not agent.running and agent not in self.held:
                            agent.start()
            self._stop.wait(0.5)
        for agents in self.agents.values():
            for agent in agents:
                agent.stop()

    def agent_log(self, agent: Process) -> str:
        """What ``agent`` logged since this installation defined it."""
        with agent.log_path.open("rb") as f:
            f.seek(self._log_offsets.get(agent, 0))
            return f.read().decode(errors="replace")

    def hold(self, agent: Process) -> None:
        """Stop ``agent`` by SIGKILL and keep it down (a lost node) until :meth:`release`."""
        with self._lock:
            self.held.add(agent)
            agent.kill()

    def release(self, agent: Process) -> None:
        with self._lock:
            self.held.discard(agent)

    def leader(self, name: str) -> Process | None:
        """The agent of cluster ``name`` that holds the leader-election Lease, if any."""
        holder = self.lease_holder(name)
        agents = self.agents[name]
        return next((a for i, a in enumerate(agents) if holder == f"{name}-agent-{i}"), None)

    def stop_agents(self) -> None:
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(30)
            self._keeper = None

    def uninstall(self) -> None:
        self.stop_agents()
        for balancer in self.balancers.values():
            balancer.stop()
        self.balancers.clear()
        for name in self.bed.clusters:
            self.helm(name, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        for name, agents in self.agents.items():
            for i in range(len(agents)):
                self.bed.clusters[name].processes.pop(f"agent-{i}", None)
        self.installed = False


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False
