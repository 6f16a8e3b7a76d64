"""Typed errors from an API server's Status: what callers branch on."""

from __future__ import annotations

from multicluster.errors import (
    AlreadyExists,
    Conflict,
    Forbidden,
    NamespaceTerminating,
    error_for,
)


def status(code: int, reason: str, message: str, causes: object = None) -> dict:
    body: dict = {"kind": "Status", "code": code, "reason": reason, "message": message}
    if causes is not None:
        body["details"] = {"causes": causes}
    return body


TERMINATING = [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]


def test_a_create_in_a_namespace_being_deleted_is_its_own_forbidden():
    error = error_for(403, status(403, "Forbidden", "being terminated", TERMINATING), "POST x")
    assert type(error) is NamespaceTerminating
    assert isinstance(error, Forbidden)
    assert error.message == "being terminated"


def test_a_refusal_by_rbac_is_plain_forbidden():
    error = error_for(403, status(403, "Forbidden", 'User "x" cannot list'), "GET x")
    assert type(error) is Forbidden


def test_causes_of_any_other_shape_are_not_taken_for_it():
    for causes in ("NamespaceTerminating", [["NamespaceTerminating"]], [{"type": "Other"}], {}):
        error = error_for(403, status(403, "Forbidden", "no", causes), "GET x")
        assert type(error) is Forbidden, causes
    # only a 403 is one: the same cause on another status is that status's error
    conflict = error_for(409, status(409, "Conflict", "changed", TERMINATING), "PUT x")
    assert type(conflict) is Conflict


def test_already_exists_is_still_told_apart():
    error = error_for(409, status(409, "AlreadyExists", "exists"), "POST x")
    assert type(error) is AlreadyExists
