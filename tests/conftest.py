"""Hypothesis without its per-example deadline: these run on shared machines where a busy
neighbour makes one example take 400 ms once and 1 ms the next (a flaky failure, not a slow
function); what must be fast is measured by the benchmarks instead."""

from hypothesis import settings

settings.register_profile("shared-machine", deadline=None)
settings.load_profile("shared-machine")
