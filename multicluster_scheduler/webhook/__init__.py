"""The admission webhook that turns elected pods into proxy pods, and its certificates."""
