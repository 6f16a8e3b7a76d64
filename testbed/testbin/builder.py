"""Build the test bed's real components from their Go modules, cached outside the clone.

There is no container runtime and no binary download here, only Go and the Go module proxy, so
each tool is compiled from its module: a scratch module per tool requires the pinned version and
builds its main packages. Results live under ``~/.cache/multicluster-scheduler/testbin`` keyed by
tool, version and Go version, so a warm machine reuses them and a pin change rebuilds one tool.

Tools of a named group (``group = "real-node"``: kubelet and containerd; ``group = "argo"``: Argo
Workflows' controller) are built only when that group is asked for, into a folder of their own: the
clusters of the test bed never wait for them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from testbed.progress import progress

PINS_FILE = Path(__file__).with_name("pins.toml")
KWOK_STAGES_DIR = "kwok-stages"
CRDS_DIR = "crds"
# Files a tool's module ships that the test bed reads (its field: the folder they are copied to).
MODULE_FILES = {"stages": KWOK_STAGES_DIR, "crds": CRDS_DIR}
LATER_FIELDS = ("crds", "symlinks")


class BuildError(RuntimeError):
    """A tool could not be built; the message says which and why."""


@dataclass(frozen=True)
class Tool:
    name: str
    module: str
    version: str
    packages: list[str]
    binary: str | None = None
    staging_version: str | None = None
    stages: list[str] = field(default_factory=list)
    crds: list[str] = field(default_factory=list)  # CustomResourceDefinitions, applied by the bed
    # Symlinks of the repository that its module zip leaves out (path: target), restored in a
    # copy of the module that the build then uses.
    symlinks: dict[str, str] = field(default_factory=dict)
    stamp: dict[str, str] = field(default_factory=dict)
    group: str = ""  # "": the test bed's own; otherwise built only when that group is asked for

    def fingerprint(self) -> str:
        """Changes with anything that changes the build's output (not with its group; nor with
        a field added later while it is empty: every other tool's key stays)."""
        spec = {
            k: v
            for k, v in self.__dict__.items()
            if k != "group" and not (k in LATER_FIELDS and not v)
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]


def load_pins(path: Path = PINS_FILE, group: str = "") -> list[Tool]:
    """The pinned Go tools of ``group`` ("" for the test bed's own); tables without a module
    pin something else (the image's base, read by :mod:`testbed.image`)."""
    with path.open("rb") as f:
        pins = tomllib.load(f)
    tools = [Tool(name=name, **spec) for name, spec in pins.items() if "module" in spec]
    return [t for t in tools if t.group == group]


def cache_root() -> Path:
    base = os.environ.get("MCS_TESTBIN_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "multicluster-scheduler" / "testbin"


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(GOWORK="off", CGO_ENABLED="0", GOTOOLCHAIN="local", GOFLAGS="-mod=mod")
    return env


def go_version() -> str:
    try:
        out = subprocess.run(
            ["go", "env", "GOVERSION"], env=go_env(), capture_output=True, text=True, check=True
        )
    except FileNotFoundError as e:
        raise BuildError("go is not installed: the test bed is built from Go modules") from e
    return out.stdout.strip()


def _bin_key(tools: list[Tool], gover: str) -> str:
    key = hashlib.sha256(json.dumps([t.fingerprint() for t in tools] + [gover]).encode())
    return key.hexdigest()[:12]


def cached_go_version(tools: list[Tool]) -> str | None:
    """The Go version of a complete build of ``tools`` in the cache (the newest), for a machine
    where Go is not installed (or no longer): binaries built once need no Go to be found."""
    found = []
    for versions in cache_root().glob("bin-*/versions.json"):
        folder = versions.parent
        try:
            gover = json.loads(versions.read_text()).get("go")
        except (OSError, ValueError):
            continue
        complete = (folder / ".complete").exists()
        if gover and complete and folder.name == f"bin-{_bin_key(tools, gover)}":
            found.append((folder.stat().st_mtime, gover))
    return max(found)[1] if found else None


def usable_go_version(tools: list[Tool]) -> str:
    """This machine's Go version; without Go, that of binaries already built."""
    try:
        return go_version()
    except BuildError:
        cached = cached_go_version(tools)
        if cached is None:
            raise
        return cached


def tool_dir(tool: Tool, gover: str) -> Path:
    return cache_root() / "tools" / f"{tool.name}-{tool.version}-{gover}-{tool.fingerprint()}"


def bin_dir(tools: list[Tool] | None = None, gover: str | None = None, group: str = "") -> Path:
    """The folder holding every pinned binary of ``group`` (and kwok's stage files) for this
    machine's Go."""
    tools = tools if tools is not None else load_pins(group=group)
    gover = gover or usable_go_version(tools)
    return cache_root() / f"bin-{_bin_key(tools, gover)}"


def _run(cmd: list[str], cwd: Path, log) -> str:
    log(f"$ {' '.join(cmd)}  (in {cwd})")
    proc = subprocess.run(cmd, cwd=cwd, env=go_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed in {cwd}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def _module_info(module: str, version: str, cwd: Path, log) -> dict:
    out = _run(["go", "mod", "download", "-json", f"{module}@{version}"], cwd, log)
    return json.loads(out)


def staging_replaces(gomod_text: str, staging_version: str) -> list[str]:
    """Replace lines for the staging modules k8s.io/kubernetes requires at v0.0.0.

    Its go.mod points them at ./staging/src/..., which only works inside its own repository; as
    a dependency we point each required one at its published version instead.
    """
    local = set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", gomod_text, re.M))
    required = set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+v0\.0\.0\b", gomod_text, re.M))
    return [f"\t{m} => {m} {staging_version}" for m in sorted(local & required)]


def ldflags(tool: Tool) -> str:
    """Strip debug info, and stamp the version where the tool reads it (``-X`` flags)."""
    match = re.fullmatch(r"v(\d+)\.(\d+)\..*", tool.version)
    if not match:
        raise BuildError(f"{tool.name}: version {tool.version} is not vMAJOR.MINOR.PATCH")
    parts = {"version": tool.version, "major": match[1], "minor": match[2]}
    flags = ["-s", "-w"]
    flags += [f"-X {var}={value.format(**parts)}" for var, value in tool.stamp.items()]
    return " ".join(flags)


def _with_symlinks(source: Path, copy: Path, symlinks: dict[str, str]) -> Path:
    """A writable copy of a module's folder with the repository's symlinks put back."""
    shutil.copytree(source, copy, symlinks=True)
    for folder in (copy, *(p for p in copy.rglob("*") if p.is_dir())):
        folder.chmod(0o755)  # the module cache is read-only
    for path, target in symlinks.items():
        link = copy / path
        if link.exists() or link.is_symlink():
            raise BuildError(f"{path} is in the module already: remove its symlinks pin")
        if not (link.parent / target).is_file():
            raise BuildError(f"{path} -> {target}: no such file in the module")
        link.symlink_to(target)
    return copy


def build_tool(tool: Tool, gover: str, log) -> Path:
    """Build one tool into its cache folder unless it is already there; return its folder."""
    out = tool_dir(tool, gover)
    done = out / ".complete"
    if done.exists():
        return out
    with progress(f"building {tool.name} {tool.version} from its Go module"):
        _build_tool(tool, gover, out, log)
    return out


def _build_tool(tool: Tool, gover: str, out: Path, log) -> None:
    done = out / ".complete"
    src = out / "src"
    shutil.rmtree(out, ignore_errors=True)
    src.mkdir(parents=True)
    started = time.monotonic()
    go_minor = re.match(r"go(\d+\.\d+)", gover)
    lines = [f"module testbin/{tool.name}", "", f"go {go_minor.group(1) if go_minor else '1.22'}"]
    info = _module_info(tool.module, tool.version, src, log)
    if tool.staging_version:
        replaces = staging_replaces(Path(info["GoMod"]).read_text(), tool.staging_version)
        lines += ["", "replace (", *replaces, ")"]
    if tool.symlinks:
        module = _with_symlinks(Path(info["Dir"]), out / "module", tool.symlinks)
        lines += ["", f"replace {tool.module} => {module}"]
    (src / "go.mod").write_text("\n".join(lines) + "\n")
    _run(["go", "get", f"{tool.module}@{tool.version}"], src, log)
    binaries = out / "bin"
    binaries.mkdir()
    target = binaries / tool.binary if tool.binary else binaries
    cmd = ["go", "build", "-trimpath", "-ldflags", ldflags(tool), "-o", f"{target}"]
    if not tool.binary:
        cmd[-1] += os.sep
    _run(cmd + tool.packages, src, log)
    for kind, folder in MODULE_FILES.items():
        for name in getattr(tool, kind):
            source = Path(info["Dir"]) / name
            if not source.exists():
                raise BuildError(f"{tool.module}@{tool.version} has no file {name} ({kind})")
            (out / folder).mkdir(exist_ok=True)
            shutil.copyfile(source, out / folder / source.name)
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(out / "module", ignore_errors=True)
    done.write_text(f"{time.monotonic() - started:.0f}\n")
    log(f"built {tool.name} {tool.version} in {time.monotonic() - started:.0f}s")


def build(log=None, group: str = "") -> Path:
    """Build every pinned tool of ``group`` (cached) and return the folder holding their
    binaries.

    Safe to call from several processes at once: the first builds, the others wait for it.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    tools = load_pins(group=group)
    gover = usable_go_version(tools)
    target = bin_dir(tools, gover)
    if (target / ".complete").exists():
        return target
    cache_root().mkdir(parents=True, exist_ok=True)
    with (cache_root() / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".complete").exists():
            _assemble(tools, gover, target, log)
    return target


def _assemble(tools: list[Tool], gover: str, target: Path, log) -> None:
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for tool in tools:
        built = build_tool(tool, gover, log)
        for binary in (built / "bin").iterdir():
            (staging / binary.name).symlink_to(binary)
        for kind, folder in MODULE_FILES.items():
            if getattr(tool, kind):
                (staging / folder).symlink_to(built / folder)
    (staging / "versions.json").write_text(
        json.dumps({t.name: t.version for t in tools} | {"go": gover}, indent=2) + "\n"
    )
    (staging / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
