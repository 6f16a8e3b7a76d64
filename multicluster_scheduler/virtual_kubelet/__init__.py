"""The virtual kubelet: one node per target, kept alive and truthful by a single writer."""
