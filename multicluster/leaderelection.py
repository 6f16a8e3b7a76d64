"""Leader election on a coordination.k8s.io Lease, with client-go's timing and semantics.

A candidate takes the lease when it is free or its holder has not renewed it for
``lease_duration`` (measured on the candidate's own clock from when it last saw the lease
change, so clocks need not agree). The leader renews every ``retry_period``; if it cannot renew
for ``renew_deadline`` it stops leading at once. Each attempt, leading or not, has half the renew
deadline, then starts again on new connections: one dead connection costs neither the lease nor
the succession. On a clean shutdown it releases the lease so a successor takes over without
waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from . import metrics
from .client import Client
from .errors import ApiError, Conflict, NotFound
from .kubetime import format_micro_time
from .resources import LEASES

log = logging.getLogger(__name__)


@dataclass
class LeaderElectionConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_cancel: bool = True


def _now() -> str:
    return format_micro_time()


class LeaderElector:
    def __init__(self, client: Client, config: LeaderElectionConfig) -> None:
        self.client = client
        self.config = config
        self._observed: tuple | None = None
        self._observed_at = 0.0
        self._lease: dict | None = None
        self.is_leader = False
        self._gauge = metrics.LEADER.labels(config.name)

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Campaign until elected, run ``lead()`` while leading; return when leadership ends.

        ``lead`` is cancelled as soon as the lease cannot be renewed. Cancelling ``run`` releases
        the lease (if configured).
        """
        config = self.config
        while not await self._attempt():
            await asyncio.sleep(config.retry_period)
        self.is_leader = True
        self._gauge.set(1)
        log.info(
            "became leader lease=%s/%s identity=%s", config.namespace, config.name, config.identity
        )
        leading = asyncio.create_task(lead(), name="leader")
        renewing = asyncio.create_task(self._renew_loop(), name="lease-renewal")
        try:
            done, _ = await asyncio.wait({leading, renewing}, return_when=asyncio.FIRST_COMPLETED)
            if renewing in done:
                log.error(
                    "leadership lost lease=%s/%s identity=%s",
                    config.namespace,
                    config.name,
                    config.identity,
                )
            error = leading.exception() if leading in done and not leading.cancelled() else None
            if error is not None:
                raise error
        finally:
            self.is_leader = False
            self._gauge.set(0)
            for task in (leading, renewing):
                task.cancel()
            await asyncio.gather(leading, renewing, return_exceptions=True)
            if config.release_on_cancel:
                # Bounded: a leader that lost its lease because the API server is unreachable
                # must not hang here while its successor waits.
                with contextlib.suppress(TimeoutError):
                    await asyncio.shield(asyncio.wait_for(self._release(), self.attempt_timeout))

    async def _renew_loop(self) -> None:
        config = self.config
        last_renew = time.monotonic()
        while True:
            await asyncio.sleep(config.retry_period)
            renewed = await self._attempt()
            if renewed:
                last_renew = time.monotonic()
            elif time.monotonic() - last_renew >= config.renew_deadline:
                return

    @property
    def attempt_timeout(self) -> float:
        """One attempt (a read and a write of the Lease) gets half the renew deadline: a request
        stuck on a connection that died silently (a load balancer's idle timeout, a node gone)
        must leave time for another, on a fresh connection, before the deadline."""
        return max(self.config.retry_period, self.config.renew_deadline / 2)

    async def _attempt(self) -> bool:
        try:
            return await asyncio.wait_for(self._try_acquire_or_renew(), self.attempt_timeout)
        except TimeoutError:
            log.warning(
                "lease %s/%s: no answer in %.1fs, retrying on a new connection",
                self.config.namespace,
                self.config.name,
                self.attempt_timeout,
            )
            await self.client.close()  # its pooled connections may be the dead ones
            return False

    async def _try_acquire_or_renew(self) -> bool:
        config = self.config
        now = _now()
        try:
            lease = await self.client.get(LEASES, config.name, config.namespace)
        except NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": config.name, "namespace": config.namespace},
                "spec": {
                    "holderIdentity": config.identity,
                    "leaseDurationSeconds": int(config.lease_duration),
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
            try:
                self._lease = await self.client.create(LEASES, body, config.namespace)
            except ApiError as e:
                log.debug("lease creation failed: %s", e)
                return False
            self._observe(self._lease)
            return True
        except ApiError as e:
            log.warning("cannot read lease %s/%s: %s", config.namespace, config.name, e)
            return False
        spec = lease.get("spec") or {}
        self._observe(lease)
        holder = spec.get("holderIdentity") or ""
        duration = spec.get("leaseDurationSeconds") or config.lease_duration
        if holder and holder != config.identity and time.monotonic() < self._observed_at + duration:
            return False
        new_spec = dict(spec)
        if holder != config.identity:
            new_spec["acquireTime"] = now
            new_spec["leaseTransitions"] = (spec.get("leaseTransitions") or 0) + 1
        new_spec["holderIdentity"] = config.identity
        new_spec["leaseDurationSeconds"] = int(config.lease_duration)
        new_spec["renewTime"] = now
        lease["spec"] = new_spec
        try:
            self._lease = await self.client.update(LEASES, lease)
        except (Conflict, ApiError) as e:
            log.debug("lease update failed: %s", e)
            return False
        self._observe(self._lease)
        return True

    def _observe(self, lease: dict) -> None:
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("acquireTime"))
        if record != self._observed:
            self._observed = record
            self._observed_at = time.monotonic()

    async def _release(self) -> None:
        lease = self._lease
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.config.identity:
            return
        spec = dict(lease["spec"])
        spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=_now())
        lease = dict(lease, spec=spec)
        try:
            await self.client.update(LEASES, lease)
            log.info("released lease %s/%s", self.config.namespace, self.config.name)
        except ApiError as e:
            log.warning("could not release lease: %s", e)
