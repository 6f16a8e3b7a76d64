"""The finalizer helpers every controller of the product uses: one patch shape, with the label
that lets a selector find the objects holding the finalizer."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from multicluster.gc import finalizer_changes, finalizer_patch

OURS = "example.com/cleanup"
LABEL = "example.com/has-finalizer"


def obj(finalizers=None, labels=None) -> dict:
    return {
        "metadata": {
            "name": "a",
            "resourceVersion": "7",
            "finalizers": finalizers or [],
            "labels": labels or {},
        }
    }


def test_adding_keeps_other_finalizers_and_marks_the_object():
    assert finalizer_patch(obj(["other"]), OURS, True, LABEL) == {
        "metadata": {
            "finalizers": ["other", OURS],
            "labels": {LABEL: "true"},
            "resourceVersion": "7",
        }
    }


def test_removing_keeps_other_finalizers_and_drops_the_mark():
    held = obj(["other", OURS], {LABEL: "true", "app": "x"})
    assert finalizer_patch(held, OURS, False, LABEL) == {
        "metadata": {"finalizers": ["other"], "labels": {LABEL: None}, "resourceVersion": "7"}
    }


def test_nothing_to_change_is_no_patch():
    assert finalizer_patch(obj([OURS], {LABEL: "true"}), OURS, True, LABEL) is None
    assert finalizer_patch(obj(["other"]), OURS, False, LABEL) is None
    assert finalizer_patch(obj([OURS]), OURS, True) is None


def test_a_missing_mark_alone_is_put_back():
    assert finalizer_changes(obj([OURS])["metadata"], OURS, True, LABEL) == {
        "labels": {LABEL: "true"}
    }


names = st.sampled_from([OURS, "other", "third"])


@given(st.lists(names, unique=True), st.booleans(), st.booleans())
def test_applying_the_changes_gives_what_was_asked(finalizers, marked, present):
    meta = obj(finalizers, {LABEL: "true"} if marked else {})["metadata"]
    changes = finalizer_changes(meta, OURS, present, LABEL)
    after = changes.get("finalizers", finalizers)
    assert (OURS in after) == present
    assert [f for f in after if f != OURS] == [f for f in finalizers if f != OURS]
    labels = {**meta["labels"], **changes.get("labels", {})}
    assert (labels.get(LABEL) == "true") == present
