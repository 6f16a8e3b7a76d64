"""The first process of a real node: PID 1 of its own PID, mount and network namespaces.

Started by :mod:`testbed.realnode.node` under ``unshare --pid --fork --mount --net --propagation
private --kill-child=SIGKILL``: everything the node runs (containerd, its shims, kubelet, the
pods' containers) is in this PID namespace, so it all ends when this process ends, by the
kernel's hand, whatever the test run did. Before starting them it makes the node's world
private:

- ``/proc`` of the new PID namespace, and over the six kernel settings kubelet insists on
  (``vm.overcommit_memory``, ``kernel.panic``, …) files holding the values it wants, so that it
  finds them set and writes nothing to the machine's kernel;
- ``/var/lib``, ``/var/log`` and ``/run`` from the node's folder (kubelet's fixed paths, the CNI
  plugins' state, containerd's sockets), seen by these processes only;
- its network: loopback, the bridge its pods join (the node's address is the bridge's), the
  ``kubernetes`` Service's address, the machine's address as pods see it, and the relays of
  :mod:`testbed.realnode.relay`.

Then it starts containerd, and kubelet once containerd answers; if either exits, the node ends.
Configuration comes as one JSON file written by :class:`testbed.realnode.node.RealNode`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .relay import Dialer, EgressProxy, Forwarder, Namespaces

log = logging.getLogger("node")


def run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")


def make_private_mounts(config: dict) -> None:
    run("mount", "-t", "proc", "proc", "/proc")
    values = Path(config["dir"]) / "kernel-settings"
    values.mkdir(exist_ok=True)
    for key, value in config["kernel_settings"].items():
        path = Path("/proc/sys") / key
        if path.read_text().strip() == str(value):
            continue
        holder = values / key.replace("/", ".")
        holder.write_text(f"{value}\n")
        run("mount", "--bind", str(holder), str(path))
        log.info("kernel setting kept private key=%s value=%s", key, value)
    for target, source in config["binds"].items():
        Path(source).mkdir(parents=True, exist_ok=True)
        run("mount", "--bind", source, target)


def bridge_address(node_ip: str) -> str:
    """A locally administered MAC address made of the node's IPv4 address."""
    return "02:00:" + ":".join(f"{int(octet):02x}" for octet in node_ip.split("."))


def make_network(config: dict) -> None:
    net = config["network"]
    run("ip", "link", "set", "lo", "up")
    for address in (net["service_ip"], net["host_address"]):
        run("ip", "address", "add", f"{address}/32", "dev", "lo")
    # A bridge left to choose takes the lowest address of its ports, so a pod going away could
    # change it: every other pod then sends to a gateway that is gone until its ARP entry
    # expires (half a minute of lost probes, webhook calls and API requests). Set, it stays.
    run(
        "ip",
        "link",
        "add",
        net["bridge"],
        "address",
        bridge_address(net["node_ip"]),
        "type",
        "bridge",
    )
    run("ip", "address", "add", f"{net['node_ip']}/{net['prefix']}", "dev", net["bridge"])
    run("ip", "link", "set", net["bridge"], "up")


async def start_relays(config: dict, host_netns: int) -> list[asyncio.AbstractServer]:
    net = config["network"]
    dialer = Dialer(Namespaces(host_netns).host_socket, [net["subnet"]])
    api = ("127.0.0.1", config["apiserver_port"])
    servers = [
        await EgressProxy(config["egress_socket"], dialer).start(),
        await Forwarder((net["service_ip"], 443), api, dialer).start(),
    ]
    for port in config["host_ports"]:
        forward = Forwarder((net["host_address"], port), ("127.0.0.1", port), dialer)
        servers.append(await forward.start())
    return servers


class Supervisor:
    """Starts the node's daemons, reaps every child (PID 1 adopts the shims' orphans), and ends
    the node when a daemon exits."""

    def __init__(self) -> None:
        self.daemons: dict[int, str] = {}
        self.ended = asyncio.Event()
        self.exit_code = 0

    def spawn(self, spec: dict) -> None:
        env = dict(os.environ) | spec.get("env", {})
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ]
        pid = os.posix_spawn(spec["argv"][0], spec["argv"], env, file_actions=actions)
        self.daemons[pid] = spec["name"]
        log.info("started name=%s pid=%d", spec["name"], pid)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            name = self.daemons.pop(pid, None)
            if name is not None:
                log.error("exited name=%s status=%d", name, os.waitstatus_to_exitcode(status))
                self.end(1)

    def end(self, code: int) -> None:
        self.exit_code = self.exit_code or code
        self.ended.set()


async def wait_for_socket(path: str, supervisor: Supervisor, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not Path(path).exists():  # noqa: ASYNC240 (a local stat, while nothing else runs)
        if supervisor.ended.is_set() or time.monotonic() > deadline:
            raise RuntimeError(f"no socket at {path}")
        await asyncio.sleep(0.1)


async def serve(config: dict, host_netns: int) -> int:
    supervisor = Supervisor()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGCHLD, supervisor.reap)
    loop.add_signal_handler(signal.SIGTERM, supervisor.end, 0)
    loop.add_signal_handler(signal.SIGINT, supervisor.end, 0)
    servers = await start_relays(config, host_netns)
    log.info("relays listening")
    containerd, kubelet = config["containerd"], config["kubelet"]
    supervisor.spawn(containerd)
    await wait_for_socket(containerd["socket"], supervisor)
    supervisor.spawn(kubelet)
    await supervisor.ended.wait()
    for server in servers:
        server.close()
    return supervisor.exit_code


def main(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(name)s %(message)s"
    )
    if os.getpid() != 1:
        print("testbed.realnode.init runs as PID 1 of a namespace (see testbed.realnode.node)")
        return 2
    config = json.loads(Path(argv[0]).read_text())
    # The machine's network namespace, from the process that started us (before /proc is the
    # new PID namespace's, where that process is not to be seen).
    host_netns = os.open(f"/proc/{config['host_pid']}/ns/net", os.O_RDONLY)
    make_private_mounts(config)
    make_network(config)
    return asyncio.run(serve(config, host_netns))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
