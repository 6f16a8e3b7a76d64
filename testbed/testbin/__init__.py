"""Pinned, cached builds of etcd, Kubernetes, kwok and helm from their Go modules."""

from .builder import BuildError, bin_dir, build, load_pins

__all__ = ["BuildError", "bin_dir", "build", "load_pins"]
