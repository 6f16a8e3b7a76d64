"""The summary controller: every cluster publishes what it offers as a ClusterSummary."""
