"""The trip of records from xdist workers to the controller, and what happens when a worker dies.

Every record travels to the controller on the test report of the item that made it, the moment it is made,
so a worker that dies (a segfault, a hung kernel, or on purpose after a sticky CUDA error) loses nothing it
has already judged. The worker's end-of-session output carries only what the collection saw. The
controller also hands its resolved paths to the workers, so every process reads the same baseline.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from .. import settings as st
from ..judge.baseline import BaselineEntry
from ..marker import MARK_NAME
from ..measure.visible import device_index, timing_gpus
from ..measure.visible import gpu_names as gpu_names  # re-exported: the seam tests fake GPUs at
from ..record import CaseRecord, Outcome, Status, dumps_records, loads_records
from ..report.writers import PATH_SETTINGS
from .progress import PROGRESS
from .role import role_of
from .state import MERGED, STATE, state_of

WORKER_POISONED_EXIT = 3
RECORDS_ATTR = "perfguard_records"
ITEM_ATTR = "perfguard_item"
PATHS_KEY = "perfguard_paths"
GPU_KEY = "perfguard_gpu"  # the CUDA index the controller gave a worker
CONTROLLER = "perfguard-controller"  # the Controller's name with the plugin manager


def attach_records(config: pytest.Config, report: pytest.TestReport) -> None:
    """Put this process's records not yet sent on `report`."""
    state, merged = state_of(config), config.stash[MERGED]
    if len(state.records) > merged.sent:
        setattr(report, RECORDS_ATTR, dumps_records(state.records[merged.sent :]))
        merged.sent = len(state.records)


def mark_report(item: pytest.Item, report: pytest.TestReport) -> None:
    if role_of(item.config).worker and STATE in item.config.stash:
        if item.get_closest_marker(MARK_NAME) is not None:
            setattr(report, ITEM_ATTR, True)
        attach_records(item.config, report)


def exit_if_poisoned(item: pytest.Item) -> None:
    """A worker whose CUDA context a case poisoned leaves before xdist marks the item complete: the
    controller starts a fresh worker and hands it this worker's remaining cases."""
    config = item.config
    if not (role_of(config).worker and STATE in config.stash and state_of(config).poisoned_by == item.nodeid):
        return
    worker = config.workerinput["workerid"]  # type: ignore[attr-defined]
    sys.stderr.write(
        f"\nperfguard: {item.nodeid} poisoned the CUDA context of worker {worker}; the worker exits and xdist "
        "replaces it\n"
    )
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(WORKER_POISONED_EXIT)


def send_timeout(config: pytest.Config, nodeid: str, location: tuple[str, int | None, str], message: str) -> None:
    """A worker's hung case: report its failure (and its record) to the controller before the exit."""
    report = pytest.TestReport(
        nodeid=nodeid, location=location, keywords={}, outcome="failed", longrepr=message, when="call"
    )
    attach_records(config, report)
    config.hook.pytest_runtest_logreport(report=report)


def late_reports(config: pytest.Config) -> bool:
    """Whether this process can log an item's reports after the item's protocol ended (confirm.Batch):
    always outside an xdist worker; in one, when its reporter is one that `reporting_as` can point."""
    return not role_of(config).worker or _worker_reporter(config) is not None


@contextlib.contextmanager
def reporting_as(item: pytest.Item) -> Iterator[None]:
    """Around logging `item`'s reports after its protocol ended. A worker's xdist reporter sends each report
    as the item it ran last, and checks that the ids agree: it is pointed at `item` meanwhile."""
    reporter = _worker_reporter(item.config)
    if reporter is None:
        yield
        return
    before = reporter.item_index
    reporter.item_index = item.session.items.index(item)
    try:
        yield
    finally:
        reporter.item_index = before


def _worker_reporter(config: pytest.Config) -> Any:
    """xdist's worker-side reporter (its WorkerInteractor), when this is a worker and it has one."""
    if not role_of(config).worker:
        return None
    for plugin in config.pluginmanager.get_plugins():
        if type(plugin).__name__ == "WorkerInteractor" and hasattr(plugin, "item_index"):
            return plugin
    return None


def worker_output(config: pytest.Config) -> None:
    merged, state = config.stash[MERGED], state_of(config)
    config.workeroutput["perfguard"] = json.dumps(  # type: ignore[attr-defined]
        {
            "collected": sorted(merged.collected),
            "deselected": merged.deselected,
            "family_size": state.family_size,
            "warmups": state.warmups,
            "device": state.settings.device,
            "fingerprint": state.fingerprint,
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
    if state.fingerprint is None and data.get("fingerprint") and data.get("device") == state.settings.device:
        # The controller's device is its first worker's (worker_gpu): that worker's fingerprint is the one it
        # would read, without importing torch (measure/visible.py). Where no worker reports it, it reads its own.
        state.fingerprint = data["fingerprint"]


# ---------------------------------------------------------------------------------------- GPUs per worker


def is_controller(config: pytest.Config) -> bool:
    """This process is an xdist controller: it starts workers and runs no case itself."""
    return not role_of(config).worker and getattr(config.option, "dist", "no") != "no"


def worker_index(config: pytest.Config) -> int:
    """N of xdist worker gwN; 0 in a run without workers (and in the controller)."""
    worker = str(getattr(config, "workerinput", {}).get("workerid", "gw0"))
    return int(worker[2:]) if worker[2:].isdigit() else 0


def gpus_for(names: Sequence[str], *, enabled: bool) -> list[int]:
    """The GPUs workers are spread over: under --perfguard those of cuda:0's model (visible.timing_gpus),
    else all of them (correctness compares with no stored time)."""
    return timing_gpus(names) if enabled else list(range(len(names)))


def worker_gpu(config: pytest.Config, *, enabled: bool) -> str:
    """This process's GPU: the one the controller gave it (GpuShares), else worker gwN takes the N-th GPU in
    turn, so N workers on N GPUs time in parallel."""
    given = getattr(config, "workerinput", {}).get(GPU_KEY)
    if isinstance(given, int):
        return f"cuda:{given}"
    gpus = gpus_for(gpu_names(), enabled=enabled)
    return f"cuda:{gpus[worker_index(config) % len(gpus)]}"


class GpuShares:
    """The controller's account of which worker holds which GPU. A new worker takes the GPU with the fewest
    live workers, so the replacement of a crashed worker (xdist names it gwN+1) takes its GPU, not the
    N+1-th, which would leave one GPU idle and put two workers on another."""

    def __init__(self, gpus: Sequence[int]) -> None:
        self.gpus = list(gpus)
        self.held: dict[str, int] = {}

    def take(self, worker: str) -> int | None:
        if not self.gpus:
            return None
        load = Counter(self.held.values())
        gpu = min(self.gpus, key=lambda g: (load[g], self.gpus.index(g)))
        self.held[worker] = gpu
        return gpu

    def release(self, worker: str) -> None:
        self.held.pop(worker, None)


def auto_workers(config: pytest.Config) -> int | None:
    """`-n auto` under --perfguard: one worker per GPU the run times on. Every GPU times at once, and no
    two workers wait on one GPU's timing lock holding a context and host cores. None leaves the count to
    xdist: a run without --perfguard or without a GPU, or PYTEST_XDIST_AUTO_NUM_WORKERS set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    settings = st.from_config(config)
    if not settings.enabled or settings.device == "cpu":
        return None
    names = gpu_names()
    if not names:
        return None
    return 1 if settings.device.startswith("cuda:") else len(gpus_for(names, enabled=True))


def gpu_lines(names: Sequence[str], workers: int, *, enabled: bool, pinned: int | None = None) -> list[str]:
    """The header's account of the host's GPUs: which the run uses, and which it leaves out and why."""
    if not names:
        return []
    gpus = [pinned] if pinned is not None else gpus_for(names, enabled=enabled)
    per = Counter(gpus[i % len(gpus)] for i in range(max(workers, 1)))

    def listed(indices: Sequence[int]) -> str:
        by_name: dict[str, list[str]] = {}
        for i in sorted(indices):
            by_name.setdefault(names[i], []).append(f"cuda:{i}")
        return "; ".join(f"{', '.join(devs)} ({name})" for name, devs in by_name.items())

    if workers == 0:
        how = ""
    elif max(per.values()) == 1:
        how = ", one xdist worker each"
    else:
        how = f", {workers} xdist workers over them (they take turns timing on each GPU)"
    lines = [f"perfguard: GPUs used: {listed(sorted(per))}{how}"]
    other = [i for i in range(len(names)) if i not in gpus]
    if other and pinned is None:
        lines.append(
            f"perfguard: GPUs not used: {listed(other)}: not the model of cuda:{gpus[0]}, and a case is timed on "
            f"one model; time them in a run of their own with --perfguard-device cuda:{other[0]} "
            "(their own baseline file)"
        )
    idle = [i for i in gpus if i not in per]
    if idle and workers:
        lines.append(
            f"perfguard: GPUs idle: {listed(idle)}: -n {workers} starts fewer workers; -n auto starts one each"
        )
    return lines


def gpu_header(config: pytest.Config, settings: st.Settings) -> list[str]:
    """gpu_lines for this run, in the process that prints the header (a worker prints none)."""
    if not settings.device.startswith("cuda") or role_of(config).worker:
        return []
    distributed = getattr(config.option, "dist", "no") != "no"
    workers = int(getattr(config.option, "numprocesses", 0) or 0) if distributed else 0
    index = device_index(settings.device)
    pinned = index if workers == 0 or st.from_config(config).device.startswith("cuda:") else None
    return gpu_lines(gpu_names(), workers, enabled=settings.enabled, pinned=pinned)


def longest_first(items: list[pytest.Item], stored: Mapping[str, BaselineEntry]) -> None:
    """Order a worker's collection so that the perf cases with the longest stored kernel times come first; the
    other items keep their places. xdist hands items out in collection order, a few at a time, and the seed
    grid lists each variant's largest shape last: on a host with two H200s, one worker still timed
    cuda_scalar S4096 (11 s) when the other had finished, 9 s of a 73 s run with one GPU idle
    (benchmarks/results/two_gpu_h200_2026-11-27). Longest first, the last items handed out are the shortest.
    A case is timed interleaved with its `against` call, so both times count; a case with no stored entry
    goes first, its time unknown. Every worker reads the same baseline file, so every worker's collection
    has the same order, as xdist requires."""

    def ns_per_call(item: pytest.Item) -> float:
        entry = stored.get(item.nodeid)
        if entry is None:
            return math.inf
        return entry.median_ns * (1.0 + 1.0 / entry.ratio if entry.ratio else 1.0)

    places = [i for i, item in enumerate(items) if item.get_closest_marker(MARK_NAME) is not None]
    ranked = sorted((items[i] for i in places), key=ns_per_call, reverse=True)  # stable: ties keep order
    for i, item in zip(places, ranked, strict=True):
        items[i] = item


def worker_paths(config: pytest.Config) -> dict[str, str] | None:
    """The paths the controller resolved, as a worker received them."""
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else workerinput.get(PATHS_KEY)


class Controller:
    """The xdist controller's side: collect records as reports arrive, and account for crashed workers."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.perf_items: set[str] = set()
        s = state_of(config).settings
        spread = s.device.startswith("cuda") and not st.from_config(config).device.startswith("cuda:")
        self.shares = GpuShares(gpus_for(gpu_names(), enabled=s.enabled) if spread else [])

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        s = state_of(self.config).settings
        node.workerinput[PATHS_KEY] = {
            name: str(getattr(s, name)) for name in ("baseline_dir", *PATH_SETTINGS) if getattr(s, name) is not None
        }
        gpu = self.shares.take(str(node.gateway.id))
        if gpu is not None:
            node.workerinput[GPU_KEY] = gpu

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        self.shares.release(str(node.gateway.id))

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


def update_devices(config: pytest.Config) -> list[str]:
    """The GPUs an update's further processes spread over (update.FreshProcesses): those this run's
    workers time on, where they are two or more; else none, and those processes run one after another on
    the run's own device. A run pinned to one GPU (--perfguard-device cuda:N, -n 0) keeps to it."""
    controller = config.pluginmanager.get_plugin(CONTROLLER)
    if controller is None or getattr(config.option, "dist", "no") == "no":
        return []
    workers = int(getattr(config.option, "numprocesses", 0) or 0)
    gpus = controller.shares.gpus
    used = sorted({gpus[i % len(gpus)] for i in range(workers)}) if gpus else []
    return [f"cuda:{g}" for g in used] if len(used) > 1 else []


def controller_setup(config: pytest.Config) -> None:
    if not role_of(config).worker and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(Controller(config), CONTROLLER)
