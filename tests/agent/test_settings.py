"""Agent settings from flags and environment, and refusals that say what is wrong."""

from __future__ import annotations

import argparse

import pytest

from multicluster_scheduler import agent
from multicluster_scheduler.api.ingresses import ClassPolicy, IngressPolicy
from multicluster_scheduler.cli import main


@pytest.mark.parametrize(
    ("text", "seconds"), [("15s", 15), ("1m30s", 90), ("2h", 7200), ("0.5", 0.5), ("100ms", None)]
)
def test_durations(text, seconds):
    if seconds is None:
        with pytest.raises(ValueError, match="not a duration"):
            agent.parse_duration(text)
    else:
        assert agent.parse_duration(text) == seconds


def parse(argv: list[str]) -> agent.AgentSettings:
    parser = argparse.ArgumentParser()
    agent.add_arguments(parser)
    return agent.settings_from(parser.parse_args(argv))


def test_flags_and_environment(monkeypatch):
    monkeypatch.setenv("MCS_NAMESPACE", "admiralty")
    monkeypatch.setenv("MCS_WEBHOOK_PORT", "10443")
    monkeypatch.setenv("MCS_SOURCE_CONTROLLER", "false")
    settings = parse(["--leader-election-lease-duration", "30s", "--webhook-cert-host", "1.2.3.4"])
    assert settings.namespace == "admiralty"
    assert settings.webhook_port == 10443
    assert settings.source_controller is False
    assert settings.leader_election_lease_duration == 30
    assert settings.webhook_cert_hosts == ["1.2.3.4"]
    assert settings.ca_secret == "multicluster-scheduler-webhook-ca"
    assert settings.self_managed_certificates


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["agent"], "--namespace: Field required"),
        (["agent", "--namespace", "a", "--webhook-port", "70000"], "--webhook-port"),
        (["agent", "--namespace", "a", "--log-level", "loud"], "log level must be"),
        (["agent", "--namespace", "a", "--leader-election-retry-period", "soon"], "not a duration"),
    ],
)
def test_bad_settings_are_refused_with_the_reason(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("MCS_NAMESPACE", raising=False)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_charts_summary_exclusion_flag_is_understood(monkeypatch):
    """The chart passes ``--summary-exclude-labels`` when ``summary.excludeLabels`` is set."""
    monkeypatch.setenv("MCS_NAMESPACE", "admiralty")
    settings = parse(["--summary-exclude-labels", "^example\\.com/build-id$"])
    assert settings.summary_exclude_labels == "^example\\.com/build-id$"
    monkeypatch.setenv("MCS_SUMMARY_EXCLUDE_LABELS", "^a$")
    assert parse([]).summary_exclude_labels == "^a$"
    with pytest.raises(ValueError, match="not a regular expression"):
        parse(["--summary-exclude-labels", "("])


def test_every_setting_is_a_flag_and_a_variable_with_its_help_and_default(monkeypatch):
    parser = argparse.ArgumentParser()
    agent.add_arguments(parser)
    actions = {a.dest: a for a in parser._actions}
    for name, field in agent.AgentSettings.model_fields.items():
        action = actions[name]
        assert field.description, f"{name} says what it is"
        assert f"$MCS_{name.upper()}" in action.help
        if not field.is_required() and field.default_factory is None and field.default:
            assert "(default: " in action.help, name
    assert "default: 15s;" in actions["leader_election_lease_duration"].help
    assert "default: true;" in actions["kubelet_websockets"].help
    # The flag wins over the variable.
    monkeypatch.setenv("MCS_NAMESPACE", "from-env")
    monkeypatch.setenv("MCS_CLIENT_QPS", "5")
    settings = parse(["--namespace", "from-flag"])
    assert (settings.namespace, settings.client_qps) == ("from-flag", 5.0)


def test_the_charts_ingress_flags_make_the_policy(monkeypatch):
    """The chart passes each allowed annotation and host as a flag of its own; in the
    environment they are comma-separated."""
    monkeypatch.setenv("MCS_NAMESPACE", "admiralty")
    policy = parse([]).ingress_policy()
    assert policy == IngressPolicy(), "nothing allowed, any class refused"
    settings = parse(
        [
            "--ingress-allowed-annotation=nginx.ingress.kubernetes.io/rewrite-target",
            "--ingress-allowed-annotation=nginx.ingress.kubernetes.io/proxy-*,example.com/a",
            "--ingress-allowed-host=*.apps.example.com",
            "--ingress-class-policy=rewrite",
            "--ingress-class=public",
            "--ingress-refused-annotations=",
        ]
    )
    assert settings.ingress_policy() == IngressPolicy(
        allowed_annotations=(
            "nginx.ingress.kubernetes.io/rewrite-target",
            "nginx.ingress.kubernetes.io/proxy-*",
            "example.com/a",
        ),
        refused_annotations=None,
        class_policy=ClassPolicy.REWRITE,
        ingress_class="public",
        allowed_hosts=("*.apps.example.com",),
    )
    monkeypatch.setenv("MCS_INGRESS_ALLOWED_HOSTS", "a.example.com,*.b.example.com")
    assert parse([]).ingress_allowed_hosts == ["a.example.com", "*.b.example.com"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--ingress-class-policy=rewrite"],
            "--ingress-class-policy=rewrite needs --ingress-class",
        ),
        (["--ingress-class-policy=drop"], "--ingress-class-policy"),
        (["--ingress-allowed-annotation=(?i)snippet"], "not an annotation key"),
        (["--ingress-allowed-host=*example.com"], "not a lowercase host name"),
        (["--ingress-class=Public"], "not the name of an IngressClass"),
    ],
)
def test_bad_ingress_settings_are_refused_with_the_reason(flags, message, capsys, monkeypatch):
    monkeypatch.delenv("MCS_NAMESPACE", raising=False)
    assert main(["agent", "--namespace", "a", *flags]) == 2
    assert message in capsys.readouterr().err
