"""benchmarks/check_profile.py end to end on CPU: it finds every step of the timed-output check and writes
one operator table per profiled case. A smoke test of the script, so that it still works when the check
changes; its figures are measured on a GPU, never here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STEPS = (
    "oracle matches?",
    "judge (oracle kept)",
    "screen (queued)",  # every copy of an honest kernel passes the screen: no full judgement, no input compare
    "last timed output",
    "every timed copy",
    "seen values",
)


@pytest.mark.slow
def test_every_step_of_the_check_is_timed_and_profiled(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    args = ["--profile", "--out", str(tmp_path), "-k", "sdpa and B1-H1-S128 and grid"]
    done = subprocess.run(
        [sys.executable, "benchmarks/check_profile.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split("|")[1:3] for line in done.stdout.splitlines() if line.startswith("| test_attention_grid")]
    assert {step.strip().removesuffix(" (profiled)") for _, step in rows} == set(STEPS)
    assert "every timed copy (profiled)" in {step.strip() for _, step in rows}
    assert {case.strip() for case, _ in rows} == {"test_attention_grid[sdpa-B1-H1-S128]"}
    profile = tmp_path / "profile_test_attention_grid_sdpa-B1-H1-S128.txt"
    assert "aten::" in profile.read_text()
