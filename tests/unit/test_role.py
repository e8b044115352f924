"""The process role: decided once from the config and the environment a parent set (run/role.py)."""

from __future__ import annotations

import pytest

from pytest_perfguard.run.role import ALONE_ENV, CHILD_ENV, ROLE, UPDATE_PROCESS_ENV, Role, role_of


def test_the_environment_a_parent_sets_decides_the_kind_of_child() -> None:
    assert Role.of(None, {}) == Role()
    assert Role.of(None, {CHILD_ENV: "1", ALONE_ENV: "1"}) == Role(child=True, alone=True)
    assert Role.of(None, {CHILD_ENV: "1", UPDATE_PROCESS_ENV: "1", ALONE_ENV: "0"}) == Role(
        child=True, update_process=True
    )
    # the marks of a child mean nothing in a process no parent started as one
    assert Role.of(None, {ALONE_ENV: "1", UPDATE_PROCESS_ENV: "1"}) == Role()


@pytest.mark.parametrize(
    ("environ", "ci"),
    [
        ({}, False),
        ({"CI": "true"}, True),
        ({"CI": "0"}, False),
        ({"CI": " False "}, False),
        ({"GITHUB_ACTIONS": "1"}, True),
    ],
)
def test_ci_is_any_of_its_variables_set_to_something_true(environ: dict[str, str], ci: bool) -> None:
    assert Role.of(None, environ).ci is ci


def test_the_role_is_decided_once_per_config(pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the plugin decided at configure is what every reader sees, whatever the environment does later."""
    decided = Role(ci=True)
    monkeypatch.setitem(pytestconfig.stash, ROLE, decided)
    monkeypatch.delenv("CI", raising=False)
    assert role_of(pytestconfig) is decided and role_of(pytestconfig).ci
