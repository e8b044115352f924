"""Fresh processes: pytest started again on some cases, with this session's settings and baseline, for a
confirmation, a batch, a replay in context or an update's further process; and what a record keeps of
what one measured."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ..record import CaseRecord, Confirmed
from ..report.results import ResultsError, read_results
from ..report.writers import PATH_SETTINGS
from ..settings import BY_NAME, Settings
from .caseitem import CaseItem
from .cleanup import CONFIRM_PREFIX, die_with_parent
from .role import ALONE_ENV, CHILD_ENV, UPDATE_PROCESS_ENV, role_of


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


def run_fresh(item: CaseItem, settings: Settings, timeout_s: float | None) -> CaseRecord | str:
    """Run `item` alone in a new process with these settings; its record, or why there is none."""
    got = start_fresh_cases(item.config, [item.nodeid], settings, timeout_s).result()
    if isinstance(got, str):
        return got
    return got.get(item.nodeid) or f"the fresh process did not run {item.nodeid}"


@dataclass
class FreshProcess:
    """A fresh process started on some cases (start_fresh_cases); ``result`` waits for it. Its output goes to
    a file, not a pipe: several of them can run at once (an update's processes, one per GPU) from this one
    thread, and none blocks on a full pipe while another is waited for."""

    folder: tempfile.TemporaryDirectory[str]
    nodeids: list[str]  # the cases whose records are read (a replay's context cases run, but are not read)
    timeout_s: float | None
    started: float = field(default_factory=time.monotonic)
    proc: subprocess.Popen[bytes] | None = None
    error: str = ""

    def result(self) -> dict[str, CaseRecord] | str:
        """Its records by id, or why there are none; the process is killed past its timeout."""
        folder = Path(self.folder.name)
        try:
            if self.proc is None:
                return self.error
            left = None if self.timeout_s is None else max(self.started + self.timeout_s - time.monotonic(), 0.0)
            try:
                self.proc.wait(timeout=left)
            except BaseException as exc:  # its timeout, or this session interrupted: the child goes too
                self.proc.kill()
                self.proc.wait()
                if isinstance(exc, subprocess.TimeoutExpired):
                    return f"the fresh process did not finish in {self.timeout_s:g}s"
                raise
            if not (folder / "confirm.json").is_file():
                tail = (folder / "output.txt").read_text(encoding="utf-8", errors="replace").strip().splitlines()
                return f"the fresh process wrote no result (exit {self.proc.returncode}): " + " | ".join(tail[-3:])
            return _records_of(folder / "confirm.json", self.nodeids, self.proc.returncode)
        finally:
            self.folder.cleanup()


def start_fresh_cases(
    config: pytest.Config,
    nodeids: list[str],
    settings: Settings,
    timeout_s: float | None,
    *,
    total_budget: float = 0.0,
    alone: bool = False,
    update: bool = False,
    judged: Sequence[str] | None = None,
) -> FreshProcess:
    """Start these items, in this order, in one new process with these settings (one start for many cases: a
    batch of confirmations, an update's further processes); its ``result()`` waits for their records by id,
    or says why there are none, and the process runs meanwhile. ``total_budget``: seconds of measurement the
    process may spend (0: unlimited); ``alone``: judge each case as a family of one, as a single confirmation
    does; ``update``: one of an update's processes, whose times are stored; ``judged``: the items whose
    records are read, when the others only run before them (a replay in context, `replay_in_context`)."""
    _release_device_memory()
    read = list(nodeids) if judged is None else list(judged)
    # The pid in the name lets the next session remove the folder if this one is killed.
    fresh = FreshProcess(tempfile.TemporaryDirectory(prefix=f"{CONFIRM_PREFIX}{os.getpid()}-"), read, timeout_s)
    folder = Path(fresh.folder.name)
    env = _child_env(settings, folder / "confirm.json", total_budget, alone=alone, update=update)
    try:
        with (folder / "output.txt").open("wb") as output:
            fresh.proc = subprocess.Popen(
                _child_command(config, nodeids, in_order=judged is not None),
                cwd=config.rootpath,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent(),  # a kill -9 of this session must not leave it on the GPU
            )
    except OSError as exc:
        fresh.error = f"could not start a fresh process: {exc}"
    return fresh


def _release_device_memory() -> None:
    """The GPU memory this process's allocator keeps cached goes back to the driver before a fresh process
    starts on the same GPU. An update's further processes time torch_hybrid S4096 (4 GiB of scores a graph)
    against its twin, which alone can fill most of an H100."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


def _child_env(settings: Settings, out: Path, total_budget: float, *, alone: bool, update: bool) -> dict[str, str]:
    """The fresh process's environment: this one's, with the settings handed over. Its results go to ``out``
    alone (the reports are this run's to write), and only its records count: strict and missing-baseline
    failures are this run's to decide."""
    from ..measure.device import SESSION_PIDS_ENV, session_pids  # torch: not at import, see measure/visible.py

    env = dict(os.environ)
    env.pop("GITHUB_STEP_SUMMARY", None)
    env.update(settings.child_env())
    env.update({BY_NAME[name].env: "" for name in PATH_SETTINGS})  # it writes its results file and no other
    env.update(
        {
            CHILD_ENV: "1",
            "PERFGUARD_JSON": str(out),
            "PERFGUARD_TOTAL_BUDGET": repr(float(total_budget)),
            "PERFGUARD_STRICT": "0",
            "PERFGUARD_ALLOW_MISSING": "1",
            # This process and its xdist siblings hold a context on the GPU: not foreign load.
            SESSION_PIDS_ENV: ",".join(str(p) for p in sorted(session_pids())),
            ALONE_ENV: "1" if alone else "0",
            UPDATE_PROCESS_ENV: "1" if update else "0",
        }
    )
    return env


def _child_command(config: pytest.Config, nodeids: list[str], *, in_order: bool = False) -> list[str]:
    """pytest on these items with this session's rootdir, config file and `-p` plugins, in one process.
    ``in_order``: a replay in context, whose items must all run, in the order given."""
    cmd = [sys.executable, "-m", "pytest", *nodeids, "-q", "-p", "no:cacheprovider", "--perfguard"]
    cmd += ["--rootdir", str(config.rootpath), *_plugin_args(config)]
    if config.inipath is not None:
        cmd += ["-c", str(config.inipath)]
    if config.pluginmanager.hasplugin("xdist"):
        cmd += ["-n", "0"]  # overrides an `-n` in addopts: these cases, in this one process
    if in_order:
        # A context case that fails there must not stop the run before the case it precedes (an `-x` in
        # addopts), and pytest-randomly would shuffle the order that is the point of the run.
        cmd += ["--maxfail", "0", "-p", "no:randomly"]
    return cmd


def _records_of(path: Path, nodeids: list[str], returncode: int) -> dict[str, CaseRecord] | str:
    """The records of these items in the fresh process's results file (read by the results codec), or why
    there are none."""
    try:
        found = read_results(path).by_id()
    except ResultsError as exc:
        return f"the fresh process wrote a results file this version cannot read: {exc}"
    records = {i: found[i] for i in nodeids if i in found}
    if not records:
        return f"the fresh process ran none of the {len(nodeids)} case(s) (exit {returncode})"
    return records


def confirmed_of(child: CaseRecord | str, spent: float) -> Confirmed:
    """What a record keeps of its confirmation in a fresh process."""
    if isinstance(child, str):
        return Confirmed(error=child, elapsed_s=spent)
    return Confirmed(
        verdict=child.verdict,
        median_ns=child.median_ns,
        ci_ns=child.ci_ns,
        ratio=child.ratio,
        gates=list(child.gates),
        reasons=list(child.reasons),
        elapsed_s=spent,
    )


def say(config: pytest.Config, text: str) -> None:
    """A line on the terminal, past output capture (a batch can take minutes); nothing in a worker."""
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is None or role_of(config).worker:
        return
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else nullcontext():
        reporter.write_line(text)
