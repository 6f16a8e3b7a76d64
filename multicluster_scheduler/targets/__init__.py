"""The targets controller: Targets and ClusterTargets as live connections."""
