"""What every example's command line shares: which kubeconfig and contexts, and logging."""

from __future__ import annotations

import argparse
import logging


def parser(
    description: str, default_contexts: str = "cluster1,cluster2"
) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    p.add_argument(
        "--contexts",
        default=default_contexts,
        help="comma-separated kubeconfig contexts; each becomes a cluster of the same name",
    )
    p.add_argument("--namespace", default="default", help="namespace to work in")
    return p


def contexts(args: argparse.Namespace) -> list[str]:
    return [c.strip() for c in args.contexts.split(",") if c.strip()]


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
