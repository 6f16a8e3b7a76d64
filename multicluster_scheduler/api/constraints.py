"""What a proxy pod asks of virtual nodes, as Admiralty's annotations say (pure, and free of the
runtime: the webhook's process imports it). ``proxy-pod-scheduling-constraints`` gives the proxy
pod a PodSpec fragment's nodeSelector, tolerations, affinity and topology spread, judged against
virtual nodes (their labels: a target's name, the labels its nodes share); with
``use-constraints-from-spec-for-proxy-pod-scheduling`` the pod's own are the proxy's, and its
delegate goes without them (the target's scheduler places it freely: Fargate, say).

The fragment is read in the webhook, on the path of every pod creation in enabled namespaces, and
its author is any tenant of them: YAML costs time in the size of the text and, in PyYAML's
scanner, in the square of its nesting (120 KB of ``[`` took the webhook three minutes, while every
other pod creation timed out). So it is read only up to :data:`MAX_FRAGMENT` bytes and
:data:`MAX_DEPTH` levels, the nesting counted token by token before anything is built, with
libyaml's loader when PyYAML has it."""

from __future__ import annotations

import yaml

from . import keys

# A fragment of four fields is a few hundred bytes; these bounds leave room to spare.
MAX_FRAGMENT = 16 * 1024  # bytes of the annotation's value
MAX_DEPTH = 32  # nested mappings and sequences (an affinity term is 6 deep)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPENING = (
    yaml.BlockMappingStartToken,
    yaml.BlockSequenceStartToken,
    yaml.FlowMappingStartToken,
    yaml.FlowSequenceStartToken,
)
_CLOSING = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)

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
    fragment = _read(text, where)
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


def _read(text: object, where: str) -> object:
    """The YAML (or JSON) ``text``, read within :data:`MAX_FRAGMENT` bytes and
    :data:`MAX_DEPTH` levels, without aliases; ValueError with the reason otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"{where} is not a string")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_FRAGMENT:
        raise ValueError(
            f"{where} is {size} bytes: a PodSpec fragment of nodeSelector, tolerations, affinity "
            f"and topologySpreadConstraints is read up to {MAX_FRAGMENT} bytes"
        )
    depth = 0
    try:
        for token in yaml.scan(text, Loader=_LOADER):
            if isinstance(token, yaml.AliasToken):
                raise ValueError(f"{where}: YAML aliases are not accepted")
            if isinstance(token, _OPENING):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ValueError(f"{where} is nested more than {MAX_DEPTH} levels deep")
            elif isinstance(token, _CLOSING):
                depth -= 1
        return yaml.load(text, Loader=_LOADER)  # a safe loader: plain data only
    except (yaml.YAMLError, RecursionError) as e:
        raise ValueError(f"{where} is not YAML or JSON: {e}") from None
