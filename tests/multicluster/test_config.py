"""Cluster configuration from kubeconfig data and Secrets: what works, and clear refusals."""

from __future__ import annotations

import base64
import json

import pytest

from multicluster import ClusterConfig, ConfigError

KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1/"}}],
    "users": [{"name": "u", "user": {"token": "s3cret"}}],
    "contexts": [
        {"name": "a", "context": {"cluster": "c", "user": "u"}},
        {"name": "b", "context": {"cluster": "c", "user": "u"}},
    ],
    "current-context": "a",
}


def secret(data: dict[str, bytes]) -> dict:
    return {
        "metadata": {"name": "kc", "namespace": "ns"},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def test_bearer_token_and_server_from_a_secret():
    config = ClusterConfig.from_secret(secret({"config": json.dumps(KUBECONFIG).encode()}))
    assert config.server == "http://127.0.0.1:1"
    assert config.authorization() == "Bearer s3cret"
    assert config.ssl_context is None


def test_secret_key_and_context_are_chosen():
    s = secret({"other": json.dumps(KUBECONFIG).encode()})
    assert ClusterConfig.from_secret(s, key="other", context="b").server == "http://127.0.0.1:1"


@pytest.mark.parametrize(
    ("data", "key", "context", "message"),
    [
        ({"config": b"x"}, "missing", None, "secret ns/kc has no key 'missing'"),
        ({"config": b"- a\n- b"}, "config", None, "is not a mapping"),
        ({"config": b"{"}, "config", None, "not valid YAML"),
        ({"config": json.dumps(KUBECONFIG).encode()}, "config", "nope", "nope"),
    ],
)
def test_bad_secrets_are_refused_with_the_reason(data, key, context, message):
    with pytest.raises(ConfigError, match=message):
        ClusterConfig.from_secret(secret(data), key=key, context=context)


def test_data_that_is_not_base64_is_refused():
    bad = {"metadata": {"name": "kc", "namespace": "ns"}, "data": {"config": "%%%"}}
    with pytest.raises(ConfigError, match="not base64"):
        ClusterConfig.from_secret(bad)
