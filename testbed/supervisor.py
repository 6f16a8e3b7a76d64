"""A test bed that outlives the command that started it, for the demo and ``python -m testbed``.

:func:`start` builds what the clusters need (cached), then starts a supervisor process in a
session of its own and returns once it reports every cluster ready: the supervisor brings the
:class:`~testbed.bed.TestBed` up, installs the chart if asked, and keeps it until :func:`stop`.
The components are bound to the supervisor (they die with it, see :mod:`testbed.process`).
What a folder holds: the request (``testbed-request.json``), the supervisor's state and the
pids of its components (``testbed.json``), its log (``supervisor.log``), the kubeconfig and a
folder per cluster.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .bed import ClusterSpec, TestBed
from .incluster import InClusterInstallation
from .install import Installation
from .testbin import build

if TYPE_CHECKING:
    from .realnode.node import RealNodes

STATE_FILE = "testbed.json"
REQUEST_FILE = "testbed-request.json"
LOG_FILE = "supervisor.log"
ROOT = Path(__file__).resolve().parents[1]
# What the command lines of a supervisor and of its components hold (a pid found in the state
# file is signalled only when its command line still says it is ours).
MARKS = (b"-m testbed ", b"testbed.realnode", b"testbin", b"/bin-")


class SupervisorError(RuntimeError):
    """The test bed did not start; the message says why (and where the supervisor's log is)."""


@dataclass
class Request:
    """What to start: the clusters, and the chart installed with agents running (``install``;
    ``agents`` per cluster, as local processes, or in their pods where clusters have a real
    node)."""

    specs: list[ClusterSpec]
    install: bool = False
    agents: int = 1
    timeout: float = 180.0

    @property
    def real_nodes(self) -> bool:
        return any(s.real_node for s in self.specs)

    @property
    def argo(self) -> bool:
        return any(s.argo for s in self.specs)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Request:
        data = json.loads(text)
        data["specs"] = [ClusterSpec(**spec) for spec in data["specs"]]
        return cls(**data)


@dataclass(frozen=True)
class Started:
    kubeconfig: Path
    bin_dir: Path
    seconds: float
    agent_image: str | None  # the agent's image real nodes hold (None without real nodes)


@dataclass
class Materials:
    """What the clusters need besides the test bed's binaries, built or found in the cache."""

    real_nodes: RealNodes | None = None
    agent_image: str | None = None
    argo_bin: Path | None = None
    executor_image: str | None = None


def prepare(request: Request) -> Materials:
    """Build (on a first run) or find in the cache what ``request`` needs."""
    found = Materials()
    if request.real_nodes:
        from .image import build_argoexec_image
        from .realnode import prepare as prepare_real_nodes

        found.real_nodes, agent = prepare_real_nodes()
        found.agent_image = agent.name
        if request.argo:
            executor = build_argoexec_image()
            found.real_nodes.images.append(executor.archive)
            found.executor_image = executor.name
    if request.argo:
        found.argo_bin = build(group="argo")
    return found


def start(directory: Path, request: Request) -> Started:
    """Stop whatever the folder ran before, build what is missing, start the supervisor and
    wait until it is ready. Ctrl-C (KeyboardInterrupt) stops what was started, and is raised."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    stop(directory)
    try:
        bin_dir = build()
        materials = prepare(request)
    except Exception as e:
        raise SupervisorError(str(e)) from e
    (directory / STATE_FILE).unlink(missing_ok=True)
    (directory / REQUEST_FILE).write_text(request.to_json())
    started = time.monotonic()
    argv = [sys.executable, "-m", "testbed", "serve", "--dir", str(directory)]
    with (directory / LOG_FILE).open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )
    try:
        _wait_ready(directory, proc)
    except BaseException:
        _stop_supervisor(proc.pid, 30.0)
        stop(directory)
        raise
    return Started(
        directory / "kubeconfig", bin_dir, time.monotonic() - started, materials.agent_image
    )


def _wait_ready(directory: Path, proc: subprocess.Popen) -> None:
    while True:
        state = read_state(directory)
        if state.get("phase") == "ready":
            return
        if state.get("phase") == "failed" or proc.poll() is not None:
            error = state.get("error") or "supervisor exited"
            raise SupervisorError(f"{error}\nsupervisor log: {directory / LOG_FILE}")
        time.sleep(0.2)


def stop(directory: Path, timeout: float = 30.0) -> None:
    """Stop the folder's supervisor (which stops its components), and kill any component
    still found."""
    state = read_state(directory)
    if state.get("supervisor"):
        _stop_supervisor(state["supervisor"], timeout)
    for pid in state.get("pids", []):
        if _is_ours(pid):
            os.kill(pid, signal.SIGKILL)
    if state:
        _write_state(directory, phase="stopped")


def alive(directory: Path) -> bool:
    """The folder's supervisor runs (starting, ready or stopping)."""
    return _is_ours(read_state(directory).get("supervisor"))


def running(directory: Path) -> bool:
    """The folder's test bed is ready and its supervisor alive."""
    return read_state(directory).get("phase") == "ready" and alive(directory)


def serve(directory: Path) -> int:
    """The supervisor: bring the requested test bed up, report it ready, keep it until
    SIGTERM or SIGINT; an exit code."""

    def interrupt(*_):
        raise SystemExit(128 + signal.SIGTERM)

    # While starting, a stop request aborts the start (TestBed.up stops what it started).
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    me = os.getpid()
    _write_state(directory, supervisor=me, phase="starting")
    try:
        request = Request.from_json((directory / REQUEST_FILE).read_text())
        bed, installation = _bring_up(directory, request, prepare(request))  # cached by start
    except Exception as e:
        _write_state(directory, supervisor=me, phase="failed", error=str(e))
        return 1
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    pids = [p.pid for p in bed.processes() if p.pid]
    _write_state(directory, supervisor=me, phase="ready", pids=pids)
    while not stopping.wait(1.0):
        dead = [p.name for p in bed.processes() if not p.running]
        if dead:
            print(f"component(s) exited: {', '.join(dead)}", file=sys.stderr, flush=True)
    if isinstance(installation, Installation):
        installation.stop_agents()
    bed.down()
    _write_state(directory, phase="stopped")
    return 0


def _bring_up(
    directory: Path, request: Request, materials: Materials
) -> tuple[TestBed, Installation | InClusterInstallation | None]:
    bed = TestBed(
        request.specs,
        directory,
        build(),
        real_nodes=materials.real_nodes,
        argo_bin=materials.argo_bin,
        argo_executor_image=materials.executor_image,
    )
    bed.up(timeout=request.timeout)
    if not request.install:
        return bed, None
    try:
        if materials.agent_image is not None:
            installed = InClusterInstallation(bed, materials.agent_image)
            installed.install()
            return bed, installed
        installation = Installation(bed, agents_per_cluster=request.agents)
        installation.install()
        installation.start_agents()
        return bed, installation
    except BaseException:
        bed.down()
        raise


def read_state(directory: Path) -> dict:
    try:
        return json.loads((directory / STATE_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _write_state(directory: Path, **state) -> None:
    tmp = directory / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state))
    tmp.rename(directory / STATE_FILE)


def _is_ours(pid: int | None) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except (OSError, TypeError):
        return False
    return any(mark in cmdline for mark in MARKS)


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
