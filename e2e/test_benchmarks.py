"""The benchmarks still run (small sizes); their figures are published from full runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from e2e.cluster import TestBed

ROOT = Path(__file__).resolve().parents[1]


def test_informer_benchmark_runs(testbed: TestBed, tmp_path: Path):
    out = tmp_path / "informer.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "e2e.bench.informer",
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
