"""Stopping with a shutdown delay: the leader's work ends at once, the rest keeps serving (and
/readyz says so) for the delay, then ends too."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from multicluster import Manager


async def test_stopping_drains_the_servers_but_not_the_leader():
    ended: dict[str, float] = {}

    def runnable(name: str):
        async def run() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                ended[name] = time.monotonic()

        return run

    manager = Manager(health_port=0, health_host="127.0.0.1", tune_gc=False, shutdown_delay=0.6)
    manager.add_runnable(runnable("leader-work"), needs_leader=True)
    manager.add_runnable(runnable("webhook"), needs_leader=False)
    running = asyncio.create_task(manager.run())
    while manager.health_address is None:
        await asyncio.sleep(0.01)
    host, port = manager.health_address
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{host}:{port}/readyz") as ready:
            assert ready.status == 200
        stopped = time.monotonic()
        manager.stop()
        while "leader-work" not in ended:
            await asyncio.sleep(0.01)
        async with http.get(f"http://{host}:{port}/readyz") as draining:
            assert draining.status == 503
            assert await draining.text() == "shutting down"
    await asyncio.wait_for(running, 5)
    assert ended["leader-work"] - stopped < 0.3, "the leader's work stops at once"
    assert ended["webhook"] - stopped >= 0.6, "the servers keep answering for the delay"


async def test_no_delay_stops_everything_at_once():
    manager = Manager(tune_gc=False)
    manager.add_runnable(asyncio.Event().wait, needs_leader=False)
    running = asyncio.create_task(manager.run())
    await asyncio.sleep(0.05)
    stopped = time.monotonic()
    manager.stop()
    await asyncio.wait_for(running, 5)
    assert time.monotonic() - stopped < 0.3
    assert not manager.draining
