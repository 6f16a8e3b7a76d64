"""The README's commands on a fresh machine, as a newcomer types them (:mod:`testbed.freshmachine`:
this machine's root under an overlay, with no Docker, no buildah, no container runtime, no
debootstrap, no caches, and here no Go either, with a copy of the repository).

- ``./dev image`` installs what it needs from Debian and builds the agent's image (its RUN
  steps need a container runtime, which Debian's buildah only recommends). The image's base
  and pip's downloads are kept between runs in caches of this test's own
  (``~/.cache/multicluster-scheduler/fresh-machine-*``): a first run makes the base (about
  4.5 minutes in all here), later ones only install the packages and build the agent's image
  on that base, RUN steps included (55 s here).
- ``./dev demo`` runs without Go once the test bed's binaries are built (they are mounted from
  this machine, read only), its report ends with the lines to paste, and getting started's
  step 6, pasted after them, steers nginx to cluster2; ``./dev down`` stops it (46 s here).

Linux and root only; skipped elsewhere with the reason.
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

import pytest

from testbed.freshmachine import (
    IMAGE_CACHE,
    PIP_CACHE,
    TESTBIN_CACHE,
    fresh_machine_blocker,
    run_on_fresh_machine,
)
from testbed.image.builder import cache_root as image_cache_root
from testbed.testbin import builder as bed_binaries

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "getting-started.md"
pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(autouse=True)
def fresh_machine():
    blocker = fresh_machine_blocker()
    if blocker:
        pytest.skip(blocker)


def run(script: str, log: Path, mounts: dict[str, Path] | None = None, **options):
    """``script`` on a fresh machine; pip's downloads are kept between runs (a cache of this
    test's own): what is tested is what is installed, not how fast PyPI answers."""
    pip = image_cache_root().parent / "fresh-machine-pip"
    started = time.monotonic()
    ran = run_on_fresh_machine(
        script, log=log, mounts={PIP_CACHE: pip, **(mounts or {})}, **options
    )
    print(f"fresh machine: exit {ran.returncode} in {time.monotonic() - started:.0f}s; log {log}")
    print(ran.stdout[-6000:])
    return ran


def test_dev_image_installs_what_it_needs_and_builds_the_image(tmp_path: Path):
    cache = image_cache_root().parent / "fresh-machine-image"
    for archive in cache.glob("agent-*.tar"):  # the agent's image is built again: RUN steps run
        archive.unlink()
    # Then the image's command runs in it, and the image goes (the base stays for the next run).
    check = (
        "set -e; ./dev image | tail -n 1 > image.name; "
        ".venv/bin/python -c 'from testbed.image.builder import builder; import sys; "
        'name = open("image.name").read().strip(); b = builder(); '
        'ran = b.run(name, ["--help"]); print(ran.stdout, ran.stderr); '
        "sys.exit(ran.returncode)'; "
        "buildah --root ~/.cache/multicluster-scheduler/image/containers/storage "
        "--runroot ~/.cache/multicluster-scheduler/image/containers/run "
        '--storage-driver overlay rmi "$(cat image.name)" >/dev/null; cat image.name'
    )
    ran = run(check, tmp_path / "image.log", mounts={IMAGE_CACHE: cache}, hide_go=True)
    assert ran.returncode == 0
    assert "installing Debian packages: buildah runc debootstrap" in ran.stdout
    assert re.search(r"built with buildah in \d+s, \d+ MB", ran.stdout)
    assert "usage: multicluster-scheduler" in ran.stdout  # the command, run in the image
    assert re.search(r"^localhost/multicluster-scheduler:\S+$", ran.stdout, re.M)


def guide_step(title: str) -> list[str]:
    """The ``sh`` blocks of a section of getting started, as a reader copies them."""
    text = GUIDE.read_text()
    section = text[text.index(f"## {title}") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def test_the_demo_runs_without_go_and_getting_started_goes_on_after_it(
    tmp_path: Path, bin_dir: Path
):
    steer = guide_step("6. Steer it with a node selector")
    # The demo's nodes have their regions: the block for nodes without one is left out, as
    # the guide says.
    steer = [block for block in steer if "label nodes" not in block]
    assert len(steer) == 2
    assert "patch deployment nginx" in steer[1]
    script = "\n".join(
        [
            "set -e",
            "./dev demo > demo.out || { cat demo.out; exit 1; }",
            "cat demo.out",
            # The report ends with the lines to paste: pasted, in a new shell.
            "tail -n 3 demo.out > pasted.sh",
            "echo '--- pasted'; cat pasted.sh",
            "bash -e <<'GUIDE'",
            ". ./pasted.sh",
            "cd /",  # the lines work from any folder
            *steer,
            'kubectl --context "$CLUSTER1" -n "$NAMESPACE" rollout status deployment/nginx '
            "--timeout=120s",
            # The old delegates go with their proxy pods: wait until they have.
            'count() { kubectl --context "$1" -n "$NAMESPACE" get pods -o name '
            "-l multicluster.admiralty.io/app=nginx | wc -l; }",
            'for i in $(seq 60); do [ "$(count "$CLUSTER1")" = 0 ] && '
            '[ "$(count "$CLUSTER2")" = 10 ] && break; sleep 1; done',
            'echo "--- delegates in $CLUSTER2:"; count "$CLUSTER2"',
            'echo "--- delegates in $CLUSTER1:"; count "$CLUSTER1"',
            'multicluster-scheduler status --context "$CLUSTER1" -n "$NAMESPACE"',
            'kubectl multicluster status --context "$CLUSTER1" -n "$NAMESPACE" -o json > /dev/null',
            "GUIDE",
            "./dev down",
        ]
    )
    testbin = bed_binaries.cache_root()
    ran = run(
        script,
        tmp_path / "demo.log",
        read_only={TESTBIN_CACHE: testbin},
        hide_go=True,
        timeout=900,
    )
    out = ran.stdout
    assert ran.returncode == 0
    pasted = out[out.index("--- pasted") :].splitlines()[1:4]
    assert pasted[0] == f"export KUBECONFIG={shlex.quote('/root/multicluster-scheduler')}" + (
        "/.testbed/kubeconfig"
    )
    assert pasted[1].startswith("export PATH=/root/multicluster-scheduler/.venv/bin:")
    assert pasted[2] == "CLUSTER1=cluster1 CLUSTER2=cluster2 NAMESPACE=default"
    # Step 6: every delegate in cluster2 (region eu), none left in cluster1.
    assert re.search(r"--- delegates in cluster2:\n10\n", out)
    assert re.search(r"--- delegates in cluster1:\n0\n", out)
    assert re.search(r"^deployment/nginx\s+10\s+c2=10\s", out, re.M)
    assert "Demo stopped" in out
