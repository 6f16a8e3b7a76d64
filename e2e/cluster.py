"""``python -m e2e.cluster``: the old name of ``python -m testbed``,
kept for one release (CHANGELOG.md)."""

import runpy
import sys

if __name__ == "__main__":
    print("note: `python -m e2e.cluster` is now `python -m testbed`", file=sys.stderr)
    runpy.run_module("testbed", run_name="__main__", alter_sys=True)
