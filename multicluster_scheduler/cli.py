"""The ``multicluster-scheduler`` command: one entry point whose subcommands run the product."""

from __future__ import annotations

import argparse
import sys

from . import __version__, agent
from .connect import export, join

# Each subcommand module offers add_arguments(parser) and main(args) -> exit code.
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
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="multicluster-scheduler",
        description="Schedule Kubernetes pods across clusters.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, summary) in COMMANDS.items():
        module.add_arguments(commands.add_parser(name, help=summary, description=summary))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    module, _ = COMMANDS[args.command]
    return module.main(args)


if __name__ == "__main__":
    sys.exit(main())
