"""``python -m testbed up|down``: local clusters for development and demos.

A thin shell over :mod:`testbed.supervisor` (the same from Python: ``supervisor.start(DIR,
Request([ClusterSpec(...), ...], install=True))``, ``supervisor.stop(DIR)``): ``up`` starts a
supervisor process in its own session and returns once every cluster is ready; the components
are bound to that supervisor (they die with it). ``down`` stops the supervisor, which stops its
components; any component still found is killed.

``--real-nodes`` adds a real node (kubelet and containerd, :mod:`testbed.realnode`) to every
cluster, holding the agent's image built here; with ``--install``, the chart is then installed
as users install it, its agents in their pods on those nodes (:mod:`testbed.incluster`).

``--argo`` runs Argo Workflows' controller, with its CRDs, in the first cluster (the source of
workflows whose steps are elected; :mod:`testbed.argo`).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from pathlib import Path

from . import supervisor
from .bed import ClusterSpec
from .incluster import install_command

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


def up(args: argparse.Namespace) -> int:
    # Ctrl-C stops what was started, even when started from a background job (whose shell
    # leaves SIGINT ignored, and Python with it: CI runs the tests so).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    request = supervisor.Request(
        parse_specs(args), install=args.install, agents=args.agents, timeout=args.timeout
    )
    try:
        started = supervisor.start(Path(args.dir), request)
    except supervisor.SupervisorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    names = ", ".join(s.name for s in request.specs)
    print(f"clusters {names} ready in {started.seconds:.1f}s", file=sys.stderr)
    if started.agent_image and not args.install:
        contexts = [s.name for s in request.specs]
        print(
            "Install the chart as users do, its agents on the real nodes (the fake ones run "
            f"nothing):\n{install_command(started.agent_image, contexts)}",
            file=sys.stderr,
        )
    print(f"export KUBECONFIG={started.kubeconfig} PATH={started.bin_dir}:$PATH")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _up_options(sub.add_parser("up", help="start clusters and wait until ready"))
    sub.add_parser("serve").add_argument("--dir", required=True)  # the supervisor (up runs it)
    sub.add_parser("down", help="stop everything started by up").add_argument(
        "--dir", required=True
    )
    args = parser.parse_args(argv)
    if args.command == "up":
        return up(args)
    if args.command == "serve":
        return supervisor.serve(Path(args.dir).resolve())
    supervisor.stop(Path(args.dir).resolve())
    return 0


def _up_options(p: argparse.ArgumentParser) -> None:
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


if __name__ == "__main__":
    sys.exit(main())
