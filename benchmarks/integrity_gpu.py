"""On a GPU: every cheat of tests/adversarial/cheats.py and every honest variant of tests/perf, through the
plugin, several times in fresh processes. Prints per variant whether it was flagged (with the message) and
what the integrity checks cost per case, and, apart from that, the checks' one-time warm-up per process.

    PYTHONPATH=$PWD python benchmarks/integrity_gpu.py --out DIR [--runs 2] [--case-budget 0.4]
    PYTHONPATH=$PWD python benchmarks/integrity_gpu.py --cpu --runs 1   # a smoke run of the same script on CPU

(An absolute PYTHONPATH where the package is not installed: the pytest runs start in DIR/cheats_project.)

Raw output (each run's results JSON and pytest log) goes under DIR (default benchmarks/out/integrity_gpu).
What it should show: every cheat fails (flagged or incorrect); no honest variant is flagged in any run,
including the ones fed constant inputs (a zero q, an all-ones weight and a zero bias); and the checks cost at
most 10% of each case's measurement time (checks_s / elapsed_s; `checks` in the record splits it by check),
with the one-time warm-up (the first torch.profiler session of a process: seconds) reported per process and
counted in no case. Sized for about 2 minutes a run on an H100 with the CUDA kernels already built; the
first build of kernels/cuda adds minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._output import DEFAULT_DIR  # noqa: E402
from benchmarks._plugin import plugin_args  # noqa: E402

CHEAT_CASES = """
import pytest
import torch
import torch.nn.functional as F
from pytest_perfguard import Variant, perf_case
import cheats as c

CUDA = torch.cuda.is_available()
NOT_SDPA = ["scaled_dot_product"]
if CUDA:
    SHAPES = [pytest.param(4, 8, 512, 64, id="B4-H8-S512"), pytest.param(8, 16, 2048, 64, id="B8-H16-S2048")]
    DEGENERATE, ROWS = (4, 8, 512, 64), (8192, 4096)
else:  # the smoke run on CPU
    SHAPES = [pytest.param(1, 2, 64, 64, id="B1-H2-S64")]
    DEGENERATE, ROWS = (1, 2, 64, 64), (64, 256)


@perf_case(
    variants={
        "honest": Variant(c.attention, not_kernels=NOT_SDPA),
        "side_stream": Variant(c.side_stream(), requires="cuda"),
        "background_thread": c.background_thread(),
        "cache_by_pointer": c.cache_by_pointer(),
        "stale_buffer": c.stale_buffer(),
        "partial_write": c.partial_write,
        "mutate_input": c.mutate_input,
        "silent_fallback": Variant(c.silent_fallback, not_kernels=NOT_SDPA),
        "lazy_output": c.lazy_output,
        "fp8_inside": c.fp8_inside,
        "timed_differently": c.timed_differently(),
        "skip_other_copies": c.skip_other_copies(),
        "value_memo": c.value_memo(),
        "version_memo": c.version_memo(),
        "flip_switch": c.flip_switch,
    },
    reference=c.reference,
    against=c.sdpa,
    flops=lambda B, H, S, D: 4 * B * H * S * S * D // 2,
)
@pytest.mark.parametrize(("B", "H", "S", "D"), SHAPES)
def test_cheats(B, H, S, D, perfguard_device):
    q, k, v = (torch.randn(B, H, S, D, device=perfguard_device, dtype=torch.float16) for _ in range(3))
    return (q, k, v), {"causal": True}


# A constant q: the honest kernel computes it like any other input, the shortcut returns the mean of v.
@perf_case(
    variants={"honest_degenerate": c.attention, "degenerate_shortcut": c.degenerate_shortcut},
    reference=c.reference,
)
def test_degenerate(perfguard_device):
    q = torch.zeros(*DEGENERATE, device=perfguard_device, dtype=torch.float16)
    k, v = (torch.randn(*DEGENERATE, device=perfguard_device, dtype=torch.float16) for _ in range(2))
    return (q, k, v), {"causal": False}


def layer_norm(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b)


# The common honest case: a layer norm with its initial weight (all ones) and bias (all zeros).
@perf_case(variants={"honest_layer_norm": layer_norm}, reference=layer_norm)
def test_layer_norm(perfguard_device):
    x = torch.randn(*ROWS, device=perfguard_device, dtype=torch.float16)
    w = torch.ones(ROWS[1], device=perfguard_device, dtype=torch.float16)
    b = torch.zeros(ROWS[1], device=perfguard_device, dtype=torch.float16)
    return (x, w, b), {}
"""

# Host cost: the baseline is recorded with the cheat off (HOST_COST=0), the guard runs with it on: 1 ms of
# Python and a synchronise per call, which graph replay never sees; the host gate must fail it.
HOST_CASES = """
import os
import pytest
import torch
from pytest_perfguard import perf_case
import cheats as c

_HOST = c.host_cost()


def host_cost(q, k, v, causal):
    if os.environ.get("HOST_COST", "1") != "0":
        return _HOST(q, k, v, causal)
    return c.attention(q, k, v, causal)


@perf_case(variants={"honest_host": c.attention, "host_cost": host_cost}, reference=c.reference, against=c.sdpa)
@pytest.mark.parametrize("S", [128, 512])
def test_host(S, perfguard_device):
    q, k, v = (torch.randn(4, 8, S, 64, device=perfguard_device, dtype=torch.float16) for _ in range(3))
    return (q, k, v), {"causal": True}
"""

PATCH_CASES = """
import torch
from pytest_perfguard import perf_case
import cheats as c


@perf_case(variants={"patch_clock": c.patch_clock()}, reference=c.reference)
def test_patched(perfguard_device):
    shape = (4, 8, 512, 64) if torch.cuda.is_available() else (1, 2, 64, 64)
    q, k, v = (torch.randn(*shape, device=perfguard_device, dtype=torch.float16) for _ in range(3))
    return (q, k, v), {"causal": True}
"""


def _pytest(args: list[str], cwd: Path, log: Path, timeout: float, env: dict[str, str] | None = None) -> int:
    # --rootdir: the results file's path outside the project must not move the case ids (the baseline's keys)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", "--rootdir", str(cwd)]
    cmd += [*plugin_args(), *args]
    t0 = time.monotonic()
    with log.open("w") as fh:
        try:
            rc = subprocess.run(
                cmd,
                cwd=cwd,
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
                env={**os.environ, **(env or {})},
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    print(f"  {' '.join(args[:2])} ... rc={rc} in {time.monotonic() - t0:.0f}s (log {log})", flush=True)
    return rc


def _document(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


MAX_SHARE = 10.0  # the checks may cost at most this % of a case's measurement time


def _share(r: dict[str, Any]) -> float | None:
    """The checks' wall time as a % of the case's measurement time (its elapsed_s)."""
    checks, timed = r.get("checks_s"), r.get("elapsed_s")
    if checks is None or not timed:
        return None
    return 100.0 * checks / timed


def _case_share(r: dict[str, Any]) -> float | None:
    """What the checks add to the whole case's time in its process (correctness, measurement, checks: the
    record's case_s), in %: the issue's "more device time per case". Looser than _share, reported beside it."""
    checks, case = r.get("checks_s"), r.get("case_s")
    if checks is None or not case or case <= checks:
        return None
    return 100.0 * checks / (case - checks)


def _costliest(r: dict[str, Any]) -> str:
    by_check: dict[str, float] = r.get("checks") or {}
    if not by_check:
        return ""
    name = max(by_check, key=lambda k: by_check[k])
    return f"{name} {1e3 * by_check[name]:.1f} ms"


def _honest(key: str) -> bool:
    return key.startswith("honest:") or key.startswith("cheat:honest")


def _table(seen: dict[str, list[dict[str, Any]]]) -> tuple[int, list[str]]:
    """Prints one row per variant; returns the number of problems and the over-budget cases."""
    print(
        f"{'variant':28} {'cases':>5} {'failed':>6} {'flagged':>7} {'checks %: median, max':>22} "
        f"{'checks ms: median, max':>23} {'% of case: max':>14}  {'costliest check at the max':28} first message"
    )
    problems, over = 0, []
    for key in sorted(seen):
        rs = [r for r in seen[key] if r.get("outcome") != "skipped"]
        if not rs:
            print(f"{key:28} skipped: {(seen[key][0].get('reasons') or ['?'])[0][:80]}")
            continue
        failed = [r for r in rs if r.get("outcome") == "failed"]
        flagged = [r for r in rs if r.get("verdict") == "flagged"]
        timed = sorted(((s, r) for r in rs if (s := _share(r)) is not None), key=lambda t: t[0])
        share = f"{timed[len(timed) // 2][0]:.1f}%, {timed[-1][0]:.1f}%" if timed else "-"
        ms = sorted(1e3 * r["checks_s"] for _, r in timed)
        spent = f"{ms[len(ms) // 2]:.1f}, {ms[-1]:.1f}" if ms else "-"
        worst = _costliest(timed[-1][1]) if timed else ""
        whole = [c for _, r in timed if (c := _case_share(r)) is not None]
        of_case = f"{max(whole):.1f}%" if whole else "-"
        msg = (failed[0].get("reasons") or ["?"])[0][:100] if failed else ""
        print(
            f"{key:28} {len(rs):5} {len(failed):6} {len(flagged):7} {share:>22} {spent:>23} {of_case:>14}  "
            f"{worst:28} {msg}"
        )
        honest = _honest(key)
        if (honest and flagged) or (not honest and len(failed) < len(rs)):
            problems += 1
        over += [f"{r['id']} ({s:.1f}%: {_costliest(r)})" for s, r in timed if s > MAX_SHARE and not failed]
    return problems, over


def _warmups(docs: dict[str, dict[str, Any]]) -> None:
    """The one-time warm-up of each process, per results file: counted in no case."""
    print("\none-time warm-up per process (before the first case; in no case's checks):")
    for name, doc in sorted(docs.items()):
        for i, w in enumerate((doc.get("run") or {}).get("warmup") or []):
            print(f"  {name} process {i}: " + ", ".join(f"{k} {v:.3f} s" for k, v in sorted(w.items())))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_DIR / "integrity_gpu", help="folder for the raw output")
    ap.add_argument("--runs", type=int, default=2, help="fresh-process runs of each suite")
    ap.add_argument("--case-budget", type=float, default=0.4, help="--perfguard-case-budget for every case")
    ap.add_argument("-k", dest="select", default=None, help="pytest -k selection within tests/perf")
    ap.add_argument("--cpu", action="store_true", help="a smoke run on CPU (small shapes; no GPU needed)")
    ap.add_argument("--no-perf", action="store_true", help="the cheats only, not the honest tests/perf suite")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available() and not args.cpu:
        print(
            "integrity_gpu: needs a CUDA GPU (torch.cuda.is_available() is False); --cpu for a smoke run",
            file=sys.stderr,
        )
        return 2
    out = args.out.resolve()
    work = out / "cheats_project"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "adversarial" / "cheats.py", work / "cheats.py")
    (work / "test_cheats_gpu.py").write_text(CHEAT_CASES)
    (work / "test_patched_gpu.py").write_text(PATCH_CASES)
    (work / "test_host_gpu.py").write_text(HOST_CASES)
    common = ["--perfguard", "--perfguard-case-budget", str(args.case_budget)]
    if args.cpu:
        common += ["--perfguard-device", "cpu"]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.cpu else "CPU (smoke run)"
    print(f"integrity_gpu on {device}, {args.runs} run(s), raw output under {out}", flush=True)
    t0 = time.monotonic()
    seen: dict[str, list[dict[str, Any]]] = defaultdict(list)
    docs: dict[str, dict[str, Any]] = {}
    for run in range(args.runs):
        print(f"run {run + 1}/{args.runs}", flush=True)
        if args.cpu:
            (work / "test_host_gpu.py").unlink(missing_ok=True)
        for name in ("test_cheats_gpu.py", "test_patched_gpu.py"):
            result = out / f"run{run}_{name.removesuffix('.py')}.json"
            base = out / f"baselines_run{run}_{name}"
            _pytest(
                [name, *common, "--perfguard-json", str(result), "--perfguard-baseline-dir", str(base)],
                work,
                out / f"run{run}_{name}.log",
                300,
            )
            docs[result.name] = doc = _document(result)
            for r in doc.get("results", []):
                seen[f"cheat:{r['variant']}"].append(r)
        host_base = out / f"baselines_run{run}_host"
        if not args.cpu:  # the cheat's host work runs on a GPU only: on CPU the timer sees it anyway
            _pytest(
                [
                    "test_host_gpu.py",
                    *common,
                    "--perfguard-update-baseline",
                    "--perfguard-baseline-dir",
                    str(host_base),
                ],
                work,
                out / f"run{run}_host_update.log",
                300,
                env={"HOST_COST": "0"},
            )
            result = out / f"run{run}_test_host_gpu.json"
            _pytest(
                [
                    "test_host_gpu.py",
                    *common,
                    "--perfguard-json",
                    str(result),
                    "--perfguard-baseline-dir",
                    str(host_base),
                ],
                work,
                out / f"run{run}_host_guard.log",
                300,
                env={"HOST_COST": "1"},
            )
            docs[result.name] = doc = _document(result)
            for r in doc.get("results", []):
                seen[f"cheat:{r['variant']}"].append(r)
        if args.no_perf:
            continue
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
        docs[result.name] = doc = _document(result)
        for r in doc.get("results", []):
            seen[f"honest:{r['variant']}"].append(r)

    print()
    problems, over = _table(seen)
    # A run that judged nothing (pytest could not start, the plugin did not load) is no evidence of either
    # kind: a cheat that never ran did not fail. Seen on a GPU host with PYTHONPATH=. and the runs' own cwd.
    empty = sorted(name for name, doc in docs.items() if not doc.get("results"))
    for name in empty:
        print(f"  no case judged in {name} (see its log): counted as a problem")
    problems += len(empty)
    _warmups(docs)
    everything = sorted(s for rs in seen.values() for r in rs if r.get("outcome") == "passed" and (s := _share(r)))
    if everything:
        print(
            f"\nchecks' cost over {len(everything)} passing cases: median {everything[len(everything) // 2]:.1f}%, "
            f"max {everything[-1]:.1f}% of the case's measurement time (at most {MAX_SHARE:g}% asked)"
        )
    for line in over:
        print(f"  over {MAX_SHARE:g}%: {line}")
    print(
        f"\n{problems} problem(s): an honest variant flagged, a cheat that passed, or a run that judged nothing; "
        f"{len(over)} passing case(s) "
        f"whose checks cost more than {MAX_SHARE:g}%. {time.monotonic() - t0:.0f}s"
    )
    return 1 if problems or over else 0


if __name__ == "__main__":
    raise SystemExit(main())
