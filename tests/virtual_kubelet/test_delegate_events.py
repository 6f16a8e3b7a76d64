"""What a delegate's Event in its target becomes on the proxy pod
(:mod:`multicluster_scheduler.virtual_kubelet.delegate_events`): hostile fields made harmless,
repeats aggregated, names stable across restarts."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from multicluster.events import Correlator
from multicluster_scheduler.virtual_kubelet.delegate_events import (
    MAX_COUNT,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_SOURCES,
    PROXY_BURST,
    PROXY_REFILL,
    REPLAY_WINDOW,
    TARGET_BURST,
    TARGET_RATE,
    TOTAL_BURST,
    TOTAL_RATE,
    Reflections,
    count_patch,
    delegate_event,
    is_recent,
    printable,
    reflected_event,
    reflected_name,
    slim_event,
)

NOW = dt.datetime(2026, 11, 26, 12, 0, 0, tzinfo=dt.UTC)
PROXY = {"metadata": {"name": "web-1", "namespace": "team-a", "uid": "proxy-uid"}}
NODE = "admiralty-namespace-team-a-c2"


def target_event(**fields) -> dict:
    """An Event as a target's kubelet writes it about a delegate."""
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": "web-1-abcde.1880",
            "namespace": "team-a",
            "uid": "event-uid-1",
            "resourceVersion": "42",
        },
        "involvedObject": {
            "kind": "Pod",
            "name": "web-1-abcde",
            "namespace": "team-a",
            "uid": "delegate-uid",
        },
        "type": "Warning",
        "reason": "BackOff",
        "message": "Back-off restarting failed container main in pod web-1-abcde",
        "count": 3,
        "firstTimestamp": "2026-11-26T11:58:00Z",
        "lastTimestamp": "2026-11-26T11:59:30Z",
        "source": {"component": "kubelet", "host": "node-1"},
    }
    event.update(fields)
    return event


def test_a_kubelet_event_is_reflected_with_its_target_named():
    event = delegate_event(slim_event(target_event()))
    assert event is not None
    reflections = Reflections()
    key = ("proxy-uid", NODE, event.type, event.reason, event.message)
    reflection, due = reflections.observe(key, "web-1", event, NOW)
    assert due
    body = reflected_event(PROXY, NODE, "c2", event, reflection)
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "web-1",
        "namespace": "team-a",
        "uid": "proxy-uid",
    }
    assert body["metadata"] == {"name": reflection.name, "namespace": "team-a"}
    assert body["type"] == "Warning"
    assert body["reason"] == "BackOff"
    assert body["message"] == (
        "[target c2] Back-off restarting failed container main in pod web-1-abcde"
    )
    assert body["source"] == {"component": "admiralty-virtual-kubelet", "host": NODE}
    assert body["count"] == 3
    assert body["firstTimestamp"] == "2026-11-26T11:58:00Z"
    assert body["lastTimestamp"] == "2026-11-26T11:59:30Z"


def test_a_repeated_event_raises_the_count_instead_of_making_another():
    reflections = Reflections()
    first = delegate_event(slim_event(target_event(count=1)))
    assert first is not None
    key = ("proxy-uid", NODE, first.type, first.reason, first.message)
    reflection, due = reflections.observe(key, "web-1", first, NOW)
    assert due
    assert reflection.count == 1
    reflection.written = 1
    # Seen again with the same count (a relist, a resync): nothing to write.
    again, due = reflections.observe(key, "web-1", first, NOW)
    assert again is reflection
    assert not due
    # Said again in the target: count 5.
    later = delegate_event(slim_event(target_event(count=5, lastTimestamp="2026-11-26T11:59:50Z")))
    assert later is not None
    again, due = reflections.observe(key, "web-1", later, NOW)
    assert again is reflection
    assert due
    assert count_patch(reflection) == {"count": 5, "lastTimestamp": "2026-11-26T11:59:50Z"}
    # Another Event of the target that says the same: added to the same one.
    other = delegate_event(slim_event(target_event(metadata={"uid": "event-uid-2"}, count=2)))
    assert other is not None
    again, due = reflections.observe(key, "web-1", other, NOW)
    assert again is reflection
    assert due
    assert reflection.count == 7
    assert len(reflections) == 1


def test_series_count_of_the_events_api_counts():
    slim = slim_event(
        target_event(
            count=None,
            series={"count": 9, "lastObservedTime": "2026-11-26T11:59:59.123456Z"},
        )
    )
    assert slim["count"] == 9
    assert slim["last"] == "2026-11-26T11:59:59.123456Z"


def test_one_reflection_follows_a_bounded_number_of_target_events():
    reflections = Reflections()
    base = delegate_event(slim_event(target_event(count=1)))
    assert base is not None
    key = ("proxy-uid", NODE, base.type, base.reason, base.message)
    for i in range(MAX_SOURCES + 50):
        event = delegate_event(slim_event(target_event(metadata={"uid": f"e{i}"}, count=1)))
        assert event is not None
        reflection, _ = reflections.observe(key, "web-1", event, NOW)
    assert len(reflection.counts) == MAX_SOURCES + 1
    assert reflection.count == MAX_SOURCES + 50


def test_the_name_is_the_same_after_a_restart_and_differs_between_events_and_targets():
    name = reflected_name("web-1", NODE, "event-uid-1")
    assert name == reflected_name("web-1", NODE, "event-uid-1")
    assert name.startswith("web-1.")
    assert name != reflected_name("web-1", NODE, "event-uid-2")
    assert name != reflected_name("web-1", "admiralty-cluster-c3", "event-uid-1")
    assert len(reflected_name("p" * 253, NODE, "u")) <= MAX_NAME


def test_only_normal_and_warning_events_with_a_camel_case_reason_are_reflected():
    assert delegate_event(slim_event(target_event(type="Error"))) is None
    assert delegate_event(slim_event(target_event(type=None))) is None
    assert delegate_event(slim_event(target_event(reason="Back Off"))) is None
    assert delegate_event(slim_event(target_event(reason="x" * 65))) is None
    assert delegate_event(slim_event(target_event(reason="\x1b[31mRed"))) is None
    assert delegate_event(slim_event(target_event(reason=""))) is None
    assert delegate_event(slim_event(target_event(reason=["BackOff"]))) is None
    assert delegate_event(slim_event(target_event(metadata={"name": "x"}))) is None
    assert delegate_event(slim_event(target_event(involvedObject={"kind": "Pod"}))) is None
    for reason in ("FailedScheduling", "Pulling", "OOMKilling", "FailedMount", "BackOff"):
        assert delegate_event(slim_event(target_event(reason=reason))) is not None


def test_messages_are_one_printable_line_of_bounded_length():
    hostile = "ok\x1b]0;owned\x07\r\nnext\u202eevil\u200b line\x00" + "y" * 5000
    event = delegate_event(slim_event(target_event(message=hostile)))
    assert event is not None
    assert event.message.startswith("ok ]0;owned nextevil line y")
    assert "\x1b" not in event.message
    assert "\u202e" not in event.message
    reflections = Reflections()
    reflection, _ = reflections.observe(("p", NODE, "Warning", "BackOff", ""), "p", event, NOW)
    body = reflected_event(PROXY, NODE, "c2", event, reflection)
    assert len(body["message"]) == MAX_MESSAGE
    assert body["message"].startswith("[target c2] ok")
    assert body["message"].endswith("…")


@given(st.text(max_size=300), st.integers(min_value=2, max_value=200))
def test_printable_never_leaves_a_control_character_nor_goes_over(text: str, limit: int):
    clean = printable(text, limit)
    assert len(clean) <= limit
    assert not any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in clean)


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "metadata",
                "involvedObject",
                "type",
                "reason",
                "message",
                "count",
                "series",
                "lastTimestamp",
                "firstTimestamp",
                "eventTime",
            ]
        ),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner),
            max_leaves=8,
        ),
    )
)
def test_whatever_a_target_sends_slimming_and_reading_never_raise(event: dict):
    slim = slim_event(event)
    parsed = delegate_event(slim)
    assert parsed is None or parsed.type in ("Normal", "Warning")
    assert 1 <= slim["count"] <= MAX_COUNT


def test_counts_are_bounded_to_what_an_event_may_say():
    assert slim_event(target_event(count=10**12))["count"] == MAX_COUNT
    assert slim_event(target_event(count=-4))["count"] == 1
    assert slim_event(target_event(count=True))["count"] == 1


def test_implausible_timestamps_are_replaced_by_now():
    future = delegate_event(slim_event(target_event(lastTimestamp="2030-01-01T00:00:00Z")))
    assert future is not None
    reflection, _ = Reflections().observe(("p", NODE, "W", "R", "m"), "p", future, NOW)
    assert reflection.last == NOW
    ancient = delegate_event(
        slim_event(target_event(firstTimestamp="2020-01-01T00:00:00Z", lastTimestamp="junk"))
    )
    assert ancient is not None
    reflection, _ = Reflections().observe(("p", NODE, "W", "R", "m"), "p", ancient, NOW)
    assert reflection.first == NOW


def test_only_recent_events_are_replayed_when_a_watch_starts():
    since = NOW - dt.timedelta(seconds=REPLAY_WINDOW)
    assert is_recent(slim_event(target_event(lastTimestamp="2026-11-26T11:59:00Z")), since)
    assert not is_recent(slim_event(target_event(lastTimestamp="2026-11-26T11:00:00Z")), since)
    assert not is_recent(slim_event(target_event(lastTimestamp=None)), since)


def test_reflections_remembered_are_bounded():
    reflections = Reflections(max_entries=3)
    for i in range(10):
        event = delegate_event(slim_event(target_event(message=f"m{i}")))
        assert event is not None
        reflections.observe(("p", NODE, "Warning", "BackOff", f"m{i}"), "p", event, NOW)
    assert len(reflections) == 3


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_limits_bound_a_flood_per_proxy_pod_and_per_target():
    """The reflector's limits, as it sets them up: 25 writes per proxy pod, then one a minute;
    100 per target, then five a second."""
    clock = Clock()
    proxies = Correlator(burst=PROXY_BURST, refill_every=PROXY_REFILL, clock=clock)
    targets = Correlator(burst=TARGET_BURST, refill_every=1 / TARGET_RATE, clock=clock)

    def allowed(pod: str, target: str) -> bool:
        return proxies.allow(("ns", "Pod", pod, pod)) and targets.allow(("", "T", target, ""))

    assert (PROXY_BURST, PROXY_REFILL, TARGET_BURST, TARGET_RATE) == (25, 60.0, 100, 5.0)
    assert (TOTAL_BURST, TOTAL_RATE) == (200, 20.0)  # a tenth of the agent's requests at most
    assert sum(allowed("crashing", "c2") for _ in range(500)) == 25
    clock.now = 60.0
    assert sum(allowed("crashing", "c2") for _ in range(500)) == 1
    # 500 pods of another target, each with its own burst: the target's limit holds them.
    assert sum(allowed(f"pod-{i}", "c3") for i in range(500)) == 100
    clock.now = 61.0
    assert sum(allowed(f"other-{i}", "c3") for i in range(500)) == 5
