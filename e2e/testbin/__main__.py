"""``python -m e2e.testbin build|bin-dir``: build the pinned test-bed binaries or locate them."""

from __future__ import annotations

import argparse
import sys
import time

from .builder import BuildError, bin_dir, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.testbin", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build every pinned tool (cached) and print the binaries' folder")
    sub.add_parser("bin-dir", help="print the folder holding the binaries (built or not)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            started = time.monotonic()
            path = build()
            print(f"test bed binaries ready in {time.monotonic() - started:.0f}s", file=sys.stderr)
        else:
            path = bin_dir()
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
