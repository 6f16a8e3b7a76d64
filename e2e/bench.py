"""``python -m e2e.bench``: the old name of ``python -m bench``, kept for one release
(CHANGELOG.md); ``python -m e2e.bench.informer`` and the others run ``bench/informer.py`` too."""

import runpy
import sys
from pathlib import Path

# The benchmarks' modules are found under this name as well (python -m e2e.bench.memory, …).
__path__ = [str(Path(__file__).resolve().parents[1] / "bench")]

if __name__ == "__main__":
    print("note: `python -m e2e.bench` is now `python -m bench`", file=sys.stderr)
    runpy.run_module("bench", run_name="__main__", alter_sys=True)
