"""A real node in a test-bed cluster: kubelet and containerd, in namespaces of their own.

Fake nodes (kwok) run no containers; the agent's image, the chart's Deployment, probes, the
webhook behind its Service and the kubelet API served from a pod need a node that does. One per
cluster is enough: workloads keep going to the fake nodes (the real node carries a NoSchedule
taint), the agent goes to the real one (a toleration and a node selector, chart values).

The node never changes the machine's own settings: :mod:`testbed.realnode.init` runs it in PID,
mount and network namespaces of its own (see there), so what is left on the machine is the
node's folder and, while it runs, a cgroup of its own in each hierarchy (kubelet's
``cgroupRoot``, removed when it stops; one left by a killed run is removed by the next).

Addresses, the same in every node (each is in a namespace of its own):

- the node and its pods: ``10.88.0.0/24`` on a bridge, the node at ``10.88.0.1``;
- the ``kubernetes`` Service: its cluster IP, forwarded to the API server on the machine;
- the machine as pods see it: ``10.89.0.1``, whose ports are the API servers of the test bed's
  clusters (``https://10.89.0.1:<port of the cluster's API server>``, in every cluster's
  serving certificate).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from multicluster.pki import CertificateAuthority
from testbed.process import Process

ROOT = Path(__file__).resolve().parents[2]
NODE_SUBNET = ipaddress.ip_network("10.88.0.0/24")
NODE_IP = "10.88.0.1"
HOST_ADDRESS = "10.89.0.1"
BRIDGE = "mcs0"
# The taint that keeps workloads off real nodes, and the label that finds them.
REAL_NODE_KEY = "testbed.multicluster-scheduler/real-node"
# What kubelet wants these kernel settings to be (it writes them otherwise): shown to it, in its
# mount namespace, instead of the machine's.
KERNEL_SETTINGS = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}
CGROUP_FS = Path("/sys/fs/cgroup")
CGROUP_PREFIX = "mcs-testbed-"
RUNC = "/usr/sbin/runc"
CNI_PLUGINS = "/usr/lib/cni"
# containerd's socket as the node's processes see it (/run is the node's own).
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


@dataclass
class RealNodes:
    """What the real nodes of a test bed share: their binaries and the images they hold."""

    bin_dir: Path  # kubelet, containerd, containerd-shim-runc-v2, ctr
    pause_image: str
    images: list[Path] = field(default_factory=list)  # archives imported at start, pause first

    def __post_init__(self) -> None:
        missing = [
            b
            for b in ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr")
            if not (self.bin_dir / b).exists()
        ]
        if missing:
            raise FileNotFoundError(
                f"{self.bin_dir} lacks {', '.join(missing)}: "
                "run `python -m testbed.testbin build --group real-node`"
            )


def cgroup_hierarchies() -> list[Path]:
    """Where kubelet's cgroupRoot must exist: every hierarchy (cgroup v1), or the one (v2)."""
    if (CGROUP_FS / "cgroup.controllers").exists():
        return [CGROUP_FS]
    return sorted(p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink())


def remove_cgroup(name: str, timeout: float = 15.0) -> list[str]:
    """Remove cgroup ``name`` and what is under it in every hierarchy; what could not be."""
    deadline = time.monotonic() + timeout
    left: list[str] = []
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / name
        if not top.exists():
            continue
        while True:
            for parent, dirs, _ in os.walk(top, topdown=False):
                for d in dirs:
                    _rmdir(Path(parent) / d)
            _rmdir(top)
            if not top.exists() or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # its processes are still going
        if top.exists():
            left.append(str(top))
    return left


def _rmdir(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def remove_stale_cgroups() -> None:
    """cgroups of real nodes whose test bed was killed before it could remove them."""
    hierarchies = cgroup_hierarchies()
    if not hierarchies:
        return
    for path in hierarchies[0].glob(CGROUP_PREFIX + "*"):
        owner = path.name[len(CGROUP_PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            remove_cgroup(path.name, timeout=2)


class RealNode:
    """The real node of one cluster: files, the process that runs it, and its images."""

    def __init__(
        self,
        cluster: str,
        directory: Path,
        setup: RealNodes,
        apiserver_port: int,
        host_ports: list[int],
        service_ip: str,
    ) -> None:
        self.cluster = cluster
        self.name = f"{cluster}-real-node"
        self.dir = directory
        self.setup = setup
        self.apiserver_port = apiserver_port
        self.host_ports = host_ports
        self.service_ip = service_ip
        self.egress_socket = directory / "egress.sock"
        self.cgroup = f"{CGROUP_PREFIX}{os.getpid()}-{cluster}-{uuid.uuid4().hex[:6]}"
        self.logs = directory.parent / "logs"
        self.process: Process | None = None
        self.started_at: float | None = None  # time.time() of the start, for reports
        self.import_seconds: float | None = None

    @property
    def containerd_socket(self) -> Path:
        """containerd's socket as this machine sees it (the node's /run is a folder here)."""
        return self.dir / "run" / CONTAINERD_SOCKET.removeprefix("/run/")

    def egress_configuration(self) -> Path:
        """For kube-apiserver's --egress-selector-config-file: its "cluster" traffic (webhooks
        behind Services, kubelets, proxy subresources) through this node's relay."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "egress-selector.json"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "apiserver.k8s.io/v1beta1",
                    "kind": "EgressSelectorConfiguration",
                    "egressSelections": [
                        {
                            "name": "cluster",
                            "connection": {
                                "proxyProtocol": "HTTPConnect",
                                "transport": {"uds": {"udsName": str(self.egress_socket)}},
                            },
                        }
                    ],
                },
                indent=2,
            )
        )
        return path

    def prepare(self, ca: CertificateAuthority, ca_cert: Path) -> Process:
        """Write the node's configuration and credentials; return the process that runs it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        pki = self.dir / "pki"
        pki.mkdir(exist_ok=True)
        client = ca.issue(f"system:node:{self.name}", organizations=("system:nodes",), client=True)
        cert, key = client.write_to(pki, "kubelet-client")
        kubeconfig = self._kubelet_kubeconfig(ca_cert, cert, key)
        cni = self.dir / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-testbed.conflist").write_text(json.dumps(self._cni_configuration(), indent=2))
        containerd_config = self.dir / "containerd.toml"
        containerd_config.write_text(self._containerd_configuration(cni))
        resolv = self.dir / "resolv.conf"
        resolv.write_text("")  # pods of real nodes resolve no names: addresses are IPs
        kubelet_config = self.dir / "kubelet.json"
        kubelet_config.write_text(json.dumps(self._kubelet_configuration(ca_cert, resolv)))
        init_config = self._init_configuration(kubelet_config, kubeconfig, containerd_config)
        config_path = self.dir / "init.json"
        config_path.write_text(json.dumps(init_config, indent=2))
        self.process = Process(
            f"{self.cluster}/real-node",
            [
                "unshare",
                "--pid",
                "--fork",
                "--kill-child=SIGKILL",
                "--mount",
                "--propagation",
                "private",
                "--net",
                sys.executable,
                "-m",
                "testbed.realnode.init",
                str(config_path),
            ],
            self.logs / "real-node.log",
            env={"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
        )
        return self.process

    def _kubelet_kubeconfig(self, ca_cert: Path, cert: Path, key: Path) -> Path:
        kubeconfig = self.dir / "kubelet.kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": self.cluster,
                            "cluster": {
                                "server": f"https://{self.service_ip}:443",
                                "certificate-authority": str(ca_cert),
                            },
                        }
                    ],
                    "users": [
                        {
                            "name": self.name,
                            "user": {"client-certificate": str(cert), "client-key": str(key)},
                        }
                    ],
                    "contexts": [
                        {"name": "node", "context": {"cluster": self.cluster, "user": self.name}}
                    ],
                    "current-context": "node",
                }
            )
        )
        kubeconfig.chmod(0o600)
        return kubeconfig

    def _init_configuration(
        self, kubelet_config: Path, kubeconfig: Path, containerd_config: Path
    ) -> dict:
        """What :mod:`testbed.realnode.init` reads: the namespaces' set-up, the node's
        processes."""
        path = os.pathsep.join([str(self.setup.bin_dir), *SYSTEM_PATH])
        return {
            "dir": str(self.dir),
            "host_pid": os.getpid(),
            "kernel_settings": KERNEL_SETTINGS,
            "binds": {
                "/var/lib": str(self.dir / "var-lib"),
                "/var/log": str(self.dir / "var-log"),
                "/run": str(self.dir / "run"),
            },
            "network": {
                "service_ip": self.service_ip,
                "host_address": HOST_ADDRESS,
                "bridge": BRIDGE,
                "node_ip": NODE_IP,
                "prefix": NODE_SUBNET.prefixlen,
                "subnet": str(NODE_SUBNET),
            },
            "egress_socket": str(self.egress_socket),
            "apiserver_port": self.apiserver_port,
            "host_ports": self.host_ports,
            "containerd": {
                "name": "containerd",
                "argv": [
                    str(self.setup.bin_dir / "containerd"),
                    f"--config={containerd_config}",
                ],
                "env": {"PATH": path},
                "log": str(self.logs / "containerd.log"),
                "socket": CONTAINERD_SOCKET,
            },
            "kubelet": {
                "name": "kubelet",
                "argv": [
                    str(self.setup.bin_dir / "kubelet"),
                    f"--config={kubelet_config}",
                    f"--kubeconfig={kubeconfig}",
                    f"--hostname-override={self.name}",
                    f"--node-ip={NODE_IP}",
                    f"--node-labels={REAL_NODE_KEY}=true",
                    "--v=1",
                ],
                "env": {"PATH": path},
                "log": str(self.logs / "kubelet.log"),
            },
        }

    def _cni_configuration(self) -> dict:
        return {
            "cniVersion": "1.0.0",
            "name": "testbed",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(NODE_SUBNET), "gateway": NODE_IP}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": "/var/lib/cni/networks",
                    },
                }
            ],
        }

    def _containerd_configuration(self, cni: Path) -> str:
        # root, state and the socket keep their defaults: /var/lib and /run are the node's own.
        return f"""version = 3
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs",
]

[plugins.'io.containerd.internal.v1.opt']
  path = '/var/lib/containerd-opt'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{self.setup.pause_image}'

[plugins.'io.containerd.cri.v1.runtime']
  # Without CAP_SYS_RESOURCE, a container may not lower its OOM score below ours.
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = '{RUNC}'
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['{CNI_PLUGINS}']
    conf_dir = '{cni}'
"""

    def _kubelet_configuration(self, ca_cert: Path, resolv: Path) -> dict:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # cgroup v1 is refused by default since 1.35; these machines have it.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup}",
            "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
            "address": NODE_IP,  # not 0.0.0.0: the relay's ports are on other addresses
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "resolvConf": str(resolv),
            "failSwapOn": False,
            "registerWithTaints": [{"key": REAL_NODE_KEY, "value": "true", "effect": "NoSchedule"}],
            # A shared machine's disk and memory are not this node's to guard.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
                "imagefs.inodesFree": "1%",
            },
            # Imported images cannot be pulled again: never collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "maxPods": 30,
        }

    # -- lifecycle -------------------------------------------------------------------------------

    def create_cgroup(self) -> None:
        remove_stale_cgroups()
        for hierarchy in cgroup_hierarchies():
            path = hierarchy / self.cgroup
            path.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):  # v1 cpuset starts empty
                if (path / name).exists() and not (path / name).read_text().strip():
                    (path / name).write_text((hierarchy / name).read_text())

    def remove_cgroup(self) -> list[str]:
        return remove_cgroup(self.cgroup)

    def running(self) -> bool:
        return self.containerd_socket.exists() and self.process is not None and self.process.running

    def import_images(self, timeout: float = 60.0) -> None:
        """Put the images into containerd's namespace for Kubernetes (no registry here)."""
        deadline = time.monotonic() + timeout
        while not self.containerd_socket.exists():
            if time.monotonic() > deadline or not (self.process and self.process.running):
                raise RuntimeError(f"{self.name}: containerd did not start; see {self.logs}")
            time.sleep(0.1)
        started = time.monotonic()
        for archive in self.setup.images:
            self.ctr("images", "import", str(archive))
        self.import_seconds = time.monotonic() - started

    def ready_after(self, node: dict) -> float | None:
        """Seconds from this node's start to its Node's Ready condition (1 s resolution)."""
        for condition in (node.get("status") or {}).get("conditions") or ():
            if condition["type"] == "Ready" and condition["status"] == "True":
                ready = datetime.fromisoformat(condition["lastTransitionTime"])
                return ready.timestamp() - (self.started_at or 0.0)
        return None

    def ctr(self, *args: str, timeout: float = 120) -> str:
        argv = [str(self.setup.bin_dir / "ctr"), "--address", str(self.containerd_socket)]
        proc = subprocess.run(
            [*argv, "-n", "k8s.io", *args], capture_output=True, text=True, timeout=timeout
        )
        if proc.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} on {self.name}: {proc.stderr.strip()}")
        return proc.stdout

    def log_paths(self) -> list[Path]:
        return [self.logs / "containerd.log", self.logs / "kubelet.log"]
