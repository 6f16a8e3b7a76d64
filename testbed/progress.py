"""What a long step is doing, and for how long, while it runs: on a terminal only.

Building the test bed, a real node or the image runs steps that print nothing for a minute or
more (``go build`` of Kubernetes, ``apt-get install``, ``debootstrap``, ``buildah bud``). A
person at a terminal who sees nothing move for that long cannot tell work from a hang. After
:data:`SHOW_AFTER` seconds, :func:`progress` shows one line, ``  building kubernetes… 42 s``,
rewritten in place every second and erased when the step ends (what the step logs then stays).
Where the stream is not a terminal (CI, a pipe, a log file) it writes nothing at all: logs keep
one line per event.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

SHOW_AFTER = 5.0  # seconds: shorter steps are not worth a line
CLEAR = "\r\033[K"  # back to the start of the line, and erase it


def on_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # closed
        return False


@contextlib.contextmanager
def progress(
    what: str,
    stream: TextIO | None = None,
    *,
    after: float = SHOW_AFTER,
    interval: float = 1.0,
) -> Iterator[None]:
    """Show ``what`` and the seconds it has taken, once it has taken ``after``, until the block
    ends; nothing when ``stream`` (stderr by default) is not a terminal."""
    out = stream if stream is not None else sys.stderr
    if not on_terminal(out):
        yield
        return
    stop = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        if stop.wait(after):
            return
        while True:
            out.write(f"{CLEAR}  {what}… {time.monotonic() - started:.0f} s")
            out.flush()
            if stop.wait(interval):
                break
        out.write(CLEAR)
        out.flush()

    ticker = threading.Thread(target=tick, name="progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
