"""A/B campaign: the head/base gate on the guarded suite, A/A and planted slowdowns, in fresh processes.

Method. The repository is copied into a scratch git repository (one commit, the base). Then, each in a
fresh pytest process over `tests/perf` on the GPU:
  1. one plain `--perfguard` run (the stored-baseline mode), for the device time per verdict it costs;
  2. A/A runs, `--perfguard-against HEAD` on the clean tree: every case compares identical code, so every
     "regressed" is a false alarm;
  3. for each planted size x, a commit on top of the base in which every variant sleeps after its kernel
     (`torch.cuda._sleep`, calibrated on this GPU: the spin's ns per cycle and the floor of one extra
     graph node) for x times the case's time from the first A/A run, and a run `--perfguard-against
     HEAD~1`. A case whose x is below the extra node's floor cannot be planted that small and is left
     out of that row. The realised slowdown is what the A/B gate measured (its estimate), shown beside.
The table prints verdict counts, false alarms, detection by case size (under and over 20 us), and device
time per verdict against the plain run. Raw results files go to --out (default benchmarks/out/ab/).

Usage (GPU): PYTHONPATH=. python benchmarks/ab_campaign.py --minutes 8 --plant 0.02,0.05
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._output import DEFAULT_DIR  # noqa: E402

IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "out", ".whl", ".gl", "*.egg-info", ".mypy_cache")

PLANT = """
# planted by benchmarks/ab_campaign.py: every variant sleeps after its kernel for a calibrated time
import json as _json
import pathlib as _pl

from pytest_perfguard.runner import describe_workload as _describe

_PLANT = _json.loads((_pl.Path(__file__).parent / "planted.json").read_text())


def _planted(name, fn):
    def run(q, k, v, causal):
        out = fn(q, k, v, causal=causal)
        cycles = _PLANT["cycles"].get(name + "|" + _describe(((q, k, v), {"causal": causal})), 0)
        if cycles:
            torch.cuda._sleep(cycles)
        return out

    return run


VARIANTS = {n: Variant(_planted(n, v.fn), requires=v.requires) for n, v in VARIANTS.items()}
"""


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "ab",
        "GIT_AUTHOR_EMAIL": "ab@example.com",
        "GIT_COMMITTER_NAME": "ab",
        "GIT_COMMITTER_EMAIL": "ab@example.com",
    }
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def _plugin_args() -> list[str]:
    """Load the plugin by module name where it is not installed (a checkout on PYTHONPATH)."""
    from importlib.metadata import entry_points

    installed = any(ep.name == "perfguard" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "pytest_perfguard.plugin"]


def run_suite(repo: Path, out: Path, name: str, extra: list[str], log: Path) -> tuple[float, dict[str, Any]]:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/perf",
        "-q",
        "-p",
        "no:cacheprovider",
        *_plugin_args(),
        "--perfguard",
        "--perfguard-json",
        str(out / f"{name}.json"),
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    log.write_text(proc.stdout + proc.stderr)
    doc = json.loads((out / f"{name}.json").read_text())
    return wall, doc


CALIBRATE = """
import json, torch
from pytest_perfguard.timing import CudaTimer, MeasureConfig, measure
timer, cfg = CudaTimer(), MeasureConfig(target=0.005, budget_s=2.0)
spin = lambda n: measure(lambda i: (lambda: torch.cuda._sleep(n)), None, timer, cfg).time.estimate
floor, high = spin(0), spin(200_000)
print(json.dumps([(high - floor) / 200_000, floor]))
"""


def calibrate() -> tuple[float, float]:
    """ns per spin cycle and the floor of one extra (empty) spin node, timed in CUDA graphs. In a process of
    its own: a CUDA context left in this one would be another process on the GPU for every later run."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CALIBRATE], env=env, capture_output=True, text=True, check=True)
    ns_per_cycle, floor = json.loads(done.stdout.strip().splitlines()[-1])
    return float(ns_per_cycle), float(floor)


def timed(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in doc["results"] if r.get("median_ns") is not None]


def gate(r: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((g for g in r.get("gates") or [] if g.get("gate") == name), None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_DIR / "ab")
    ap.add_argument("--minutes", type=float, default=8.0, help="stop starting A/A runs after this")
    ap.add_argument("--plant", default="0.02,0.05", help="planted slowdowns, fractions")
    ap.add_argument("--aa-runs", type=int, default=0, help="A/A runs (default: as many as the time allows)")
    ap.add_argument("--no-plain", action="store_true", help="skip the plain --perfguard run")
    args = ap.parse_args()
    deadline = time.monotonic() + args.minutes * 60
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ab-campaign-"))
    repo = work / "repo"
    shutil.copytree(ROOT, repo, ignore=IGNORE)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    os.environ.setdefault("PERFGUARD_CACHE_DIR", str(work / "cache"))
    rows: list[list[str]] = []
    walls: dict[str, list[float]] = {"plain": [], "ab": []}
    verdicts: dict[str, list[float]] = {"plain": [], "ab": []}
    if not args.no_plain:
        wall, doc = run_suite(repo, out, "plain", [], out / "plain.log")
        walls["plain"].append(wall)
        verdicts["plain"].append(len(timed(doc)))
    aa_docs = []
    i = 0
    plants = [float(x) for x in args.plant.split(",") if x]
    reserve = 150.0 * len(plants)  # seconds kept for the planted runs
    while (args.aa_runs and i < args.aa_runs) or (not args.aa_runs and time.monotonic() + reserve < deadline):
        wall, doc = run_suite(repo, out, f"aa_{i}", ["--perfguard-against", "HEAD"], out / f"aa_{i}.log")
        walls["ab"].append(wall)
        verdicts["ab"].append(len(timed(doc)))
        aa_docs.append(doc)
        i += 1
        if not args.aa_runs and i >= 1 and time.monotonic() + wall + reserve > deadline:
            break
    aa = [r for d in aa_docs for r in timed(d)]
    counts: dict[str, int] = {}
    for r in aa:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    base_false = sum(1 for r in aa if (gate(r, "baseline") or {}).get("status") == "regressed")
    rows.append(
        [
            "A/A",
            str(len(aa_docs)),
            str(len(aa)),
            str(counts.get("regressed", 0)),
            ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
            f"baseline gate regressed: {base_false}",
        ]
    )
    if plants and aa_docs:
        ns_per_cycle, floor = calibrate()
        reference = {(r["variant"], r["workload_desc"]): r["median_ns"] for r in timed(aa_docs[0])}
        for x in plants:
            cycles = {}
            for (variant, desc), t in reference.items():
                extra = x * t - floor
                if extra > 0:
                    cycles[f"{variant}|{desc}"] = int(extra / ns_per_cycle)
            git(repo, "checkout", "-q", "-B", f"plant-{x}", "main")
            test = repo / "tests" / "perf" / "test_attention.py"
            text = test.read_text()
            anchor = "VARIANTS = {name: Variant(fn, requires=REQUIRES.get(name)) for name, fn in KERNELS.items()}\n"
            assert anchor in text, "the suite's variant table moved: update the plant anchor"
            test.write_text(text.replace(anchor, anchor + PLANT))
            (test.parent / "planted.json").write_text(json.dumps({"x": x, "cycles": cycles}))
            git(repo, "add", "-A")
            git(repo, "commit", "-qm", f"plant {x}")
            name = f"planted_{x:g}"
            _, doc = run_suite(repo, out, name, ["--perfguard-against", "HEAD~1"], out / f"{name}.log")
            planted = [r for r in timed(doc) if f"{r['variant']}|{r['workload_desc']}" in cycles]
            by_size: dict[str, list[int]] = {"<20us": [0, 0], ">=20us": [0, 0]}
            realised = []
            base_caught = 0
            for r in planted:
                size = "<20us" if reference.get((r["variant"], r["workload_desc"]), 0) < 20_000 else ">=20us"
                by_size[size][1] += 1
                by_size[size][0] += r["verdict"] == "regressed"
                g = gate(r, "ab")
                if g and g.get("estimate"):
                    realised.append(g["estimate"] - 1)
                base_caught += (gate(r, "baseline") or {}).get("status") == "regressed"
            med = f"{statistics.median(realised) * 100:+.2f}%" if realised else "-"
            rows.append(
                [
                    f"+{x:.0%} planted",
                    "1",
                    str(len(planted)),
                    ", ".join(f"{k}: {c}/{n}" for k, (c, n) in by_size.items()),
                    f"realised median {med}; not plantable {len(reference) - len(cycles)}",
                    f"baseline gate regressed: {base_caught}",
                ]
            )
            git(repo, "checkout", "-q", "main")
        rows.append(["spin calibration", "", "", "", f"{ns_per_cycle:.4f} ns/cycle, floor {floor:.0f} ns", ""])
    per = {k: sum(walls[k]) / max(sum(verdicts[k]), 1) for k in walls if walls[k]}
    if "plain" in per and "ab" in per:
        rows.append(
            [
                "wall per verdict",
                "",
                "",
                "",
                f"A/B {per['ab']:.2f} s, plain {per['plain']:.2f} s ({per['ab'] / per['plain']:.2f}x)",
                "",
            ]
        )
    from tabulate import tabulate

    table = tabulate(rows, headers=["run", "runs", "case verdicts", "regressed / caught", "verdicts", "note"])
    print(table)
    (out / "summary.txt").write_text(table + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
