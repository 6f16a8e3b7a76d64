"""The webhook benchmark: nearest-rank percentiles, realistic reviews and how answers are judged,
kube-apiserver's webhook histogram, and short runs against the real server over TLS (steady,
and in bursts over connections kept as kube-apiserver keeps them)."""

from __future__ import annotations

import asyncio
import math
import os
from pathlib import Path

import orjson
import pytest

from bench.webhook import (
    API_SERVER_IDLE,
    apiserver_webhook_histogram,
    bursts,
    fraction_within,
    latency_summary,
    measure,
    percentile,
    review_bodies,
    review_problem,
    summary_line,
)
from multicluster_scheduler.api import keys
from multicluster_scheduler.webhook.certificates import new_ca, new_serving_certificate
from multicluster_scheduler.webhook.server import WebhookServer, answer_review, review_response
from tests.webhook.sealing import KEY


@pytest.mark.parametrize(
    ("p", "expected"), [(0, 15), (5, 15), (30, 20), (40, 20), (50, 35), (100, 50)]
)
def test_percentile_is_the_nearest_rank(p, expected):
    assert percentile([50, 15, 40, 20, 35], p) == expected


def test_percentile_ranks_are_exact_for_decimal_percentiles():
    values = list(range(1, 1001))
    assert percentile(values, 99.9) == 999
    assert percentile(values, 99) == 990
    assert percentile(values, 90) == 900
    assert percentile([1.0, 2.0], 50) == 1.0


@pytest.mark.parametrize(("values", "p"), [([], 50), ([1.0], -1), ([1.0], 100.1)])
def test_percentile_refuses_what_has_no_answer(values, p):
    with pytest.raises(ValueError):  # noqa: PT011 - both reasons are ValueErrors
        percentile(values, p)


def test_latency_summary_is_in_milliseconds_and_ordered():
    summary = latency_summary([i / 10_000 for i in range(1, 10_001)])  # 0.1 ms .. 1 s
    assert summary == {"p50": 500.0, "p90": 900.0, "p99": 990.0, "p99.9": 999.0, "max": 1000.0}
    assert latency_summary([]) == dict.fromkeys(summary)


def test_reviews_are_pod_creations_with_fresh_uids():
    bodies = review_bodies(3, "bench")
    assert len({uid for uid, _ in bodies}) == 3
    for uid, body in bodies:
        request = orjson.loads(body)["request"]
        assert request["uid"] == uid
        assert request["operation"] == "CREATE"
        assert request["namespace"] == "bench"
        pod = request["object"]
        assert "name" not in pod["metadata"]  # generated after admission
        assert pod["metadata"]["generateName"].endswith("-")
        assert pod["metadata"]["annotations"] == {keys.ELECT: ""}
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"


def test_the_servers_answer_to_a_review_is_right():
    uid, body = review_bodies(1, "bench")[0]
    result, review = answer_review(body, KEY)
    assert result == "patched"
    assert review_problem(orjson.dumps(review), uid) is None


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (b"<html>", "not JSON"),
        (b"{}", "no response"),
        (orjson.dumps(review_response("other", patch=b"[{}]")), "another request uid"),
        (orjson.dumps(review_response("u1")), "no JSONPatch"),
        (
            orjson.dumps(review_response("u1", allowed=False, status={"message": "spec"})),
            "not allowed: spec",
        ),
        (orjson.dumps(review_response("u1", patch=b"[]")), "non-empty list"),
        (orjson.dumps(review_response("u1", patch=b"{")), "not base64 of JSON"),
    ],
)
def test_wrong_answers_are_errors_with_a_reason(answer, problem):
    assert problem in review_problem(answer, "u1")


METRICS = r"""# HELP apiserver_admission_webhook_admission_duration_seconds [STABLE] Admission webhook latency histogram in seconds, identified by name and broken out for each operation and API resource and type (validate or admit).
# TYPE apiserver_admission_webhook_admission_duration_seconds histogram
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="false",type="admit",le="0.005"} 1.19e+06
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="false",type="admit",le="0.025"} 1.2e+06
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="false",type="admit",le="0.1"} 1.2e+06
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="false",type="admit",le="0.5"} 1.2e+06
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="false",type="admit",le="1"} 1.2e+06
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="false",type="admit",le="2.5"} 1.2e+06
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="false",type="admit",le="10"} 1.2e+06
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="false",type="admit",le="25"} 1.2e+06
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="false",type="admit",le="+Inf"} 1.2e+06
apiserver_admission_webhook_admission_duration_seconds_sum{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="false",type="admit"} 2950.5
apiserver_admission_webhook_admission_duration_seconds_count{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="false",type="admit"} 1.2e+06
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="true",type="admit",le="0.005"} 0
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="true",type="admit",le="0.025"} 0
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="true",type="admit",le="0.1"} 0
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="true",type="admit",le="0.5"} 0
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="true",type="admit",le="1"} 0
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="true",type="admit",le="2.5"} 0
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="true",type="admit",le="10"} 2
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="true",type="admit",le="25"} 2
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejected="true",type="admit",le="+Inf"} 2
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="UPDATE",rejected="false",type="admit",le="0.005"} 7
apiserver_admission_webhook_admission_duration_seconds_bucket{name="proxy-pods.multicluster.admiralty.io",operation="UPDATE",rejected="false",type="admit",le="+Inf"} 7
apiserver_admission_webhook_admission_duration_seconds_bucket{name="other.example.com",operation="CREATE",rejected="false",type="admit",le="0.005"} 40
apiserver_admission_webhook_admission_duration_seconds_bucket{name="other.example.com",operation="CREATE",rejected="false",type="admit",le="+Inf"} 41
apiserver_admission_webhook_rejection_count{error_type="calling_webhook_error",name="proxy-pods.multicluster.admiralty.io",operation="CREATE",rejection_code="0",type="admit"} 2
"""  # noqa: E501 - kube-apiserver's lines as they are
WEBHOOK = "proxy-pods.multicluster.admiralty.io"


def test_the_apiservers_histogram_sums_the_webhooks_creations():
    assert apiserver_webhook_histogram(METRICS, WEBHOOK) == {
        0.005: 1_190_000,
        0.025: 1_200_000,
        0.1: 1_200_000,
        0.5: 1_200_000,
        1.0: 1_200_000,
        2.5: 1_200_000,
        10.0: 1_200_002,
        25.0: 1_200_002,
        math.inf: 1_200_002,
    }
    assert apiserver_webhook_histogram(METRICS, "other.example.com") == {0.005: 40, math.inf: 41}
    assert apiserver_webhook_histogram(METRICS, "multicluster-scheduler") == {}


def test_fraction_within_reads_the_cumulative_buckets():
    buckets = {0.005: 90, 0.025: 99, 0.1: 100, math.inf: 100}
    assert fraction_within(buckets, 0.005) == 0.9
    assert fraction_within(buckets, 0.01) == 0.9  # a lower bound between bounds
    assert fraction_within(buckets, 0.001) == 0.0
    assert fraction_within(buckets, 30) == 1.0
    with pytest.raises(ValueError, match="no calls"):
        fraction_within({0.005: 0, math.inf: 0}, 0.005)
    with pytest.raises(ValueError, match="no calls"):
        fraction_within({}, 0.005)


async def test_a_short_run_against_the_real_server_over_tls(tmp_path: Path):
    ca = new_ca("bench-ca")
    serving = new_serving_certificate(ca, ["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(serving.cert_pem)
    (tmp_path / "tls.key").write_bytes(serving.key_pem)
    server = WebhookServer("127.0.0.1", 0, tmp_path / "tls.crt", tmp_path / "tls.key", KEY)
    serving_task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.02)
        port = server.server.servers[0].sockets[0].getsockname()[1]
        result = await measure(
            f"https://127.0.0.1:{port}/mutate", ca.cert_pem, rate=100, seconds=2, warmup=0.5
        )
    finally:
        server.server.should_exit = True
        await serving_task
    assert result["sent"] == 200
    assert result["errors"] == 0, result["error_reasons"]
    assert 50 < result["achieved_rate"] < 200
    for latencies in (result["latency_ms"]["intended"], result["latency_ms"]["service"]):
        values = list(latencies.values())
        assert values[0] > 0
        assert values == sorted(values)
    assert result["latency_ms"]["service"]["max"] <= result["latency_ms"]["intended"]["max"]
    for delays in (result["lag_ms"], result["queued_ms"]):
        assert 0 <= delays["p50"] <= delays["max"]
    assert ", 0 errors;" in summary_line(result)


async def test_bursts_open_a_connection_per_admission_in_flight_and_keep_25(tmp_path: Path):
    ca = new_ca("bench-ca")
    new_serving_certificate(ca, ["127.0.0.1"]).write(tmp_path / "tls.crt", tmp_path / "tls.key")
    server = WebhookServer("127.0.0.1", 0, tmp_path / "tls.crt", tmp_path / "tls.key", KEY)
    serving_task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.02)
        port = server.server.servers[0].sockets[0].getsockname()[1]
        result = await bursts(
            f"https://127.0.0.1:{port}/mutate",
            ca.cert_pem,
            total=90,
            size=30,
            pause=0,
            settle=0,
            pid=os.getpid(),
        )
    finally:
        server.server.should_exit = True
        await serving_task
    assert result["admissions"] == 90
    assert result["errors"] == 0, result["error_reasons"]
    assert result["most_open"] == 30
    assert result["opened"] == 30 + 2 * (30 - API_SERVER_IDLE)
    assert 0 < result["rss_start_mb"] <= result["rss_highest_mb"]
