"""The elector against a server whose answers stop coming (a connection that died silently, a
load balancer's idle timeout): one stuck attempt costs neither the lease nor the succession.
The Lease's own semantics are exercised against a real API server in e2e/runtime."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from multicluster import Client, ClusterConfig
from multicluster.leaderelection import LeaderElectionConfig, LeaderElector
from tests.multicluster.test_hostile_server import kubeconfig

PATH = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/lease"


class Leases:
    """One Lease, kept as an API server keeps it (resourceVersion, conflicts); ``stall`` makes
    the next requests wait forever, as on a dead connection."""

    def __init__(self) -> None:
        self.lease: dict | None = None
        self.version = 0
        self.stall = 0
        self.requests = 0
        self.server: TestServer | None = None

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.stall:
            self.stall -= 1
            await asyncio.sleep(3600)
        if request.method == "GET":
            if self.lease is None:
                status = {"kind": "Status", "code": 404, "reason": "NotFound", "message": "no"}
                return web.json_response(status, status=404)
            return web.json_response(self.lease)
        body = orjson.loads(await request.read())
        if request.method == "PUT" and body["metadata"].get("resourceVersion") != str(self.version):
            status = {"kind": "Status", "code": 409, "reason": "Conflict", "message": "stale"}
            return web.json_response(status, status=409)
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.lease = body
        return web.json_response(body, status=201 if request.method == "POST" else 200)


async def elected() -> tuple[Leases, Client, LeaderElector, asyncio.Event, asyncio.Task]:
    """A server keeping one Lease, and an elector campaigning for it (``led`` once it leads)."""
    leases = Leases()
    app = web.Application()
    app.router.add_route("*", PATH, leases.handle)
    app.router.add_post("/apis/coordination.k8s.io/v1/namespaces/ns/leases", leases.handle)
    leases.server = TestServer(app, host="127.0.0.1")
    await leases.server.start_server()
    url = str(leases.server.make_url(""))
    client = Client(ClusterConfig.from_kubeconfig_data(kubeconfig(url)))
    config = LeaderElectionConfig(
        "ns", "lease", "me", lease_duration=1.5, renew_deadline=1.0, retry_period=0.1
    )
    elector = LeaderElector(client, config)
    led = asyncio.Event()

    async def lead() -> None:
        led.set()
        await asyncio.sleep(3600)

    return leases, client, elector, led, asyncio.create_task(elector.run(lead))


async def test_a_stuck_renewal_is_abandoned_in_time_and_the_lease_kept():
    leases, client, elector, led, task = await elected()
    try:
        await asyncio.wait_for(led.wait(), 2)
        leases.stall = 1  # the next renewal never gets an answer
        await asyncio.sleep(1.5)  # past the renew deadline, had that attempt been waited for
        assert not task.done(), "still leading: the stuck attempt was given up for another"
        assert elector.is_leader
        assert leases.lease["spec"]["holderIdentity"] == "me"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
        await leases.server.close()
    assert leases.lease["spec"]["holderIdentity"] == "", "released when cancelled"


async def test_a_leader_cut_off_from_its_server_stops_leading_without_hanging():
    """Every answer stops: leadership ends at the renew deadline, and releasing the Lease (which
    cannot succeed) is given up after one attempt's time, so a successor is not kept waiting."""
    leases, client, elector, led, task = await elected()
    config = elector.config
    try:
        await asyncio.wait_for(led.wait(), 2)
        leases.stall = 1_000_000
        cut = asyncio.get_running_loop().time()
        await asyncio.wait_for(task, 5)
        took = asyncio.get_running_loop().time() - cut
        assert not elector.is_leader
        # The renew deadline (1 s, rounded up by a stuck attempt of 0.5 s), then the release's
        # 0.5 s at most.
        assert took < config.renew_deadline + 2 * elector.attempt_timeout + 0.5, took
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
        await leases.server.close()
