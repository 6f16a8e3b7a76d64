"""Connecting clusters from a workstation: ``multicluster-scheduler export`` and ``join``.

A source schedules to a target with an identity it holds in the target. ``export`` turns a
service account of the target into a kubeconfig Secret for the source (what ``kubemcsa export``
did); ``join`` does the whole exchange in one command: a Source in the target, the exported
Secret and a Target in the source. Pure pieces (kubeconfigs, manifests, names, messages) are
separate from the few API calls, so they are tested without clusters.
"""
