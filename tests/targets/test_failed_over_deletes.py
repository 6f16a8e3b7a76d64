"""A delegate in a target that has been away past its failover setting does not hold its pod:
its deletion is left for when the target is back; elsewhere an unreachable target still does."""

from __future__ import annotations

import time

import pytest

from multicluster import Unreachable
from multicluster_scheduler.targets.registry import TargetConnection
from multicluster_scheduler.targets.release import delete_delegate


class Away:
    """A client whose server does not answer."""

    async def delete(self, *args, **kwargs):
        raise Unreachable("DELETE on c2: cannot connect to 10.0.0.2:6443: Connection refused")


class Cluster:
    client = Away()


def away(failover_after: float | None, since: float) -> TargetConnection:
    connection = TargetConnection("Target", "c2", "ns", cluster=Cluster())  # type: ignore[arg-type]
    connection.failover_after = failover_after
    connection.set_ready(False, "Unreachable", "cannot connect")
    connection.not_ready_since = time.monotonic() - since
    return connection


DELEGATE = {"metadata": {"name": "p-x", "namespace": "ns", "uid": "u"}}


async def test_a_failed_over_target_is_not_waited_for():
    await delete_delegate(away(failover_after=20, since=30), DELEGATE, "its proxy pod is deleted")


@pytest.mark.parametrize(("failover_after", "since"), [(None, 600), (20, 5)])
async def test_otherwise_an_unreachable_target_still_holds_it(failover_after, since):
    with pytest.raises(Unreachable):
        await delete_delegate(away(failover_after, since), DELEGATE, "its proxy pod is deleted")
