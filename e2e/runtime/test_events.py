"""The event recorder against a real API server: repeats counted on one Event, as
``kubectl describe`` shows them, and a chatty controller held to its burst."""

from __future__ import annotations

from multicluster.events import Correlator, EventRecorder
from multicluster.resources import CONFIGMAPS, EVENTS


async def test_an_event_said_again_is_counted_on_the_one_written(connect, namespace: str):
    cluster = connect("cluster1")
    client = cluster.client
    config_map = await client.create(
        CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cm", "namespace": namespace},
        },
        namespace,
    )
    recorder = EventRecorder(client, "test", correlator=Correlator(burst=5))
    for _ in range(3):
        await recorder.record(config_map, "Warning", "Odd", "the same thing")
    await recorder.record(config_map, "Warning", "Odd", "something else")
    for _ in range(5):  # past the burst of 5 writes: held back
        await recorder.record(config_map, "Normal", "Chatty", "again")
    events, _ = await client.list(EVENTS, namespace)
    said = sorted((e["reason"], e["message"], e["count"]) for e in events)
    assert said == [
        ("Chatty", "again", 1),
        ("Odd", "something else", 1),
        ("Odd", "the same thing", 3),
    ]
    counted = next(e for e in events if e["count"] == 3)
    assert counted["lastTimestamp"] >= counted["firstTimestamp"]
    assert counted["involvedObject"]["uid"] == config_map["metadata"]["uid"]

    # An Event deleted meanwhile (they expire after an hour) is written anew.
    fresh = EventRecorder(client, "test")
    await fresh.record(config_map, "Normal", "Gone", "soon deleted")
    (written,) = [e for e in (await client.list(EVENTS, namespace))[0] if e["reason"] == "Gone"]
    await client.delete(EVENTS, written["metadata"]["name"], namespace)
    await fresh.record(config_map, "Normal", "Gone", "soon deleted")
    again = [e for e in (await client.list(EVENTS, namespace))[0] if e["reason"] == "Gone"]
    assert [e["count"] for e in again] == [1]
    assert again[0]["metadata"]["name"] != written["metadata"]["name"]
