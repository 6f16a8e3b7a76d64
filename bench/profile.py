"""Summarise py-spy's raw (collapsed) samples: where the agent's CPU time goes.

    python -m bench.profile bench-results/agent-profile.txt [--top 25] [--match TEXT]

Prints the functions holding the most samples on their own (self) and with what they call
(inclusive), as percentages of all samples (py-spy counts only non-idle samples).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def frame_name(frame: str) -> str:
    """``func (path/to/file.py:12)`` → ``func (file.py)``: lines of one function merged."""
    match = FRAME.match(frame)
    if not match:
        return frame
    path = match["file"]
    short = (
        "/".join(path.split("/")[-2:])
        if "site-packages" not in path
        else path.split("site-packages/")[-1]
    )
    return f"{match['func']} ({short})"


def summarise(lines: list[str]) -> tuple[int, Counter, Counter]:
    total = 0
    own: Counter = Counter()
    inclusive: Counter = Counter()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [frame_name(f) for f in stack.split(";")]
        own[frames[-1]] += n
        for name in set(frames):
            inclusive[name] += n
    return total, own, inclusive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--match", help="only stacks containing this text")
    args = parser.parse_args(argv)
    lines = args.profile.read_text(errors="replace").splitlines()
    if args.match:
        lines = [line for line in lines if args.match in line]
    total, own, inclusive = summarise(lines)
    if not total:
        print("no samples", file=sys.stderr)
        return 1
    print(f"{total} samples")
    for title, counter in (("self", own), ("inclusive", inclusive)):
        print(f"\n{title}:")
        for name, n in counter.most_common(args.top):
            print(f"{100 * n / total:6.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
