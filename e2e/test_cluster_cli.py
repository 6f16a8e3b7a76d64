"""``python -m testbed up|down`` as developers use it, and what it leaves behind: nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e.scenarios import processes_under
from testbed import wait_for
from testbed.kubectl import Kubectl

ROOT = Path(__file__).resolve().parents[1]


def cluster_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "testbed", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def run_dir(tmp_path: Path):
    directory = tmp_path / "bed"
    yield directory
    cluster_cli("down", "--dir", str(directory))


def test_up_get_nodes_then_down_leaves_no_process(run_dir: Path, bin_dir: Path):
    started = time.monotonic()
    up = cluster_cli("up", "--clusters", "cluster1,cluster2", "--dir", str(run_dir))
    assert up.returncode == 0, up.stderr
    print(f"two clusters up in {time.monotonic() - started:.1f}s")
    assert f"KUBECONFIG={run_dir / 'kubeconfig'}" in up.stdout

    kubectl = Kubectl(run_dir / "kubeconfig", bin_dir)
    table = kubectl("cluster2", "get", "nodes", "--no-headers")
    rows = [line.split() for line in table.splitlines()]
    assert [(r[0], r[1]) for r in rows] == [(f"cluster2-node-{i}", "Ready") for i in range(3)]
    assert len(processes_under(run_dir)) == 1 + 2 * 5, "supervisor plus five per cluster"

    down = cluster_cli("down", "--dir", str(run_dir))
    assert down.returncode == 0, down.stderr
    assert processes_under(run_dir) == []


def test_components_die_with_a_killed_supervisor(run_dir: Path):
    up = cluster_cli("up", "--clusters", "solo", "--nodes", "1", "--dir", str(run_dir))
    assert up.returncode == 0, up.stderr
    state = json.loads((run_dir / "testbed.json").read_text())
    assert len(state["pids"]) == 5
    os.kill(state["supervisor"], signal.SIGKILL)
    wait_for(
        lambda: processes_under(run_dir) == [],
        timeout=15,
        what="components to die with their supervisor",
    )


def test_interrupted_up_stops_what_it_started(run_dir: Path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed", "up", "--clusters", "solo", "--dir", str(run_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(
        lambda: any("etcd" in p for p in processes_under(run_dir)),
        timeout=60,
        what="etcd to start",
        interval=0.05,
    )
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 130
    assert processes_under(run_dir) == []


def test_up_refuses_bad_names_before_starting_anything(run_dir: Path):
    up = cluster_cli("up", "--clusters", "Cluster_1", "--dir", str(run_dir), timeout=60)
    assert up.returncode != 0
    assert "'Cluster_1' is not a DNS label" in up.stderr
    assert processes_under(run_dir) == []


def test_up_with_install_runs_agents_and_down_stops_them(run_dir: Path, bin_dir: Path):
    up = cluster_cli(
        "up",
        "--clusters",
        "solo",
        "--nodes",
        "1",
        "--install",
        "--agents",
        "2",
        "--dir",
        str(run_dir),
    )
    assert up.returncode == 0, up.stderr
    kubectl = Kubectl(run_dir / "kubeconfig", bin_dir)
    lease = wait_for(
        lambda: kubectl.json("solo", "get", "lease", "multicluster-scheduler", "-n", "admiralty")[
            "spec"
        ].get("holderIdentity"),
        timeout=30,
        what="an agent leading",
    )
    assert lease in ("solo-agent-0", "solo-agent-1")
    assert len([p for p in processes_under(run_dir) if "multicluster_scheduler" in p]) == 2
    down = cluster_cli("down", "--dir", str(run_dir))
    assert down.returncode == 0, down.stderr
    assert processes_under(run_dir) == []
