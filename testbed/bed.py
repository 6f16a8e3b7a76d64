"""Several real Kubernetes clusters on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok per cluster, with kwok's fake nodes.

Everything the product does crosses API servers (admission, bindings, watches, RBAC, finalizers,
garbage collection), so it is proven on real control planes. Clusters come up in phases, all of
them at once per phase (etcd, API server, then controllers and nodes), which keeps two clusters
under a minute on two cores.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from multicluster.pki import CertificateAuthority, KeyPair, signing_key_pair

from . import argo
from .process import Process
from .rest import ApiError, RestClient

if TYPE_CHECKING:
    from testbed.realnode.node import RealNode, RealNodes

SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
POD_CIDR = "10.244.0.0/16"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# Stages of our own (pods that exit with a chosen code), next to kwok's.
TESTBED_STAGES = Path(__file__).parent / "stages"

# Soft memory limits (GOMEMLIMIT) so three clusters fit easily on a small machine.
MEMORY_LIMITS = {
    "etcd": "256MiB",
    "kube-apiserver": "768MiB",
    "kube-controller-manager": "256MiB",
    "kube-scheduler": "192MiB",
    "kwok": "192MiB",
}
COMPONENTS = tuple(MEMORY_LIMITS)


class TestBedError(RuntimeError):
    """The test bed could not start; the message carries the failing component's log tail."""


@dataclass
class ClusterSpec:
    """What one cluster looks like: its name and its fake nodes."""

    name: str
    nodes: int = 3
    allocatable: dict[str, str] = field(
        default_factory=lambda: {"cpu": "8", "memory": "32Gi", "pods": "110"}
    )
    node_labels: dict[str, str] = field(default_factory=dict)
    # Client QPS (burst twice as much) of the controller manager and the scheduler; None keeps
    # the test bed's defaults. Benchmarks raise it so native scheduling is not throttled.
    client_qps: int | None = None
    # GOMEMLIMIT per component, over MEMORY_LIMITS (benchmarks hold 10,000s of pods).
    memory_limits: dict[str, str] = field(default_factory=dict)
    # One real node besides the fake ones: kubelet and containerd (testbed.realnode), for what must
    # run in containers (the agent's image, as the chart deploys it).
    real_node: bool = False
    # Argo Workflows' controller and CRDs (testbed.argo; the TestBed needs ``argo_bin``).
    argo: bool = False


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 right now, distinct from one another, taken below the kernel's
    ephemeral range when there is room: a port from that range may be given meanwhile to one
    of the thousands of outgoing connections the clusters make, before its component binds."""
    low = _ephemeral_low()
    rng = random.Random()
    chosen: list[int] = []
    for _ in range(50 * count):
        if len(chosen) == count or low <= 10000:
            break
        port = rng.randrange(10000, low)
        if port not in chosen and _bindable(port):
            chosen.append(port)
    if len(chosen) == count:
        return chosen
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def kubeconfig(entries: list[dict]) -> dict:
    """A kubeconfig with one context per entry (name, server, ca, cert, key as PEM bytes)."""
    import base64

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "current-context": entries[0]["name"] if entries else "",
        "clusters": [
            {
                "name": e["name"],
                "cluster": {"server": e["server"], "certificate-authority-data": b64(e["ca"])},
            }
            for e in entries
        ],
        "users": [
            {
                "name": e["name"],
                "user": {
                    "client-certificate-data": b64(e["cert"]),
                    "client-key-data": b64(e["key"]),
                },
            }
            for e in entries
        ],
        "contexts": [
            {"name": e["name"], "context": {"cluster": e["name"], "user": e["name"]}}
            for e in entries
        ],
    }


class Cluster:
    """One control plane. Ports are fixed at creation so components restart on the same ones."""

    def __init__(self, spec: ClusterSpec, directory: Path, bin_dir: Path) -> None:
        self.spec = spec
        self.name = spec.name
        self.dir = directory
        self.bin = bin_dir
        ports = free_ports(6)
        self.etcd_port, self.etcd_peer_port, self.apiserver_port = ports[:3]
        self.controller_manager_port, self.scheduler_port, self.kwok_port = ports[3:]
        self.server = f"https://127.0.0.1:{self.apiserver_port}"
        self.processes: dict[str, Process] = {}
        self.ca: CertificateAuthority | None = None
        self.admin: KeyPair | None = None
        self.real_node: RealNode | None = None
        self.argo_bin: Path | None = None  # Argo Workflows' build, when the spec asks for it
        self.argo_executor_image: str | None = None  # None: Argo's release image, by name
        # Addresses besides 127.0.0.1 where clients reach the API server (pods of real nodes).
        self.server_addresses: tuple[str, ...] = ()

    # -- preparation ---------------------------------------------------------------------------

    def prepare(self) -> None:
        """Write certificates, keys and per-component kubeconfigs; define the processes."""
        pki = self.dir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        self.ca = ca = CertificateAuthority.new(f"{self.name}-ca", path_length=None)
        ca.pair.write_to(pki, "ca")
        ca.issue(
            "kube-apiserver",
            hosts=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                "127.0.0.1",
                KUBERNETES_SERVICE_IP,
                *self.server_addresses,
            ),
            server=True,
        ).write_to(pki, "apiserver")
        ca.issue(
            "kube-apiserver-kubelet-client", organizations=("kubeadm:cluster-admins",), client=True
        ).write_to(pki, "apiserver-kubelet-client")
        signing_key_pair().write_to(pki, "sa")
        self.admin = ca.issue("kubernetes-admin", organizations=("system:masters",), client=True)
        identities = {
            "admin": self.admin,
            "kube-controller-manager": ca.issue("system:kube-controller-manager", client=True),
            "kube-scheduler": ca.issue("system:kube-scheduler", client=True),
            # kwok acts as the kubelet of every fake node: node status, leases, pod status.
            "kwok": ca.issue("kwok", organizations=("system:masters",), client=True),
        }
        if self.spec.argo:
            # Argo's own install gives its controller rights over pods, workflows, leases and
            # more in every namespace; its RBAC is not what the bed tests.
            identities[argo.PROCESS] = ca.issue(
                argo.PROCESS, organizations=("system:masters",), client=True
            )
        for who, pair in identities.items():
            config = kubeconfig(
                [
                    {
                        "name": self.name,
                        "server": self.server,
                        "ca": ca.cert_pem,
                        "cert": pair.cert_pem,
                        "key": pair.key_pem,
                    }
                ]
            )
            path = self.dir / f"{who}.kubeconfig"
            path.write_text(json.dumps(config, indent=2))
            path.chmod(0o600)
        admin_cert, admin_key = self.admin.write_to(pki, "admin")
        self.rest = RestClient(self.server, pki / "ca.crt", admin_cert, admin_key)
        self._write_debugging()
        self._define_processes()

    @property
    def container_log(self) -> Path:
        """What every fake container of this cluster logs (CRI format; append to follow)."""
        return self.dir / "containers" / "container.log"

    def _write_debugging(self) -> None:
        """kwok's logs, exec and attach for fake pods: every container logs the same file,
        and exec runs the command on this machine (in a directory of the cluster's, with
        CLUSTER set to its name)."""
        workdir = self.dir / "containers"
        workdir.mkdir(exist_ok=True)
        stamp = "2026-01-01T00:00:00.000000000Z"
        self.container_log.write_text(
            "".join(f"{stamp} stdout F {self.name} line {i}\n" for i in range(1, 4))
        )
        (workdir / "previous.log").write_text(f"{stamp} stdout F {self.name} previous run\n")
        documents = [
            {
                "kind": "ClusterLogs",
                "spec": {
                    "logs": [
                        {
                            "logsFile": str(self.container_log),
                            "previousLogsFile": str(workdir / "previous.log"),
                            "follow": True,
                        }
                    ]
                },
            },
            {
                "kind": "ClusterExec",
                "spec": {
                    "execs": [
                        {
                            "local": {
                                "workDir": str(workdir),
                                "envs": [{"name": "CLUSTER", "value": self.name}],
                            }
                        }
                    ]
                },
            },
            {
                "kind": "ClusterAttach",
                "spec": {"attaches": [{"logsFile": str(self.container_log)}]},
            },
        ]
        (self.dir / "kwok-debugging.yaml").write_text(
            "\n---\n".join(
                json.dumps(
                    {
                        "apiVersion": "kwok.x-k8s.io/v1alpha1",
                        "metadata": {"name": f"testbed-{doc['kind'].lower()}"},
                        **doc,
                    }
                )
                for doc in documents
            )
        )

    def bootstrap(self) -> None:
        """What kubeadm does too: the API server's kubelet client (group
        kubeadm:cluster-admins) is a cluster admin, so kubelets authorize its calls."""
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kubeadm:cluster-admins"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Group",
                    "name": "kubeadm:cluster-admins",
                }
            ],
        }
        try:
            self.rest.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
        except ApiError as e:
            if e.status != 409:
                raise

    def _process(self, name: str, argv: list[str]) -> None:
        self.processes[name] = Process(
            f"{self.name}/{name}",
            [str(self.bin / argv[0]), *argv[1:]],
            self.dir / "logs" / f"{name}.log",
            env={"GOMEMLIMIT": self.spec.memory_limits.get(name, MEMORY_LIMITS[name])},
        )

    def _define_processes(self) -> None:
        self._process("etcd", self._etcd_argv())
        self._process("kube-apiserver", self._apiserver_argv())
        self._process("kube-controller-manager", self._controller_manager_argv())
        self._process("kube-scheduler", self._scheduler_argv())
        self._process("kwok", self._kwok_argv())
        pki = self.dir / "pki"
        if self.real_node is not None:
            assert self.ca is not None
            self.processes["real-node"] = self.real_node.prepare(self.ca, pki / "ca.crt")
        if self.spec.argo:
            assert self.argo_bin is not None
            versions = json.loads((self.argo_bin / "versions.json").read_text())
            image = self.argo_executor_image or argo.EXECUTOR_IMAGE.format(
                version=versions["argo-workflows"]
            )
            self.processes[argo.PROCESS] = argo.process(self.name, self.dir, self.argo_bin, image)

    def _etcd_argv(self) -> list[str]:
        etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        peer_url = f"http://127.0.0.1:{self.etcd_peer_port}"
        return [
            "etcd",
            f"--name={self.name}",
            f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster={self.name}={peer_url}",
            # Test data only: skipping fsync makes writes fast on a shared disk.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]

    def _apiserver_argv(self) -> list[str]:
        pki = self.dir / "pki"
        etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        real_node_flags = []
        if self.real_node is not None:
            real_node_flags = [
                # Pods are reached through the node's relay (testbed.realnode.relay), and the
                # webhook behind the chart's Service at its pods' addresses: the API server
                # runs on this machine, where there is no route to pods nor kube-proxy.
                f"--egress-selector-config-file={self.real_node.egress_configuration()}",
                "--enable-aggregator-routing=true",
                # Nodes by address: their names resolve nowhere.
                "--kubelet-preferred-address-types=InternalIP,Hostname,ExternalIP",
            ]
        return [
            "kube-apiserver",
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.crt'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            "--max-requests-inflight=1000",
            "--max-mutating-requests-inflight=500",
            # The `kubernetes` Service cannot point at a loopback address.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            *real_node_flags,
        ]

    def _controller_manager_argv(self) -> list[str]:
        pki = self.dir / "pki"
        qps = self.spec.client_qps or 200
        return [
            "kube-controller-manager",
            f"--kubeconfig={self.dir / 'kube-controller-manager.kubeconfig'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.controller_manager_port}",
            "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            # The kubelet-serving signer only (the agent asks it for its kubelet API's
            # certificate): each signer watches its files with an inotify instance of its own,
            # and several beds at once would exhaust the machine's (128 by default).
            f"--cluster-signing-kubelet-serving-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-kubelet-serving-key-file={pki / 'ca.key'}",
            "--use-service-account-credentials=true",
            f"--kube-api-qps={qps}",
            f"--kube-api-burst={2 * qps}",
            "--profiling=false",
        ]

    def _scheduler_argv(self) -> list[str]:
        qps = self.spec.client_qps
        return [
            "kube-scheduler",
            f"--kubeconfig={self.dir / 'kube-scheduler.kubeconfig'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.scheduler_port}",
            "--leader-elect=false",
            *([f"--kube-api-qps={qps}", f"--kube-api-burst={2 * qps}"] if qps else []),
            "--profiling=false",
        ]

    def _kwok_argv(self) -> list[str]:
        stages = self.bin / "kwok-stages"  # kwok's own
        return [
            "kwok",
            f"--kubeconfig={self.dir / 'kwok.kubeconfig'}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
            "--node-lease-duration-seconds=40",
            f"--cidr={POD_CIDR}",
            "--node-ip=127.0.0.1",
            # The port fake nodes advertise: API servers call kwok there for pods' logs,
            # exec and attach.
            f"--node-port={self.kwok_port}",
            f"--server-address=127.0.0.1:{self.kwok_port}",
            "-v=WARN",
            *(f"--config={p}" for p in sorted(stages.glob("*.yaml"))),
            *(f"--config={p}" for p in sorted(TESTBED_STAGES.glob("*.yaml"))),
            f"--config={self.dir / 'kwok-debugging.yaml'}",
        ]

    def start_argo(self) -> None:
        """Argo's CRDs and configuration, then its controller (once the control plane runs)."""
        assert self.argo_bin is not None
        argo.install(self.rest, self.name, self.argo_bin)
        self.start(argo.PROCESS)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, component: str) -> None:
        self.processes[component].start()

    def stop(self, component: str, timeout: float = 10.0) -> None:
        self.processes[component].stop(timeout)

    def stop_all(self) -> None:
        """Everything else first (agents, the real node), then the control plane in reverse
        start order."""
        if self.real_node is not None:
            # Its state is thrown away, and unshare(1) would ignore SIGTERM: killing its first
            # process ends every process of the node at once (see testbed.realnode.init).
            self.processes["real-node"].kill()
            self.real_node.remove_cgroup()
        for name, process in self.processes.items():
            if name not in COMPONENTS:
                process.stop()
        for name in reversed(COMPONENTS):
            if name in self.processes:
                self.processes[name].stop()

    def start_real_node(self) -> None:
        """The real node's cgroup and process (its images: :meth:`RealNode.import_images`)."""
        assert self.real_node is not None
        self.real_node.create_cgroup()
        self.real_node.started_at = time.time()
        self.start("real-node")

    def wait_apiserver_ready(self, timeout: float = 60.0) -> None:
        """Block until /readyz answers ok (call from a thread when an event loop must run)."""
        wait_for(self.apiserver_ready, timeout, what=f"{self.name} API server ready")

    def settled(self) -> bool:
        """API server ready, every fake node Ready and free of the node controller's taints
        (after an API server restart, stale leases can taint nodes for a moment)."""
        if not self.apiserver_ready() or not self.ready():
            return False
        for node in self.rest.get("/api/v1/nodes")["items"]:
            if FAKE_NODE_ANNOTATION not in (node["metadata"].get("annotations") or {}):
                continue
            taints = (node.get("spec") or {}).get("taints") or ()
            if any(t["key"].startswith("node.kubernetes.io/") for t in taints):
                return False
            if not (node.get("status") or {}).get("addresses"):
                self._readdress(node["metadata"]["name"])
                return False
        return True

    def _readdress(self, node: str) -> None:
        """kwok can rewrite a node's status without its addresses when the control plane
        restarts under it; API servers then cannot reach its kubelet (logs, exec). Its later
        heartbeats keep addresses that are there."""
        patch = {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}}
        self.rest.request(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            patch,
            content_type="application/merge-patch+json",
        )

    def wait_settled(self, timeout: float = 90.0) -> None:
        """Block until :meth:`settled` (from a thread when an event loop must keep running;
        but start and stop components from the main thread: they die with the thread that
        started them)."""
        wait_for(self.settled, timeout, what=f"{self.name} settled")

    def etcd_revision(self) -> int:
        body = json.dumps({"key": "Lw=="}).encode()  # base64 of "/"
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.etcd_port}/v3/kv/range", data=body, method="POST"
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(json.loads(resp.read())["header"]["revision"])

    def compact_etcd(self) -> int:
        """Compact etcd's history up to now, so older resource versions are gone for good."""
        revision = self.etcd_revision()
        body = json.dumps({"revision": str(revision), "physical": True}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.etcd_port}/v3/kv/compaction", data=body, method="POST"
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
        return revision

    def check_alive(self, *components: str) -> None:
        for name in components:
            proc = self.processes[name]
            if not proc.running:
                raise TestBedError(
                    f"{proc.name} exited with code {proc.exit_code()}; last lines of "
                    f"{proc.log_path}:\n{proc.log_tail()}"
                )

    # -- probes --------------------------------------------------------------------------------

    def etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.etcd_port}/health", timeout=2
            ) as resp:
                return json.loads(resp.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def apiserver_ready(self) -> bool:
        try:
            status, body = self.rest.request("GET", "/readyz", timeout=2)
        except OSError:
            return False
        return status == 200 and body.strip() == b"ok"

    def create_nodes(self, count: int | None = None, first: int = 0) -> list[str]:
        """The spec's fake nodes, or ``count`` more numbered from ``first``; their names."""
        capacity = dict(self.spec.allocatable)
        names = []
        for i in range(first, first + (self.spec.nodes if count is None else count)):
            name = f"{self.name}-node-{i}"
            names.append(name)
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {FAKE_NODE_ANNOTATION: "fake"},
                    "labels": {
                        "kubernetes.io/arch": "amd64",
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/hostname": name,
                        "type": "kwok",
                        **self.spec.node_labels,
                    },
                },
                "spec": {},
                "status": {"allocatable": capacity, "capacity": capacity},
            }
            try:
                self.rest.create("/api/v1/nodes", node)
            except ApiError as e:
                if e.status != 409:
                    raise
        return names

    def ready(self) -> bool:
        """The default ServiceAccount exists and every fake node is Ready."""
        status, _ = self.rest.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
        if status != 200:
            return False
        nodes = self.rest.get("/api/v1/nodes")["items"]
        fake = [n for n in nodes if n["metadata"].get("annotations", {}).get(FAKE_NODE_ANNOTATION)]
        if len(fake) < self.spec.nodes:
            return False
        if self.real_node is not None:
            real = [n for n in nodes if n["metadata"]["name"] == self.real_node.name]
            fake += real
            if not real:
                return False
        for node in fake:
            conditions = node.get("status", {}).get("conditions", [])
            if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return False
        return True

    def kubeconfig_entry(self) -> dict:
        assert self.ca is not None
        assert self.admin is not None
        return {
            "name": self.name,
            "server": self.server,
            "ca": self.ca.cert_pem,
            "cert": self.admin.cert_pem,
            "key": self.admin.key_pem,
        }


class TestBed:
    """Several clusters started together; ``DIR/kubeconfig`` has one context per cluster."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        specs: list[ClusterSpec],
        directory: Path,
        bin_dir: Path,
        real_nodes: RealNodes | None = None,
        argo_bin: Path | None = None,
        argo_executor_image: str | None = None,
    ) -> None:
        names = [s.name for s in specs]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"cluster names must be distinct and non-empty: {names}")
        missing = [c for c in ("etcd", *COMPONENTS[1:], "kubectl") if not (bin_dir / c).exists()]
        if missing:
            raise TestBedError(
                f"{bin_dir} lacks {', '.join(missing)}: run `python -m testbed.testbin build`"
            )
        self.dir = directory
        self.bin_dir = bin_dir
        self.clusters = {s.name: Cluster(s, directory / s.name, bin_dir) for s in specs}
        self.kubeconfig = directory / "kubeconfig"
        if any(s.real_node for s in specs):
            if real_nodes is None:
                raise ValueError("clusters with a real node need real_nodes (testbed.realnode)")
            self._add_real_nodes(real_nodes)
        if any(s.argo for s in specs):
            if argo_bin is None:
                raise ValueError("clusters with Argo Workflows need argo_bin (build group argo)")
            for cluster in self.clusters.values():
                cluster.argo_bin = argo_bin
                # The image real nodes hold (testbed.image.build_argoexec_image); fake nodes run
                # no container, and any name does.
                cluster.argo_executor_image = argo_executor_image

    def _add_real_nodes(self, setup: RealNodes) -> None:
        from testbed.realnode.node import HOST_ADDRESS, RealNode

        ports = [c.apiserver_port for c in self.clusters.values()]
        for cluster in self.clusters.values():
            # Pods of every real node reach every API server at HOST_ADDRESS.
            cluster.server_addresses = (HOST_ADDRESS,)
            if cluster.spec.real_node:
                cluster.real_node = RealNode(
                    cluster.name,
                    cluster.dir / "node",
                    setup,
                    cluster.apiserver_port,
                    ports,
                    KUBERNETES_SERVICE_IP,
                )

    def __getitem__(self, name: str) -> Cluster:
        return self.clusters[name]

    def up(self, timeout: float = 180.0) -> None:
        """Start every cluster and return when all are ready; stop everything on failure."""
        deadline = time.monotonic() + timeout
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            for cluster in self.clusters.values():
                if cluster.dir.exists():
                    shutil.rmtree(cluster.dir)
                cluster.prepare()
            self._write_kubeconfig()
            self._phase(["etcd"], lambda c: c.etcd_healthy(), deadline, "etcd healthy")
            self._phase(
                ["kube-apiserver"], lambda c: c.apiserver_ready(), deadline, "API server ready"
            )
            for cluster in self.clusters.values():
                cluster.bootstrap()
                cluster.create_nodes()
                if cluster.real_node is not None:
                    cluster.start_real_node()
            self._import_real_node_images()
            self._phase(
                ["kube-controller-manager", "kube-scheduler", "kwok"],
                lambda c: c.ready(),
                deadline,
                "nodes Ready and default ServiceAccount created",
            )
            for cluster in self.clusters.values():
                if cluster.spec.argo:
                    cluster.start_argo()
        except BaseException:
            self.down()
            raise

    def _import_real_node_images(self) -> None:
        """All real nodes at once: each import takes seconds."""
        nodes = [c.real_node for c in self.clusters.values() if c.real_node is not None]
        if nodes:
            with ThreadPoolExecutor(len(nodes)) as pool:
                list(pool.map(lambda node: node.import_images(), nodes))

    def _phase(self, components: list[str], probe, deadline: float, what: str) -> None:
        for cluster in self.clusters.values():
            for name in components:
                cluster.start(name)
        pending = dict(self.clusters)
        while pending:
            for name, cluster in list(pending.items()):
                cluster.check_alive(*components)
                if probe(cluster):
                    del pending[name]
            if not pending:
                return
            if time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {p.name} ({p.log_path})\n{p.log_tail(20)}"
                    for c in pending.values()
                    for p in (c.processes[n] for n in components)
                )
                raise TestBedError(f"timed out waiting for {what} in {sorted(pending)}\n{logs}")
            time.sleep(0.2)

    def _write_kubeconfig(self) -> None:
        config = kubeconfig([c.kubeconfig_entry() for c in self.clusters.values()])
        self.kubeconfig.write_text(json.dumps(config, indent=2))
        self.kubeconfig.chmod(0o600)

    def down(self) -> None:
        for cluster in self.clusters.values():
            cluster.stop_all()

    def processes(self) -> list[Process]:
        return [p for c in self.clusters.values() for p in c.processes.values()]

    def log_tails(self, lines: int = 30) -> str:
        tails = [f"--- {p.name} ({p.log_path})\n{p.log_tail(lines)}" for p in self.processes()]
        for cluster in self.clusters.values():
            for path in cluster.real_node.log_paths() if cluster.real_node else ():
                tails.append(f"--- {cluster.name}/{path.stem} ({path})\n{_tail(path, lines)}")
        return "\n".join(tails)

    def kubectl_env(self) -> dict[str, str]:
        return dict(os.environ) | {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open(errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except FileNotFoundError:
        return ""


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; raise TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (OSError, urllib.error.URLError, ApiError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
