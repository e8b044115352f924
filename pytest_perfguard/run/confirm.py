"""Confirm a regression in a fresh process before failing the build on it.

A measured slowdown can belong to the process rather than to the code: what the process did before (a
small Triton kernel ran several per cent faster on each fresh process's first inputs and graph than on any
later ones; see benchmarks/results/README.md) moves a few-microsecond kernel reproducibly within that
process. The in-process re-measurement cannot see past such a state; a new process can. So a case that is
still "regressed" after re-measurement is run once more, alone, in a fresh Python process with the same
settings and baseline, and fails the build only if it regresses there too. The same check keeps an update
run whose time moved past the case's threshold from restarting an entry on a process's whim.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from ..measure.device import SESSION_PIDS_ENV, session_pids
from ..record import CaseRecord, RecordError, Status
from ..settings import Settings
from .cleanup import CHILD_ENV, CONFIRM_PREFIX, die_with_parent, in_child

if TYPE_CHECKING:
    from ..judge.baseline import BaselineEntry
    from ..judge.verdict import Verdict
    from .session import SessionState
    from .watchdog import Deadline

MAX_PER_SESSION = 10  # past this many, regressions are real enough: the rest fail unconfirmed


class CaseRun(Protocol):
    """What a confirmation needs of the runner of the case it confirms."""

    item: pytest.Item
    state: SessionState

    @property
    def clock(self) -> Deadline: ...

    def fresh_process_timeout(self) -> float | None: ...


@dataclass
class Confirmation:
    status: Status
    info: dict[str, Any] | None = None  # what the fresh process measured, kept in the record
    note: str = ""  # added to the verdict's notes
    hold_back: str = ""  # an update run not to fold into the baseline, and why


def _plugin_args(config: pytest.Config) -> list[str]:
    """The `-p NAME` options of the original invocation (the plugin may be loaded that way)."""
    args = [str(a) for a in config.invocation_params.args]
    out: list[str] = []
    for i, a in enumerate(args):
        if a == "-p" and i + 1 < len(args):
            out += ["-p", args[i + 1]]
        elif a.startswith("-p") and len(a) > 2 and not a.startswith("--"):
            out += ["-p", a[2:]]
    return out


def run_fresh(item: pytest.Item, settings: Settings, timeout_s: float | None) -> CaseRecord | str:
    """Run `item` alone in a new process with these settings; its record, or why there is none."""
    got = run_fresh_cases(item.config, [item.nodeid], settings, timeout_s)
    if isinstance(got, str):
        return got
    return got.get(item.nodeid) or f"the fresh process did not run {item.nodeid}"


def run_fresh_cases(
    config: pytest.Config, nodeids: list[str], settings: Settings, timeout_s: float | None
) -> dict[str, CaseRecord] | str:
    """Run these items, in this order, in one new process with these settings (one start for many cases:
    a batch of confirmations, an update's further processes); their records by id, or why there are none."""
    # The pid in the name lets the next session remove the folder if this one is killed.
    with tempfile.TemporaryDirectory(prefix=f"{CONFIRM_PREFIX}{os.getpid()}-") as tmp:
        out = Path(tmp) / "confirm.json"
        env = dict(os.environ)
        env.pop("GITHUB_STEP_SUMMARY", None)
        env.update(settings.child_env())
        env.update(
            {
                CHILD_ENV: "1",
                "PERFGUARD_JSON": str(out),
                "PERFGUARD_TOTAL_BUDGET": "0",
                "PERFGUARD_STRICT": "0",
                "PERFGUARD_ALLOW_MISSING": "1",
                "PERFGUARD_HTML": "",
                # This process and its xdist siblings hold a context on the GPU: not foreign load.
                SESSION_PIDS_ENV: ",".join(str(p) for p in sorted(session_pids())),
            }
        )
        cmd = [sys.executable, "-m", "pytest", *nodeids, "-q", "-p", "no:cacheprovider", "--perfguard"]
        cmd += ["--rootdir", str(config.rootpath), *_plugin_args(config)]
        if config.inipath is not None:
            cmd += ["-c", str(config.inipath)]
        if config.pluginmanager.hasplugin("xdist"):
            cmd += ["-n", "0"]  # overrides an `-n` in addopts: these cases, in this one process
        try:
            proc = subprocess.run(
                cmd,
                cwd=config.rootpath,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
                preexec_fn=die_with_parent(),  # a kill -9 of this session must not leave it on the GPU
            )
        except subprocess.TimeoutExpired:
            return f"the fresh process did not finish in {timeout_s:g}s"
        except OSError as exc:
            return f"could not start a fresh process: {exc}"
        try:
            doc = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
            return f"the fresh process wrote no result (exit {proc.returncode}): " + " | ".join(tail)
    wanted = set(nodeids)
    records: dict[str, CaseRecord] = {}
    for raw in doc.get("results", []):
        if isinstance(raw, dict) and raw.get("id") in wanted:
            try:
                records[str(raw["id"])] = CaseRecord.from_json(raw)
            except RecordError as exc:
                return f"the fresh process wrote a record this version cannot read: {exc}"
    if not records:
        return f"the fresh process ran none of the {len(nodeids)} case(s) (exit {proc.returncode})"
    return records


def _fresh(run: CaseRun) -> tuple[CaseRecord | str, dict[str, Any]] | None:
    """The case run alone in a fresh process, within the session's cap: None once the cap is reached; else
    the child's record (or why there is none) and what to keep of it in this record's "confirmation"."""
    state = run.state
    if state.confirmations >= MAX_PER_SESSION:
        return None
    state.confirmations += 1
    t0 = time.monotonic()
    with run.clock.paused():  # the fresh process has its own deadline
        child = run_fresh(run.item, state.settings, run.fresh_process_timeout())
    spent = round(time.monotonic() - t0, 1)
    if isinstance(child, str):
        return child, {"error": child, "elapsed_s": spent}
    info: dict[str, Any] = {
        "verdict": child.verdict.value if child.verdict else None,
        "median_ns": child.median_ns,
        "ci_ns": list(child.ci_ns) if child.ci_ns else None,
        "ratio": child.ratio,
        "gates": child.gates,
        "reasons": child.reasons,
        "elapsed_s": spent,
    }
    return child, info


def confirm_regression(run: CaseRun, verdict: Verdict) -> Confirmation:
    """The verdict stays "regressed" only if the case regresses in a fresh process too; a regression seen in
    one process alone becomes inconclusive. When no confirmation can be had, the regression stands."""
    if not run.state.settings.confirm or in_child():
        return Confirmation(Status.REGRESSED)
    return _reconfirm(run, verdict, Status.REGRESSED, ("ab", "baseline"), ": a process-dependent time, not judged")


def confirm_faster(run: CaseRun, verdict: Verdict) -> Confirmation:
    """A/B only: "faster than the base revision" is a claim a pull request shows, and a process can make it
    alone. Two separately loaded copies of the same code can differ by a few percent for a whole process
    (cuda_scalar on H100s, benchmarks/results/ab_2026-11-23: up to 4.7%, stable within the process), which
    read as "faster" in 7 of 588 A/A verdicts. So the speed-up is checked in a fresh process: confirmed,
    it stands; "pass" there, the case passes (slower in neither process, faster in one only); anything else
    is inconclusive. Without a confirmation (off, the cap reached, a failed child) the verdict stands."""
    if not run.state.settings.confirm or in_child():
        return Confirmation(Status.FASTER)
    return _reconfirm(run, verdict, Status.FASTER, ("ab",), ": a process-dependent time")


def _reconfirm(run: CaseRun, verdict: Verdict, claim: Status, shown_gates: tuple[str, ...], tail: str) -> Confirmation:
    """`claim` (regressed or faster) stands if the fresh process makes it too, or if no fresh process can be
    had. Otherwise the case is inconclusive, or passes where a speed-up meets a pass."""

    def noted(status: Status, info: dict[str, Any] | None, text: str, first: bool = False) -> Confirmation:
        verdict.notes.insert(0 if first else len(verdict.notes), text)
        return Confirmation(status, info, text)

    fresh = _fresh(run)
    if fresh is None:
        return noted(claim, None, f"not confirmed in a fresh process: {MAX_PER_SESSION} confirmations already run")
    child, info = fresh
    if isinstance(child, str):
        what = "the regression" if claim is Status.REGRESSED else "the verdict"
        return noted(claim, info, f"confirmation failed, {what} stands: {child}")
    first = next((g.reason for g in verdict.gates if g.status is claim and g.reason), str(claim))
    again = next((g.get("reason") for g in child.gates if g.get("status") == claim), None)
    if child.verdict is claim:
        return noted(claim, info, f"confirmed in a fresh process: {again or claim}")
    shown = next((g.get("reason") for g in child.gates if g.get("gate") in shown_gates), None)
    text = (
        f"not confirmed: {first} in this process, but {child.verdict} in a fresh one"
        + (f" ({shown})" if shown else "")
        + tail
    )
    passed = claim is Status.FASTER and child.verdict is Status.PASS
    return noted(Status.PASS if passed else Status.INCONCLUSIVE, info, text, first=True)


def confirm_move(run: CaseRun, stored: BaselineEntry, median_ns: float, verdict: Verdict) -> Confirmation:
    """An update run whose time moved past the case's threshold from the stored centre would restart the
    case's entry (a changed kernel: see baseline.merge_entry). A slow or fast process can do that on its
    own, and would throw away the runs the centre was made of. So the case is measured against the stored
    entry in a fresh process: if it passes there, this run was the process, not the kernel, and it is held
    back from the baseline; otherwise the change stands and the entry restarts."""
    limit = run.state.policy().baseline_delta(stored)
    moved = math.log(median_ns / stored.median_ns)
    status = verdict.status
    if abs(moved) <= math.log1p(limit) or not run.state.settings.confirm or in_child():
        return Confirmation(status)
    here = f"{math.expm1(moved) * 100:+.1f}%"
    fresh = _fresh(run)
    if fresh is None:
        verdict.notes.append(
            f"moved {here} from the stored time; not checked in a fresh process ({MAX_PER_SESSION} confirmations "
            "already run): its entry restarts as a changed kernel"
        )
        return Confirmation(status)
    child, info = fresh
    if isinstance(child, str):
        verdict.notes.append(f"moved {here}; the fresh-process check failed ({child}): its entry restarts")
        return Confirmation(status, info)
    there = child.median_ns
    there_txt = f"{(there / stored.median_ns - 1) * 100:+.1f}%" if there else "?"
    if child.verdict is Status.PASS:  # within the same threshold of the stored time, in a fresh process
        why = (
            f"moved {here} from the stored time in this process but {there_txt} (pass) in a fresh one: the "
            f"process, not the kernel; this run is not folded into the baseline (its {stored.runs} run(s) kept)"
        )
        verdict.notes.insert(0, why)
        return Confirmation(status, info, hold_back=why)
    verdict.notes.append(
        f"moved {here} from the stored time here and {there_txt} ({child.verdict}) in a fresh process: "
        "a changed kernel, its entry restarts"
    )
    return Confirmation(status, info)
