"""``python -m testbed.image [build|pause] [--push REPOSITORY[:TAG]]``: build the agent's image
(``./dev image``) or the real nodes' pause image, print its name and archive, push it if asked."""

from __future__ import annotations

import argparse
import sys

from testbed.host import SetupError

from .builder import ImageError, build_agent_image, build_pause_image, push


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.image", description=__doc__)
    parser.add_argument("what", nargs="?", choices=("build", "pause"), default="build")
    parser.add_argument(
        "--push",
        metavar="REPOSITORY[:TAG]",
        help="then push it there (e.g. registry.example.com/multicluster-scheduler:0.1.0)",
    )
    args = parser.parse_args(argv)
    try:
        image = build_agent_image() if args.what == "build" else build_pause_image()
        if args.push:
            push(image, args.push)
    except (ImageError, SetupError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(
        f"{image.name} built with {image.builder} in {image.seconds:.0f}s, "
        f"{image.size / 1e6:.0f} MB; archive: {image.archive}",
        file=sys.stderr,
    )
    if args.push:
        print(f"pushed as {args.push}", file=sys.stderr)
    print(image.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
