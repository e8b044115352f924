"""Which kind of process this is, decided once at configure time (`Role.of`) from pytest's config and the
environment that the process which started this one set; everything reads that one value (`role_of`, or
the session state's `role`), never the environment.

The kinds: the process a user started (under xdist, its controller); an xdist worker, whose controller
merges, reports and decides; a fresh process started by confirm.py to confirm a regression or measure a
case again (a child), which never confirms again; a child confirming a batch, whose cases are judged as if
each ran alone; a child measuring one more process of an update. And whether the run is under CI, where an
unverified case fails it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import pytest

CHILD_ENV = "PERFGUARD_CONFIRMING"  # set in a fresh process (confirm.py), so it does not confirm again
# Set in an update's further processes: the times they measure are stored, under A/A too.
UPDATE_PROCESS_ENV = "PERFGUARD_UPDATE_PROCESS"
# Set in a batch's fresh process: each case there is judged as a single confirmation judges its one case
# (a family of one), not widened for the batch's size.
ALONE_ENV = "PERFGUARD_CONFIRM_ALONE"
CI_ENVS = ("CI", "GITHUB_ACTIONS")


@dataclass(frozen=True)
class Role:
    worker: bool = False  # an xdist worker
    child: bool = False  # a fresh process of confirm.py
    alone: bool = False  # a child confirming a batch: each case judged as if it ran alone
    update_process: bool = False  # a child measuring one more process of an update
    ci: bool = False  # CI or GITHUB_ACTIONS set (not "", "0" or "false")

    @classmethod
    def of(cls, config: pytest.Config | None, environ: Mapping[str, str] = os.environ) -> Role:
        child = environ.get(CHILD_ENV) == "1"
        return cls(
            worker=config is not None and hasattr(config, "workerinput"),
            child=child,
            alone=child and environ.get(ALONE_ENV) == "1",
            update_process=child and environ.get(UPDATE_PROCESS_ENV) == "1",
            ci=any(environ.get(k, "").strip().lower() not in ("", "0", "false") for k in CI_ENVS),
        )


ROLE = pytest.StashKey[Role]()


def role_of(config: pytest.Config) -> Role:
    """The process's role, as decided at configure time (decided now where configure has not run yet)."""
    role = config.stash.get(ROLE, None)
    if role is None:
        role = config.stash[ROLE] = Role.of(config)
    return role
