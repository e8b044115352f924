"""What a case past --perfguard-case-timeout says on a GPU: one project, four runs, each ending in TIMEOUT.

- ``measuring``: a slow variant (SDPA 200 times: 400 blocks take half a minute), at a CI target no
  measurement reaches, with a 30 s budget: blocks are still ending at the timeout, and the line says so (a
  longer timeout or a shorter budget lets it finish);
- ``hung-in-check``: a variant that launches a spin kernel of minutes on its first call: the correctness
  check waits on it, and the line names that step;
- ``hung-in-graph``: the spin recorded in the variant's CUDA graph, so the first timed replay never ends;
- ``hung-in-stream``: a variant that cannot be captured (timed call by call) and spins from its 600th
  call: blocks ended, then none did.

Each run's exit status, its TIMEOUT line and the record's verdict, reasons and environment go to a table
(stdout and OUT/timeout_gpu.md) with the device, torch version and date; the raw logs to OUT/raw.

    PYTHONPATH=. python -m benchmarks.timeout_gpu [OUT]      # OUT default benchmarks/out/timeout_gpu
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from tabulate import tabulate

from benchmarks._plugin import plugin_args

TEST_FILE = '''
import os

import pytest
import torch
import torch.nn.functional as F

from pytest_perfguard import perf_case

CALLS = [0]
SPIN_CYCLES = 1 << 40  # minutes of one SM's clock


def reference(q, k, v):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double()).to(q.dtype)


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def slow(q, k, v):
    """A kernel of about 3 ms on an H200 (SDPA 200 times): 400 blocks of its measurement take half a minute."""
    for _ in range(199):
        F.scaled_dot_product_attention(q, k, v)
    return F.scaled_dot_product_attention(q, k, v)


def spins(q, k, v):
    """Correct; from its call number HANG_AT on (calls outside a CUDA-graph capture) it launches a kernel
    that spins for minutes. Under SPIN_IN_GRAPH what a capture records spins; under NO_GRAPH it cannot be
    captured (as with host work inside), so its timed calls are launched from Python one by one."""
    capturing = torch.cuda.is_current_stream_capturing()
    if capturing and os.environ.get("NO_GRAPH"):
        raise RuntimeError("not capturable (a stand-in for host work in the call)")
    if capturing and os.environ.get("SPIN_IN_GRAPH"):
        torch.cuda._sleep(SPIN_CYCLES)
    if not capturing:
        CALLS[0] += 1
        if CALLS[0] >= int(os.environ.get("HANG_AT", "1000000000")):
            torch.cuda._sleep(SPIN_CYCLES)
    return F.scaled_dot_product_attention(q, k, v)


@perf_case(variants={"sdpa": sdpa, "slow": slow, "spins": spins}, reference=reference, against=sdpa)
@pytest.mark.parametrize("S", [1024])
def test_attn(S, perfguard_device):
    q, k, v = (torch.randn(1, 8, S, 64, device=perfguard_device, dtype=torch.float16) for _ in range(3))
    return (q, k, v), {}
'''

# run name: (selection, environment, what the TIMEOUT line should say)
RUNS = {
    "measuring": ("slow", {"PERFGUARD_CI_TARGET": "0.00001"}, "still measuring"),
    "hung-in-check": ("spins", {"HANG_AT": "1"}, "in its correctness check"),
    "hung-in-graph": ("spins", {"SPIN_IN_GRAPH": "1"}, "in timing"),
    "hung-in-stream": ("spins", {"NO_GRAPH": "1", "HANG_AT": "600"}, "no block had ended"),
}
TIMEOUT_S = 8


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/out/timeout_gpu")
    (out / "raw").mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="perfguard-timeout-") as tmp:
        project = Path(tmp)
        (project / "test_timeout.py").write_text(TEST_FILE)
        for name, (variant, env, expected) in RUNS.items():
            results = out / "raw" / f"{name}.json"
            cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-p", "no:xdist"]
            cmd += ["test_timeout.py", "-k", variant, "--perfguard", "--perfguard-case-budget", "30"]
            cmd += ["--perfguard-case-timeout", str(TIMEOUT_S), f"--perfguard-json={results.resolve()}"]
            pythonpath = os.pathsep.join(p for p in (str(Path.cwd()), os.environ.get("PYTHONPATH")) if p)
            t0 = time.monotonic()
            ran = subprocess.run(
                cmd,
                cwd=project,
                env={**os.environ, **env, "PYTHONPATH": pythonpath},
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            wall = time.monotonic() - t0
            (out / "raw" / f"{name}.log").write_text(ran.stdout + ran.stderr)
            line = next((x for x in (ran.stdout + ran.stderr).splitlines() if "TIMEOUT:" in x), "(no TIMEOUT line)")
            said = line.split("(--perfguard-case-timeout)", 1)[-1].strip()
            record = json.loads(results.read_text())["results"][0] if results.is_file() else {}
            env_keys = ",".join(sorted(record.get("env") or {})) or "-"
            rows.append(
                [name, ran.returncode, f"{wall:.1f}", expected in line, record.get("verdict", "-"), env_keys, said]
            )
    device = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    table = tabulate(
        rows,
        headers=[
            "run",
            "exit",
            "wall s",
            "says expected",
            "verdict",
            "record env keys",
            "TIMEOUT line after the limit",
        ],
        tablefmt="github",
    )
    text = f"{device}; {when}; case timeout {TIMEOUT_S} s, budget 30 s, one process each\n\n{table}\n"
    (out / "timeout_gpu.md").write_text(text)
    print(text)
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
