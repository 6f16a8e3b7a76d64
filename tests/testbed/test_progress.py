"""Long steps say what runs and for how long on a terminal, and nothing anywhere else."""

from __future__ import annotations

import io
import time

from testbed.progress import CLEAR, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_nothing_is_written_where_no_one_watches():
    out = io.StringIO()
    with progress("building kubernetes", out, after=0, interval=0.01):
        time.sleep(0.05)
    assert out.getvalue() == ""


def test_a_long_step_shows_its_seconds_and_erases_its_line():
    out = Terminal()
    with progress("building kubernetes", out, after=0.01, interval=0.01):
        time.sleep(0.1)
    text = out.getvalue()
    assert f"{CLEAR}  building kubernetes… 0 s" in text
    assert text.endswith(CLEAR)


def test_a_short_step_writes_nothing():
    out = Terminal()
    with progress("pip install", out, after=5):
        pass
    assert out.getvalue() == ""
