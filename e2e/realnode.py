"""``python -m e2e.realnode``: the old name of ``python -m testbed.realnode``,
kept for one release (CHANGELOG.md)."""

import runpy
import sys

if __name__ == "__main__":
    print("note: `python -m e2e.realnode` is now `python -m testbed.realnode`", file=sys.stderr)
    runpy.run_module("testbed.realnode", run_name="__main__", alter_sys=True)
