"""``python -m testbed up|down``: local clusters for development and demos.

``up`` starts a supervisor process in its own session and returns once every cluster is ready;
the components are bound to that supervisor (they die with it). ``down`` stops the supervisor,
which stops its components; any component still found is killed.

``--real-nodes`` adds a real node (kubelet and containerd, :mod:`testbed.realnode`) to every
cluster, holding the agent's image built here; with ``--install``, the chart is then installed
as users install it, its agents in their pods on those nodes (:mod:`testbed.incluster`).

``--argo`` runs Argo Workflows' controller, with its CRDs, in the first cluster (the source of
workflows whose steps are elected; :mod:`testbed.argo`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .bed import ClusterSpec, TestBed
from .incluster import InClusterInstallation, install_command
from .install import Installation
from .testbin import build

STATE_FILE = "testbed.json"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?")


def parse_specs(args: argparse.Namespace) -> list[ClusterSpec]:
    names = [n.strip() for n in args.clusters.split(",") if n.strip()]
    for name in names:
        if not DNS_LABEL.fullmatch(name):
            raise SystemExit(f"--clusters: {name!r} is not a DNS label (a-z, 0-9, '-')")
    if not names or len(set(names)) != len(names):
        raise SystemExit(f"--clusters: names must be distinct and non-empty: {args.clusters!r}")
    labels: dict[str, dict[str, str]] = {n: {} for n in names}
    for item in args.node_label:
        scope, _, pair = item.rpartition(":")
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--node-label {item!r}: expected [CLUSTER:]KEY=VALUE")
        for name in [scope] if scope else names:
            if name not in labels:
                raise SystemExit(f"--node-label {item!r}: no cluster named {name!r}")
            labels[name][key] = value
    allocatable = {"cpu": args.node_cpu, "memory": args.node_memory, "pods": args.node_pods}
    return [
        ClusterSpec(
            name=n,
            nodes=args.nodes,
            allocatable=dict(allocatable),
            node_labels=labels[n],
            real_node=args.real_nodes,
            argo=args.argo and n == names[0],
        )
        for n in names
    ]


def _write_state(directory: Path, **state) -> None:
    tmp = directory / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state))
    tmp.rename(directory / STATE_FILE)


def _read_state(directory: Path) -> dict:
    try:
        return json.loads((directory / STATE_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _is_ours(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return any(
        mark in cmdline for mark in (b"-m testbed ", b"testbed.realnode", b"testbin", b"/bin-")
    )


def serve(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    stop = threading.Event()

    def interrupt(*_):
        raise SystemExit(128 + signal.SIGTERM)

    # While starting, a stop request aborts the start (TestBed.up stops what it started).
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    _write_state(directory, supervisor=os.getpid(), phase="starting")
    real_nodes = agent_image = None
    if args.real_nodes:
        from testbed.realnode import prepare

        try:
            real_nodes, agent_image = prepare()  # built by `up` already: cached
            if args.argo:
                from testbed.image import build_argoexec_image

                real_nodes.images.append(build_argoexec_image().archive)
        except Exception as e:
            _write_state(directory, supervisor=os.getpid(), phase="failed", error=str(e))
            return 1
    argo_bin = executor = None
    try:
        if args.argo:
            argo_bin = build(group="argo")  # built by `up` already: cached
        if args.argo and real_nodes is not None:
            from testbed.image import build_argoexec_image

            executor = build_argoexec_image().name  # cached too
    except Exception as e:
        _write_state(directory, supervisor=os.getpid(), phase="failed", error=str(e))
        return 1
    bed = TestBed(
        parse_specs(args),
        directory,
        Path(args.bin_dir),
        real_nodes=real_nodes,
        argo_bin=argo_bin,
        argo_executor_image=executor,
    )
    try:
        bed.up(timeout=args.timeout)
    except Exception as e:
        _write_state(directory, supervisor=os.getpid(), phase="failed", error=str(e))
        return 1
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if args.install:
        try:
            if agent_image is not None:
                installation = InClusterInstallation(bed, agent_image.name)
                installation.install()
            else:
                installation = Installation(bed, agents_per_cluster=args.agents)
                installation.install()
                installation.start_agents()
        except Exception as e:
            bed.down()
            _write_state(directory, supervisor=os.getpid(), phase="failed", error=str(e))
            return 1
    pids = [p.pid for p in bed.processes() if p.pid]
    _write_state(directory, supervisor=os.getpid(), phase="ready", pids=pids)
    while not stop.wait(1.0):
        dead = [p.name for p in bed.processes() if not p.running]
        if dead:
            print(f"component(s) exited: {', '.join(dead)}", file=sys.stderr, flush=True)
    if args.install and isinstance(installation, Installation):
        installation.stop_agents()
    bed.down()
    _write_state(directory, phase="stopped")
    return 0


def _stop_supervisor(pid: int, timeout: float) -> None:
    """SIGTERM, wait for it to stop its components, SIGKILL if it does not."""
    if not _is_ours(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _is_ours(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _is_ours(pid):
        os.kill(pid, signal.SIGKILL)


def down(directory: Path, timeout: float = 30.0) -> None:
    state = _read_state(directory)
    if state.get("supervisor"):
        _stop_supervisor(state["supervisor"], timeout)
    for pid in state.get("pids", []):
        if _is_ours(pid):
            os.kill(pid, signal.SIGKILL)
    if state:
        _write_state(directory, phase="stopped")


def up(args: argparse.Namespace) -> int:
    # Ctrl-C stops what was started, even when started from a background job (whose shell
    # leaves SIGINT ignored, and Python with it: CI runs the tests so).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    directory = Path(args.dir).resolve()
    parse_specs(args)  # refuse bad options before starting anything
    directory.mkdir(parents=True, exist_ok=True)
    down(directory)
    image = None
    try:
        bin_dir = build()
        if args.argo:
            build(group="argo")
        if args.real_nodes:
            from testbed.realnode import prepare

            image = prepare()[1].name
        if args.argo and args.real_nodes:
            from testbed.image import build_argoexec_image

            build_argoexec_image()
    except Exception as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    (directory / STATE_FILE).unlink(missing_ok=True)
    argv = [sys.executable, "-m", "testbed", "serve", "--bin-dir", str(bin_dir)]
    argv += ["--dir", str(directory), "--clusters", args.clusters, "--nodes", str(args.nodes)]
    argv += ["--node-cpu", args.node_cpu, "--node-memory", args.node_memory]
    argv += ["--node-pods", args.node_pods, "--timeout", str(args.timeout)]
    for label in args.node_label:
        argv += ["--node-label", label]
    if args.install:
        argv += ["--install", "--agents", str(args.agents)]
    if args.real_nodes:
        argv += ["--real-nodes"]
    if args.argo:
        argv += ["--argo"]
    started = time.monotonic()
    with (directory / "supervisor.log").open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[1],
        )
    try:
        while True:
            state = _read_state(directory)
            if state.get("phase") == "ready":
                break
            if state.get("phase") == "failed" or proc.poll() is not None:
                print(f"error: {state.get('error') or 'supervisor exited'}", file=sys.stderr)
                print(f"supervisor log: {directory / 'supervisor.log'}", file=sys.stderr)
                _stop_supervisor(proc.pid, 30.0)
                down(directory)
                return 1
            time.sleep(0.2)
    except KeyboardInterrupt:
        _stop_supervisor(proc.pid, 30.0)
        down(directory)
        return 130
    names = ", ".join(s.strip() for s in args.clusters.split(","))
    print(f"clusters {names} ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
    if image and not args.install:
        contexts = [s.strip() for s in args.clusters.split(",")]
        print(
            "Install the chart as users do, its agents on the real nodes (the fake ones run "
            f"nothing):\n{install_command(image, contexts)}",
            file=sys.stderr,
        )
    print(f"export KUBECONFIG={directory / 'kubeconfig'} PATH={bin_dir}:$PATH")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "serve"):
        p = sub.add_parser(name, help="start clusters and wait until ready" if name == "up" else "")
        p.add_argument("--clusters", default="cluster1,cluster2", help="comma-separated names")
        p.add_argument("--dir", required=True, help="folder for state, logs and kubeconfig")
        p.add_argument("--nodes", type=int, default=3, help="fake nodes per cluster")
        p.add_argument("--node-cpu", default="8")
        p.add_argument("--node-memory", default="32Gi")
        p.add_argument("--node-pods", default="110")
        p.add_argument(
            "--node-label",
            action="append",
            default=[],
            metavar="[CLUSTER:]KEY=VALUE",
            help="label the fake nodes (of one cluster, or all); repeatable",
        )
        p.add_argument("--timeout", type=float, default=180.0)
        p.add_argument(
            "--install",
            action="store_true",
            help="helm install the chart into every cluster and run its agents locally",
        )
        p.add_argument("--agents", type=int, default=1, help="agents per cluster (with --install)")
        p.add_argument(
            "--real-nodes",
            action="store_true",
            help="one real node per cluster (kubelet, containerd) holding the agent's image "
            "built here; with --install, the agents run there as the chart deploys them",
        )
        p.add_argument(
            "--argo",
            action="store_true",
            help="Argo Workflows' controller and CRDs in the first cluster (built from its Go "
            "module on first use, then cached)",
        )
        if name == "serve":
            p.add_argument("--bin-dir", required=True)
    p = sub.add_parser("down", help="stop everything started by up")
    p.add_argument("--dir", required=True)
    args = parser.parse_args(argv)
    if args.command == "up":
        return up(args)
    if args.command == "serve":
        return serve(args)
    down(Path(args.dir).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
