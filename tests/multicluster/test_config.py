"""Cluster configuration from kubeconfig data and Secrets: what works, and clear refusals."""

from __future__ import annotations

import base64
import json
import time

import pytest
import yaml

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


@pytest.mark.parametrize("text", [b"current-context: 2024-13-01", b"[" * 1500 + b"]" * 1500])
def test_yaml_that_the_parser_chokes_on_is_refused(text):
    with pytest.raises(ConfigError, match="not valid YAML"):
        ClusterConfig.from_secret(secret({"config": text}))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (b"a: [" + b"{b: c}," * 140_000 + b"]", "bytes: at most 262144 are read"),
        (b"a: [" + b"{b: c}," * 30_000 + b"]", "list or mapping items: at most 4096"),
        (b"a:\n" + b"- b\n" * 10_000, "list or mapping items"),
        (b"[" * 450 + b"a," * 100_000 + b"]" * 450, "list or mapping items"),
    ],
)
def test_a_kubeconfig_that_would_hold_the_event_loop_is_refused_at_once(text, says):
    """Whoever may write Secrets in a Target's namespace (Kubernetes' edit role) writes its
    kubeconfig, read on the agent's event loop at each change. Before, 1 MB of small flow
    mappings held the loop 13 s (another tenant's pod placed 21 s late)."""
    started = time.process_time()
    with pytest.raises(ConfigError, match=says):
        ClusterConfig.from_secret(secret({"config": text}))
    assert time.process_time() - started < 0.1


def test_a_kubeconfig_of_many_contexts_is_read_and_costs_little():
    """Twenty clusters, users and contexts with their tokens: 120 KB, 250 lines."""
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": f"c{i}", "cluster": {"server": f"http://10.0.0.{i}:6443"}} for i in range(20)
        ],
        "users": [
            {"name": f"u{i}", "user": {"token": base64.b64encode(b"t" * 4500).decode()}}
            for i in range(20)
        ],
        "contexts": [
            {"name": f"x{i}", "context": {"cluster": f"c{i}", "user": f"u{i}"}} for i in range(20)
        ],
        "current-context": "x0",
    }
    text = yaml.safe_dump(kubeconfig).encode()
    assert len(text) > 100_000
    started = time.process_time()
    config = ClusterConfig.from_secret(secret({"config": text}), context="x7")
    assert config.server == "http://10.0.0.7:6443"
    assert time.process_time() - started < 0.5


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
