"""``python -m e2e.demo``: the old name of ``python -m testbed.demo``,
kept for one release (CHANGELOG.md)."""

import runpy
import sys

if __name__ == "__main__":
    print("note: `python -m e2e.demo` is now `python -m testbed.demo`", file=sys.stderr)
    runpy.run_module("testbed.demo", run_name="__main__", alter_sys=True)
