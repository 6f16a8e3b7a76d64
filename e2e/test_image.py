"""The agent's image as ``./dev image`` builds it from the Dockerfile, here with no registry:
it runs as uid 65532, its entrypoint is the ``multicluster-scheduler`` command, and it works."""

from __future__ import annotations

import pytest

from testbed.image import Image, build_agent_image, image_blocker
from testbed.image.builder import builder

# On a fresh machine the first build makes the image's base too (./dev test does it before
# pytest).
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def image() -> Image:
    blocker = image_blocker()
    if blocker:
        pytest.skip(blocker)
    built = build_agent_image()
    print(
        f"{built.name}: built with {built.builder} in {built.seconds:.0f}s (0 when cached), "
        f"{built.size / 1e6:.0f} MB uncompressed"
    )
    return built


def test_the_image_runs_the_agent_as_non_root(image: Image):
    config = builder().config(image.name)
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["multicluster-scheduler"]
    assert config["Cmd"] == ["agent"]


def test_the_command_works_in_the_image(image: Image):
    ran = builder().run(image.name, ["--help"])
    assert ran.returncode == 0, ran.stderr
    for command in ("agent", "export", "join"):
        assert command in ran.stdout
    agent = builder().run(image.name, ["agent", "--help"])
    assert agent.returncode == 0, agent.stderr
    assert "--kubelet-port" in agent.stdout


def test_the_image_and_its_archive_are_reported(image: Image):
    assert image.archive.exists()
    assert image.size == image.archive.stat().st_size
    assert 50e6 < image.size < 1e9, f"{image.size / 1e6:.0f} MB"
