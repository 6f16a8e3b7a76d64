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


def with_user(user: dict, cluster: dict | None = None) -> dict:
    config = json.loads(json.dumps(KUBECONFIG))
    config["users"][0]["user"] = user
    if cluster is not None:
        config["clusters"][0]["cluster"] = cluster
    return secret({"config": json.dumps(config).encode()})


@pytest.mark.parametrize(
    ("user", "cluster", "field"),
    [
        (
            {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "touch"}},
            None,
            "exec",
        ),
        ({"auth-provider": {"name": "oidc"}}, None, "auth-provider"),
        ({"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}, None, "tokenFile"),
        (
            {"client-certificate": "/etc/a.crt", "client-key": "/etc/a.key"},
            None,
            "client-certificate",
        ),
        (
            {"token": "t"},
            {"server": "https://x", "certificate-authority": "/etc/ca"},
            "certificate-authority",
        ),
    ],
)
def test_a_kubeconfig_in_a_secret_runs_nothing_and_reads_no_file(tmp_path, user, cluster, field):
    if "exec" in user:
        user["exec"]["args"] = [str(tmp_path / "ran")]
    with pytest.raises(ConfigError, match=f"uses .*{field}.*may only hold inline values"):
        ClusterConfig.from_secret(with_user(user, cluster))
    assert not (tmp_path / "ran").exists()


def test_inline_credentials_in_a_secret_are_fine():
    config = ClusterConfig.from_secret(
        with_user(
            {"token": "t"}, {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}
        )
    )
    assert config.authorization() == "Bearer t"


@pytest.mark.parametrize(
    "text",
    [
        b"apiVersion: v1\nusers:\n- user:\n    token: pw-d41d8cd9\n  name: [unclosed",
        b"a: b: pw-d41d8cd9",
        b"\tpw-d41d8cd9",
    ],
)
def test_yaml_errors_never_quote_the_kubeconfig(text):
    with pytest.raises(ConfigError) as refused:
        ClusterConfig.from_secret(secret({"config": text}))
    assert "not valid YAML" in str(refused.value)
    assert "pw-d41d8cd9" not in str(refused.value)
    assert "line" in str(refused.value)


def test_a_kubeconfig_that_is_not_text_is_refused_without_quoting_it():
    with pytest.raises(ConfigError, match="not UTF-8") as refused:
        ClusterConfig.from_secret(secret({"config": b"token: \xff\xfepw-d41d8cd9"}))
    assert "pw-d41d8cd9" not in str(refused.value)


@pytest.mark.parametrize("text", [b"current-context: 2024-13-01", b"[" * 5000 + b"]" * 5000])
def test_yaml_that_the_parser_chokes_on_is_refused(text):
    with pytest.raises(ConfigError, match="not valid YAML"):
        ClusterConfig.from_secret(secret({"config": text}))


def with_server(server: object) -> dict:
    clusters = [{"name": "c", "cluster": {"server": server}}]
    return secret({"config": json.dumps({**KUBECONFIG, "clusters": clusters}).encode()})


@pytest.mark.parametrize(
    "server",
    [
        "https://api.example.com:6443",
        "https://api.example.com",
        "https://10.0.0.1:443/",
        "http://127.0.0.1:8080",
        "https://[2001:db8::1]:6443",
        "https://[::1]",
    ],
)
def test_a_server_that_is_a_host_and_port_is_fine(server):
    assert ClusterConfig.from_secret(with_server(server)).server == server.rstrip("/")


@pytest.mark.parametrize(
    ("server", "problem"),
    [
        ("http://127.0.0.1:9/admin/dump?x=", "has a path and a query"),
        ("https://rancher.example.com/k8s/clusters/c-1", "has a path"),
        ("https://api.example.com:6443?x=1", "has a query"),
        ("https://api.example.com:6443#frag", "has a fragment"),
        ("https://user:pass@api.example.com:6443", "has user info"),
        ("ftp://api.example.com", "is not an http:// or https:// URL"),
        ("api.example.com:6443", "is not an http:// or https:// URL"),
        ("https://api example.com", "has characters a host and port cannot have"),
        (6443, "is not a URL"),
    ],
)
def test_a_server_with_more_than_a_host_and_port_is_refused_without_quoting_it(server, problem):
    with pytest.raises(ConfigError) as refused:
        ClusterConfig.from_secret(with_server(server))
    message = str(refused.value)
    assert f"the server URL {problem}" in message
    for part in ("admin/dump", "x=", "pass@", "#frag", "rancher", "ftp:", "6443"):
        assert part not in message
