"""The ``multicluster-scheduler`` command: one entry point whose subcommands run the product."""

from __future__ import annotations

import argparse
import difflib
import sys

from . import __version__, agent
from .connect import export, join, status, unjoin

# Each subcommand module offers add_arguments(parser) and main(args) -> exit code, and may
# offer EXAMPLES: command lines shown at the end of its help.
COMMANDS = {
    "agent": (agent, "run the agent (webhook, controllers) of one cluster"),
    "export": (
        export,
        "print a Secret holding a kubeconfig for a service account (pipe into kubectl apply)",
    ),
    "join": (
        join,
        "connect a source cluster to a target: Source in the target, Secret and Target in the "
        "source",
    ),
    "unjoin": (
        unjoin,
        "disconnect a source cluster from a target: what join made, deleted in both clusters",
    ),
    "status": (
        status,
        "targets of a source cluster, their readiness and use, and where its elected pods run",
    ),
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Examples as written, and every option's default in its help unless the help says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or not action.option_strings
            or default in (None, False, True, [], argparse.SUPPRESS)
        ):
            return text
        return f"{text} (default: %(default)s)"


def build_parser(prog: str = "multicluster-scheduler") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Schedule Kubernetes pods across clusters.",
        formatter_class=HelpFormatter,
        allow_abbrev=False,  # --source is not --source-context: a script says what it means
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, summary) in COMMANDS.items():
        examples = getattr(module, "EXAMPLES", "")
        module.add_arguments(
            commands.add_parser(
                name,
                help=summary,
                description=summary,
                epilog=f"examples:\n{examples}" if examples else None,
                formatter_class=HelpFormatter,
                allow_abbrev=False,
            )
        )
    return parser


def long_options(parser: argparse.ArgumentParser) -> set[str]:
    """Every ``--option`` of the parser and of its subcommands."""
    found = set()
    for action in parser._actions:
        found |= {o for o in action.option_strings if o.startswith("--")}
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= long_options(sub)
    return found


def misspelt(argv: list[str], known: set[str]) -> str | None:
    """Why an option on the command line is not one (checked before argparse, which would
    rather report a required option missing, or read ``-namespace x`` as ``-n amespace``)."""
    for token in argv:
        if token == "--":
            break
        name = token.split("=", 1)[0]
        if name.startswith("--") and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            return f"unrecognized option {name}{hint}"
        if name[:1] == "-" and name[1:2].isalpha() and len(name) > 2 and "-" + name in known:
            return f"unrecognized option {name} (did you mean -{name}?)"
    return None


def main(argv: list[str] | None = None, prog: str = "multicluster-scheduler") -> int:
    parser = build_parser(prog)
    argv = sys.argv[1:] if argv is None else argv
    problem = misspelt(argv, long_options(parser))
    if problem:
        parser.error(problem)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    module, _ = COMMANDS[args.command]
    try:
        return module.main(args)
    except KeyboardInterrupt:  # what a command made is rolled back first (join)
        print("interrupted", file=sys.stderr)
        return 130


def kubectl_plugin() -> int:
    """``kubectl-multicluster``: the same command as a kubectl plugin (``kubectl multicluster
    status`` runs ``kubectl-multicluster status``)."""
    return main(prog="kubectl multicluster")


if __name__ == "__main__":
    sys.exit(main())
