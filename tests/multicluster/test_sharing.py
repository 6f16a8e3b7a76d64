"""SharedValues: equal parts of cached objects made one object, and let go when unused."""

from __future__ import annotations

import gc

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from multicluster import SharedValues

STATUS = (
    b'{"phase": "Running", "podIP": "10.0.0.%d", "podIPs": [{"ip": "10.0.0.%d"}],'
    b' "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": null}],'
    b' "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0, "lastState": {}}]}'
)


def status(ip: int) -> dict:
    return orjson.loads(STATUS % (ip, ip))


def test_equal_values_become_one_object_equal_to_what_was_given():
    shared = SharedValues()
    first, second = shared.share(status(1)), shared.share(status(1))
    assert first is second
    assert first == status(1)


def test_unequal_values_share_their_equal_parts_and_strings():
    shared = SharedValues()
    one, two = shared.share(status(1)), shared.share(status(2))
    assert one is not two
    assert one["conditions"] is two["conditions"]
    assert one["containerStatuses"][0]["lastState"] is two["containerStatuses"][0]["lastState"]
    assert one["phase"] is two["phase"]
    assert one["podIPs"] != two["podIPs"]


def test_what_is_given_is_not_changed():
    shared = SharedValues()
    shared.share(status(1))
    given = status(1)
    assert shared.share(given) is not given
    assert given == status(1)


def test_booleans_and_numbers_are_not_confused():
    shared = SharedValues()
    flag, number, real = shared.share({"a": True}), shared.share({"a": 1}), shared.share([1.0])
    assert flag["a"] is True
    assert type(number["a"]) is int
    assert type(shared.share([1])[0]) is int
    assert type(real[0]) is float


def test_long_strings_and_what_is_not_json_are_kept_as_they_are():
    shared = SharedValues(longest=4)
    long = "x" * 10
    assert shared.share(long) is long
    odd = {"a": {1, 2}}
    assert shared.share(odd) is odd


def test_a_sweep_lets_go_of_values_nobody_holds_and_keeps_the_others():
    shared = SharedValues()
    kept = shared.share(status(1))
    shared.share(status(2))  # held by nobody but the table
    gc.collect()
    shared.sweep()
    assert shared.share(status(1)) is kept, "what a cache holds is still shared"
    alone = SharedValues()
    alone.share(status(1))
    assert len(shared) == len(alone), "status(2)'s own parts are gone, the shared ones stay"


def test_the_table_follows_what_is_held_as_it_grows():
    shared = SharedValues(first_sweep=64)
    for i in range(10_000):
        shared.share(status(i))  # each dropped at once
    assert len(shared) < 200


@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-2, 2) | st.text(max_size=3),
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.text(max_size=2), children, max_size=3)
        ),
        max_leaves=12,
    )
)
def test_a_shared_value_encodes_as_the_value_does(value):
    shared = SharedValues()
    shared.share(orjson.loads(orjson.dumps(value)))
    assert orjson.dumps(shared.share(value)) == orjson.dumps(value)


def test_a_value_of_another_json_type_under_the_same_hash_is_not_handed_out():
    """``[1] == [True]`` in Python: a hit is checked by its encoding, not by ``==``."""
    table = SharedValues()
    table._table[hash(orjson.dumps([True]))] = [1]  # a collision, as unlikely as it is
    assert orjson.dumps(table.share([True])) == b"[true]"
    table._table[hash(orjson.dumps({"ready": False}))] = {"ready": 0}
    assert orjson.dumps(table.share({"ready": False})) == b'{"ready":false}'


def test_what_is_nested_deeper_than_pods_are_is_kept_as_it_is():
    """A target may answer a status nested hundreds of levels deep: each level shared would
    encode all it holds again, on every event."""
    inner: list = ["x"]
    deep: list = inner
    for _ in range(50):
        deep = [deep]
    shared = SharedValues().share(deep)
    assert shared == deep
    level = shared
    for _ in range(50):
        level = level[0]
    assert level is inner, "below the depth shared, the value given is kept"
