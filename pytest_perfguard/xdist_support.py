"""The trip of records from xdist workers to the controller, and what happens when a worker dies.

Every record travels to the controller on the test report of the item that made it, the moment it is made,
so a worker that dies (a segfault, a hung kernel, or on purpose after a sticky CUDA error) loses nothing it
has already judged. The worker's end-of-session output carries only what the collection saw. The
controller also hands its resolved paths to the workers, so every process reads the same baseline.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

from .marker import MARK_NAME
from .progress import PROGRESS
from .record import CaseRecord, Outcome, Status, dumps_records, loads_records
from .session import MERGED, STATE, is_worker, state_of

WORKER_POISONED_EXIT = 3
RECORDS_ATTR = "perfguard_records"
ITEM_ATTR = "perfguard_item"
PATHS_KEY = "perfguard_paths"


def attach_records(config: pytest.Config, report: pytest.TestReport) -> None:
    """Put this process's records not yet sent on `report`."""
    state, merged = state_of(config), config.stash[MERGED]
    if len(state.records) > merged.sent:
        setattr(report, RECORDS_ATTR, dumps_records(state.records[merged.sent :]))
        merged.sent = len(state.records)


def mark_report(item: pytest.Item, report: pytest.TestReport) -> None:
    if is_worker(item.config) and STATE in item.config.stash:
        if item.get_closest_marker(MARK_NAME) is not None:
            setattr(report, ITEM_ATTR, True)
        attach_records(item.config, report)


def exit_if_poisoned(item: pytest.Item) -> None:
    """A worker whose CUDA context a case poisoned leaves before xdist marks the item complete: the
    controller starts a fresh worker and hands it this worker's remaining cases."""
    config = item.config
    if not (is_worker(config) and STATE in config.stash and state_of(config).poisoned_by == item.nodeid):
        return
    worker = config.workerinput["workerid"]  # type: ignore[attr-defined]
    sys.stderr.write(
        f"\nperfguard: {item.nodeid} poisoned the CUDA context of worker {worker}; the worker exits and xdist "
        "replaces it\n"
    )
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(WORKER_POISONED_EXIT)


def send_timeout(config: pytest.Config, item: pytest.Item, message: str) -> None:
    """A worker's hung case: report its failure (and its record) to the controller before the exit."""
    report = pytest.TestReport(
        nodeid=item.nodeid, location=item.location, keywords={}, outcome="failed", longrepr=message, when="call"
    )
    attach_records(config, report)
    config.hook.pytest_runtest_logreport(report=report)


def worker_output(config: pytest.Config) -> None:
    merged, state = config.stash[MERGED], state_of(config)
    config.workeroutput["perfguard"] = json.dumps(  # type: ignore[attr-defined]
        {
            "collected": sorted(merged.collected),
            "deselected": merged.deselected,
            "family_size": state.family_size,
            "warmups": state.warmups,
        }
    )


def node_down(node: Any) -> None:
    """Fold a finished worker's collection into the controller's view."""
    raw = (getattr(node, "workeroutput", None) or {}).get("perfguard")
    if not raw:
        return
    data = json.loads(raw)
    config = node.config
    merged = config.stash[MERGED]
    merged.collected.update(data["collected"])
    merged.deselected = merged.deselected or data["deselected"]
    state = state_of(config)
    state.family_size = max(state.family_size, int(data.get("family_size", 1)))
    state.warmups.extend(data.get("warmups", []))


def worker_paths(config: pytest.Config) -> dict[str, str] | None:
    """The paths the controller resolved, as a worker received them."""
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else workerinput.get(PATHS_KEY)


class Controller:
    """The xdist controller's side: collect records as reports arrive, and account for crashed workers."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.perf_items: set[str] = set()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        s = state_of(self.config).settings
        node.workerinput[PATHS_KEY] = {
            name: str(getattr(s, name)) for name in ("baseline_dir", "json", "html") if getattr(s, name) is not None
        }

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if getattr(report, ITEM_ATTR, False):
            self.perf_items.add(report.nodeid)
        raw = getattr(report, RECORDS_ATTR, None)
        if raw:
            records = loads_records(raw)
            self.config.stash[MERGED].records.extend(records)
            line = self.config.stash.get(PROGRESS, None)
            if line is not None:
                line.finished(records)  # one line per measured case: workers have no terminal

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        merged = self.config.stash[MERGED]
        mine = [r for r in merged.records if r.id == crashitem]
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "?")
        timed_out = any(r.verdict is Status.TIMEOUT for r in mine)
        if timed_out or any(r.sticky for r in mine):
            # The case has already failed with its own reason, and the worker left on purpose. Turn xdist's
            # "crashed" report into an empty teardown so the case is not counted twice.
            report.outcome = "passed"
            report.when = "teardown"
            report.longrepr = None
            why = "timed out" if timed_out else "poisoned its CUDA context"
            merged.notes.append(
                f"perfguard: worker {worker} ended after {crashitem} {why}; a fresh worker ran its remaining cases"
            )
            return
        if crashitem in self.perf_items and not mine:
            merged.records.append(
                CaseRecord(
                    id=crashitem,
                    outcome=Outcome.FAILED,
                    verdict=Status.ERROR,
                    crashed=True,
                    reasons=[
                        f"worker {worker} crashed while running this case (the process died: segfault, abort or killed)"
                    ],
                )
            )


def controller_setup(config: pytest.Config) -> None:
    if not is_worker(config) and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(Controller(config), "perfguard-controller")
