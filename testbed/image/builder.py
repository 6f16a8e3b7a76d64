"""The agent's image, built here from the project's Dockerfile, and the real nodes' pause image
(and Argo Workflows' executor, for the Argo tests on real nodes).

With a Docker daemon that answers, ``docker build`` builds the Dockerfile as it is (its base,
``python:3.12-slim``, comes from Docker Hub). Without one, and with no registry to pull a base
from, buildah builds it from Debian packages: the base is made on this machine (debootstrap of
Debian with its Python, the ``[image-base]`` pin of ``testbed/testbin/pins.toml``), brought up to
date from Debian's security archive, stored under a local name, and given to the Dockerfile as
its ``BASE_IMAGE`` argument; ``buildah bud`` then builds the Dockerfile with no pull. Either way
the image is also saved as an archive (docker-archive format) that containerd imports and that
``docker load`` reads.

Everything is cached under ``~/.cache/multicluster-scheduler/image``, keyed by what it is made
of: the base by its pin, the agent's image by the Dockerfile, pyproject, README and sources (and
the base), the pause image by its source and Go version, the executor's by its binary's pin. A
warm build is a look-up.
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
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from testbed.host import IMAGE_PACKAGES, ensure_packages, missing
from testbed.progress import progress
from testbed.testbin.builder import PINS_FILE, go_env, go_version

ROOT = Path(__file__).resolve().parents[2]
PAUSE_SOURCE = ROOT / "testbed" / "realnode" / "pause" / "pause.go"
# What goes into the agent's image (the Dockerfile's COPY lines and what they read).
IMAGE_INPUTS = ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md")
IMAGE_SOURCES = ("multicluster", "multicluster_scheduler")
AGENT_REPOSITORY = "localhost/multicluster-scheduler"
BASE_REPOSITORY = "localhost/multicluster-scheduler-base"
PAUSE_REPOSITORY = "localhost/multicluster-scheduler-e2e/pause"
ARGOEXEC_REPOSITORY = "localhost/multicluster-scheduler-e2e/argoexec"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Bumped when the way the base is made changes (not only what the pin says).
BASE_RECIPE = 1
# Left out of the base: package lists and caches, documentation, translations.
BASE_TRIM = (
    "var/cache/apt",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
)


class ImageError(RuntimeError):
    """An image could not be built; the message says which step failed and its output."""


@dataclass(frozen=True)
class Image:
    name: str  # repository:tag, as pods name it
    archive: Path  # docker-archive of it, for containerd (ctr images import) or docker load
    builder: str  # "docker" or "buildah"
    size: int  # bytes of its archive: the uncompressed layers and their metadata
    seconds: float  # time this call spent (0 when cached)


def cache_root() -> Path:
    base = os.environ.get("MCS_IMAGE_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "multicluster-scheduler" / "image"


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def source_digest(root: Path = ROOT) -> str:
    """Changes with anything the Dockerfile puts into the image."""
    parts = [name.encode() + b"\0" + (root / name).read_bytes() for name in IMAGE_INPUTS]
    for folder in IMAGE_SOURCES:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                parts.append(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return _digest(*parts)


def project_version(root: Path = ROOT) -> str:
    with (root / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]["version"]


def base_pin() -> dict:
    with PINS_FILE.open("rb") as f:
        return tomllib.load(f)["image-base"]


def _run(argv: list[str], log_path: Path, what: str, **kwargs) -> subprocess.CompletedProcess:
    with log_path.open("ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        with progress(what):
            proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False, **kwargs)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise ImageError(f"{what} failed ({' '.join(argv[:3])} …); end of {log_path}:\n{tail}")
    return proc


def docker_works() -> bool:
    """A Docker daemon answers (a docker CLI alone is not enough)."""
    if not shutil.which("docker"):
        return False
    try:
        proc = subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def image_blocker() -> str | None:
    """Why the agent's image cannot be built here, or None when it can."""
    if docker_works() or not missing(IMAGE_PACKAGES):
        return None
    if sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("apt-get"):
        return (
            "building the image needs a Docker daemon, or buildah, runc and debootstrap (Debian "
            "packages, installed here only as root on Debian or Ubuntu)"
        )
    return None


class Docker:
    name = "docker"

    def exists(self, image: str) -> bool:
        argv = ["docker", "image", "inspect", image]
        return subprocess.run(argv, capture_output=True, check=False).returncode == 0

    def build(self, context: Path, tag: str, build_args: dict[str, str], log: Path) -> None:
        args = [a for k, v in build_args.items() for a in ("--build-arg", f"{k}={v}")]
        _run(["docker", "build", *args, "-t", tag, str(context)], log, f"docker build {tag}")

    def save(self, image: str, archive: Path, log: Path) -> None:
        _run(["docker", "save", "-o", str(archive), image], log, f"docker save {image}")

    def push(self, image: str, destination: str, log: Path) -> None:
        _run(["docker", "tag", image, destination], log, f"docker tag {destination}")
        _run(["docker", "push", destination], log, f"docker push {destination}")

    def config(self, image: str) -> dict:
        argv = ["docker", "image", "inspect", "-f", "{{json .Config}}", image]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        return json.loads(out)

    def run(self, image: str, argv: list[str]) -> subprocess.CompletedProcess:
        """The image's entrypoint with ``argv``, as its user."""
        cmd = ["docker", "run", "--rm", "--network", "none", image, *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


class Buildah:
    """buildah with storage of its own in the cache (the machine's is left alone)."""

    name = "buildah"

    def __init__(self, cache: Path) -> None:
        self.flags = [
            "--root",
            str(cache / "containers" / "storage"),
            "--runroot",
            str(cache / "containers" / "run"),
            "--storage-driver",
            "overlay",
        ]

    def _cmd(self, *args: str) -> list[str]:
        return ["buildah", *self.flags, *args]

    def exists(self, image: str) -> bool:
        argv = self._cmd("inspect", "--type", "image", image)
        return subprocess.run(argv, capture_output=True, check=False).returncode == 0

    def build(self, context: Path, tag: str, build_args: dict[str, str], log: Path) -> None:
        args = [a for k, v in build_args.items() for a in ("--build-arg", f"{k}={v}")]
        # RUN steps reach PyPI with this machine's trust (a TLS-inspecting proxy's CA, say),
        # lent for the build only: the image keeps its own.
        if HOST_CA_BUNDLE.exists():
            args += ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
        argv = self._cmd("bud", "--pull=never", "--network", "host", *args, "-t", tag)
        _run([*argv, str(context)], log, f"buildah bud {tag}")

    def from_rootfs(self, rootfs_tar: Path, image: str, env: dict[str, str], log: Path) -> None:
        container = subprocess.run(
            self._cmd("from", "scratch"), capture_output=True, text=True, check=True
        ).stdout.strip()
        try:
            # A tar keeps owners and modes (a folder added as such would be owned by root).
            _run(self._cmd("add", container, str(rootfs_tar), "/"), log, "buildah add")
            config = [a for k, v in env.items() for a in ("--env", f"{k}={v}")]
            _run(self._cmd("config", *config, "--cmd", "python3", container), log, "config")
            _run(self._cmd("commit", "--rm", container, image), log, f"buildah commit {image}")
        except BaseException:
            subprocess.run(self._cmd("rm", container), capture_output=True, check=False)
            raise

    def save(self, image: str, archive: Path, log: Path) -> None:
        _run(self._cmd("push", image, f"docker-archive:{archive}:{image}"), log, "buildah push")

    def push(self, image: str, destination: str, log: Path) -> None:
        _run(self._cmd("push", image, f"docker://{destination}"), log, f"push {destination}")

    def _inspect(self, image: str) -> dict:
        argv = self._cmd("inspect", "--type", "image", image)
        return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)

    def config(self, image: str) -> dict:
        return self._inspect(image)["OCIv1"]["config"]

    def run(self, image: str, argv: list[str]) -> subprocess.CompletedProcess:
        """The image's entrypoint with ``argv``, as its user, in a throwaway container."""
        container = subprocess.run(
            self._cmd("from", "--pull=never", image), capture_output=True, text=True, check=True
        ).stdout.strip()
        try:
            entrypoint = self.config(image).get("Entrypoint") or []
            cmd = self._cmd("run", "--isolation", "chroot", container)
            return subprocess.run(
                [*cmd, "--", *entrypoint, *argv],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        finally:
            subprocess.run(self._cmd("rm", container), capture_output=True, check=False)


def builder(log=None):
    """Docker when its daemon answers, else buildah (installed from Debian when missing)."""
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    if docker_works():
        return Docker()
    ensure_packages(IMAGE_PACKAGES, log)
    return Buildah(cache)


class _Locked:
    """One build at a time per cache, across processes."""

    def __init__(self, cache: Path) -> None:
        self.path = cache / ".lock"

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.path.open("w")
        fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


def apt_sources(text: str | None = None) -> tuple[str, str]:
    """The Debian archive and security archive apt uses here (Debian's own by default), from
    ``text`` (one-line or deb822 sources) or this machine's apt sources."""
    if text is None:
        text = ""
        for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]:
            if path.is_file():
                text += path.read_text(errors="replace") + "\n"
    uris = re.findall(r"(?:URIs:\s*|^deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text, re.M)
    security = next((u for u in uris if u.rstrip("/").endswith("debian-security")), None)
    archive = next((u for u in uris if u.rstrip("/").endswith("/debian")), None)
    return (
        archive or "http://deb.debian.org/debian",
        security or "http://deb.debian.org/debian-security",
    )


def build_base(build: Buildah, log) -> str:
    """Debian with its Python as a local image (debootstrap, then security updates)."""
    pin = base_pin()
    suite, packages = pin["debian_suite"], pin["packages"]
    key = _digest(json.dumps([pin, BASE_RECIPE], sort_keys=True).encode())[:12]
    image = f"{BASE_REPOSITORY}:{suite}-{key}"
    if build.exists(image):
        return image
    cache = cache_root()
    logs = cache / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    build_log = logs / f"base-{suite}-{key}.log"
    build_log.unlink(missing_ok=True)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="base-", dir=cache))
    try:
        rootfs = work / "rootfs"
        _make_rootfs(rootfs, suite, packages, build_log, log)
        tar = work / "rootfs.tar"
        _run(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tar), "."],
            build_log,
            "tar",
        )
        build.from_rootfs(
            tar,
            image,
            {
                "LANG": "C.UTF-8",
                # Debian's pip refuses to install beside the system's packages otherwise.
                "PIP_BREAK_SYSTEM_PACKAGES": "1",
            },
            build_log,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"made the image's base {image} in {time.monotonic() - started:.0f}s")
    return image


def _make_rootfs(rootfs: Path, suite: str, packages: list[str], build_log: Path, log) -> None:
    """Debian ``suite`` with ``packages`` in ``rootfs``, brought up to date, trimmed, and without
    this machine's name and resolvers."""
    archive, security = apt_sources()
    log(f"making the image's base: debootstrap {suite} from {archive}")
    _run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(packages)}",
            suite,
            str(rootfs),
            archive,
        ],
        build_log,
        "debootstrap",
    )
    (rootfs / "etc/apt/sources.list").write_text(
        f"deb {archive} {suite} main\n"
        f"deb {archive} {suite}-updates main\n"
        f"deb {security} {suite}-security main\n"
    )
    # apt in the new system needs /proc: mounted in a mount namespace of its own, gone
    # with it.
    upgrade = (
        f"mount -t proc proc {rootfs}/proc && "
        f"chroot {rootfs} apt-get update -q && "
        f"DEBIAN_FRONTEND=noninteractive chroot {rootfs} apt-get upgrade -y -q && "
        f"chroot {rootfs} apt-get clean"
    )
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", upgrade]
    _run(argv, build_log, "security updates of the base")
    for path in BASE_TRIM:
        shutil.rmtree(rootfs / path, ignore_errors=True)
    # This machine's name and resolvers are no part of an image (runtimes provide them).
    for path in ("etc/resolv.conf", "etc/hostname"):
        (rootfs / path).unlink(missing_ok=True)
        (rootfs / path).touch()


def build_agent_image(log=None) -> Image:
    """The agent's image from the Dockerfile (cached), and its archive."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    started = time.monotonic()
    build = builder(log)
    cache = cache_root()
    with _Locked(cache):
        build_args: dict[str, str] = {}
        base_key = ""
        if isinstance(build, Buildah):
            build_args["BASE_IMAGE"] = build_base(build, log)
            base_key = build_args["BASE_IMAGE"]
        key = _digest(source_digest().encode(), base_key.encode(), build.name.encode())[:12]
        image = f"{AGENT_REPOSITORY}:{project_version()}-{key}"
        archive = cache / f"agent-{key}.tar"
        if not (archive.exists() and build.exists(image)):
            logs = cache / "logs"
            logs.mkdir(exist_ok=True)
            build_log = logs / f"agent-{key}.log"
            build_log.unlink(missing_ok=True)
            log(f"building {image} with {build.name}")
            build.build(ROOT, image, build_args, build_log)
            partial = archive.with_suffix(".partial")
            partial.unlink(missing_ok=True)
            build.save(image, partial, build_log)
            partial.rename(archive)
        seconds = time.monotonic() - started
        return Image(image, archive, build.name, archive.stat().st_size, seconds)


def build_pause_image(log=None) -> Image:
    """The sandbox image of real nodes: a static Go program that waits (cached)."""
    gover = go_version()

    def compile_pause(context: Path, build_log: Path) -> None:
        binary = str(context / "pause")
        argv = ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", binary, str(PAUSE_SOURCE)]
        _run(argv, build_log, "go build pause", env=go_env(), cwd=context)

    return _static_image(
        "pause",
        PAUSE_REPOSITORY,
        _digest(PAUSE_SOURCE.read_bytes(), gover.encode()),
        compile_pause,
        'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n',
        log,
    )


def build_argoexec_image(log=None) -> Image:
    """Argo Workflows' executor for real nodes (cached): its binary, built from its Go module
    (the ``argo`` group of pins.toml), where Argo's own image has it (``/bin/argoexec``, the
    entrypoint), with an empty ``/tmp``. Its ``init`` container copies it into every workflow
    pod, whose main container then runs under it."""
    from testbed.testbin.builder import build as build_tools

    binary = (build_tools(log, group="argo") / "argoexec").resolve()

    def copy_binary(context: Path, build_log: Path) -> None:
        shutil.copyfile(binary, context / "argoexec")
        (context / "argoexec").chmod(0o755)
        (context / "tmp").mkdir(mode=0o1777)
        (context / "tmp" / ".keep").touch()  # a folder with nothing in it is not copied

    return _static_image(
        "argoexec",
        ARGOEXEC_REPOSITORY,
        _digest(str(binary).encode()),  # the path names the pinned version and Go
        copy_binary,
        'FROM scratch\nCOPY argoexec /bin/argoexec\nCOPY tmp /tmp\nENTRYPOINT ["argoexec"]\n',
        log,
    )


def _static_image(name, repository, key, prepare, dockerfile, log) -> Image:
    """An image of a static binary (no base), built once per ``key``: ``prepare(context,
    log_path)`` puts its files in the build context."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    started = time.monotonic()
    build = builder(log)
    cache = cache_root()
    key = _digest(key.encode(), build.name.encode())[:12]
    image = f"{repository}:{key}"
    archive = cache / f"{name}-{key}.tar"
    with _Locked(cache):
        if not (archive.exists() and build.exists(image)):
            logs = cache / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            build_log = logs / f"{name}-{key}.log"
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                context = Path(tmp)
                prepare(context, build_log)
                (context / "Dockerfile").write_text(dockerfile)
                build.build(context, image, {}, build_log)
            partial = archive.with_suffix(".partial")
            partial.unlink(missing_ok=True)
            build.save(image, partial, build_log)
            partial.rename(archive)
        seconds = time.monotonic() - started
        return Image(image, archive, build.name, archive.stat().st_size, seconds)


def push(image: Image, destination: str, log=None) -> None:
    """Push a built image to a registry, as ``destination`` (REPOSITORY[:TAG])."""
    build = builder(log)
    logs = cache_root() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    build.push(image.name, destination, logs / "push.log")
