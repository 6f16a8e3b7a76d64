"""``python -m bench``: every benchmark of docs/performance.md, in one run.

    python -m bench [--only rollout,placement,fairness,webhook,writes,targets,scale,growth]
                        [--out DIR] [--quick]

Starts three clusters on this machine (see ``bed``), installs the chart in each, runs the
benchmarks in order and writes ``DIR/results.json`` and ``DIR/results.md`` (default
``bench-results/``), and the growth benchmark's plots as PNG files (with the optional ``bench``
extra: matplotlib). ``--quick`` runs everything at small sizes (a smoke test, not figures).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from . import report
from .bed import BenchBed, dump, machine, versions

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ("rollout", "placement", "fairness", "webhook", "writes", "targets", "scale", "growth")


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split(",") if n.strip())


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated benchmarks")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    parser.add_argument("--replicas", type=int, help="rollout replicas (default 1000)")
    parser.add_argument("--rounds", type=int, help="native/elected rollout pairs (default 2)")
    parser.add_argument("--burst", type=int, help="pods per placement burst (default 2000)")
    parser.add_argument("--fair-burst", type=int, help="fairness: tenant A's pods (default 300)")
    parser.add_argument("--fair-pods", type=int, default=5, help="fairness: tenant B's pods")
    parser.add_argument("--fair-rounds", type=int, help="fairness: rounds (default 3)")
    parser.add_argument("--webhook-rate", type=float, default=500.0)
    parser.add_argument("--webhook-seconds", type=float, help="default 30")
    parser.add_argument("--scale-pods", type=int, help="elected pods at scale (default 10000)")
    parser.add_argument("--writes-pods", type=int, help="pods per writes run (default 1000)")
    parser.add_argument(
        "--growth-targets", type=_sizes, help="growth: target counts (default 1,10,50,100)"
    )
    parser.add_argument(
        "--growth-pods", type=_sizes, help="growth: pod counts (default 1000,5000,10000,20000)"
    )
    parser.add_argument(
        "--growth-burst", type=int, help="growth: pods placed at each target count (default 1000)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run the source agent under py-spy; its samples go to OUT/agent-profile.txt",
    )
    parser.add_argument("--keep", action="store_true", help="leave the clusters running")
    args = parser.parse_args(argv)
    quick = args.quick
    args.replicas = args.replicas or (60 if quick else 1000)
    args.rounds = args.rounds or (1 if quick else 2)
    args.burst = args.burst or (60 if quick else 2000)
    args.fair_burst = args.fair_burst or (60 if quick else 300)
    args.fair_rounds = args.fair_rounds or (1 if quick else 3)
    args.webhook_seconds = args.webhook_seconds or (3 if quick else 30)
    args.scale_pods = args.scale_pods or (100 if quick else 10_000)
    args.writes_pods = args.writes_pods or (60 if quick else 1000)
    args.growth_targets = args.growth_targets or ((1, 4) if quick else (1, 10, 50, 100))
    args.growth_pods = args.growth_pods or ((40, 80) if quick else (1000, 5000, 10_000, 20_000))
    args.growth_burst = args.growth_burst or (30 if quick else 1000)
    args.growth_idle_s = 3.0 if quick else 20.0
    args.only = [b.strip() for b in args.only.split(",") if b.strip()]
    py_spy = Path(sys.executable).with_name("py-spy")
    if args.profile and not py_spy.exists():
        parser.error(f"--profile needs py-spy next to {sys.executable}: pip install -e '.[bench]'")
    unknown = set(args.only) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmarks {sorted(unknown)}: choose from {', '.join(BENCHMARKS)}")
    return args


async def run(bed: BenchBed, args: argparse.Namespace, results: dict) -> None:
    from . import rollout, scale, targets

    bed.connect()
    try:
        if {"rollout", "placement", "fairness"} & set(args.only):
            await targets.connect_cluster_targets(bed)
        if "rollout" in args.only:
            results["rollout"] = await rollout.compare(bed, args.replicas, args.rounds)
        if "placement" in args.only:
            results["placement"] = await rollout.placement(bed, args.burst)
        if "fairness" in args.only:
            from . import fairness

            results["fairness"] = await fairness.run(
                bed, args.fair_burst, args.fair_pods, args.fair_rounds
            )
        if "webhook" in args.only:
            from . import webhook_bench

            results["webhook"] = await webhook_bench.run(
                bed, args.webhook_rate, args.webhook_seconds
            )
        if {"rollout", "placement", "fairness"} & set(args.only):
            await targets.disconnect_cluster_targets(bed)
        if "writes" in args.only:
            from . import writes

            results["writes"] = await writes.run(bed, args.writes_pods)
        if "targets" in args.only:
            results["targets"] = await targets.time_to_ready(bed, 3 if args.quick else 10)
        if "scale" in args.only:
            results["scale"] = await scale.run(bed, args.scale_pods)
        if "growth" in args.only:
            from . import growth

            results["growth"] = {}
            await growth.run(
                bed,
                results["growth"],
                args.growth_targets,
                args.growth_pods,
                args.growth_burst,
                args.growth_idle_s,
            )
    finally:
        await bed.close()


def save_logs(bed: BenchBed, where: Path) -> None:
    """Every component's log, for the profile of a failure or of a figure."""
    shutil.rmtree(where, ignore_errors=True)
    for name, cluster in bed.testbed.clusters.items():
        if (cluster.dir / "logs").exists():
            shutil.copytree(cluster.dir / "logs", where / name)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": machine(),
    }
    with tempfile.TemporaryDirectory(prefix="mcs-bench-") as scratch:
        profile = args.out / "agent-profile.txt" if args.profile else None
        bed = BenchBed(Path(scratch), profile=profile)
        results["versions"] = versions(bed.bin_dir)
        started = time.monotonic()
        failed = False
        try:
            bed.up()
            asyncio.run(run(bed, args, results))
        except Exception:
            failed = True
            traceback.print_exc()
            results["error"] = traceback.format_exc(limit=3)
        finally:
            results["seconds"] = round(time.monotonic() - started)
            results["agent_errors"] = report.agent_errors(bed)
            dump(args.out / "results.json", results)
            (args.out / "results.md").write_text(report.markdown(results))
            if (results.get("growth") or {}).get("target_steps"):
                from . import plots

                plots.write(results, args.out)
            save_logs(bed, args.out / "logs")
            if args.keep:
                print(f"clusters left running: KUBECONFIG={bed.kubeconfig}", file=sys.stderr)
                input("press Enter to stop them")
            bed.down()
    print(report.markdown(results))
    print(f"written to {args.out}/results.md and results.json", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
