"""What this machine needs for real nodes and image builds, installed from Debian packages.

Real nodes (:mod:`testbed.realnode`) run kubelet and containerd, which are built from their Go
modules, over runc and the CNI plugins, which come from the distribution; images are built
with buildah, on a base made by debootstrap (:mod:`testbed.image`), and buildah runs the
Dockerfile's ``RUN`` steps with runc: Debian's buildah only recommends a runtime, and apt-get
leaves recommendations out here, so runc is asked for by name. Whatever is missing is installed
with apt-get, once, when it is first needed. Real nodes also need what no package gives: Linux,
root (namespaces, mounts, cgroups) and cgroup hierarchies; :func:`real_node_blocker` says which
of those is missing, so that tests are skipped with that reason instead of failing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from testbed.progress import progress

# Debian package -> a file it installs (present: nothing to do).
PACKAGES = {
    "runc": "/usr/sbin/runc",
    "containernetworking-plugins": "/usr/lib/cni/bridge",
    "buildah": "/usr/bin/buildah",
    "debootstrap": "/usr/sbin/debootstrap",
    "iproute2": "/usr/sbin/ip",
    "util-linux": "/usr/bin/unshare",
}
REAL_NODE_PACKAGES = ("runc", "containernetworking-plugins", "iproute2", "util-linux")
IMAGE_PACKAGES = ("buildah", "runc", "debootstrap")
CGROUP_ROOT = Path("/sys/fs/cgroup")


class SetupError(RuntimeError):
    """Something this machine lacks could not be installed; the message says what to do."""


def real_node_blocker() -> str | None:
    """Why a real node cannot run on this machine, or None when it can."""
    if sys.platform != "linux":
        return f"real nodes need Linux (namespaces and cgroups); this is {sys.platform}"
    if os.geteuid() != 0:
        return "real nodes need root (mount, network and PID namespaces, cgroups); run as root"
    if not (CGROUP_ROOT / "cgroup.controllers").exists() and not (CGROUP_ROOT / "pids").is_dir():
        return f"real nodes need cgroups mounted under {CGROUP_ROOT}"
    return None


def missing(packages: tuple[str, ...]) -> list[str]:
    return [name for name in packages if not Path(PACKAGES[name]).exists()]


def ensure_packages(packages: tuple[str, ...], log=None) -> float:
    """Install the missing ``packages`` with apt-get; returns the seconds it took."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if not missing(packages):
        return 0.0
    if not shutil.which("apt-get") or os.geteuid() != 0:
        raise SetupError(
            f"missing {', '.join(missing(packages))}: install these Debian packages "
            "(apt-get as root), or their equivalents"
        )
    started = time.monotonic()
    lock_path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    lock_path = lock_path / "multicluster-scheduler" / ".apt.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wanted = missing(packages)
        if not wanted:
            return 0.0
        log(f"installing Debian packages: {' '.join(wanted)}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for argv in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *wanted],
        ):
            with progress(" ".join(argv[:2])):
                proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise SetupError(f"{' '.join(argv)} failed:\n{proc.stdout[-2000:]}{proc.stderr}")
    if missing(packages):
        raise SetupError(f"still missing after apt-get: {', '.join(missing(packages))}")
    seconds = time.monotonic() - started
    log(f"installed Debian packages in {seconds:.0f}s")
    return seconds


def machine_settings() -> dict[str, object]:
    """What real nodes promise to leave as they found it on this machine: kernel settings,
    network interfaces, addresses, routes and forwarding, iptables rules, and mounts (cgroup
    hierarchies included)."""
    settings: dict[str, object] = {}
    for key in (
        "vm/overcommit_memory",
        "vm/panic_on_oom",
        "kernel/panic",
        "kernel/panic_on_oops",
        "kernel/keys/root_maxkeys",
        "kernel/keys/root_maxbytes",
        "net/ipv4/ip_forward",
        "net/ipv4/conf/all/route_localnet",
        "net/bridge/bridge-nf-call-iptables",
    ):
        path = Path("/proc/sys") / key
        settings[key] = path.read_text().strip() if path.exists() else None
    settings["interfaces"] = sorted(os.listdir("/sys/class/net"))
    for name, argv in (
        ("addresses", ["ip", "-o", "address"]),
        ("routes", ["ip", "route", "show", "table", "all"]),
        ("iptables", ["iptables-save"]),
    ):
        if shutil.which(argv[0]):
            out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
            # iptables-save stamps its output with the time.
            settings[name] = [line for line in out.splitlines() if not line.startswith("#")]
    with open("/proc/self/mountinfo") as f:
        settings["mounts"] = sorted(line.split(" - ")[0].split()[4] for line in f)
    return settings
