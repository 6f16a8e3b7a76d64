"""Child processes of the test bed that never outlive their owner.

Each component runs with ``PR_SET_PDEATHSIG`` so the kernel kills it when the process that
started it dies, even by SIGKILL: a crashed test run leaves nothing behind. Processes must
therefore be started from a long-lived thread (the main one): the signal fires when the
*thread* that forked exits.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections import deque
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent(parent_pid: int) -> None:
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


class Process:
    """One component: a command line, an environment and a log file; restartable."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        *,
        bound_to_parent: bool = True,
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = env or {}
        self.bound_to_parent = bound_to_parent
        self._popen: subprocess.Popen | None = None
        self.started_at: float | None = None  # time.monotonic() of the last start

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    @property
    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def exit_code(self) -> int | None:
        return self._popen.poll() if self._popen else None

    def start(self) -> None:
        if self.running:
            return
        env = dict(os.environ) | self.env
        parent = os.getpid()
        with self.log_path.open("ab") as log:
            log.write(f"\n==> {time.strftime('%H:%M:%S')} start {self.name}\n".encode())
            log.flush()
            self.started_at = time.monotonic()
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=(lambda: _die_with_parent(parent)) if self.bound_to_parent else None,
                start_new_session=not self.bound_to_parent,
            )

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if self._popen is None:
            return
        if self._popen.poll() is None:
            self._popen.terminate()
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()

    def kill(self) -> None:
        if self._popen is not None and self._popen.poll() is None:
            self._popen.kill()
            self._popen.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            with self.log_path.open(errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except FileNotFoundError:
            return ""
