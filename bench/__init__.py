"""Benchmarks on the real test bed."""
