"""On a GPU: every cheat of tests/adversarial/cheats.py and every honest variant of tests/perf, through the
plugin, several times in fresh processes. Prints per variant whether it was flagged (with the message) and
what the integrity checks cost as a share of the case's device time.

    PYTHONPATH=. python benchmarks/integrity_gpu.py --out DIR [--runs 2] [--case-budget 0.4]

Raw output (each run's results JSON and pytest log) goes under DIR (default benchmarks/out/integrity_gpu).
What it should show: every cheat fails (flagged or incorrect), no honest variant is flagged in any run, and
the checks cost at most 10% of a case's time. Sized for about 5 minutes on an H100 with the CUDA kernels
already built; the first build of kernels/cuda adds minutes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from _output import DEFAULT_DIR  # noqa: E402

CHEAT_CASES = """
import pytest
import torch
from pytest_perfguard import Variant, perf_case
import cheats as c

NOT_SDPA = ["scaled_dot_product"]
SHAPES = [pytest.param(4, 8, 512, 64, id="B4-H8-S512"), pytest.param(8, 16, 2048, 64, id="B8-H16-S2048")]


@perf_case(
    variants={
        "honest": Variant(c.attention, not_kernels=NOT_SDPA),
        "side_stream": c.side_stream(),
        "background_thread": c.background_thread(),
        "cache_by_pointer": c.cache_by_pointer(),
        "stale_buffer": c.stale_buffer(),
        "partial_write": c.partial_write,
        "mutate_input": c.mutate_input,
        "silent_fallback": Variant(c.silent_fallback, not_kernels=NOT_SDPA),
        "lazy_output": c.lazy_output,
        "fp8_inside": c.fp8_inside,
        "timed_differently": c.timed_differently(),
    },
    reference=c.reference,
    against=c.sdpa,
    flops=lambda B, H, S, D: 4 * B * H * S * S * D // 2,
)
@pytest.mark.parametrize(("B", "H", "S", "D"), SHAPES)
def test_cheats(B, H, S, D, perfguard_device):
    q, k, v = (torch.randn(B, H, S, D, device=perfguard_device, dtype=torch.float16) for _ in range(3))
    return (q, k, v), {"causal": True}


@perf_case(variants={"degenerate_shortcut": c.degenerate_shortcut}, reference=c.reference)
def test_degenerate(perfguard_device):
    q = torch.zeros(4, 8, 512, 64, device=perfguard_device, dtype=torch.float16)
    k, v = (torch.randn(4, 8, 512, 64, device=perfguard_device, dtype=torch.float16) for _ in range(2))
    return (q, k, v), {"causal": False}
"""

PATCH_CASES = """
import torch
from pytest_perfguard import perf_case
import cheats as c


@perf_case(variants={"patch_clock": c.patch_clock()}, reference=c.reference)
def test_patched(perfguard_device):
    q, k, v = (torch.randn(4, 8, 512, 64, device=perfguard_device, dtype=torch.float16) for _ in range(3))
    return (q, k, v), {"causal": True}
"""


def _plugin_args() -> list[str]:
    """Load the plugin by module name where it is not installed (a checkout on PYTHONPATH)."""
    from importlib.metadata import entry_points

    installed = any(ep.name == "perfguard" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "pytest_perfguard.plugin"]


def _pytest(args: list[str], cwd: Path, log: Path, timeout: float) -> int:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", *_plugin_args(), *args]
    t0 = time.monotonic()
    with log.open("w") as fh:
        try:
            rc = subprocess.run(
                cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    print(f"  {' '.join(args[:2])} ... rc={rc} in {time.monotonic() - t0:.0f}s (log {log})", flush=True)
    return rc


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    results: list[dict[str, Any]] = json.loads(path.read_text())["results"]
    return results


def _overhead(r: dict[str, Any]) -> float | None:
    checks, timed = r.get("checks_s"), r.get("elapsed_s")
    if checks is None or not timed:
        return None
    return 100.0 * checks / timed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_DIR / "integrity_gpu", help="folder for the raw output")
    ap.add_argument("--runs", type=int, default=2, help="fresh-process runs of each suite")
    ap.add_argument("--case-budget", type=float, default=0.4, help="--perfguard-case-budget for every case")
    ap.add_argument("-k", dest="select", default=None, help="pytest -k selection within tests/perf")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("integrity_gpu: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    out = args.out.resolve()
    work = out / "cheats_project"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "adversarial" / "cheats.py", work / "cheats.py")
    (work / "test_cheats_gpu.py").write_text(CHEAT_CASES)
    (work / "test_patched_gpu.py").write_text(PATCH_CASES)
    common = ["--perfguard", "--perfguard-case-budget", str(args.case_budget)]
    print(
        f"integrity_gpu on {torch.cuda.get_device_name()}, {args.runs} run(s), raw output under {out}",
        flush=True,
    )
    t0 = time.monotonic()
    seen: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in range(args.runs):
        print(f"run {run + 1}/{args.runs}", flush=True)
        for name in ("test_cheats_gpu.py", "test_patched_gpu.py"):
            result = out / f"run{run}_{name.removesuffix('.py')}.json"
            base = out / f"baselines_run{run}_{name}"
            _pytest(
                [name, *common, "--perfguard-json", str(result), "--perfguard-baseline-dir", str(base)],
                work,
                out / f"run{run}_{name}.log",
                300,
            )
            for r in _records(result):
                seen[f"cheat:{r['variant']}"].append(r)
        result = out / f"run{run}_perf.json"
        select = ["-k", args.select] if args.select else []
        _pytest(
            [
                "tests/perf",
                *select,
                *common,
                "--perfguard-json",
                str(result),
                "--perfguard-baseline-dir",
                str(out / f"baselines_run{run}_perf"),
            ],
            ROOT,
            out / f"run{run}_perf.log",
            600,
        )
        for r in _records(result):
            seen[f"honest:{r['variant']}"].append(r)

    print()
    print(
        f"{'variant':32} {'cases':>5} {'failed':>6} {'flagged':>7} "
        f"{'checks % of timing (median, max)':>34}  first message"
    )
    failures = 0
    for key in sorted(seen):
        rs = [r for r in seen[key] if r.get("outcome") != "skipped"]
        if not rs:
            print(f"{key:32} skipped: {(seen[key][0].get('reasons') or ['?'])[0][:80]}")
            continue
        failed = [r for r in rs if r.get("outcome") == "failed"]
        flagged = [r for r in rs if r.get("verdict") == "flagged"]
        costs = sorted(c for c in (_overhead(r) for r in rs) if c is not None)
        cost = f"{costs[len(costs) // 2]:.1f}%, {costs[-1]:.1f}%" if costs else "-"
        msg = (failed[0].get("reasons") or ["?"])[0][:110] if failed else ""
        print(f"{key:32} {len(rs):5} {len(failed):6} {len(flagged):7} {cost:>34}  {msg}")
        honest = key.startswith("honest:") or key == "cheat:honest"
        if (honest and flagged) or (not honest and len(failed) < len(rs)):
            failures += 1
    print(f"\n{failures} problem(s): an honest variant flagged, or a cheat that passed. {time.monotonic() - t0:.0f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
