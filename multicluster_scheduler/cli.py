"""The ``multicluster-scheduler`` command: one entry point whose subcommands run the product."""

from __future__ import annotations

import argparse
import sys

from . import __version__, agent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="multicluster-scheduler",
        description="Schedule Kubernetes pods across clusters.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    agent_parser = commands.add_parser(
        "agent", help="run the agent (webhook, controllers) of one cluster"
    )
    agent.add_arguments(agent_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "agent":
        return agent.main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
