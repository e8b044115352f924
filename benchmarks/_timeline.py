"""Where the wall time of a pytest run goes, process by process: loaded with `-p benchmarks._timeline` (xdist
passes it on to its workers), it appends one JSON line per event to the file named by PERFGUARD_TIMELINE:
the process's start (from /proc), its first configure hook, its header, the end of its
collection, its session start and finish, its unconfigure, and each item's start and end, in epoch seconds.
`python -m benchmarks._timeline FILE...` prints, per run, when each process started, how long its items
took in all, and when it finished, and where each process's time outside its items went
(benchmarks/two_gpu.sh)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

_PATH = os.environ.get("PERFGUARD_TIMELINE", "")


def _emit(config: pytest.Config, event: str, **fields: Any) -> None:
    if not _PATH:
        return
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    line = {"t": time.time(), "pid": os.getpid(), "worker": worker, "event": event, **fields}
    with open(_PATH, "a", encoding="utf-8") as f:  # one short write per line: lines of processes do not mix
        f.write(json.dumps(line) + "\n")


def _process_start() -> float | None:
    """This process's start in epoch seconds: its start in clock ticks after boot, plus the boot time."""
    try:
        ticks = float(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
        boot = next(float(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    _emit(config, "configure", process_start=_process_start())


@pytest.hookimpl(trylast=True)
def pytest_report_header(config: pytest.Config) -> list[str]:
    _emit(config, "header")
    return []


def pytest_collection_finish(session: pytest.Session) -> None:
    _emit(session.config, "collected")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    _emit(config, "unconfigure")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _emit(session.config, "sessionstart")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _emit(item.config, "start", id=item.nodeid)
    try:
        return (yield)
    finally:
        _emit(item.config, "end", id=item.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _emit(session.config, "sessionfinish")


def summary(path: Path) -> list[str]:
    """Per process of one run: its first event (s from the run's first), items and their summed seconds,
    the longest item, and its last event."""
    events = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    if not events:
        return [f"{path.name}: no events"]
    t0 = min(e["t"] for e in events)
    by: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by[(e["pid"], e["worker"])].append(e)
    rows = [f"{path.name}: {max(e['t'] for e in events) - t0:.1f} s from the first event to the last"]
    for (pid, worker), got in sorted(by.items(), key=lambda kv: min(e["t"] for e in kv[1])):
        starts = {e["id"]: e["t"] for e in got if e["event"] == "start"}
        spans = [(e["t"] - starts[e["id"]], e["id"]) for e in got if e["event"] == "end" and e["id"] in starts]
        first = min(e["t"] for e in got) - t0
        last = max(e["t"] for e in got) - t0
        first_item = f"{min(starts.values()) - t0:6.1f} s" if starts else "     -"
        longest = max(spans, default=(0.0, "-"))
        rows.append(
            f"  {worker:>6} pid {pid}: from {first:6.1f} s, first item at {first_item}, "
            f"{len(spans)} items {sum(s for s, _ in spans):6.1f} s, longest {longest[0]:.1f} s "
            f"({longest[1].split('::')[-1]}), last event {last:6.1f} s"
        )
        rows.append("         " + _phases(got, t0))
    return rows


PHASES = ("configure", "sessionstart", "header", "collected", "start", "sessionfinish", "unconfigure")


def _phases(events: list[dict[str, Any]], t0: float) -> str:
    """When the process started and reached each phase (its first item's start, the others' first event;
    its items' last end before its session's finish), in seconds from the run's first event."""
    at: dict[str, float] = {}
    for e in sorted(events, key=lambda e: e["t"]):
        at.setdefault(e["event"], e["t"] - t0)
        if e["event"] == "configure" and e.get("process_start"):
            at.setdefault("process", e["process_start"] - t0)
    ends = [e["t"] - t0 for e in events if e["event"] == "end"]
    if ends:
        at["last end"] = max(ends)
    order = ("process", *PHASES[:5], "last end", *PHASES[5:])
    return ", ".join(f"{name} {at[name]:.1f}" for name in order if name in at)


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print("\n".join(summary(Path(name))))
