"""``python -m testbed.realnode prepare``: build or install everything real nodes need (cached) and
say how long each part took: Debian packages, kubelet and containerd, the pause image, the
agent's image."""

from __future__ import annotations

import argparse
import sys

from . import prepare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.realnode", description=__doc__)
    parser.add_argument("command", choices=("prepare",))
    parser.parse_args(argv)
    try:
        setup, agent = prepare()
    except Exception as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"kubelet and containerd: {setup.bin_dir}")
    print(f"images: {', '.join(str(p) for p in setup.images)}")
    print(agent.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
