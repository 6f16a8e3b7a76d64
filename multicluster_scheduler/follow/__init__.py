"""Config maps and secrets that follow delegates to their targets."""
