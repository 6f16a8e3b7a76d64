"""``python -m testbed.demo up|down``: the README's one-command demo (``./dev demo``,
``./dev down``).

``up`` starts two local clusters (the test bed) with the chart installed and agents running,
connects them as the user guide does with ``multicluster-scheduler join`` (cluster1 is a source
and its own target ``c1``, cluster2 a target ``c2``), labels ``default`` in cluster1
``multicluster-scheduler=enabled``, deploys the guide's nginx (10 elected replicas), waits until
every delegate is Running and prints where they landed. Run again while the demo is up, it
prints the same report (``--restart`` starts over); ``down`` stops everything and removes what
``up`` wrote in its folder.

With ``--contexts A,B`` it does the same on your clusters instead: the chart helm-installed
where it is missing (``--image REPO:TAG``: the published image does not exist yet), the guide's
connections in a namespace of its own, nginx there. It records everything it creates in
``DIR/remote.json``, and ``down --contexts A,B`` deletes exactly that, nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from multicluster_scheduler.api.keys import (
    GROUP,
    PARENT_UID,
    PROVIDER_KEY,
    PROXY_SCHEDULER_NAME,
)
from multicluster_scheduler.api.naming import virtual_node_name

from . import supervisor
from .bed import ClusterSpec
from .guide import REGION, nginx, running_and_ready

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "multicluster-scheduler"
RELEASE = "multicluster-scheduler"
RELEASE_NAMESPACE = "admiralty"
# The chart's CRDs by name: multicluster.admiralty.io_targets.yaml holds
# targets.multicluster.admiralty.io.
CRDS = tuple(
    sorted(".".join(reversed(p.stem.split("_", 1))) for p in (CHART / "crds").glob("*.yaml"))
)

LOCAL_CLUSTERS = ("cluster1", "cluster2")
LOCAL_NAMESPACE = "default"
# A namespace of the demo's own on real clusters (no dash: virtual node names stay readable).
REMOTE_NAMESPACE = "mcsdemo"
SOURCE_NAME = "c1"  # the guide's names: cluster1 is c1 (self target and Source), cluster2 c2
TARGET_NAMES = ("c1", "c2")
ENABLED = "multicluster-scheduler=enabled"
REPLICAS = 10

DEV_COMMANDS = {"up": "./dev demo", "down": "./dev down"}
DEMO_STATE = "demo.json"
REMOTE_STATE = "remote.json"
LOCK = "demo.lock"
# What `up` writes in its folder, all removed by `down` (the folder too, when left empty).
LOCAL_FILES = (
    *LOCAL_CLUSTERS,
    "kubeconfig",
    supervisor.LOG_FILE,
    supervisor.REQUEST_FILE,
    supervisor.STATE_FILE,
    supervisor.STATE_FILE + ".tmp",
    "helm",
    DEMO_STATE,
)


class DemoError(RuntimeError):
    pass


# -- commands ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tools:
    """Command lines for kubectl, helm (the test bed's) and join, on one kubeconfig."""

    bin_dir: Path
    kubeconfig: Path | None  # None: the user's ($KUBECONFIG, else ~/.kube/config)
    helm_home: Path

    def _config(self) -> list[str]:
        return ["--kubeconfig", str(self.kubeconfig)] if self.kubeconfig else []

    def kubectl(self, context: str, *args: str) -> list[str]:
        return [str(self.bin_dir / "kubectl"), *self._config(), "--context", context, *args]

    def helm(self, context: str, *args: str) -> list[str]:
        return [str(self.bin_dir / "helm"), *self._config(), "--kube-context", context, *args]

    def join(
        self, source: str, target: str, namespace: str, target_name: str, server: str | None
    ) -> list[str]:
        argv = [sys.executable, "-m", "multicluster_scheduler.cli", "join", *self._config()]
        argv += ["--source-context", source, "--target-context", target, "-n", namespace]
        argv += ["--name", SOURCE_NAME, "--target-name", target_name]
        return argv + (["--server", server] if server else [])

    def env(self) -> dict[str, str]:
        return dict(os.environ) | {
            "HELM_CACHE_HOME": str(self.helm_home / "cache"),
            "HELM_CONFIG_HOME": str(self.helm_home / "config"),
            "HELM_DATA_HOME": str(self.helm_home / "data"),
        }


def joins(tools: Tools, contexts: tuple[str, str], namespace: str, server: str | None = None):
    """The guide's two connections: cluster1 to itself (Target c1, spec.self) and to cluster2
    (Source c1 there, Secret and Target c2 in cluster1)."""
    source, target = contexts
    return [
        tools.join(source, source, namespace, TARGET_NAMES[0], None),
        tools.join(source, target, namespace, TARGET_NAMES[1], server),
    ]


def helm_install(tools: Tools, context: str, image: str | None) -> list[str]:
    argv = tools.helm(context, "install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE)
    argv += ["--create-namespace", "--wait", "--timeout", "5m"]
    if image:
        repository, tag = parse_image(image)
        argv += ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"]
    return argv


def parse_image(image: str) -> tuple[str, str]:
    """``REPO:TAG`` (a registry port is part of REPO: ``localhost:5000/mcs:dev``)."""
    repository, sep, tag = image.rpartition(":")
    if not sep or not repository or not tag or "/" in tag or "@" in image:
        raise DemoError(f"--image {image!r}: expected REPOSITORY:TAG, e.g. ghcr.io/you/mcs:dev")
    return repository, tag


def display(argv: list[str]) -> str:
    """A command as the user would type it."""
    shown = list(argv)
    if shown[:3] == [sys.executable, "-m", "multicluster_scheduler.cli"]:
        shown[:3] = ["multicluster-scheduler"]
    elif shown and Path(shown[0]).name in ("kubectl", "helm"):
        shown[0] = Path(shown[0]).name
    return shlex.join(shown).replace(str(CHART), "charts/multicluster-scheduler")


def short_path(path: Path) -> str:
    """Relative to the current folder when under it, else with ~ for the home folder."""
    path = path.resolve()
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    with contextlib.suppress(ValueError):
        return "~/" + str(path.relative_to(Path.home()))
    return str(path)


def run(argv: list[str], tools: Tools, stdin: str | None = None, timeout: float = 120) -> str:
    proc = subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        env=tools.env(),
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )
    if proc.returncode != 0:
        raise DemoError(f"`{display(argv)}` failed:\n{(proc.stdout + proc.stderr).strip()}")
    return proc.stdout


def run_all(argvs: list[list[str]], tools: Tools, timeout: float = 300) -> list[str]:
    """Several commands at once (one per cluster or connection); the first failure is raised."""
    if not argvs:
        return []
    with ThreadPoolExecutor(len(argvs)) as pool:
        futures = [pool.submit(run, argv, tools, None, timeout) for argv in argvs]
        return [f.result() for f in futures]


def get_json(tools: Tools, context: str, *args: str) -> dict:
    return json.loads(run(tools.kubectl(context, *args, "-o", "json"), tools, timeout=30))


# -- what is running where -----------------------------------------------------------------------


@dataclass
class Placement:
    cluster: str
    target: str
    virtual_node: str
    node_ready: bool
    running: int
    other: int  # delegates not Running (yet)


def running(pod: dict) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and running_and_ready(pod)


def placements(tools: Tools, contexts: tuple[str, str], namespace: str) -> list[Placement]:
    source = contexts[0]
    nodes = get_json(tools, source, "get", "nodes", "-l", PROVIDER_KEY)["items"]
    ready = {
        n["metadata"]["name"]: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in n.get("status", {}).get("conditions") or ()
        )
        for n in nodes
    }
    found = []
    for cluster, target in zip(contexts, TARGET_NAMES, strict=True):
        pods = get_json(tools, cluster, "get", "pods", "-n", namespace, "-l", PARENT_UID)["items"]
        pods = [p for p in pods if p["spec"].get("schedulerName") != PROXY_SCHEDULER_NAME]
        up = sum(running(p) for p in pods)
        node = virtual_node_name(target, namespace)
        found.append(Placement(cluster, target, node, ready.get(node, False), up, len(pods) - up))
    return found


def wait_running(
    tools: Tools, contexts: tuple[str, str], namespace: str, timeout: float
) -> list[Placement]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = placements(tools, contexts, namespace)
        except (DemoError, subprocess.TimeoutExpired):
            found = None
        if found and sum(p.running for p in found) >= REPLICAS:
            return found
        if time.monotonic() > deadline:
            where = ", ".join(f"{p.cluster}: {p.running}" for p in found or ())
            raise DemoError(
                f"nginx delegates not all Running after {timeout:.0f}s ({where or 'none found'})"
            )
        time.sleep(0.5)


def table(found: list[Placement], source: str) -> list[str]:
    rows = [("CLUSTER", "TARGET", f"VIRTUAL NODE (in {source})", "DELEGATES RUNNING")]
    for p in found:
        count = str(p.running) + (f" (+{p.other} starting)" if p.other else "")
        node = p.virtual_node + ("" if p.node_ready else " (not Ready)")
        rows.append((p.cluster, p.target, node, count))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, [*widths, 0], strict=True)).rstrip()
        for r in rows
    ]


def shell_lines(tools: Tools, contexts: tuple[str, str], namespace: str) -> list[str]:
    """What to paste into a shell to go on by hand, as getting started does from its step 6:
    the kubeconfig, the commands (kubectl and helm of the test bed, multicluster-scheduler and
    its kubectl plugin), and the guide's variables. Absolute paths: they work from any folder."""
    lines = []
    if tools.kubeconfig:
        lines.append(f"export KUBECONFIG={shlex.quote(str(tools.kubeconfig.resolve()))}")
    paths = []
    venv_bin = Path(sys.prefix) / "bin"
    if (venv_bin / "multicluster-scheduler").exists():
        paths.append(str(venv_bin))
    paths.append(str(tools.bin_dir.resolve()))
    lines.append(f'export PATH={":".join(shlex.quote(p) for p in paths)}:"$PATH"')
    source, target = contexts
    lines.append(f"CLUSTER1={source} CLUSTER2={target} NAMESPACE={namespace}")
    return lines


def report(
    found: list[Placement],
    tools: Tools,
    contexts: tuple[str, str],
    namespace: str,
    stop: str,
    again: str,
) -> None:
    total = sum(p.running for p in found)
    print(f"\nWhere the {total} nginx delegates run:\n")
    print("\n".join(table(found, contexts[0])))
    source, target = contexts
    ns = [] if namespace == LOCAL_NAMESPACE else ["-n", namespace]
    looks = [
        (["kubectl", "--context", source, *ns, "get", "pods", "-o", "wide"],
         "proxy pods on virtual nodes, c1's delegates"),
        (["kubectl", "--context", target, *ns, "get", "pods", "-o", "wide"], "c2's delegates"),
        (["kubectl", "--context", source, "get", "nodes"], "real and virtual nodes"),
        (["multicluster-scheduler", "status", "--context", source, *ns],
         "the targets, and where nginx runs"),
        (["kubectl", "--context", source, *ns, "logs", "deployment/nginx"],
         "a delegate's log, asked of its proxy pod"),
    ]  # fmt: skip
    print("\nLook further, once the lines at the end are pasted into your shell:")
    commands = [shlex.join(argv) for argv, _ in looks]
    width = max(map(len, commands))
    for command, (_, why) in zip(commands, looks, strict=True):
        print(f"  {command.ljust(width)}  # {why}")
    print(f"\nStop it: {stop}   Start over: {again}")
    print(
        "\nPaste these lines into your shell to use the demo's clusters (getting started goes on "
        "from step 6 with them, docs/getting-started.md):\n"
    )
    print("\n".join(shell_lines(tools, contexts, namespace)))


# -- local demo ----------------------------------------------------------------------------------


@contextlib.contextmanager
def locked(directory: Path, wait: float = 0):
    """Only one up or down at a time per folder; the holder's pid is in the lock file, which
    goes on release (with the folder, when nothing else is left in it)."""
    path = directory / LOCK
    deadline = time.monotonic() + wait
    while True:
        directory.mkdir(parents=True, exist_ok=True)
        f = path.open("a+")  # closed on release
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            if time.monotonic() >= deadline:
                raise DemoError(
                    f"another demo command (pid {holder}) is working on "
                    f"{short_path(directory)}; wait for it, or stop it with down"
                ) from None
            time.sleep(0.2)
            continue
        if _same_file(f, path):
            break
        f.close()  # its holder removed it on release: lock the one there now
    try:
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        yield
    finally:
        path.unlink(missing_ok=True)
        f.close()
        with contextlib.suppress(OSError):
            directory.rmdir()


def _same_file(f, path: Path) -> bool:
    try:
        return os.fstat(f.fileno()).st_ino == path.stat().st_ino
    except FileNotFoundError:
        return False


def lock_holder(directory: Path) -> int | None:
    """The pid of a ``testbed.demo`` process holding the folder's lock."""
    try:
        pid = int((directory / LOCK).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if pid != os.getpid() and b"testbed.demo" in cmdline else None


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.rename(path)


def local_running(directory: Path) -> bool:
    """The demo's clusters are up (a live supervisor) and the demo finished starting."""
    return supervisor.running(directory) and bool(_read(directory / DEMO_STATE))


def binaries() -> Path:
    """The test bed's kubectl, helm and control planes: built from Go modules on a first run
    (a line per tool), cached afterwards."""
    from .testbin.builder import BuildError, bin_dir, build

    try:
        if (bin_dir() / ".complete").exists():
            return bin_dir()
        print(
            "Building the test bed from Go modules (first run only: about ten minutes on two "
            "cores, then cached under ~/.cache/multicluster-scheduler)",
            flush=True,
        )
        started = time.monotonic()
        built = build(log=lambda m: m.startswith("built ") and print(f"  {m}", flush=True))
    except BuildError as e:
        raise DemoError(str(e)) from e
    print(f"  test bed built in {time.monotonic() - started:.0f} s", flush=True)
    return built


def local_tools(directory: Path) -> Tools:
    return Tools(binaries(), directory / "kubeconfig", directory / "helm")


class Clock:
    def __init__(self) -> None:
        self.start = self.last = time.monotonic()

    def step(self, text: str) -> None:
        now = time.monotonic()
        print(f"  {text:<62} {now - self.last:5.1f} s", flush=True)
        self.last = now

    @property
    def total(self) -> float:
        return time.monotonic() - self.start


def start_clusters(directory: Path) -> None:
    """The guide's two clusters, with the regions of its "Advanced Scheduling" (docs/demo.md),
    the chart installed and agents running."""
    specs = [
        ClusterSpec(LOCAL_CLUSTERS[0], node_labels={REGION: "us"}),
        ClusterSpec(LOCAL_CLUSTERS[1], node_labels={REGION: "eu"}),
    ]
    try:
        supervisor.start(directory, supervisor.Request(specs, install=True))
    except supervisor.SupervisorError as e:
        raise DemoError(f"the clusters did not start: {e}") from e


def up_local(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    stop, again = hints(args)
    with locked(directory):
        tools = local_tools(directory)
        if local_running(directory) and not args.restart:
            since = _read(directory / DEMO_STATE).get("ready", time.time())
            clock = time.strftime("%H:%M", time.localtime(since))
            print(
                f"The demo is already running (ready since {clock}, "
                f"{(time.time() - since) / 60:.0f} min ago)."
            )
            found = placements(tools, LOCAL_CLUSTERS, LOCAL_NAMESPACE)
            report(found, tools, LOCAL_CLUSTERS, LOCAL_NAMESPACE, stop, again)
            return 0
        if any((directory / name).exists() for name in LOCAL_FILES) and remove_local(directory):
            print("Stopped the previous, unfinished demo", flush=True)
        print(
            "Demo: local clusters cluster1 (a source, and its own target c1) and cluster2 "
            "(target c2);\nfake nodes: pods run no containers, kwok marks them Running",
            flush=True,
        )
        clock = Clock()
        try:
            start_clusters(directory)
            clock.step("clusters up, chart helm-installed, agents running")
            run_all(joins(tools, LOCAL_CLUSTERS, LOCAL_NAMESPACE), tools)
            clock.step("joined: cluster1 -> c1 (itself), cluster1 -> c2 (cluster2)")
            source = LOCAL_CLUSTERS[0]
            run(
                tools.kubectl(
                    source, "label", "namespace", LOCAL_NAMESPACE, ENABLED, "--overwrite"
                ),
                tools,
            )
            run(
                tools.kubectl(source, "apply", "-n", LOCAL_NAMESPACE, "-f", "-"),
                tools,
                nginx(REPLICAS),
            )
            found = wait_running(tools, LOCAL_CLUSTERS, LOCAL_NAMESPACE, args.timeout)
            clock.step(
                f"namespace {LOCAL_NAMESPACE} labeled, nginx applied, {REPLICAS} delegates Running"
            )
        except KeyboardInterrupt:
            print("interrupted: stopping the demo", file=sys.stderr)
            remove_local(directory)
            return 130
        except (DemoError, subprocess.TimeoutExpired) as e:
            print(f"error: {e}", file=sys.stderr)
            print(
                f"logs: {short_path(directory)}/<cluster>/logs/; `{stop}` cleans up",
                file=sys.stderr,
            )
            return 1
        _write(directory / DEMO_STATE, {"ready": time.time(), "seconds": round(clock.total, 1)})
        print(f"Ready in {clock.total:.0f} s.")
        report(found, tools, LOCAL_CLUSTERS, LOCAL_NAMESPACE, stop, again)
        return 0


def remove_local(directory: Path) -> bool:
    """Stop the demo's clusters and delete what up wrote; whether any was running."""
    was_running = supervisor.alive(directory)
    supervisor.stop(directory)
    for name in LOCAL_FILES:
        path = directory / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    return was_running


def down_local(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    if not directory.is_dir():
        print(f"No demo in {short_path(directory)}.")
        return 0
    holder = lock_holder(directory)
    if holder:  # an up still starting: interrupt it, it stops what it started
        print(f"Interrupting the demo starting in pid {holder}", flush=True)
        os.kill(holder, signal.SIGTERM)
    started = time.monotonic()
    with locked(directory, wait=90):
        was_running = remove_local(directory)
    if was_running:
        took = time.monotonic() - started
        print(f"Demo stopped in {took:.1f} s; {short_path(directory)} cleaned up.")
    else:
        print(f"No demo was running in {short_path(directory)}; cleaned up.")
    if (directory / REMOTE_STATE).exists():
        contexts = ",".join(_read(directory / REMOTE_STATE).get("contexts", []))
        print(
            f"A demo on your clusters is still recorded: `down --contexts {contexts}` removes it."
        )
    return 0


# -- your clusters -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One step of down: its commands run at once (one per cluster)."""

    what: str
    commands: list[list[str]]
    # Tidying up before the namespace goes (so that agents never act in a terminating one);
    # when it fails, deleting the namespace still removes everything.
    best_effort: bool = False


def cleanup_commands(tools: Tools, state: dict) -> list[Step]:
    """What down runs, step by step, for what up recorded as made (and nothing else): in the
    demo's namespace, nginx (its delegates deleted by the agents), the Targets, the Source,
    then the namespace itself; the chart, its CRDs and namespace where the demo installed them."""
    made: dict[str, list[str]] = state.get("made", {})
    ns = state["namespace"]

    def where(what: str, contexts: list[str] | None = None) -> list[str]:
        return [c for c in (contexts or list(made)) if what in made[c]]

    def inside(context: str, *args: str) -> list[str]:
        return tools.kubectl(context, "-n", ns, *args)

    source, target = where("namespace", list(made)[:1]), where("namespace", list(made)[1:])
    gone = ("--ignore-not-found", "--timeout=180s")
    steps = [
        Step(
            "nginx deleted",
            [inside(c, "delete", "deployment", "nginx", "--cascade=foreground", *gone) for c in source],  # noqa: E501
            best_effort=True,
        ),
        Step(
            "its delegates gone",
            [inside(c, "wait", "--for=delete", "pod", "-l", "app=nginx", gone[1]) for c in where("namespace")],  # noqa: E501
            best_effort=True,
        ),
        Step(
            "Targets c1, c2 deleted",
            [inside(c, "delete", f"targets.{GROUP}", *TARGET_NAMES, *gone) for c in source],
            best_effort=True,
        ),
        Step(
            f"Source {SOURCE_NAME} deleted",
            [inside(c, "delete", f"sources.{GROUP}", SOURCE_NAME, *gone) for c in target],
            best_effort=True,
        ),
        Step(
            f"namespace {ns} deleted",
            [tools.kubectl(c, "delete", "namespace", ns, gone[0], "--wait=false") for c in where("namespace")],  # noqa: E501
        ),
        Step(
            f"namespace {ns} gone",
            [tools.kubectl(c, "wait", "--for=delete", f"namespace/{ns}", gone[1]) for c in where("namespace")],  # noqa: E501
        ),
        Step(
            "chart uninstalled",
            [tools.helm(c, "uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait", gone[0]) for c in where("release")],  # noqa: E501
        ),
        Step(
            "CRDs deleted",
            [tools.kubectl(c, "delete", "crd", *CRDS, gone[0]) for c in where("crds")],
        ),
        Step(
            f"namespace {RELEASE_NAMESPACE} deleted",
            [tools.kubectl(c, "delete", "namespace", RELEASE_NAMESPACE, gone[0]) for c in where("release-namespace")],  # noqa: E501
        ),
    ]  # fmt: skip
    return [step for step in steps if step.commands]


def parse_contexts(value: str) -> tuple[str, str]:
    contexts = tuple(c.strip() for c in value.split(",") if c.strip())
    if len(contexts) != 2 or contexts[0] == contexts[1]:
        raise DemoError(f"--contexts {value!r}: expected two contexts, SOURCE,TARGET")
    return contexts  # type: ignore[return-value]


def remote_tools(args: argparse.Namespace, directory: Path) -> Tools:
    bin_dir = binaries()
    kubeconfig = Path(args.kubeconfig).resolve() if args.kubeconfig else None
    return Tools(bin_dir, kubeconfig, directory / "helm")


def survey(tools: Tools, context: str, namespace: str) -> dict:
    """What already exists in a cluster (read only)."""
    existing = run(
        tools.kubectl(
            context,
            "get",
            "namespace",
            namespace,
            RELEASE_NAMESPACE,
            "-o",
            "name",
            "--ignore-not-found",
        ),
        tools,
    )
    releases = json.loads(
        run(tools.helm(context, "list", "--all-namespaces", "-o", "json"), tools) or "[]"
    )
    crds = run(tools.kubectl(context, "get", "crd", "-o", "name"), tools).split()
    return {
        "namespace": f"namespace/{namespace}" in existing.split(),
        "release-namespace": f"namespace/{RELEASE_NAMESPACE}" in existing.split(),
        "release": [
            f"{r['name']} in {r['namespace']}"
            for r in releases
            if r.get("chart", "").startswith(RELEASE + "-")
        ],
        "crds": [c for c in CRDS if f"customresourcedefinition.apiextensions.k8s.io/{c}" in crds],
    }


def up_remote(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    contexts = parse_contexts(args.contexts)
    namespace = args.namespace
    stop, again = hints(args)
    state_path = directory / REMOTE_STATE
    with locked(directory):
        state = _read(state_path)
        args.kubeconfig = args.kubeconfig or state.get("kubeconfig")
        tools = remote_tools(args, directory)
        if state and tuple(state.get("contexts", ())) != contexts:
            raise DemoError(
                f"a demo on contexts {','.join(state['contexts'])} is recorded in "
                f"{short_path(state_path)}: remove it first with down --contexts "
                f"{','.join(state['contexts'])}"
            )
        if state.get("phase") == "ready" and not args.restart:
            print(f"The demo is already running on {', '.join(contexts)}; `{stop}` removes it.")
            found = placements(tools, contexts, state["namespace"])
            report(found, tools, contexts, state["namespace"], stop, again)
            return 0
        if state:
            print("Removing the previous demo first", flush=True)
            remove_remote(tools, state_path)
        print(
            f"Demo on your clusters: {contexts[0]} (a source, and its own target c1) and "
            f"{contexts[1]} (target c2), in a new namespace {namespace}",
            flush=True,
        )
        clock = Clock()
        before = {c: survey(tools, c, namespace) for c in contexts}
        check_remote(before, namespace, args.image)
        state = {
            "contexts": list(contexts),
            "kubeconfig": str(tools.kubeconfig) if tools.kubeconfig else None,
            "namespace": namespace,
            "made": {c: [] for c in contexts},
            "phase": "starting",
        }
        try:
            found = make_remote(tools, args, before, state, state_path, clock)
        except KeyboardInterrupt:
            print(f"interrupted; `{stop}` removes what was made", file=sys.stderr)
            return 130
        except (DemoError, subprocess.TimeoutExpired) as e:
            print(f"error: {e}", file=sys.stderr)
            print(f"`{stop}` removes what was made", file=sys.stderr)
            return 1
        state["phase"] = "ready"
        _write(state_path, state)
        print(f"Ready in {clock.total:.0f} s.")
        report(found, tools, contexts, namespace, stop, again)
        return 0


def check_remote(before: dict[str, dict], namespace: str, image: str | None) -> None:
    """Refuse, before anything is made, a namespace that exists, and a missing chart with no
    image to install it from."""
    for context, found in before.items():
        if found["namespace"]:
            raise DemoError(
                f"namespace {namespace} already exists in {context}: the demo makes its own "
                f"namespace so that down removes all it made; choose another with --namespace"
            )
    missing = [c for c, f in before.items() if not f["release"]]
    if image:
        parse_image(image)
    if missing and not image:
        raise DemoError(
            f"multicluster-scheduler is not installed in {', '.join(missing)} and its image "
            f"is not published yet: build it from the Dockerfile, push it where "
            f"{' and '.join(missing)} can pull it, and pass --image REPOSITORY:TAG"
        )


def make_remote(
    tools: Tools,
    args: argparse.Namespace,
    before: dict[str, dict],
    state: dict,
    state_path: Path,
    clock: Clock,
) -> list[Placement]:
    """The chart where missing, the namespace, the joins and nginx, each recorded in
    ``state`` as it is made; where nginx's delegates run."""
    contexts, namespace = tuple(before), state["namespace"]
    missing = [c for c, f in before.items() if not f["release"]]
    for context, found in before.items():
        if found["release"]:
            print(f"  {context}: using the installed {found['release'][0]}")
            continue
        # Recorded before it is made, so that down cleans up an interrupted install (the
        # folder's lock keeps another demo from installing it meanwhile).
        state["made"][context] += ["release"]
        state["made"][context] += [] if found["crds"] else ["crds"]
        state["made"][context] += [] if found["release-namespace"] else ["release-namespace"]
    _write(state_path, state)
    installs = [helm_install(tools, c, args.image) for c in missing]
    if installs:
        run_all(installs, tools, timeout=360)
        clock.step(f"chart installed in {', '.join(missing)} (image {args.image})")
    for context in contexts:
        run(tools.kubectl(context, "create", "namespace", namespace), tools)
        # Recorded once made: a namespace someone else created meanwhile is not ours.
        state["made"][context].insert(0, "namespace")
        _write(state_path, state)
    source, target = contexts
    run(tools.kubectl(source, "label", "namespace", namespace, ENABLED), tools)
    run_all(joins(tools, (source, target), namespace, args.server), tools)
    clock.step(f"joined: {source} -> c1 (itself), {source} -> c2 ({target})")
    run(tools.kubectl(source, "apply", "-n", namespace, "-f", "-"), tools, nginx(REPLICAS))
    found = wait_running(tools, (source, target), namespace, args.timeout)
    clock.step(f"nginx applied, {REPLICAS} delegates Running")
    return found


def remove_remote(tools: Tools, state_path: Path) -> None:
    state = _read(state_path)
    for step in cleanup_commands(tools, state):
        try:
            run_all(step.commands, tools, timeout=300)
        except (DemoError, subprocess.TimeoutExpired) as e:
            if not step.best_effort:
                raise DemoError(
                    f"{e}\nnothing more was removed; run down again once that is solved (are "
                    f"the agents running? kubectl -n {RELEASE_NAMESPACE} get pods)"
                ) from e
            print(f"  {step.what}: failed, going on ({str(e).splitlines()[-1]})", flush=True)
            continue
        print(f"  {step.what}", flush=True)
    state_path.unlink(missing_ok=True)


def down_remote(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    contexts = parse_contexts(args.contexts)
    state_path = directory / REMOTE_STATE
    state = _read(state_path)
    if not state:
        print(f"No demo recorded for {', '.join(contexts)} in {short_path(directory)}.")
        return 0
    if tuple(state["contexts"]) != contexts:
        raise DemoError(f"the recorded demo is on contexts {','.join(state['contexts'])}")
    args.kubeconfig = args.kubeconfig or state.get("kubeconfig")
    tools = remote_tools(args, directory)
    started = time.monotonic()
    with locked(directory, wait=90):
        remove_remote(tools, state_path)
        if not (directory / supervisor.STATE_FILE).exists():  # no local demo uses it
            shutil.rmtree(directory / "helm", ignore_errors=True)
    took = time.monotonic() - started
    print(f"Removed what the demo made in {', '.join(contexts)} in {took:.0f} s.")
    return 0


def dry_run(args: argparse.Namespace) -> int:
    """The commands up and down would run on your clusters, assuming nothing is installed."""
    contexts = parse_contexts(args.contexts)
    tools = remote_tools(args, Path(args.dir).resolve())
    made = ["namespace", "release", "crds", "release-namespace"]
    state = {"namespace": args.namespace, "made": {c: made for c in contexts}}
    ns = args.namespace
    up = [helm_install(tools, c, args.image) for c in contexts]
    up += [tools.kubectl(c, "create", "namespace", ns) for c in contexts]
    up += [tools.kubectl(contexts[0], "label", "namespace", ns, ENABLED)]
    up += joins(tools, contexts, ns, args.server)
    up += [tools.kubectl(contexts[0], "apply", "-n", ns, "-f", "nginx.yaml")]
    print("# up (the chart only where missing):")
    print("\n".join(display(a) for a in up))
    print("# down (only what up made):")
    print("\n".join(display(a) for step in cleanup_commands(tools, state) for a in step.commands))
    return 0


# -- command line --------------------------------------------------------------------------------


def hints(args: argparse.Namespace) -> tuple[str, str]:
    """How to stop, and how to start over, in the words the user started with."""
    contexts = f" --contexts {args.contexts}" if args.contexts else ""
    if args.prog == "./dev":
        env = f"MCS_DEMO_DIR={args.dir} " if Path(args.dir).resolve() != ROOT / ".testbed" else ""
        return f"{env}./dev down{contexts}", f"{env}./dev demo{contexts} --restart"
    where = f"python -m testbed.demo {{}} --dir {args.dir}{contexts}"
    return where.format("down"), where.format("up") + " --restart"


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    # ./dev runs this as `./dev demo` and `./dev down`: usage lines say so.
    prog = argparse.ArgumentParser(add_help=False)
    prog.add_argument("--prog", default="python -m testbed.demo")
    called = prog.parse_known_args(argv)[0].prog
    parser = argparse.ArgumentParser(prog=called, description=__doc__)
    parser.add_argument("--prog", default="python -m testbed.demo", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "down"):
        p = sub.add_parser(
            name,
            prog=DEV_COMMANDS[name] if called == "./dev" else f"{called} {name}",
            help="run the demo" if name == "up" else "stop it, clean up",
        )
        p.add_argument("--dir", default=".testbed", help="folder for its state (default .testbed)")
        p.add_argument(
            "--contexts",
            metavar="SOURCE,TARGET",
            help="your clusters' kubeconfig contexts instead of local clusters",
        )
        p.add_argument(
            "--kubeconfig", help="with --contexts (default: $KUBECONFIG, ~/.kube/config)"
        )
        if name == "up":
            p.add_argument("--restart", action="store_true", help="start over when already up")
            p.add_argument("--timeout", type=float, help="seconds to wait for Running delegates")
            p.add_argument(
                "--image",
                metavar="REPOSITORY:TAG",
                help="with --contexts: the agent's image, built from the Dockerfile and pushed "
                "where your clusters pull from (required where the chart is not installed)",
            )
            p.add_argument(
                "--namespace",
                default=REMOTE_NAMESPACE,
                help=f"with --contexts: a new namespace for the demo (default {REMOTE_NAMESPACE})",
            )
            p.add_argument(
                "--server",
                help="with --contexts: TARGET's API server address as SOURCE's pods reach it "
                "(join --server, see docs/connecting.md)",
            )
            p.add_argument(
                "--dry-run", action="store_true", help="with --contexts: print the commands only"
            )
    args = parser.parse_args(argv)
    # A `down` while this starts: stop like Ctrl-C does (what was started is stopped).
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    try:
        if args.command == "up":
            if args.timeout is None:
                args.timeout = 300.0 if args.contexts else 120.0
            if args.contexts:
                return dry_run(args) if args.dry_run else up_remote(args)
            return up_local(args)
        return down_remote(args) if args.contexts else down_local(args)
    except DemoError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
