"""Where the wall time of a pytest run goes, process by process: loaded with `-p benchmarks._timeline` (xdist
passes it on to its workers), it appends one JSON line per event to the file named by PERFGUARD_TIMELINE:
the process's configure, its session start and finish, and each item's start and end, in epoch seconds.
`python -m benchmarks._timeline FILE...` prints, per run, when each process started, how long its items
took in all, and when it finished (benchmarks/two_gpu.sh)."""

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


def pytest_configure(config: pytest.Config) -> None:
    _emit(config, "configure")


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
    return rows


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print("\n".join(summary(Path(name))))
