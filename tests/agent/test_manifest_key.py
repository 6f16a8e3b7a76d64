"""The key that seals saved manifests, shared through the chart's Secret: the first replica fills
it, a replica that loses the race reads the winner's, every later start reads it, and a Secret
that is missing or holds no key says so (the agent does not start)."""

from __future__ import annotations

import asyncio
import base64
import time

import pytest

from multicluster.errors import Forbidden, ServerError
from multicluster.resources import SECRETS
from multicluster.testing import FakeClient, FakeServer
from multicluster_scheduler.api.manifest_mac import KEY_BYTES
from multicluster_scheduler.webhook.manifest_key import ManifestKeyError, load_manifest_key

NS, NAME = "admiralty", "multicluster-scheduler-manifest-key"


def empty_secret() -> dict:
    return {"metadata": {"name": NAME, "namespace": NS}, "type": "Opaque"}


async def test_the_first_replica_fills_the_secret_and_the_others_read_it():
    server = FakeServer()
    server.add(SECRETS, empty_secret())
    before = time.time()
    first = await load_manifest_key(FakeClient(server), NS, NAME)
    assert len(first.secret) == KEY_BYTES
    assert first.created is not None
    assert before <= first.created <= time.time()
    stored = server.objects(SECRETS, NS)[0]["data"]
    assert base64.b64decode(stored["key"]) == first.secret
    again = await load_manifest_key(FakeClient(server), NS, NAME)
    assert again.secret == first.secret
    assert again.created == pytest.approx(first.created, abs=1e-5)


async def test_replicas_starting_together_share_one_key():
    server = FakeServer()
    server.add(SECRETS, empty_secret())
    keys = await asyncio.gather(
        *(load_manifest_key(FakeClient(server), NS, NAME) for _ in range(5))
    )
    assert len({k.secret for k in keys}) == 1
    assert [a.verb for a in server.writes].count("update") >= 1


async def test_a_secret_without_the_key_is_filled_keeping_what_else_it_holds():
    server = FakeServer()
    server.add(SECRETS, {**empty_secret(), "data": {"note": base64.b64encode(b"x").decode()}})
    await load_manifest_key(FakeClient(server), NS, NAME)
    assert set(server.objects(SECRETS, NS)[0]["data"]) == {"note", "key", "created"}


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"key": base64.b64encode(b"short").decode()}, "its key is 5 bytes, fewer than 32"),
        ({"key": "not base64!"}, "its data is not base64"),
    ],
)
async def test_a_secret_holding_something_else_stops_the_agent(data, says):
    server = FakeServer()
    server.add(SECRETS, {**empty_secret(), "data": data})
    with pytest.raises(ManifestKeyError, match=says):
        await load_manifest_key(FakeClient(server), NS, NAME)
    assert not server.writes, "what an administrator put there is not overwritten"


async def test_a_key_without_a_creation_time_trusts_no_pod_without_a_mac():
    server = FakeServer()
    key = base64.b64encode(bytes(32)).decode()
    server.add(SECRETS, {**empty_secret(), "data": {"key": key}})
    assert (await load_manifest_key(FakeClient(server), NS, NAME)).created is None


async def test_a_missing_or_forbidden_secret_says_what_the_chart_makes():
    with pytest.raises(ManifestKeyError, match="the chart makes it"):
        await load_manifest_key(FakeClient(FakeServer()), NS, NAME)
    server = FakeServer()
    server.add(SECRETS, empty_secret())
    server.fail_next("get", SECRETS, Forbidden("forbidden", status=403))
    with pytest.raises(ManifestKeyError, match="cannot be read"):
        await load_manifest_key(FakeClient(server), NS, NAME)


async def test_a_server_error_is_waited_out():
    server = FakeServer()
    server.add(SECRETS, empty_secret())
    server.fail_next("get", SECRETS, ServerError("starting", status=503))
    key = await asyncio.wait_for(load_manifest_key(FakeClient(server), NS, NAME), 5)
    assert len(key.secret) == KEY_BYTES
