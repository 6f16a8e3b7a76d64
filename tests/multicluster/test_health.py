"""The health endpoints, as probes and Prometheus read them."""

from __future__ import annotations

import aiohttp

from multicluster.health import HealthServer, health_app


async def test_probes_and_metrics_are_answered_with_the_reason_when_unready():
    reason: list[str | None] = [None]
    server = HealthServer(health_app(lambda: reason[0]), "127.0.0.1", 0)
    await server.start()
    host, port = server.address
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://{host}:{port}/healthz") as alive:
                assert (alive.status, await alive.text()) == (200, "ok")
            async with http.get(f"http://{host}:{port}/readyz") as ready:
                assert (ready.status, await ready.text()) == (200, "ok")
            reason[0] = "caches not synced: c2"
            async with http.get(f"http://{host}:{port}/readyz") as unready:
                assert (unready.status, await unready.text()) == (503, "caches not synced: c2")
            async with http.get(f"http://{host}:{port}/metrics") as scraped:
                assert scraped.status == 200
                assert scraped.headers["content-type"].startswith("text/plain")
                assert "event_loop_lag_seconds" in await scraped.text()
            async with http.get(f"http://{host}:{port}/docs") as docs:
                assert docs.status == 404, "no API docs served on a probe port"
    finally:
        await server.stop()
    async with aiohttp.ClientSession() as http:
        try:
            await http.get(f"http://{host}:{port}/healthz")
            raise AssertionError("still serving after stop()")
        except aiohttp.ClientConnectionError:
            pass
