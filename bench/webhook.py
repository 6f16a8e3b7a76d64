"""Benchmark: the admission webhook's latency at a steady rate of pod creations, over TLS.

    python -m bench.webhook --url https://127.0.0.1:PORT/mutate --ca-file ca.crt \\
        [--rate 500] [--seconds 20] [--warmup 2] [--connections 16] [--json]

The webhook is on the path of every pod creation in enabled namespaces, so its latency is the
API server's: the goal is p99 ≤ 5 ms at 500 admissions per second. This sends what the API
server sends, an ``admission.k8s.io/v1`` AdmissionReview of an elected pod as a ReplicaSet
creates it (built-in admission already applied), each with a fresh ``request.uid``, over at most
``--connections`` keep-alive TLS connections verified against the agent's CA; every answer must
be an allowed review with a JSONPatch, or it counts as an error.

The load is open-loop: request i is due at ``t0 + i/rate`` whatever happened to the earlier
ones, as pod creations arrive whether or not the webhook kept up. A closed loop (send the next
request when one comes back) slows down with the server, sends nothing while the server stalls,
and so leaves the slow moments out of its statistics (coordinated omission). Each request is
timed from its due time ("intended": what a pod creation waits) and from the moment it went out
on a connection ("service": what one call costs); the difference is reported in two parts, the
"lag" (how late the generator was ready to send: its own CPU, and the event loop's timers, which
wake up to a millisecond late) and the time "queued" for one of the connections (which grows
when the server falls behind). A large lag means the figures say more about the generator than
about the webhook. The warm-up (TLS handshakes, first calls) is left out of the statistics, and
the bodies are made before the clock starts.

``--bursts SIZE`` sends ``--total`` admissions instead in bursts of SIZE at once, over
connections kept as kube-apiserver keeps them (a new one per admission in flight, 25 kept idle),
and reports how many were opened and, with ``--pid``, the webhook process's RSS: what bulk pod
creations cost its memory.

Run the generator in a process of its own (``run_in_subprocess``) so that its CPU use does not
share an event loop with the caller. ``apiserver_webhook_histogram`` reads the same latency as
kube-apiserver measures it, from its ``/metrics``, to cross-check.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import datetime as dt
import json
import math
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import aiohttp
import orjson

from multicluster_scheduler.api import keys

ROOT = Path(__file__).resolve().parents[1]
PERCENTILES: dict[str, float] = {"p50": 50, "p90": 90, "p99": 99, "p99.9": 99.9, "max": 100}
REQUEST_TIMEOUT = 10.0  # the chart's webhook timeoutSeconds: the API server gives up then
REPLICASET = "nginx-6d4cf56db6"
REPLICASET_UID = "3f6c2a8e-5b1d-4c7a-9e2f-8d0b1a4c6e71"
WEBHOOK_DURATION_BUCKET = "apiserver_admission_webhook_admission_duration_seconds_bucket"
_SAMPLE = re.compile(r'[^{]+\{(?P<labels>(?:[^"}]|"(?:[^"\\]|\\.)*")*)\}\s+(?P<value>\S+)')
_LABEL = re.compile(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"')


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest rank: the smallest of ``values`` that at least ``p`` percent of them do not exceed.

    Always one of the values, never an interpolation. Raises ValueError when ``values`` is empty
    or ``p`` is outside [0, 100].
    """
    if not values:
        raise ValueError("no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is outside [0, 100]")
    ordered = sorted(values)
    rank = math.ceil(Fraction(str(p)) * len(ordered) / 100)  # exact: 99.9% of 1000 is 999
    return ordered[max(rank, 1) - 1]


def latency_summary(seconds: Sequence[float]) -> dict[str, float | None]:
    """p50, p90, p99, p99.9 and max of durations in seconds, in milliseconds; None when empty."""
    ordered = sorted(seconds)
    return {
        name: round(percentile(ordered, p) * 1000, 3) if ordered else None
        for name, p in PERCENTILES.items()
    }


def replicaset_pod(namespace: str) -> dict:
    """An nginx pod as the ReplicaSet controller creates it, as mutating webhooks receive it.

    Built-in admission has run (service account token volume, default tolerations, priority);
    the name and uid are not set yet (the API server generates them after admission).
    """
    volume = "kube-api-access-7xk2p"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{REPLICASET}-",
            "namespace": namespace,
            "creationTimestamp": None,
            "labels": {"app": "nginx", "pod-template-hash": REPLICASET.rsplit("-", 1)[1]},
            "annotations": {keys.ELECT: ""},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": REPLICASET,
                    "uid": REPLICASET_UID,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [_controller_managed_fields()],
        },
        "spec": {
            "volumes": [
                {
                    "name": volume,
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                        }
                                    ]
                                }
                            },
                        ],
                        "defaultMode": 420,
                    },
                }
            ],
            "containers": [
                {
                    "name": "nginx",
                    "image": "nginx:1.27",
                    "ports": [{"containerPort": 80, "protocol": "TCP"}],
                    "resources": {
                        "limits": {"memory": "128Mi"},
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                    },
                    "volumeMounts": [
                        {
                            "name": volume,
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": f"node.kubernetes.io/{taint}",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
                for taint in ("not-ready", "unreachable")
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {},
    }


def _controller_managed_fields() -> dict:
    fields = {".": {}, "f:containerPort": {}, "f:protocol": {}}
    container = {
        ".": {},
        "f:image": {},
        "f:imagePullPolicy": {},
        "f:name": {},
        "f:ports": {".": {}, 'k:{"containerPort":80,"protocol":"TCP"}': fields},
        "f:resources": {
            ".": {},
            "f:limits": {".": {}, "f:memory": {}},
            "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}},
        },
        "f:terminationMessagePath": {},
        "f:terminationMessagePolicy": {},
    }
    return {
        "manager": "kube-controller-manager",
        "operation": "Update",
        "apiVersion": "v1",
        "time": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:metadata": {
                "f:annotations": {".": {}, f"f:{keys.ELECT}": {}},
                "f:generateName": {},
                "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
                "f:ownerReferences": {".": {}, f'k:{{"uid":"{REPLICASET_UID}"}}': {}},
            },
            "f:spec": {
                "f:containers": {'k:{"name":"nginx"}': container},
                "f:dnsPolicy": {},
                "f:enableServiceLinks": {},
                "f:restartPolicy": {},
                "f:schedulerName": {},
                "f:securityContext": {},
                "f:terminationGracePeriodSeconds": {},
            },
        },
    }


def admission_review(pod: dict, uid: str, namespace: str) -> dict:
    """The AdmissionReview the API server sends a mutating webhook for a pod CREATE."""
    pods = {"group": "", "version": "v1", "resource": "pods"}
    kind = {"group": "", "version": "v1", "kind": "Pod"}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": kind,
            "resource": pods,
            "requestKind": kind,
            "requestResource": pods,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "b1e0f6a4-2c3d-4e5f-8a9b-0c1d2e3f4a5b",
                "groups": [
                    "system:serviceaccounts",
                    "system:serviceaccounts:kube-system",
                    "system:authenticated",
                ],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def review_bodies(count: int, namespace: str) -> list[tuple[str, bytes]]:
    """``count`` serialized reviews of the same pod, each with a fresh uid: (uid, body)."""
    pod = replicaset_pod(namespace)
    bodies = []
    for _ in range(count):
        uid = str(uuid.uuid4())
        bodies.append((uid, orjson.dumps(admission_review(pod, uid, namespace))))
    return bodies


def review_problem(body: bytes, uid: str) -> str | None:
    """Why ``body`` is not the answer for an elected pod; None when it is.

    The answer is an AdmissionReview for request ``uid``, allowed, with a non-empty JSONPatch.
    """
    try:
        response = orjson.loads(body)["response"]
    except orjson.JSONDecodeError:
        return "the answer is not JSON"
    except (KeyError, TypeError):
        return "the answer has no response"
    if not isinstance(response, dict):
        return "the response is not an object"
    if response.get("uid") != uid:
        return "the response is for another request uid"
    if response.get("allowed") is not True:
        message = (response.get("status") or {}).get("message", "no reason given")
        return f"not allowed: {message}"
    if response.get("patchType") != "JSONPatch":
        return "no JSONPatch"
    try:
        patch = orjson.loads(base64.b64decode(response.get("patch") or "", validate=True))
    except (binascii.Error, orjson.JSONDecodeError):
        return "the patch is not base64 of JSON"
    if not isinstance(patch, list) or not patch:
        return "the patch is not a non-empty list of operations"
    return None


async def measure(
    url: str,
    ca_pem: bytes | None,
    *,
    rate: float = 500,
    seconds: float = 20,
    warmup: float = 2,
    connections: int = 16,
    namespace: str = "bench",
) -> dict:
    """Send reviews to ``url`` at ``rate`` per second for ``warmup`` then ``seconds`` seconds.

    TLS is verified against ``ca_pem`` (the system's CAs when None). Statistics cover the
    requests due after the warm-up: how many were ``sent``, the ``achieved_rate`` (from the
    first one's due time to the last one's sending, so a generator that ends late shows),
    ``errors`` (HTTP status other than 200, a wrong answer, no answer within the API server's
    timeout) with their most common ``error_reasons``, ``latency_ms`` of the right answers
    ("intended" and "service"), ``lag_ms`` and ``queued_ms``; each summary in milliseconds
    (p50, p90, p99, p99.9, max).
    Raises ValueError for a rate, duration or connection count out of range.
    """
    if rate <= 0 or seconds <= 0 or warmup < 0 or connections < 1:
        raise ValueError("rate and seconds must be positive, warmup >= 0, connections >= 1")
    warmup_count = round(warmup * rate)
    count = warmup_count + max(round(seconds * rate), 1)
    bodies = review_bodies(count, namespace)
    due = [0.0] * count
    ready = [0.0] * count
    sent = [0.0] * count
    done = [0.0] * count
    problems: list[str | None] = [None] * count
    slots = asyncio.Semaphore(connections)  # a request waits here, not inside aiohttp
    context = ssl.create_default_context(cadata=ca_pem.decode() if ca_pem else None)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context, limit=connections),
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )

    async def admit(i: int) -> None:
        ready[i] = time.perf_counter()
        uid, body = bodies[i]
        async with slots:
            sent[i] = time.perf_counter()
            try:
                async with session.post(url, data=body) as response:
                    status, answer = response.status, await response.read()
            except (aiohttp.ClientError, TimeoutError) as e:
                done[i] = time.perf_counter()
                problems[i] = f"{type(e).__name__}: {e}"[:160]
                return
            done[i] = time.perf_counter()
        problems[i] = f"HTTP {status}" if status != 200 else review_problem(answer, uid)

    async with session:
        tasks = []
        start = time.perf_counter() + 0.01
        for i in range(count):
            due[i] = start + i / rate
            delay = due[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(admit(i)))
        await asyncio.gather(*tasks)

    measured = range(warmup_count, count)
    right = [i for i in measured if problems[i] is None]
    errors = Counter(problems[i] for i in measured if problems[i] is not None)
    span = max(sent[i] for i in measured) - due[warmup_count]  # a late start or end counts
    return {
        "url": url,
        "rate": rate,
        "seconds": seconds,
        "warmup": warmup,
        "connections": connections,
        "sent": len(measured),
        "achieved_rate": round((len(measured) - 1) / span, 1) if len(measured) > 1 else None,
        "errors": errors.total(),
        "error_reasons": dict(errors.most_common(5)),
        "latency_ms": {
            "intended": latency_summary([done[i] - due[i] for i in right]),
            "service": latency_summary([done[i] - sent[i] for i in right]),
        },
        "lag_ms": latency_summary([ready[i] - due[i] for i in measured]),
        "queued_ms": latency_summary([sent[i] - ready[i] for i in measured]),
    }


API_SERVER_IDLE = 25  # client-go's MaxIdleConnsPerHost: idle connections kept per webhook


class _ApiServerConnections:
    """Connections to a webhook as kube-apiserver keeps them: HTTP/1.1 (it asks webhooks for
    nothing else), a new connection for a request when none is idle, so one per admission in
    flight, and at most ``API_SERVER_IDLE`` kept once their request is answered."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext) -> None:
        self.host, self.port, self.context = host, port, context
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.opened = self.open = self.most_open = 0

    async def take(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self.idle:
            reader, writer = self.idle.pop()
            if not writer.is_closing() and not reader.at_eof():  # the server closes idle ones
                return reader, writer
            self.close(writer)
        connection = await asyncio.open_connection(self.host, self.port, ssl=self.context)
        self.opened += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        return connection

    def give_back(self, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        if len(self.idle) < API_SERVER_IDLE:
            self.idle.append(connection)
        else:
            self.close(connection[1])

    def close(self, writer: asyncio.StreamWriter) -> None:
        self.open -= 1
        writer.close()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """One request on a kept connection; on a fresh one if the kept one was closed."""
        head = (
            f"POST {path}?timeout={REQUEST_TIMEOUT:.0f}s HTTP/1.1\r\nHost: {self.host}\r\n"
            "Content-Type: application/json\r\nAccept: application/json, */*\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        for attempt in range(2):
            reader, writer = await self.take()
            try:
                writer.write(head + body)
                status = int((await reader.readuntil(b"\r\n")).split()[1])
                length = 0
                while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                answer = await reader.readexactly(length)
            except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
                self.close(writer)
                if attempt:
                    raise
                continue
            self.give_back((reader, writer))
            return status, answer
        raise AssertionError("unreachable")


def resident_mb(pid: int) -> float:
    """The RSS of process ``pid``, in MB (Linux)."""
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


async def bursts(
    url: str,
    ca_pem: bytes | None,
    *,
    total: int = 30_000,
    size: int = 300,
    pause: float = 1.0,
    settle: float = 3.0,
    pid: int | None = None,
    namespace: str = "bench",
) -> dict:
    """``total`` admissions in bursts of ``size`` sent at once, ``pause`` seconds apart, over
    connections kept as kube-apiserver keeps them, which is how pod creations in bulk (a
    ReplicaSet makes up to 500 at once) reach the webhook.

    Returns the ``admissions`` and ``errors`` (an HTTP status other than 200, a wrong answer,
    a connection lost twice), the connections ``opened`` in all and ``most_open`` at once, the
    run's ``seconds``; with ``pid``, that process's RSS in MB: at the start, the highest seen
    after a burst, and ``settle`` seconds after the last. Raises ValueError for sizes out of
    range.
    """
    if total < 1 or size < 1 or pause < 0 or settle < 0:
        raise ValueError("total and size must be positive, pause and settle >= 0")
    parsed = urllib.parse.urlsplit(url)
    if parsed.hostname is None or parsed.port is None:
        raise ValueError(f"{url}: no host and port")
    context = ssl.create_default_context(cadata=ca_pem.decode() if ca_pem else None)
    context.set_alpn_protocols(["http/1.1"])
    connections = _ApiServerConnections(parsed.hostname, parsed.port, context)
    reviews = review_bodies(min(size, total), namespace)
    rss = {"rss_start_mb": resident_mb(pid)} if pid else {}
    highest = 0.0
    errors: Counter[str] = Counter()

    async def admit(uid: str, body: bytes) -> None:
        try:
            status, answer = await connections.post(parsed.path or "/", body)
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError) as e:
            errors[f"{type(e).__name__}: {e}"[:160]] += 1
            return
        problem = f"HTTP {status}" if status != 200 else review_problem(answer, uid)
        if problem is not None:
            errors[problem] += 1

    started = time.perf_counter()
    sent = 0
    while sent < total:
        count = min(size, total - sent)
        await asyncio.gather(*(admit(uid, body) for uid, body in reviews[:count]))
        sent += count
        if pid:
            highest = max(highest, resident_mb(pid))
        if sent < total:
            await asyncio.sleep(pause)
    seconds = time.perf_counter() - started
    for _, writer in connections.idle:
        connections.close(writer)
    if pid:
        await asyncio.sleep(settle)
        rss.update(rss_highest_mb=round(highest, 1), rss_end_mb=round(resident_mb(pid), 1))
        rss["rss_start_mb"] = round(rss["rss_start_mb"], 1)
    return {
        "url": url,
        "admissions": sent,
        "burst": size,
        "errors": errors.total(),
        "error_reasons": dict(errors.most_common(5)),
        "opened": connections.opened,
        "most_open": connections.most_open,
        "seconds": round(seconds, 1),
        **rss,
    }


def run_in_subprocess(
    url: str,
    ca_file: str | Path | None,
    rate: float = 500,
    seconds: float = 20,
    *,
    warmup: float = 2,
    connections: int = 16,
    namespace: str = "bench",
) -> dict:
    """``measure`` in a fresh Python process, so the generator has an event loop of its own.

    Raises RuntimeError, with the end of its stderr, when the process fails.
    """
    command = [sys.executable, "-m", "bench.webhook", "--url", url, "--json"]
    if ca_file is not None:
        command += ["--ca-file", str(ca_file)]
    command += ["--rate", str(rate), "--seconds", str(seconds), "--warmup", str(warmup)]
    command += ["--connections", str(connections), "--namespace", namespace]
    proc = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=warmup + seconds + REQUEST_TIMEOUT + 60,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"webhook benchmark failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def summary_line(result: dict) -> str:
    """One line for people: the rate achieved, errors, both latencies, lag and queueing."""

    def percentiles(summary: dict[str, float | None]) -> str:
        return " ".join(
            f"{name} {'-' if value is None else value}" for name, value in summary.items()
        )

    errors = f"{result['errors']} errors"
    if result["error_reasons"]:
        reason, count = next(iter(result["error_reasons"].items()))
        errors += f" ({count} {reason})"
    latency = result["latency_ms"]
    return (
        f"{result['url']}: {result['sent']} sent at {result['achieved_rate']}/s "
        f"(target {result['rate']:g}/s, {result['connections']} connections), {errors}; "
        f"ms intended {percentiles(latency['intended'])}; "
        f"service {percentiles(latency['service'])}; "
        f"max lag {result['lag_ms']['max']}, max queued {result['queued_ms']['max']}"
    )


def apiserver_webhook_histogram(metrics_text: str, webhook_name: str) -> dict[float, int]:
    """kube-apiserver's histogram of calls to ``webhook_name`` on CREATE: {le: cumulative count}.

    ``metrics_text`` is the API server's ``/metrics`` (Prometheus text format);
    ``webhook_name`` is the name of the webhook in its configuration, which is what the API
    server labels it with (``proxy-pods.multicluster.admiralty.io`` for the chart), not the
    configuration's name. Counts are summed over the other labels (rejected, type). The counts
    are since the API server started: subtract an earlier scrape to get one run's.
    """
    buckets: dict[float, int] = {}
    for line in metrics_text.splitlines():
        if not line.startswith(WEBHOOK_DURATION_BUCKET + "{"):
            continue
        sample = _SAMPLE.match(line)
        if sample is None:
            raise ValueError(f"not a Prometheus sample: {line!r}")
        labels = {k: _unescape(v) for k, v in _LABEL.findall(sample["labels"])}
        if labels.get("name") != webhook_name or labels.get("operation") != "CREATE":
            continue
        le = float(labels["le"])  # "+Inf" too
        buckets[le] = buckets.get(le, 0) + int(float(sample["value"]))  # "1.2e+06" too
    return dict(sorted(buckets.items()))


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], value)


def fraction_within(buckets: dict[float, int], seconds: float) -> float:
    """The fraction of calls that took at most ``seconds``, from a cumulative histogram.

    Exact when ``seconds`` is a bucket bound (kube-apiserver's are 5 ms, 25 ms, 100 ms, ...),
    otherwise a lower bound: the count at the largest bound not above ``seconds``. Raises
    ValueError when there is no +Inf bucket or it counts nothing.
    """
    total = buckets.get(math.inf, 0)
    if total <= 0:
        raise ValueError("no calls counted (no +Inf bucket, or zero)")
    within = max((n for le, n in buckets.items() if le <= seconds), default=0)
    return within / total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="https://HOST:PORT/mutate")
    parser.add_argument("--ca-file", type=Path, help="the agent's CA (default: the system's)")
    parser.add_argument("--rate", type=float, default=500, help="requests per second")
    parser.add_argument("--seconds", type=float, default=20, help="measured, after the warm-up")
    parser.add_argument("--warmup", type=float, default=2, help="seconds left out")
    parser.add_argument("--connections", type=int, default=16, help="keep-alive connections")
    parser.add_argument("--namespace", default="bench", help="of the reviewed pods")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--bursts", type=int, metavar="SIZE", help="instead: bursts of SIZE admissions at once"
    )
    parser.add_argument("--total", type=int, default=30_000, help="admissions, with --bursts")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between bursts")
    parser.add_argument("--pid", type=int, help="the webhook's process: its RSS, with --bursts")
    args = parser.parse_args(argv)
    ca_pem = args.ca_file.read_bytes() if args.ca_file else None
    if args.bursts:
        result = asyncio.run(
            bursts(
                args.url,
                ca_pem,
                total=args.total,
                size=args.bursts,
                pause=args.pause,
                pid=args.pid,
                namespace=args.namespace,
            )
        )
        print(json.dumps(result), flush=True)
        return 0
    result = asyncio.run(
        measure(
            args.url,
            ca_pem,
            rate=args.rate,
            seconds=args.seconds,
            warmup=args.warmup,
            connections=args.connections,
            namespace=args.namespace,
        )
    )
    print(json.dumps(result) if args.json else summary_line(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
