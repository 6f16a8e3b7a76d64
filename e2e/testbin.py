"""``python -m e2e.testbin``: the old name of ``python -m testbed.testbin``,
kept for one release (CHANGELOG.md)."""

import runpy
import sys

if __name__ == "__main__":
    print("note: `python -m e2e.testbin` is now `python -m testbed.testbin`", file=sys.stderr)
    runpy.run_module("testbed.testbin", run_name="__main__", alter_sys=True)
