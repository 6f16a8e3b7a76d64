"""Scenarios of the multicluster runtime against real API servers."""
