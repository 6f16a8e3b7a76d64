"""The benchmarks still run (small sizes); their figures are published from full runs."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import TestBed

ROOT = Path(__file__).resolve().parents[1]


def test_informer_benchmark_runs(testbed: TestBed, tmp_path: Path):
    out = tmp_path / "informer.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.informer",
            "--pods",
            "300",
            "--kubeconfig",
            str(testbed.kubeconfig),
            "--context",
            "cluster1",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [r["objects"] for r in report["results"]] == [
        "full dict",
        "full dict without managedFields",
        "slim projection",
    ]
    for result in report["results"]:
        assert result["cached_pods"] == 300
        assert result["events_per_s"] > 0
    assert "| slim projection |" in proc.stdout


@pytest.mark.timeout(900)  # eight benchmarks, each on the same three clusters: about 7 minutes
def test_the_benchmark_suite_runs_end_to_end_at_small_sizes(bin_dir: Path, tmp_path: Path):
    """``python -m bench --quick``: every benchmark on its own three clusters, at smoke
    sizes; the figures in docs/performance.md come from full runs."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert "error" not in results
    assert results["agent_errors"] == {}, results["agent_errors"]
    rollout = results["rollout"]
    assert rollout["native_s"][0] > 0
    assert rollout["elected_s"][0] > 0
    elected = rollout["runs"]["elected"][0]
    assert sum(elected["delegates"].values()) == rollout["replicas"], "one delegate per replica"
    placement = results["placement"]
    assert placement["api_ceiling_per_s"] > 0
    assert placement["placement_per_s"] > 0
    assert placement["runs"]["elected"]["refused"] == 0
    fairness = results["fairness"]
    assert len(fairness["during_burst_s"]) == 1
    assert fairness["ratio"] > 0
    webhook = results["webhook"]
    assert webhook["errors"] == 0
    assert webhook["sent"] > 0
    assert webhook["apiserver"]["failures"] == 0
    assert len(results["targets"]["seconds"]) == 3
    scale = results["scale"]
    assert scale["targets"] == 10
    assert sum(scale["delegates"].values()) == scale["pods"]
    assert scale["restart"]["seconds"] > 0
    table = (tmp_path / "results.md").read_text()
    for figure in ("ratio elected / native", "placement, proxies bound/s", "webhook p50 / p99"):
        assert figure in table
    assert (tmp_path / "logs" / "cluster1" / "agent-0.log").exists()


@pytest.mark.alone  # a ratio of two timings: measured with no other test running
@pytest.mark.timeout(1500)
def test_a_burst_in_one_namespace_does_not_hold_up_another_namespaces_first_pods(
    bin_dir: Path, tmp_path: Path
):
    """``python -m bench --only fairness``: 5 elected pods of namespace B, created once a
    quarter of namespace A's burst of 300 elected pods exists (both through the same two
    ClusterTargets), are Running before half of A's burst is, and within 5 times their time
    during the same burst unelected, where our agent has nothing to do (the goal is 2, nearly
    met on a quiet machine; on this shared two-core one the ratio swings with its load; B alone on
    an idle machine is a figure of the report, not a bound: the burst alone, unelected, makes B
    1.5 to 3.3 times as slow). Medians of five rounds, all in the same run. First come, first
    served, B came after 71 to 100 % of A's burst, 7.8 times as slow as during the unelected
    burst."""
    argv = ["--only", "fairness", "--fair-burst", "300", "--fair-rounds", "5"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *argv, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert "error" not in results
    fairness = results["fairness"]
    summary = {
        key: fairness[key]
        for key in ("alone_s", "during_native_burst_s", "during_burst_s", "during_burst_a_ready")
    }
    assert statistics.median(fairness["during_burst_a_ready"]) < 300 / 2, summary
    assert fairness["ratio_to_native_burst"] <= 5.0, summary
