"""Confirm a regression in a fresh process before failing the build on it.

A measured slowdown can belong to the process rather than to the code: what the process did before (on
an H200, a 4 us Triton kernel ran 8% faster on each fresh process's first inputs and graph than on any
later ones; benchmarks/placement_probe.py) moves a few-microsecond kernel by several per cent,
reproducibly within that process. The in-process re-measurement cannot see past such a state; a new process can. So
a case that is still "regressed" after re-measurement is run once more, alone, in a fresh Python process
with the same settings and baseline, and fails the build only if it regresses there too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from .device import SESSION_PIDS_ENV, session_pids

CHILD_ENV = "PERFGUARD_CONFIRMING"  # set in the fresh process, so it does not confirm again
MAX_PER_SESSION = 10  # past this many, regressions are real enough: the rest fail unconfirmed


def in_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


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


def run_fresh(item: pytest.Item, settings: Any, timeout_s: float | None) -> dict[str, Any] | str:
    """Run `item` alone in a new process; its record, or why there is none."""
    config = item.config
    with tempfile.TemporaryDirectory(prefix="perfguard-confirm-") as tmp:
        out = Path(tmp) / "confirm.json"
        env = dict(os.environ)
        env.pop("GITHUB_STEP_SUMMARY", None)
        env.update(
            {
                CHILD_ENV: "1",
                "PERFGUARD_JSON": str(out),
                "PERFGUARD_BASELINE_DIR": str(Path(settings.baseline_dir).resolve()),
                "PERFGUARD_MARGIN": repr(settings.margin),
                "PERFGUARD_CI_TARGET": repr(settings.ci_target),
                "PERFGUARD_CASE_BUDGET": repr(settings.case_budget),
                "PERFGUARD_CASE_TIMEOUT": repr(settings.case_timeout),
                "PERFGUARD_TOTAL_BUDGET": "0",
                "PERFGUARD_STRICT": "0",
                "PERFGUARD_DEVICE": settings.device,
                # This process and its xdist siblings hold a context on the GPU: not foreign load.
                SESSION_PIDS_ENV: ",".join(str(p) for p in sorted(session_pids())),
            }
        )
        cmd = [sys.executable, "-m", "pytest", item.nodeid, "-q", "-p", "no:cacheprovider", "--perfguard"]
        cmd += ["--rootdir", str(config.rootpath), *_plugin_args(config)]
        if config.inipath is not None:
            cmd += ["-c", str(config.inipath)]
        if config.pluginmanager.hasplugin("xdist"):
            cmd += ["-n", "0"]  # overrides an `-n` in addopts: one case, in this one process
        try:
            proc = subprocess.run(
                cmd, cwd=config.rootpath, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
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
    mine = [r for r in doc.get("results", []) if r.get("id") == item.nodeid]
    if not mine:
        return f"the fresh process did not run {item.nodeid} (exit {proc.returncode})"
    return dict(mine[0])
