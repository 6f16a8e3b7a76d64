"""The parts of the image build that need no builder: what its cache key covers, and which
Debian mirror the base comes from."""

from __future__ import annotations

import shutil
from pathlib import Path

from testbed.image import builder

ROOT = Path(__file__).resolve().parents[2]


def copy_of_sources(tmp_path: Path) -> Path:
    for name in builder.IMAGE_INPUTS:
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in builder.IMAGE_SOURCES:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("*.pyc"))
    return tmp_path


def test_the_image_key_follows_what_the_dockerfile_copies(tmp_path):
    root = copy_of_sources(tmp_path)
    first = builder.source_digest(root)
    assert builder.source_digest(root) == first
    (root / "multicluster_scheduler" / "__pycache__").mkdir(exist_ok=True)
    (root / "multicluster_scheduler" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"0")
    assert builder.source_digest(root) == first, "byte code is not an input"
    agent = root / "multicluster_scheduler" / "agent.py"
    agent.write_text(agent.read_text() + "\n# changed\n")
    changed = builder.source_digest(root)
    assert changed != first
    (root / "Dockerfile").write_text((root / "Dockerfile").read_text() + "\n# changed\n")
    assert builder.source_digest(root) != changed


def test_the_base_comes_from_the_mirror_apt_uses():
    deb822 = """Types: deb
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
"""
    assert builder.apt_sources(deb822) == (
        "http://mirror.example/debian",
        "http://mirror.example/debian-security",
    )
    one_line = "deb [arch=amd64] http://ftp.example/debian bookworm main\n"
    assert builder.apt_sources(one_line) == (
        "http://ftp.example/debian",
        "http://deb.debian.org/debian-security",
    )
    assert builder.apt_sources("") == (
        "http://deb.debian.org/debian",
        "http://deb.debian.org/debian-security",
    )


def test_the_dockerfile_takes_its_base_as_an_argument():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.12-slim" in dockerfile
    assert dockerfile.count("FROM ${BASE_IMAGE}") == 2
    assert "USER 65532:65532" in dockerfile
