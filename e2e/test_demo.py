"""The one-command demo (``./dev demo``, ``./dev down``): the local run end to end in a folder of
its own, and the commands of the run on real clusters (which cannot run here) checked as built."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e.scenarios import processes_under
from testbed import demo
from testbed.kubectl import Kubectl

ROOT = Path(__file__).resolve().parents[1]


def demo_cli(*args: str, timeout: float = 420) -> subprocess.CompletedProcess:
    """The entry point ``./dev demo`` and ``./dev down`` run (after setting up the venv). The
    timeout is for a machine busy with other workers' beds: alone, ``up`` takes about a minute
    (it prints how long)."""
    proc = subprocess.run(
        [sys.executable, "-m", "testbed.demo", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    print(f"$ python -m testbed.demo {' '.join(args)}\n{proc.stdout}{proc.stderr}")
    return proc


@pytest.fixture
def demo_dir(tmp_path: Path):
    directory = tmp_path / "demo"
    yield directory
    demo_cli("down", "--dir", str(directory))


def test_demo_runs_nginx_across_two_clusters_and_down_leaves_nothing(demo_dir: Path, bin_dir: Path):
    started = time.monotonic()
    up = demo_cli("up", "--dir", str(demo_dir))
    assert up.returncode == 0, up.stderr
    print(f"demo up in {time.monotonic() - started:.1f}s")

    # The report: a row per cluster, 10 delegates in all, how to look further and to stop.
    rows = dict(
        (m["cluster"], int(m["count"]))
        for m in re.finditer(
            r"^  (?P<cluster>cluster[12])\s+c[12]\s+admiralty-namespace-default-c[12]\s+"
            r"(?P<count>\d+)$",
            up.stdout,
            re.MULTILINE,
        )
    )
    assert sorted(rows) == ["cluster1", "cluster2"]
    assert sum(rows.values()) == 10
    assert re.search(r"^Ready in \d+ s\.$", up.stdout, re.MULTILINE)
    kubeconfig = demo_dir / "kubeconfig"
    assert "kubectl --context cluster2 get pods -o wide" in up.stdout
    assert f"Stop it: python -m testbed.demo down --dir {demo_dir}" in up.stdout
    assert up.stdout.splitlines()[-3] == f"export KUBECONFIG={kubeconfig}"

    # What the report says is what runs: delegates Running in both clusters.
    kubectl = Kubectl(kubeconfig, bin_dir)
    for cluster, count in rows.items():
        pods = kubectl.json(cluster, "get", "pods", "-n", "default", "-l", demo.PARENT_UID)
        delegates = [
            p for p in pods["items"] if p["spec"].get("schedulerName") != "admiralty-proxy"
        ]
        assert count > 0
        assert len(delegates) == count
        assert all(p["status"]["phase"] == "Running" for p in delegates)
    nodes = kubectl("cluster1", "get", "nodes", "-l", demo.PROVIDER_KEY, "-o", "name").split()
    assert nodes == [
        "node/admiralty-namespace-default-c1",
        "node/admiralty-namespace-default-c2",
    ]

    # Again while up: the same report, nothing restarted.
    pids = json.loads((demo_dir / "testbed.json").read_text())["pids"]
    again = demo_cli("up", "--dir", str(demo_dir), timeout=180)
    assert again.returncode == 0, again.stderr
    assert "The demo is already running" in again.stdout
    assert "Where the 10 nginx delegates run" in again.stdout
    assert json.loads((demo_dir / "testbed.json").read_text())["pids"] == pids

    down = demo_cli("down", "--dir", str(demo_dir), timeout=180)
    assert down.returncode == 0, down.stderr
    assert "Demo stopped" in down.stdout
    assert processes_under(demo_dir) == []
    assert not demo_dir.exists()
    assert "No demo in" in demo_cli("down", "--dir", str(demo_dir), timeout=180).stdout


# -- your clusters, played by the session's test bed ----------------------------------------------


def helm_releases(kubectl: Kubectl, context: str, home: Path) -> list[str]:
    found = json.loads(kubectl.helm(context, "list", "--all-namespaces", "-o", "json", home=home))
    return [f"{r['name']}/{r['namespace']}" for r in found]


def namespaces(kubectl: Kubectl, context: str) -> set[str]:
    return set(kubectl(context, "get", "namespaces", "-o", "name").split())


def crds(kubectl: Kubectl, context: str) -> set[str]:
    return set(kubectl(context, "get", "crds", "-o", "name").split())


@pytest.fixture
def remote_dir(tmp_path: Path):
    """The demo's folder for the test bed played as your clusters; down, whatever happens."""
    yield tmp_path
    if (tmp_path / demo.REMOTE_STATE).exists():
        demo.main(["down", "--dir", str(tmp_path), "--contexts", "cluster1,cluster2"])


def test_on_clusters_without_the_chart_it_installs_it_and_down_uninstalls_it(
    testbed, kubectl: Kubectl, remote_dir: Path, monkeypatch, capsys
):
    """The chart's Deployment runs on kwok's fake nodes (Running without an image pulled), so
    helm's --wait passes; no agent really runs, so the joins and the wait are left out."""
    contexts = ("cluster1", "cluster2")
    before = {c: (namespaces(kubectl, c), crds(kubectl, c)) for c in contexts}
    assert not any(helm_releases(kubectl, c, remote_dir / "h") for c in contexts)
    monkeypatch.setattr(demo, "joins", lambda *a: [])
    found = [
        demo.Placement(c, t, "n", True, 5, 0) for c, t in zip(contexts, ("c1", "c2"), strict=True)
    ]
    monkeypatch.setattr(demo, "wait_running", lambda *a: found)
    common = ["--dir", str(remote_dir), "--contexts", "cluster1,cluster2"]
    up = ["up", *common, "--kubeconfig", str(testbed.kubeconfig), "--image", "example.com/mcs:t"]
    assert demo.main(up) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "chart installed in cluster1, cluster2 (image example.com/mcs:t)" in out
    for context in contexts:
        assert helm_releases(kubectl, context, remote_dir / "h") == [
            "multicluster-scheduler/admiralty"
        ]
        deployment = kubectl.json(
            context, "get", "deployment", "multicluster-scheduler", "-n", "admiralty"
        )
        image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == "example.com/mcs:t"
        assert "namespace/mcsdemo" in namespaces(kubectl, context)
    state = json.loads((remote_dir / demo.REMOTE_STATE).read_text())
    assert all("release" in made and "namespace" in made for made in state["made"].values())

    assert demo.main(["down", *common]) == 0, capsys.readouterr().err
    for context in contexts:
        assert helm_releases(kubectl, context, remote_dir / "h") == []
        assert (namespaces(kubectl, context), crds(kubectl, context)) == before[context]
    assert not (remote_dir / demo.REMOTE_STATE).exists()


def test_on_clusters_with_the_chart_it_runs_the_guide_and_down_leaves_the_chart(
    installation, testbed, kubectl: Kubectl, remote_dir: Path, capsys
):
    contexts = ("cluster1", "cluster2")
    before = {c: namespaces(kubectl, c) for c in contexts}
    logs = [agent.log_path for c in contexts for agent in installation.agents[c]]
    offsets = {log: log.stat().st_size for log in logs}
    common = ["--dir", str(remote_dir), "--contexts", "cluster1,cluster2"]
    up = ["up", *common, "--kubeconfig", str(testbed.kubeconfig)]
    assert demo.main(up) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    print(out)
    assert "cluster1: using the installed multicluster-scheduler in admiralty" in out
    rows = re.findall(
        r"^  (cluster[12])\s+c[12]\s+admiralty-namespace-mcsdemo-c[12]\s+(\d+)$", out, re.M
    )
    assert [c for c, _ in rows] == ["cluster1", "cluster2"]
    assert sum(int(n) for _, n in rows) == 10
    assert "--context cluster2 -n mcsdemo get pods -o wide" in out
    for context in contexts:
        pods = kubectl.json(context, "get", "pods", "-n", "mcsdemo", "-l", demo.PARENT_UID)
        assert any(p["status"]["phase"] == "Running" for p in pods["items"])
    binding = "admiralty-source-mcsdemo-c1-cluster-summary-viewer"
    assert (
        kubectl.run("cluster2", "get", "clusterrolebinding", binding, check=False).returncode == 0
    )

    # Again (the recorded kubeconfig): the report, nothing changed.
    assert demo.main(["up", *common]) == 0, capsys.readouterr().err
    assert "already running on cluster1, cluster2" in capsys.readouterr().out

    assert demo.main(["down", *common]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "chart uninstalled" not in out
    for context in contexts:
        assert namespaces(kubectl, context) == before[context]
        assert helm_releases(kubectl, context, remote_dir / "h") == [
            "multicluster-scheduler/admiralty"
        ]
    assert kubectl.run("cluster2", "get", "clusterrolebinding", binding, check=False).returncode
    assert not (remote_dir / demo.REMOTE_STATE).exists()
    # Taken down in order (nginx, Targets, Source, namespace): no agent acted in a terminating
    # namespace or lost its rights on the way.
    for log in logs:
        with log.open(errors="replace") as f:
            f.seek(offsets[log])
            written = f.read()
        assert "Forbidden" not in written, written
        assert " 403 " not in written, written


# -- your clusters: the commands, checked without clusters ---------------------------------------

TOOLS = demo.Tools(Path("/bin-dir"), Path("/home/me/kube.yaml"), Path("/demo/helm"))


def shown(argvs: list[list[str]]) -> list[str]:
    return [demo.display(a) for a in argvs]


def test_joins_are_the_guides_connections():
    assert shown(demo.joins(TOOLS, ("prod", "burst"), "mcsdemo", "https://10.0.0.2:6443")) == [
        "multicluster-scheduler join --kubeconfig /home/me/kube.yaml --source-context prod "
        "--target-context prod -n mcsdemo --name c1 --target-name c1",
        "multicluster-scheduler join --kubeconfig /home/me/kube.yaml --source-context prod "
        "--target-context burst -n mcsdemo --name c1 --target-name c2 --server "
        "https://10.0.0.2:6443",
    ]
    default_kubeconfig = demo.Tools(Path("/bin-dir"), None, Path("/demo/helm"))
    assert shown(demo.joins(default_kubeconfig, ("a", "b"), "ns"))[1] == (
        "multicluster-scheduler join --source-context a --target-context b -n ns --name c1 "
        "--target-name c2"
    )


def test_helm_install_sets_the_image():
    assert demo.display(demo.helm_install(TOOLS, "prod", "localhost:5000/mcs:dev")) == (
        "helm --kubeconfig /home/me/kube.yaml --kube-context prod install multicluster-scheduler "
        "charts/multicluster-scheduler --namespace admiralty --create-namespace --wait --timeout "
        "5m --set image.repository=localhost:5000/mcs --set image.tag=dev"
    )


@pytest.mark.parametrize("image", ["mcs", "localhost:5000/mcs", "mcs:", ":dev", "mcs@sha256:ab"])
def test_an_image_without_a_tag_is_refused(image: str):
    with pytest.raises(demo.DemoError, match="expected REPOSITORY:TAG"):
        demo.parse_image(image)


def test_cleanup_removes_only_what_was_made():
    state = {
        "namespace": "mcsdemo",
        # prod got the chart from the demo; burst had it already.
        "made": {
            "prod": ["namespace", "release", "crds", "release-namespace"],
            "burst": ["namespace"],
        },
    }
    steps = demo.cleanup_commands(TOOLS, state)
    k = "kubectl --kubeconfig /home/me/kube.yaml --context"
    crds = " ".join(demo.CRDS)
    assert [(s.what, shown(s.commands), s.best_effort) for s in steps] == [
        ("nginx deleted", [f"{k} prod -n mcsdemo delete deployment nginx --cascade=foreground --ignore-not-found --timeout=180s"], True),  # noqa: E501
        ("its delegates gone", [f"{k} {c} -n mcsdemo wait --for=delete pod -l app=nginx --timeout=180s" for c in ("prod", "burst")], True),  # noqa: E501
        ("Targets c1, c2 deleted", [f"{k} prod -n mcsdemo delete targets.multicluster.admiralty.io c1 c2 --ignore-not-found --timeout=180s"], True),  # noqa: E501
        ("Source c1 deleted", [f"{k} burst -n mcsdemo delete sources.multicluster.admiralty.io c1 --ignore-not-found --timeout=180s"], True),  # noqa: E501
        ("namespace mcsdemo deleted", [f"{k} {c} delete namespace mcsdemo --ignore-not-found --wait=false" for c in ("prod", "burst")], False),  # noqa: E501
        ("namespace mcsdemo gone", [f"{k} {c} wait --for=delete namespace/mcsdemo --timeout=180s" for c in ("prod", "burst")], False),  # noqa: E501
        ("chart uninstalled", ["helm --kubeconfig /home/me/kube.yaml --kube-context prod uninstall multicluster-scheduler -n admiralty --wait --ignore-not-found"], False),  # noqa: E501
        ("CRDs deleted", [f"{k} prod delete crd {crds} --ignore-not-found"], False),
        ("namespace admiralty deleted", [f"{k} prod delete namespace admiralty --ignore-not-found"], False),  # noqa: E501
    ]  # fmt: skip
    assert demo.CRDS == (
        "clustersources.multicluster.admiralty.io",
        "clustersummaries.multicluster.admiralty.io",
        "clustertargets.multicluster.admiralty.io",
        "sourceheartbeats.multicluster.admiralty.io",
        "sources.multicluster.admiralty.io",
        "targets.multicluster.admiralty.io",
    )
    assert demo.cleanup_commands(TOOLS, {"namespace": "mcsdemo", "made": {"prod": []}}) == []


class FakeClusters:
    """Records the commands up and down would run on real clusters; every command succeeds."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, existing: dict[str, dict]) -> None:
        self.commands: list[str] = []
        self.existing = existing
        monkeypatch.setattr(demo, "binaries", lambda: Path("/bin-dir"))
        monkeypatch.setattr(demo, "survey", lambda tools, context, ns: self.existing[context])
        monkeypatch.setattr(demo, "run", self.run)
        monkeypatch.setattr(
            demo, "run_all", lambda argvs, tools, timeout=0: [self.run(a, tools) for a in argvs]
        )
        found = [
            demo.Placement("prod", "c1", "n1", True, 6, 0),
            demo.Placement("burst", "c2", "n2", True, 4, 0),
        ]
        monkeypatch.setattr(demo, "wait_running", lambda *a: found)
        monkeypatch.setattr(demo, "placements", lambda *a: found)

    def run(self, argv: list[str], tools, stdin=None, timeout=0) -> str:
        self.commands.append(demo.display(argv).replace(" --kubeconfig /k", ""))
        return ""


def nothing_installed() -> dict:
    return {"namespace": False, "release-namespace": False, "release": [], "crds": []}


def test_up_and_down_on_real_clusters_touch_only_what_up_made(monkeypatch, tmp_path, capsys):
    burst = nothing_installed() | {"release": ["mcs in kube-tools"], "crds": list(demo.CRDS)}
    fake = FakeClusters(monkeypatch, {"prod": nothing_installed(), "burst": burst})
    common = ["--dir", str(tmp_path), "--contexts", "prod,burst", "--kubeconfig", "/k"]
    assert demo.main(["up", *common, "--image", "ghcr.io/me/mcs:dev"]) == 0
    out = capsys.readouterr().out
    assert "burst: using the installed mcs in kube-tools" in out
    assert "Where the 10 nginx delegates run" in out
    assert re.search(r"^  prod\s+c1\s+n1\s+6$", out, re.MULTILINE)
    assert f"Stop it: python -m testbed.demo down --dir {tmp_path} --contexts prod,burst" in out
    assert fake.commands == [
        "helm --kube-context prod install multicluster-scheduler charts/multicluster-scheduler "
        "--namespace admiralty --create-namespace --wait --timeout 5m "
        "--set image.repository=ghcr.io/me/mcs --set image.tag=dev",
        "kubectl --context prod create namespace mcsdemo",
        "kubectl --context burst create namespace mcsdemo",
        "kubectl --context prod label namespace mcsdemo multicluster-scheduler=enabled",
        "multicluster-scheduler join --source-context prod --target-context prod -n mcsdemo "
        "--name c1 --target-name c1",
        "multicluster-scheduler join --source-context prod --target-context burst -n mcsdemo "
        "--name c1 --target-name c2",
        "kubectl --context prod apply -n mcsdemo -f -",
    ]
    state = json.loads((tmp_path / demo.REMOTE_STATE).read_text())
    assert state["phase"] == "ready"
    assert state["made"] == {
        "prod": ["namespace", "release", "crds", "release-namespace"],
        "burst": ["namespace"],
    }

    fake.commands.clear()
    assert demo.main(["up", *common]) == 0  # again: the report, nothing run
    assert "already running on prod, burst" in capsys.readouterr().out
    assert fake.commands == []

    assert demo.main(["down", "--dir", str(tmp_path), "--contexts", "prod,burst"]) == 0
    assert fake.commands == [
        "kubectl --context prod -n mcsdemo delete deployment nginx --cascade=foreground --ignore-not-found --timeout=180s",  # noqa: E501
        "kubectl --context prod -n mcsdemo wait --for=delete pod -l app=nginx --timeout=180s",
        "kubectl --context burst -n mcsdemo wait --for=delete pod -l app=nginx --timeout=180s",
        "kubectl --context prod -n mcsdemo delete targets.multicluster.admiralty.io c1 c2 --ignore-not-found --timeout=180s",  # noqa: E501
        "kubectl --context burst -n mcsdemo delete sources.multicluster.admiralty.io c1 --ignore-not-found --timeout=180s",  # noqa: E501
        "kubectl --context prod delete namespace mcsdemo --ignore-not-found --wait=false",
        "kubectl --context burst delete namespace mcsdemo --ignore-not-found --wait=false",
        "kubectl --context prod wait --for=delete namespace/mcsdemo --timeout=180s",
        "kubectl --context burst wait --for=delete namespace/mcsdemo --timeout=180s",
        "helm --kube-context prod uninstall multicluster-scheduler -n admiralty --wait --ignore-not-found",  # noqa: E501
        f"kubectl --context prod delete crd {' '.join(demo.CRDS)} --ignore-not-found",
        "kubectl --context prod delete namespace admiralty --ignore-not-found",
    ]  # fmt: skip
    assert not tmp_path.joinpath(demo.REMOTE_STATE).exists()


def test_up_on_real_clusters_refuses_before_making_anything(monkeypatch, tmp_path, capsys):
    fake = FakeClusters(monkeypatch, {"prod": nothing_installed(), "burst": nothing_installed()})
    common = ["--dir", str(tmp_path), "--contexts", "prod,burst"]
    assert demo.main(["up", *common]) == 1
    assert (
        "multicluster-scheduler is not installed in prod, burst and its image is not published "
        "yet: build it from the Dockerfile, push it where prod and burst can pull it, and pass "
        "--image REPOSITORY:TAG" in capsys.readouterr().err
    )
    fake.existing["burst"]["namespace"] = True
    assert demo.main(["up", *common, "--image", "r/mcs:1"]) == 1
    assert "namespace mcsdemo already exists in burst" in capsys.readouterr().err
    assert demo.main(["up", *common, "--contexts", "prod,prod"]) == 1
    assert "expected two contexts" in capsys.readouterr().err
    assert fake.commands == []
    assert not tmp_path.joinpath(demo.REMOTE_STATE).exists()


def test_dry_run_prints_the_commands(monkeypatch, tmp_path, capsys):
    FakeClusters(monkeypatch, {})
    args = ["up", "--dir", str(tmp_path), "--contexts", "a,b", "--image", "r/mcs:1", "--dry-run"]
    assert demo.main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# up (the chart only where missing):"
    assert out[5] == "kubectl --context a label namespace mcsdemo multicluster-scheduler=enabled"
    assert "# down (only what up made):" in out


def test_hints_speak_the_users_words(tmp_path):
    args = demo.argparse.Namespace(prog="./dev", dir=".testbed", contexts=None)
    assert demo.hints(args) == ("./dev down", "./dev demo --restart")
    args = demo.argparse.Namespace(prog="./dev", dir="/tmp/x", contexts="a,b")
    assert demo.hints(args) == (
        "MCS_DEMO_DIR=/tmp/x ./dev down --contexts a,b",
        "MCS_DEMO_DIR=/tmp/x ./dev demo --contexts a,b --restart",
    )


def test_the_report_ends_with_the_lines_to_paste(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "multicluster-scheduler").touch()
    monkeypatch.setattr(demo.sys, "prefix", str(venv))
    tools = demo.Tools(tmp_path / "bin", tmp_path / ".testbed" / "kubeconfig", tmp_path / "helm")
    found = [demo.Placement("cluster1", "c1", "admiralty-namespace-default-c1", True, 7, 1)]
    demo.report(found, tools, demo.LOCAL_CLUSTERS, "default", "./dev down", "./dev demo --restart")
    out = capsys.readouterr().out
    assert out.splitlines()[-3:] == [
        f"export KUBECONFIG={tmp_path}/.testbed/kubeconfig",
        f'export PATH={venv}/bin:{tmp_path}/bin:"$PATH"',
        "CLUSTER1=cluster1 CLUSTER2=cluster2 NAMESPACE=default",
    ]
    assert "  kubectl --context cluster1 get pods -o wide" in out
    assert "  multicluster-scheduler status --context cluster1" in out
    assert re.search(r"cluster1\s+c1\s+admiralty-namespace-default-c1\s+7 \(\+1 starting\)", out)


def test_the_lines_to_paste_on_your_clusters_keep_your_kubeconfig(tmp_path):
    tools = demo.Tools(tmp_path / "bin", None, tmp_path / "helm")
    lines = demo.shell_lines(tools, ("prod", "burst"), "mcsdemo")
    assert lines[0].startswith("export PATH=")
    assert lines[1] == "CLUSTER1=prod CLUSTER2=burst NAMESPACE=mcsdemo"


def test_help_names_the_command_as_typed(capsys):
    with pytest.raises(SystemExit):
        demo.main(["--prog", "./dev", "up", "--help"])
    assert capsys.readouterr().out.startswith("usage: ./dev demo ")
    with pytest.raises(SystemExit):
        demo.main(["--prog", "./dev", "down", "--help"])
    assert capsys.readouterr().out.startswith("usage: ./dev down ")
