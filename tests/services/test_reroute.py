"""Rerouting (docs/services.md, rerouting): a Service that selects proxy pods selects their
delegates instead, stays so when its manifest is applied again, and never flaps."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicluster.testing import merge_patch
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.copies import finalizer_patch
from multicluster_scheduler.api.proxy import prefixed_labels
from multicluster_scheduler.api.regexps import compile_regexp
from multicluster_scheduler.api.services import (
    reroute_patch,
    rerouted_selector,
    selects,
    user_selector,
)

PREFIX = keys.PREFIX
NAMES = st.text("abcxyz", min_size=1, max_size=4)
VALUES = st.text("ab01", max_size=3)
KEYS = st.builds(
    lambda p, n: p + n, st.sampled_from(["", "example.com/", "app.kubernetes.io/"]), NAMES
)


def service(selector: dict | None, **annotations: str) -> dict:
    return {
        "metadata": {
            "name": "nginx",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "7",
            "annotations": annotations,
        },
        "spec": {"selector": selector, "ports": [{"port": 80, "protocol": "TCP"}]},
    }


def applied(svc: dict, patch: dict | None) -> dict:
    assert patch is not None
    result = merge_patch(svc, patch)
    assert isinstance(result, dict)
    result["metadata"]["resourceVersion"] = str(int(svc["metadata"]["resourceVersion"]) + 1)
    return result


def test_the_guides_service_is_rerouted_to_delegates():
    nginx = service({"app": "nginx"})
    proxy = {"app": "nginx", "pod-template-hash": "5d8f", keys.HAS_FINALIZER: "true"}
    patch = reroute_patch(nginx, [proxy])
    assert patch == {
        "metadata": {
            "annotations": {
                "io.cilium/global-service": "true",
                "multicluster.admiralty.io/global": "true",
                "multicluster.admiralty.io/original-selector": '{"app":"nginx"}',
            },
            "resourceVersion": "7",
        },
        "spec": {"selector": {"app": None, "multicluster.admiralty.io/app": "nginx"}},
    }
    rerouted = applied(nginx, patch)
    assert rerouted["spec"]["selector"] == {"multicluster.admiralty.io/app": "nginx"}
    assert reroute_patch(rerouted, [proxy]) is None, "rerouted once, then left alone"


def test_services_that_select_no_proxy_pod_are_left_alone():
    assert reroute_patch(service({"app": "web"}), [{"app": "nginx"}]) is None
    assert reroute_patch(service({"app": "nginx"}), []) is None
    assert reroute_patch(service(None), [{"app": "nginx"}]) is None, "no selector"
    assert reroute_patch(service({}), [{"app": "nginx"}]) is None
    direct = service({PREFIX + "app": "nginx"})
    assert reroute_patch(direct, [{"app": "nginx"}]) is None, "selects delegates already"
    assert not selects({}, {"app": "nginx"})


def test_a_reapplied_manifest_is_rerouted_again_with_its_current_values():
    """``kubectl apply`` merges its selector into the rerouted one (client-side apply keeps
    keys it does not own): the user's keys win and the result is rerouted again."""
    rerouted = applied(
        service({"app": "nginx"}), reroute_patch(service({"app": "nginx"}), [{"app": "nginx"}])
    )
    merged = merge_patch(rerouted, {"spec": {"selector": {"app": "web"}}})
    patch = reroute_patch(merged, [{"app": "web"}])
    again = applied(merged, patch)
    assert again["spec"]["selector"] == {PREFIX + "app": "web"}
    assert json.loads(again["metadata"]["annotations"][keys.ORIGINAL_SELECTOR]) == {"app": "web"}


def test_a_user_who_disables_global_keeps_the_reroute():
    nginx = service({"app": "nginx"})
    rerouted = applied(nginx, reroute_patch(nginx, [{"app": "nginx"}]))
    rerouted["metadata"]["annotations"][keys.GLOBAL] = "false"
    assert reroute_patch(rerouted, [{"app": "nginx"}]) is None


@given(
    selector=st.dictionaries(KEYS, VALUES, min_size=1, max_size=4),
    extra=st.dictionaries(KEYS, VALUES, max_size=3),
    ours=st.dictionaries(NAMES.map(lambda n: PREFIX + n), VALUES, max_size=2),
)
def test_rerouting_converges_and_selects_what_delegates_carry(selector, extra, ours):
    proxy = {**extra, **selector}
    unique = len({k.rsplit("/", 1)[-1] for k in proxy}) == len(proxy)
    svc = service({**ours, **selector})
    patch = reroute_patch(svc, [proxy])
    assert patch is not None
    rerouted = applied(svc, patch)
    new = rerouted["spec"]["selector"]
    assert new == rerouted_selector({**ours, **selector})
    assert not user_selector(new), "no key of the user's left"
    assert all(k.startswith(PREFIX) for k in new)
    assert json.loads(rerouted["metadata"]["annotations"][keys.ORIGINAL_SELECTOR]) == selector
    assert reroute_patch(rerouted, [proxy]) is None, "stable: no flapping"
    assert not selects(new, proxy), "no longer selects the proxy pod"
    if unique and not ours:
        assert selects(new, prefixed_labels(proxy)), "selects the proxy's delegate"
    # kubectl apply of the same manifest merges the user's selector back: rerouted again, same.
    reapplied = merge_patch(rerouted, {"spec": {"selector": selector}})
    assert applied(reapplied, reroute_patch(reapplied, [proxy]))["spec"]["selector"] == new


def test_finalizer_and_its_label_come_and_go_together():
    svc = service({"app": "nginx"})
    svc["metadata"]["finalizers"] = ["someone.else/keep"]
    added = applied(svc, finalizer_patch(svc, present=True))
    assert added["metadata"]["finalizers"] == ["someone.else/keep", keys.FINALIZER]
    assert added["metadata"]["labels"] == {keys.HAS_FINALIZER: "true"}
    assert finalizer_patch(added, present=True) is None
    removed = applied(added, finalizer_patch(added, present=False))
    assert removed["metadata"]["finalizers"] == ["someone.else/keep"]
    assert removed["metadata"]["labels"] == {}
    assert finalizer_patch(removed, present=False) is None
    assert finalizer_patch(added, present=False)["metadata"]["resourceVersion"] == "8"


def test_keys_matching_the_no_prefix_regexp_stay_as_they_are():
    """As upstream's ``no-prefix-label-regexp`` on a Service: matching ``key=value`` entries
    of the selector are not prefixed, as the pods' own regexp keeps them on delegates."""
    queue = "kueue.x-k8s.io/queue-name"
    svc = service(
        {"app": "nginx", queue: "q1"}, **{keys.NO_PREFIX_LABEL_REGEXP: r"^kueue\.x-k8s\.io/"}
    )
    patch = reroute_patch(svc, [{"app": "nginx", queue: "q1"}])
    assert patch is not None
    assert patch["spec"]["selector"] == {"app": None, PREFIX + "app": "nginx"}
    assert json.loads(patch["metadata"]["annotations"][keys.ORIGINAL_SELECTOR]) == {
        "app": "nginx",
        queue: "q1",
    }
    rerouted = applied(svc, patch)
    assert rerouted["spec"]["selector"] == {PREFIX + "app": "nginx", queue: "q1"}
    assert reroute_patch(rerouted, [{"app": "nginx", queue: "q1"}]) is None, "converged"


def test_a_selector_kept_whole_by_the_no_prefix_regexp_is_not_rerouted():
    svc = service({"app": "nginx"}, **{keys.NO_PREFIX_LABEL_REGEXP: "^app="})
    assert reroute_patch(svc, [{"app": "nginx"}]) is None


def test_an_invalid_no_prefix_regexp_is_refused_with_the_reason():
    svc = service({"app": "nginx"}, **{keys.NO_PREFIX_LABEL_REGEXP: "(unclosed"})
    with pytest.raises(ValueError, match="not a regular expression"):
        reroute_patch(svc, [{"app": "nginx"}])


@given(st.dictionaries(KEYS, VALUES, min_size=1, max_size=4), st.sampled_from(["^app", "a", "x"]))
def test_delegates_labelled_with_the_same_regexp_are_selected(labels, pattern):
    """A Service and its pods that carry the same regexp: the rerouted selector selects the
    delegates' labels."""
    svc = service(dict(labels), **{keys.NO_PREFIX_LABEL_REGEXP: pattern})
    patch = reroute_patch(svc, [labels])
    delegate = prefixed_labels(labels, compile_regexp(pattern))
    selector = applied(svc, patch)["spec"]["selector"] if patch else labels
    if len({k.rsplit("/", 1)[-1] for k in labels}) == len(labels):
        assert selects(selector, delegate)
