"""The console script answers --version, explains itself without arguments, and its export
and join fail with a message on stderr and exit code 1."""

from __future__ import annotations

import argparse
import json
import socket

import pytest

from multicluster_scheduler import __version__
from multicluster_scheduler.cli import HelpFormatter, build_parser, main


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"multicluster-scheduler {__version__}"


def test_no_command_prints_usage(capsys):
    assert main([]) == 2
    assert "usage: multicluster-scheduler" in capsys.readouterr().err


def kubeconfig_file(tmp_path, server: str = "https://127.0.0.1:1") -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "clusters": [{"name": "k", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "a", "context": {"cluster": "k", "user": "u"}}],
                "current-context": "a",
            }
        )
    )
    return str(path)


def test_export_and_join_are_listed(capsys):
    assert main([]) == 2
    usage = capsys.readouterr().err
    assert "export" in usage
    assert "join" in usage


def test_export_of_an_unknown_context_fails_on_stderr(tmp_path, capsys):
    argv = ["export", "c1", "--as", "c2", "--kubeconfig", kubeconfig_file(tmp_path)]
    assert main([*argv, "--context", "nope"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "error: context 'nope' is not in the kubeconfig (contexts: a)\n"


def test_a_malformed_kubeconfig_fails_on_stderr(tmp_path, capsys):
    path = tmp_path / "kubeconfig"
    path.write_text("contexts: [a]\nclusters: []\n")
    argv = ["join", "--kubeconfig", str(path), "--source-context", "a", "--target-context", "b"]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        f"error: kubeconfig {path}: an entry of contexts is not a mapping: 'a'\n"
    )


def test_join_with_an_unreachable_target_names_its_address(tmp_path, capsys):
    port = free_port()
    path = kubeconfig_file(tmp_path, f"https://127.0.0.1:{port}")
    argv = ["join", "--kubeconfig", path, "--source-context", "a", "--target-context", "a"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read Namespace default: the API server of context a")
    assert f"(https://127.0.0.1:{port}) does not answer" in err


def test_export_requires_a_secret_name(capsys):
    with pytest.raises(SystemExit):
        main(["export", "c1"])
    assert "--as" in capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        # An abbreviation is not taken for the option it begins.
        (
            ["join", "--source", "a", "--target-context", "b"],
            "--source (did you mean --source-context?)",
        ),
        # A typo is named, rather than reported as a required option missing.
        (
            ["join", "--source-contxt", "a", "--target-context", "b"],
            "--source-contxt (did you mean",
        ),
        (["join", "--source-context=a", "--target-contxt=b"], "--target-contxt (did you mean"),
        # One dash before a long option is not -n with the rest as its value.
        (
            ["export", "c1", "--as", "c2", "-namespace", "default"],
            "-namespace (did you mean --namespace?)",
        ),
        (["agent", "--no-such-flag"], "--no-such-flag"),
    ],
)
def test_options_are_taken_only_as_written(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert f"error: unrecognized option {says}" in capsys.readouterr().err


def subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_option_says_what_it_does_and_its_default(command: str):
    parser = subcommands()[command]
    text = parser.format_help()
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        assert action.help, f"{command} {action.option_strings[-1]} has no help"
        if action.default not in (None, [], argparse.SUPPRESS) and action.nargs != 0:
            rendered = HelpFormatter("x")._get_help_string(action) or ""
            assert "default" in rendered, f"{command} {action.option_strings[-1]}: no default"
    assert "\nexamples:\n" in text, f"{command} --help has no examples"
    for line in text.split("\nexamples:\n", 1)[1].splitlines():
        if line.strip() and not line.strip().startswith("#"):
            assert line.startswith(
                ("  multicluster-scheduler ", "  kubectl ", "      ", "  MCS_")
            ), line


def test_an_interrupted_command_says_so_and_exits_130(monkeypatch, capsys):
    from multicluster_scheduler.connect import unjoin

    def interrupted(_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(unjoin, "main", interrupted)
    assert main(["unjoin", "--source-context", "a", "--target-context", "b"]) == 130
    assert capsys.readouterr().err == "interrupted\n"
