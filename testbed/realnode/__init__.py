"""Real nodes for the test bed: kubelet and containerd in namespaces of their own, holding the
agent's image built here (see :mod:`testbed.realnode.node`)."""

from __future__ import annotations

import sys
import time

from testbed.host import IMAGE_PACKAGES, REAL_NODE_PACKAGES, ensure_packages, real_node_blocker
from testbed.image import Image, build_agent_image, build_pause_image
from testbed.testbin import build

from .node import HOST_ADDRESS, REAL_NODE_KEY, RealNode, RealNodes


def prepare(log=None) -> tuple[RealNodes, Image]:
    """Everything real nodes need, built or installed when missing (cached): Debian packages,
    kubelet and containerd, the pause image and the agent's image; and that agent image."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    blocker = real_node_blocker()
    if blocker:
        raise RuntimeError(blocker)
    steps: list[str] = []
    started = time.monotonic()
    ensure_packages(REAL_NODE_PACKAGES + IMAGE_PACKAGES, log)
    steps.append(f"packages {time.monotonic() - started:.0f}s")
    mark = time.monotonic()
    bin_dir = build(log, group="real-node")
    steps.append(f"kubelet and containerd {time.monotonic() - mark:.0f}s")
    pause = build_pause_image(log)
    steps.append(f"pause image {pause.seconds:.0f}s")
    agent = build_agent_image(log)
    steps.append(f"agent image {agent.seconds:.0f}s ({agent.size / 1e6:.0f} MB)")
    log(f"real nodes ready in {time.monotonic() - started:.0f}s: {', '.join(steps)}")
    return RealNodes(bin_dir, pause.name, [pause.archive, agent.archive]), agent


__all__ = ["HOST_ADDRESS", "REAL_NODE_KEY", "RealNode", "RealNodes", "prepare"]
