"""``python -m e2e.image``: the old name of ``python -m testbed.image``,
kept for one release (CHANGELOG.md)."""

import runpy
import sys

if __name__ == "__main__":
    print("note: `python -m e2e.image` is now `python -m testbed.image`", file=sys.stderr)
    runpy.run_module("testbed.image", run_name="__main__", alter_sys=True)
