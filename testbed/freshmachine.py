"""A fresh machine for the install tests, made from this one in a second and gone after.

The README's commands must work on a machine that has only Python (and Go for the test bed): no
Docker, no buildah, no container runtime. A second machine, or a virtual one, is costly; this
machine's own root filesystem under an overlay is not. In a mount and PID namespace of their own,
``/`` is mounted again as the lower layer of an overlay whose upper layer is a tmpfs, so that
everything written there (apt's packages, dpkg's database, the virtualenv) vanishes with the
namespace; the packages the product installs itself are purged there (``apt-get purge``: dpkg
forgets them too, as on a machine that never had them), commands that would change the path
taken (``docker``, ``podman``, Go when asked) are removed, and a fresh copy of the repository
(its tracked and untracked files, as a clone with the changes not yet committed) is put under
``/root``. Then a shell script runs in it, chrooted, as root, with a clean environment (only the
machine's proxy and pip settings carried over).

The caches of this machine (pip's, Go's, the test bed's) are hidden: a fresh machine has none.
The caller may mount folders of this machine's disk into it (``mounts``): what needs a real
filesystem under it (buildah's overlay storage cannot live on an overlay), such as the image
cache, or what the test is not about, such as the test bed's binaries, read only.

Linux and root only (namespaces, mounts, chroot), like real nodes: :func:`fresh_machine_blocker`
says why it cannot run.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Where the copy of the repository is, in the fresh machine.
CLONE = "/root/multicluster-scheduler"
# What the product installs itself when missing (testbed/host.py), and what would make it take
# another path (a Docker daemon, a runtime of another name).
PURGED_PACKAGES = (
    "buildah",
    "debootstrap",
    "runc",
    "crun",
    "containernetworking-plugins",
    "golang-github-containers-common",
    "containers-common",
    "podman",
    "docker.io",
    "docker-ce",
    "docker-ce-cli",
)
REMOVED_FILES = ("/usr/local/bin/docker", "/usr/bin/docker", "/usr/local/bin/podman")
GO_ROOTS = ("/usr/local/go",)
HIDDEN_DIRS = ("/root/.cache", "/root/go", "/root/.config", "/root/.local")
# The machine's own settings a fresh machine of the same site would have.
KEPT_ENVIRONMENT = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY")
KEPT_PREFIXES = ("PIP_",)
UPPER_SIZE = "8g"  # tmpfs of the overlay's upper layer (pages are used only as written)


def fresh_machine_blocker() -> str | None:
    """Why a fresh machine cannot be made here, or None."""
    if sys.platform != "linux":
        return f"a fresh machine is made with Linux namespaces and overlays; this is {sys.platform}"
    if os.geteuid() != 0:
        return "a fresh machine needs root (mounts, chroot); run as root"
    if not shutil.which("unshare"):
        return "a fresh machine needs unshare (util-linux)"
    if not Path("/usr/bin/apt-get").exists():
        return "a fresh machine is made from a Debian or Ubuntu root filesystem (no apt-get here)"
    return None


def repository_files(root: Path = ROOT) -> list[str]:
    """The repository's files as a clone with its uncommitted changes has them."""
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    return sorted(p for p in out.decode().split("\0") if p and (root / p).is_file())


def environment() -> dict[str, str]:
    env = {
        "HOME": "/root",
        "PATH": "/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
    }
    for key, value in os.environ.items():
        if key in KEPT_ENVIRONMENT or key.startswith(KEPT_PREFIXES):
            env[key] = value
    return env


IMAGE_CACHE = "/root/.cache/multicluster-scheduler/image"
PIP_CACHE = "/root/.cache/pip"
TESTBIN_CACHE = "/root/.cache/multicluster-scheduler/testbin"


def _setup_script(work: Path, mounts: dict[str, tuple[Path, bool]], hide_go: bool) -> str:
    """Run in the new mount namespace: the overlay, the mounts, the copy, the purge."""
    layers, root = work / "layers", work / "root"
    hidden = list(GO_ROOTS) if hide_go else []
    lines = [
        "set -eu",
        f"mount -t tmpfs -o size={UPPER_SIZE} tmpfs {layers}",
        f"mkdir -p {layers}/upper {layers}/work",
        f"mount -t overlay overlay -o lowerdir=/,upperdir={layers}/upper,workdir={layers}/work "
        f"{root}",
        f"mount -t proc proc {root}/proc",
        f"mount --rbind /dev {root}/dev",
        f"mount --rbind /sys {root}/sys",
        f"mount -t tmpfs tmpfs {root}/tmp",
        f"mount -t tmpfs tmpfs {root}/run",
        # This machine's caches (pip's, Go's, the test bed's) are not on a fresh one.
        *(f"mount -t tmpfs tmpfs {root}{path}" for path in HIDDEN_DIRS if Path(path).is_dir()),
        *(
            f"mkdir -p {root}{inside} && mount --bind {'-o ro ' if ro else ''}{host} {root}{inside}"
            for inside, (host, ro) in mounts.items()
        ),
        *(f"mount -t tmpfs tmpfs {root}{path}" for path in hidden if Path(path).exists()),
        f"mkdir -p {root}{CLONE}",
        f"tar -C {ROOT} --null -T {work}/files -cf - | tar -C {root}{CLONE} -xf -",
        *(f"rm -f {root}{path}" for path in REMOVED_FILES),
        # Installed here: purged (dpkg forgets them), as a machine that never had them.
        f"installed=$(chroot {root} dpkg-query -W -f='${{db:Status-Abbrev}} ${{Package}}\\n' "
        f"{' '.join(PURGED_PACKAGES)} 2>/dev/null | awk '$1 ~ /^.i/ {{print $2}}')",
        f'if [ -n "$installed" ]; then DEBIAN_FRONTEND=noninteractive chroot {root} '
        "apt-get purge -y -q $installed >/dev/null; fi",
    ]
    return "\n".join(lines)


def run_on_fresh_machine(
    script: str,
    *,
    mounts: dict[str, Path] | None = None,
    read_only: dict[str, Path] | None = None,
    hide_go: bool = False,
    timeout: float = 1200,
    log: Path | None = None,
) -> subprocess.CompletedProcess:
    """Run ``script`` (sh, from the copy of the repository) as root on a fresh machine; its
    output (stdout and stderr together) in the result's ``stdout``, also written to ``log``.
    ``mounts`` and ``read_only``: folders of this machine mounted there (path there → path
    here), writable or not; ``hide_go``: Go is not installed there."""
    blocker = fresh_machine_blocker()
    if blocker:
        raise RuntimeError(blocker)
    binds = {inside: (host, False) for inside, host in (mounts or {}).items()}
    binds |= {inside: (host, True) for inside, host in (read_only or {}).items()}
    for host, _ in binds.values():
        host.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fresh-machine-", dir="/var/tmp"))
    try:
        (work / "layers").mkdir()
        (work / "root").mkdir()
        (work / "files").write_bytes(b"\0".join(p.encode() for p in repository_files()))
        env = " ".join(shlex.quote(f"{k}={v}") for k, v in environment().items())
        inner = f"cd {CLONE} && {script}"
        whole = (
            _setup_script(work, binds, hide_go)
            + f"\nexec chroot {work}/root env -i {env} sh -c {shlex.quote(inner)}\n"
        )
        argv = ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation",
                "private", "sh", "-c", whole]  # fmt: skip
        proc = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=timeout,
            check=False,
        )
        if log is not None:
            log.write_text(proc.stdout)
        return proc
    finally:
        shutil.rmtree(work, ignore_errors=True)
