"""``python -m testbed.testbin build|bin-dir``: build the pinned test-bed binaries, or locate
them."""

from __future__ import annotations

import argparse
import sys
import time

from .builder import BuildError, bin_dir, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.testbin", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("build", "build every pinned tool (cached) and print the binaries' folder"),
        ("bin-dir", "print the folder holding the binaries (built or not)"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument(
            "--group",
            default="",
            help='the tools of a group of pins.toml instead ("real-node": kubelet, containerd; '
            '"argo": Argo Workflows\' controller)',
        )
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            started = time.monotonic()
            path = build(group=args.group)
            print(f"test bed binaries ready in {time.monotonic() - started:.0f}s", file=sys.stderr)
        else:
            path = bin_dir(group=args.group)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
