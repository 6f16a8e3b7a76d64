"""The vocabulary every component shares: CRD models, well-known keys and naming rules."""
