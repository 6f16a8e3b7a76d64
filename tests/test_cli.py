"""The console script answers --version and explains itself without arguments."""

from __future__ import annotations

import pytest

from multicluster_scheduler import __version__
from multicluster_scheduler.cli import main


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"multicluster-scheduler {__version__}"


def test_no_command_prints_usage(capsys):
    assert main([]) == 2
    assert "usage: multicluster-scheduler" in capsys.readouterr().err
