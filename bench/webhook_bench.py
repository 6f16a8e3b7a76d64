"""Benchmark 3 on the bench's test bed: the source agent's webhook under a steady load, over
TLS, from a separate process (see ``webhook``); then, as a cross-check, elected pods created
through the API server with ``dryRun=All`` and the API server's own histogram of the webhook's
latency."""

from __future__ import annotations

import asyncio
import base64
import time

from multicluster import Resource
from multicluster.resources import PODS

from . import webhook
from .bed import SOURCE, BenchBed, pod

WEBHOOKS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)
NAMESPACE = "bench-webhook"
CONFIGURATION = "multicluster-scheduler"  # the chart's MutatingWebhookConfiguration
WEBHOOK_NAME = "proxy-pods.multicluster.admiralty.io"


async def apiserver_metrics(bed: BenchBed) -> str:
    raw = await bed.clusters[SOURCE].client.request("GET", "/metrics", raw=True)
    return raw.decode()


async def through_apiserver(bed: BenchBed, rate: float, seconds: float) -> dict:
    """Dry-run creations of elected pods at ``rate`` per second: what the API server measured."""
    client = bed.clusters[SOURCE].client
    await bed.create_namespace(NAMESPACE, enabled=True, clusters=(SOURCE,))
    before = webhook.apiserver_webhook_histogram(await apiserver_metrics(bed), WEBHOOK_NAME)
    body = pod(elect=True)
    count = int(rate * seconds)
    started = time.monotonic()
    failures = 0

    async def one(i: int) -> None:
        nonlocal failures
        await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
        try:
            await client.create(PODS, body, NAMESPACE, params={"dryRun": "All"})
        except Exception:
            failures += 1

    await asyncio.gather(*(one(i) for i in range(count)))
    elapsed = time.monotonic() - started
    after = webhook.apiserver_webhook_histogram(await apiserver_metrics(bed), WEBHOOK_NAME)
    delta = {le: after.get(le, 0) - before.get(le, 0) for le in after}
    return {
        "requests": count,
        "failures": failures,
        "achieved_per_s": round(count / elapsed, 1),
        "within_5ms": round(webhook.fraction_within(delta, 0.005), 4),
        "within_25ms": round(webhook.fraction_within(delta, 0.025), 4),
        "buckets": {str(k): v for k, v in sorted(delta.items())},
    }


async def run(bed: BenchBed, rate: float, seconds: float) -> dict:
    client = bed.clusters[SOURCE].client
    config = await client.get(WEBHOOKS, CONFIGURATION)
    hook = config["webhooks"][0]["clientConfig"]
    ca_file = bed.dir / "webhook-ca.crt"
    ca_file.write_bytes(base64.b64decode(hook["caBundle"]))
    url = hook.get("url") or f"https://127.0.0.1:{bed.installation.webhook_ports[SOURCE]}/mutate"
    result = await asyncio.to_thread(
        webhook.run_in_subprocess, url, ca_file, rate=rate, seconds=seconds
    )
    print(f"  webhook: {result}", flush=True)
    # The API server's histogram: its request path costs more than the webhook does; the
    # buckets are coarse (5 ms, 25 ms, ...).
    cross = await through_apiserver(bed, min(rate, 200.0), min(seconds, 10.0))
    print(f"  webhook through the API server: {cross}", flush=True)
    await bed.delete_namespace(NAMESPACE)
    return {
        **result,
        "apiserver": cross,
        "apiserver_within_5ms": cross["within_5ms"],
    }
