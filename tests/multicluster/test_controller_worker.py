"""A worker outlives whatever one item does, the queue's own calls included."""

from __future__ import annotations

import asyncio

from multicluster import Controller, Func, Request


async def test_an_error_outside_the_reconcile_ends_no_worker(caplog):
    handled: list[str] = []

    async def reconcile(request: Request):
        handled.append(request.name)

    controller = Controller("t", Func(reconcile), workers=1)
    queue = controller.queue
    real_forget = queue.forget

    def forget(item):
        if item.name == "bad":
            raise OverflowError("a queue that cannot compute a delay")
        real_forget(item)

    queue.forget = forget  # type: ignore[method-assign]
    running = asyncio.create_task(controller.run())
    queue.add(Request("c", "ns", "bad"))
    queue.add(Request("c", "ns", "good"))
    for _ in range(100):
        if "good" in handled:
            break
        await asyncio.sleep(0.01)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert handled == ["bad", "good"]
    assert "worker failed controller=t" in caplog.text
