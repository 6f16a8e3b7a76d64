"""The writes benchmark's arithmetic: requests counted from the API server's own metric, and
CPU per pod less what components spend at rest."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.writes import over_idle, parse_requests, writes_per_pod


def sample(
    verb: str, resource: str, value: str, *, sub: str = "", dry: str = "", code="201"
) -> str:
    labels = (
        f'code="{code}",component="apiserver",dry_run="{dry}",group="",resource="{resource}",'
        f'scope="resource",subresource="{sub}",verb="{verb}",version="v1"'
    )
    return f"apiserver_request_total{{{labels}}} {value}"


METRICS = "\n".join(
    [
        "# HELP apiserver_request_total [STABLE] Counter of apiserver requests",
        "# TYPE apiserver_request_total counter",
        sample("POST", "pods", "10"),
        sample("POST", "pods", "4", sub="binding"),
        sample("POST", "pods", "2", sub="binding", code="409"),
        sample("POST", "pods", "500", dry="All"),
        sample("LIST", "pods", "3", code="200"),
        sample("POST", "events", "7"),
        sample("PUT", "leases", "1e+01", code="200"),
        'apiserver_request_duration_seconds_count{verb="POST"} 99',
    ]
)


def test_requests_are_summed_by_verb_and_resource_without_dry_runs() -> None:
    assert parse_requests(METRICS) == Counter(
        {
            ("POST", "pods"): 10,
            ("POST", "pods/binding"): 6,
            ("LIST", "pods"): 3,
            ("POST", "events"): 7,
            ("PUT", "leases"): 10,
        }
    )


def test_writes_per_pod_count_writes_only_with_events_and_the_rest_apart() -> None:
    before = parse_requests(METRICS)
    after = before.copy()
    after.update({("POST", "pods"): 4, ("POST", "pods/binding"): 2, ("LIST", "pods"): 40})
    after.update({("POST", "events"): 2, ("PUT", "leases"): 1})
    found = writes_per_pod(before, after, 2)
    assert found["pod_writes"] == 3.0
    assert found["pods"] == {"POST pods": 2.0, "POST pods/binding": 1.0}
    assert found["event_writes"] == 1.0
    assert found["other_writes"] == 0.5


def test_cpu_over_idle_takes_away_what_each_component_spends_at_rest() -> None:
    before = {"machine": 100.0, "kube-apiserver": 10.0, "agent": 1.0}
    after = {"machine": 110.0, "kube-apiserver": 14.0, "agent": 1.1}
    idle = {"machine": 0.5, "kube-apiserver": 0.1, "agent": 0.05}
    found = over_idle(before, after, 10.0, idle, 100)
    assert found["machine"] == pytest.approx(50.0)  # (10 - 0.5 * 10) s over 100 pods
    assert found["kube-apiserver"] == pytest.approx(30.0)
    assert found["agent"] == 0.0, "never below zero"


def test_the_report_judges_the_machine_cpu_over_a_pods_life() -> None:
    from bench.report import rows

    life = {"machine": 60.0, "kube-apiserver": 30.0, "agent": 6.0}
    writes = {
        "pods": 100,
        "source_pod_writes": {"native": 6.0, "elected": 5.0},
        "target_pod_writes": 6.0,
        "event_writes": {"native": 1.0, "source": 1.0, "target": 1.0},
        "machine_cpu_ms_per_pod": {"native": 30.0, "elected": 60.0, "ratio": 2.0},
        "elected": {"cpu_ms_per_pod_over_idle": {"life": life}},
    }
    found = {
        figure: (measured, verdict) for figure, measured, _, verdict in rows({"writes": writes})
    }
    assert found["machine CPU per elected pod / native, over its life"] == ("2.00", "met")
    writes["machine_cpu_ms_per_pod"]["ratio"] = 2.4
    found = {figure: verdict for figure, _, _, verdict in rows({"writes": writes})}
    assert found["machine CPU per elected pod / native, over its life"] == "**not met**"
