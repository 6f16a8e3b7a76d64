"""The MAC of saved manifests: made by the key for a namespace, a user and a time, it verifies
for exactly those and that manifest, and says nothing of the key."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicluster_scheduler.api import keys
from multicluster_scheduler.api.manifest_mac import (
    KEY_BYTES,
    VERSION,
    ManifestKey,
    seal,
    user_hash,
    verify,
)
from multicluster_scheduler.api.proxy import untrusted_manifest
from tests.webhook.sealing import KEY

names = st.text(min_size=1, max_size=20)
manifests = st.text(max_size=200)
issued_times = st.integers(0, 10**12 - 2)


@given(names, names, manifests, issued_times)
def test_a_seal_verifies_for_what_it_was_made_for(namespace, username, manifest, issued):
    found = verify(KEY, namespace, manifest, seal(KEY, namespace, username, manifest, issued))
    assert (found.issued, found.user) == (issued, user_hash(username))


@given(names, names, manifests, issued_times, st.data())
def test_a_seal_verifies_for_nothing_else(namespace, username, manifest, issued, data):
    value = seal(KEY, namespace, username, manifest, issued)
    other_manifest = data.draw(manifests.filter(lambda m: m != manifest))
    other_namespace = data.draw(names.filter(lambda n: n != namespace))
    for args in ((namespace, other_manifest), (other_namespace, manifest)):
        with pytest.raises(ValueError, match="does not verify"):
            verify(KEY, *args, value)
    with pytest.raises(ValueError, match="does not verify"):
        verify(ManifestKey.new(), namespace, manifest, value)
    version, when, user, mac = value.split(".")
    other_user = user_hash(username + "x")
    for changed in (
        f"{version}.{issued + 1}.{user}.{mac}",
        f"{version}.{when}.{other_user}.{mac}",
    ):
        with pytest.raises(ValueError, match="does not verify"):
            verify(KEY, namespace, manifest, changed)


def test_fields_cannot_run_into_each_other():
    """Each field is preceded by its length: moving bytes from the namespace to the manifest
    makes another MAC."""
    assert seal(KEY, "ab", "u", "c", 1).split(".")[3] != seal(KEY, "a", "u", "bc", 1).split(".")[3]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (None, "not a MAC written by multicluster-scheduler"),
        ("", "not a MAC written by multicluster-scheduler"),
        ("v2.1.0123456789abcdef0123456789abcdef.AAAA", "its version 'v2' is not 'v1'"),
        ("v1.x.0123456789abcdef0123456789abcdef.AAAA", "not a MAC written by"),
        ("v1.1.0123.AAAA", "not a MAC written by"),
        ("v1.1.0123456789abcdef0123456789abcdef.***", "does not verify"),
        ("v1.1.0123456789abcdef0123456789abcdef.AAAA", "does not verify"),
        ("v1.1.2.3.4", "not a MAC written by"),
    ],
)
def test_a_value_that_is_no_mac_says_so(value, says):
    with pytest.raises(ValueError, match=says):
        verify(KEY, "ns", "{}", value)


def test_the_key_is_never_shown():
    key = ManifestKey.new(created=1.0)
    assert len(key.secret) == KEY_BYTES
    assert key.secret.hex() not in repr(key)
    assert repr(key.secret) not in repr(key)
    assert ManifestKey.new().secret != key.secret


def test_the_annotation_reads_version_time_user_and_mac():
    value = seal(KEY, "ns", "alice", "{}", 1_800_000_000)
    version, issued, user, mac = value.split(".")
    assert (version, issued, user) == (VERSION, "1800000000", user_hash("alice"))
    assert "alice" not in value
    assert len(mac) == 43  # 32 bytes, base64url without padding


# -- a proxy pod's manifest, as the scheduler checks it ------------------------------------------


def proxy(
    name: str = "web",
    namespace: str = "team-a",
    manifest_meta: dict | None = None,
    mac: str | None = "seal",
    created: str = "2026-11-27T10:00:00Z",
) -> dict:
    import orjson

    meta = {"name": name, "namespace": namespace}
    manifest = orjson.dumps({"metadata": manifest_meta or meta, "spec": {}}).decode()
    annotations = {keys.SOURCEPOD_MANIFEST: manifest}
    if mac == "seal":
        mac = seal(KEY, namespace, "alice", manifest, int(time.time()))
    if mac is not None:
        annotations[keys.SOURCEPOD_MANIFEST_MAC] = mac
    return {"metadata": {**meta, "creationTimestamp": created, "annotations": annotations}}


def test_a_sealed_manifest_of_the_pod_is_trusted():
    assert untrusted_manifest(proxy(), KEY) is None
    generated = {"generateName": "web-7d9f-", "namespace": "team-a"}
    assert untrusted_manifest(proxy("web-7d9f-x2k4p", manifest_meta=generated), KEY) is None


@pytest.mark.parametrize(
    ("pod", "says"),
    [
        (proxy(manifest_meta={"name": "admin-debug"}), "it was saved for pod 'admin-debug'"),
        (proxy(manifest_meta={"generateName": "db-"}), "it was saved for a pod named 'db-'…"),
        (proxy(manifest_meta={"namespace": "team-a"}), "it was saved for another pod"),
        (proxy(mac="v1.1.0123456789abcdef0123456789abcdef.AAAA"), "does not verify"),
        (proxy(mac=None), "it has no multicluster.admiralty.io/sourcepod-manifest-mac"),
    ],
)
def test_any_other_manifest_is_not(pod, says):
    assert says in (untrusted_manifest(pod, KEY) or "")


def test_a_manifest_without_a_mac_is_trusted_on_a_pod_made_before_the_key():
    key = ManifestKey(KEY.secret, created=1_795_000_000.5)  # 2026-11-18T11:06:40.5Z
    before, after = "2026-11-18T11:06:40Z", "2026-11-18T11:06:41Z"
    assert untrusted_manifest(proxy(mac=None, created=before), key) is None
    assert untrusted_manifest(proxy(mac=None, created=after), key)
    unknown = ManifestKey(KEY.secret, created=None)
    assert untrusted_manifest(proxy(mac=None, created=before), unknown)
    assert untrusted_manifest(proxy(mac=None, created="not a time"), key)
    # A MAC that is there is checked, however old the pod.
    forged = proxy(mac="v1.1.0123456789abcdef0123456789abcdef.AAAA", created=before)
    assert untrusted_manifest(forged, key)
