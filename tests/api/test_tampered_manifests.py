"""A proxy pod's saved manifest is user input: a user may set the ``sourcepod-manifest``
annotation when creating the pod (the webhook keeps an existing one), so the delegate may be built
from anything. Whatever it holds, building the delegate never raises: a manifest the delegate
cannot be made of is refused by ``source_manifest`` with the reason (the scheduler reports it
as the pod's condition), and anything else malformed is left for the target's API server to
refuse with its own message."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multicluster_scheduler.api import keys
from multicluster_scheduler.api.proxy import (
    SERVICE_ACCOUNT_MOUNT,
    InvalidManifest,
    delegate_pod,
    source_manifest,
)

CONTAINER = {"name": "main", "image": "busybox"}


def proxy_with(manifest: object) -> dict:
    text = manifest if isinstance(manifest, str) else orjson.dumps(manifest).decode()
    return {
        "metadata": {
            "name": "web",
            "namespace": "default",
            "uid": "uid-1",
            "annotations": {keys.SOURCEPOD_MANIFEST: text},
        },
        "spec": {"schedulerName": "admiralty-proxy"},
    }


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({"labels": ["app"]}, "labels"),
        ({"labels": {"app": 1}}, "labels"),
        ({"labels": "app=web"}, "labels"),
        ({"annotations": ["note"]}, "annotations"),
        ({"annotations": {"note": {"nested": "x"}}}, "annotations"),
        ({"annotations": {"note": None}}, "annotations"),
    ],
)
def test_labels_or_annotations_that_are_not_maps_of_strings_are_refused(metadata, field):
    proxy = proxy_with({"metadata": metadata, "spec": {"containers": [CONTAINER]}})
    with pytest.raises(InvalidManifest, match=f"whose {field} are not a map of strings"):
        source_manifest(proxy)


@pytest.mark.parametrize("metadata", [{"labels": None}, {"annotations": {}}, {}])
def test_missing_or_empty_labels_and_annotations_are_fine(metadata):
    proxy = proxy_with({"metadata": metadata, "spec": {"containers": [CONTAINER]}})
    delegate = delegate_pod(proxy, source_manifest(proxy), "c1")
    assert delegate["metadata"]["labels"] == {keys.PARENT_UID: "uid-1"}


@pytest.mark.parametrize(
    "container",
    [
        {**CONTAINER, "volumeMounts": ["token"]},
        {**CONTAINER, "volumeMounts": "token"},
        {**CONTAINER, "volumeMounts": {"name": "token"}},
        {**CONTAINER, "volumeMounts": [{"name": "token", "mountPath": 7}]},
        {**CONTAINER, "volumeMounts": [None, {"name": "token"}]},
        "main",
        None,
    ],
    ids=["mount-string", "mounts-string", "mounts-object", "path-number", "mount-null", "c", "n"],
)
def test_malformed_mounts_are_left_for_the_target_to_refuse(container):
    manifest = {"spec": {"containers": [container], "volumes": "none"}}
    delegate = delegate_pod(proxy_with(manifest), manifest, "c1")
    assert delegate["spec"] == manifest["spec"]


def test_the_token_is_still_removed_next_to_malformed_entries():
    token = {"name": "token", "mountPath": SERVICE_ACCOUNT_MOUNT}
    manifest = {
        "spec": {
            "containers": [{**CONTAINER, "volumeMounts": [token, "junk"]}, "junk"],
            "initContainers": {"not": "a list"},
            "volumes": [{"name": "token", "projected": {}}, "junk", {"name": "data"}],
        }
    }
    spec = delegate_pod(proxy_with(manifest), manifest, "c1")["spec"]
    assert spec["containers"] == [{**CONTAINER, "volumeMounts": ["junk"]}, "junk"]
    assert spec["volumes"] == ["junk", {"name": "data"}]
    assert spec["initContainers"] == {"not": "a list"}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
mounts = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "name": st.sampled_from(["token", "data"]) | json_values,
            "mountPath": st.sampled_from([SERVICE_ACCOUNT_MOUNT, SERVICE_ACCOUNT_MOUNT + "/"])
            | json_values,
        },
    )
    | json_values,
    max_size=3,
)
containers = st.lists(
    st.fixed_dictionaries(
        {"name": st.just("main")}, optional={"volumeMounts": mounts | json_values}
    )
    | json_values,
    min_size=1,
    max_size=3,
)
manifests = st.fixed_dictionaries(
    {
        "spec": st.fixed_dictionaries(
            {"containers": containers},
            optional={
                "initContainers": containers | json_values,
                "ephemeralContainers": containers | json_values,
                "volumes": st.lists(
                    st.fixed_dictionaries({"name": st.sampled_from(["token", "data"])})
                    | json_values,
                    max_size=3,
                )
                | json_values,
                "nodeName": json_values,
                "priority": json_values,
            },
        )
    },
    optional={"metadata": json_values},
)


@settings(max_examples=300)
@given(manifests)
def test_a_delegate_is_built_or_the_manifest_refused_whatever_it_holds(manifest):
    proxy = proxy_with(manifest)
    try:
        accepted = source_manifest(proxy)
    except InvalidManifest:
        return
    delegate = delegate_pod(proxy, accepted, "c1")
    assert delegate["metadata"]["labels"][keys.PARENT_UID] == "uid-1"
    assert "nodeName" not in delegate["spec"]
    assert "priority" not in delegate["spec"]
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for container in _list(delegate["spec"].get(field)):
            mounts = container.get("volumeMounts") if isinstance(container, dict) else None
            for mount in _list(mounts):
                path = mount.get("mountPath") if isinstance(mount, dict) else None
                assert not isinstance(path, str) or path.rstrip("/") != SERVICE_ACCOUNT_MOUNT


def _list(value: object) -> list:
    return value if isinstance(value, list) else []
