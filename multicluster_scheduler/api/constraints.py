"""What a proxy pod asks of virtual nodes, as Admiralty's annotations say (pure, and free of the
runtime: the webhook's process imports it). ``proxy-pod-scheduling-constraints`` gives the proxy
pod a PodSpec fragment's nodeSelector, tolerations, affinity and topology spread, judged against
virtual nodes (their labels: a target's name, the labels its nodes share); with
``use-constraints-from-spec-for-proxy-pod-scheduling`` the pod's own are the proxy's, and its
delegate goes without them (the target's scheduler places it freely: Fargate, say)."""

from __future__ import annotations

import yaml

from . import keys

CONSTRAINT_FIELDS = ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints")
_CONSTRAINT_TYPES = {
    "nodeSelector": dict,
    "tolerations": list,
    "affinity": dict,
    "topologySpreadConstraints": list,
}


def uses_constraints_from_spec(manifest: dict) -> bool:
    annotations = (manifest.get("metadata") or {}).get("annotations") or {}
    return isinstance(annotations, dict) and keys.USE_CONSTRAINTS_FROM_SPEC in annotations


def delegate_constraints(manifest: dict) -> dict:
    """``manifest`` as its delegate asks: without its nodeSelector, tolerations, affinity and
    topology spread when ``use-constraints-from-spec-…`` made them the proxy pod's (as
    upstream: they are judged against virtual nodes, a target's own scheduler places freely)."""
    if not uses_constraints_from_spec(manifest):
        return manifest
    spec = {k: v for k, v in manifest["spec"].items() if k not in CONSTRAINT_FIELDS}
    return {**manifest, "spec": spec}


def proxy_scheduling_constraints(annotations: dict, spec: dict) -> dict:
    """What the proxy pod asks of virtual nodes besides theirs (some of ``CONSTRAINT_FIELDS``):
    the ``proxy-pod-scheduling-constraints`` annotation's PodSpec fragment (YAML or JSON), else,
    with ``use-constraints-from-spec-…``, the pod's own ``spec``'s, else nothing. ValueError
    with the reason when the annotation is not such a fragment (the pod is refused, as
    upstream refuses it)."""
    text = annotations.get(keys.PROXY_POD_SCHEDULING_CONSTRAINTS)
    if text is None:
        if keys.USE_CONSTRAINTS_FROM_SPEC in annotations:
            return {k: spec[k] for k in CONSTRAINT_FIELDS if spec.get(k)}
        return {}
    where = f"annotation {keys.PROXY_POD_SCHEDULING_CONSTRAINTS}"
    try:
        if any(isinstance(t, yaml.AliasToken) for t in yaml.scan(text, Loader=yaml.SafeLoader)):
            raise ValueError(f"{where}: YAML aliases are not accepted")
        fragment = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{where} is not YAML or JSON: {e}") from None
    if fragment is None:
        return {}
    if not isinstance(fragment, dict):
        raise ValueError(f"{where} is not a PodSpec fragment (an object)")
    unknown = sorted(str(k) for k in fragment if k not in CONSTRAINT_FIELDS)
    if unknown:
        raise ValueError(
            f"{where}: only {', '.join(CONSTRAINT_FIELDS)} apply to a proxy pod, not "
            f"{', '.join(unknown)}"
        )
    for name, value in fragment.items():
        if value is not None and not isinstance(value, _CONSTRAINT_TYPES[name]):
            kind = "an object" if _CONSTRAINT_TYPES[name] is dict else "a list"
            raise ValueError(f"{where}: {name} is not {kind}")
    selector = fragment.get("nodeSelector") or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
        raise ValueError(f"{where}: nodeSelector is not a map of strings")
    return {k: v for k, v in fragment.items() if v}
