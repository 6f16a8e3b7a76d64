"""The test bed: real Kubernetes control planes built from Go modules, and scenarios on them."""
