"""Real multi-cluster control planes on 127.0.0.1 for tests, benchmarks and the local demo."""

from .bed import Cluster, ClusterSpec, TestBed, TestBedError, wait_for

__all__ = ["Cluster", "ClusterSpec", "TestBed", "TestBedError", "wait_for"]
