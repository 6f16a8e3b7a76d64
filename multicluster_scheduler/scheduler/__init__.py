"""The proxy scheduler: places each elected pod's delegate in the best target that can run it."""
