"""Where the timed-output checks' time goes: runs selected guarded cases through the plugin in this process,
with every step of `copies.timed_outputs`, `every_copy` and `seen_values` timed between device
synchronisations, and prints a table per
run: the case, the step, its wall time, and the driver allocations (cudaMalloc, cudaFree) the caching
allocator made during it. With --profile, each case's check in the first run also runs under
torch.profiler (its step times then include the profiler's cost), one operator table per case in --out.

    PYTHONPATH=. python benchmarks/check_profile.py [-k EXPR] [--against REV] [--runs 2] [--profile] [--out DIR]

On CUDA the default selection is the B8 H16 S4096 cases that finish in under 20 ms. On CPU it runs the
S128 cases, as a smoke test of the script. What it found on H100s (2026-11-25): in plain runs the first
allocation after the measurement costs a cudaMalloc of 9-18 ms, under 1-3 ms after an A/B measurement:
benchmarks/results/integrity_2026-11-23/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._output import DEFAULT_DIR  # noqa: E402
from benchmarks._plugin import plugin_args  # noqa: E402
from pytest_perfguard.research import copies, correctness  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _driver_calls() -> tuple[int, int]:
    """cudaMalloc and cudaFree calls of the caching allocator so far."""
    if not torch.cuda.is_available():
        return 0, 0
    stats = torch.cuda.memory_stats()
    return int(stats.get("num_device_alloc", 0)), int(stats.get("num_device_free", 0))


class Steps:
    """Wall time and allocator traffic per step of the check, for the case under way."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, float, int, int]] = []
        self.case = ""
        self.suffix = ""  # " (profiled)" while torch.profiler runs

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        _sync()
        a0, f0 = _driver_calls()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            _sync()
            a1, f1 = _driver_calls()
            self.rows.append((self.case, name + self.suffix, (time.perf_counter() - t0) * 1e3, a1 - a0, f1 - f0))

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.step(name):
                return fn(*args, **kwargs)

        return timed


class Profiler:
    """The pytest plugin that patches the check's steps for the run."""

    def __init__(self, steps: Steps, out: Path, profile: bool) -> None:
        self.steps, self.out, self.profile = steps, out, profile
        self.patches: list[tuple[Any, str, Any]] = []
        self.profiled: set[str] = set()

    def _patch(self, owner: Any, name: str, new: Any) -> None:
        self.patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    def pytest_sessionstart(self) -> None:
        steps = self.steps
        judged = [0]

        def judge(*args: Any, **kwargs: Any) -> Any:
            judged[0] += 1
            with steps.step("judge" + (" (oracle kept)" if kwargs.get("oracle") else " (new oracle)")):
                return correctness.judge_output(*args, **kwargs)

        def profiled(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
            """The check's step `name`, timed; in a case's first run also under torch.profiler, whose operator
            table goes to --out (its step times then include the profiler's cost, and say so)."""

            def run(*args: Any, **kwargs: Any) -> Any:
                key = f"{steps.case}/{name}"
                if not self.profile or key in self.profiled:
                    with steps.step(name):
                        return original(*args, **kwargs)
                self.profiled.add(key)
                activities = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                steps.suffix = " (profiled)"
                try:
                    with torch.profiler.profile(activities=activities) as prof, steps.step(name):
                        result = original(*args, **kwargs)
                finally:
                    steps.suffix = ""
                case = steps.case.replace("/", "_").replace(":", "_").replace("[", "_").replace("]", "")
                table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=30)
                with (self.out / f"profile_{case}.txt").open("a") as f:
                    f.write(f"== {name}\n{table}\n")
                return result

            return run

        self._patch(copies, "judge_output", judge)
        self._patch(copies, "modified_input", steps.wrap("input unchanged?", copies.modified_input))
        self._patch(copies, "screened", steps.wrap("screen (queued)", copies.screened))
        self._patch(correctness.Oracle, "matches", steps.wrap("oracle matches?", correctness.Oracle.matches))
        for name, step in (
            ("timed_outputs", "last timed output"),
            ("every_copy", "every timed copy"),
            ("seen_values", "seen values"),
        ):
            self._patch(copies, name, profiled(step, getattr(copies, name)))

    def pytest_sessionfinish(self) -> None:
        for owner, name, old in reversed(self.patches):
            setattr(owner, name, old)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        self.steps.case = item.nodeid.split("::")[-1]
        return (yield)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", default=None, help="pytest -k expression (default: the B8 H16 S4096 cases on CUDA)")
    ap.add_argument("--against", default=None, help="also run in A/B mode against this revision")
    ap.add_argument("--runs", type=int, default=1, help="plain runs (and A/B runs) in this process")
    ap.add_argument("--case-budget", type=float, default=None)
    ap.add_argument("--profile", action="store_true", help="each case's check in the first run under torch.profiler")
    ap.add_argument("--out", type=Path, default=DEFAULT_DIR / "check_profile")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    expr = args.k or ("B8-H16-S4096 and not cuda_scalar and not torch_hybrid" if torch.cuda.is_available() else "S128")
    steps = Steps()
    modes = [("plain", [])] * args.runs
    if args.against:
        modes += [("A/B", ["--perfguard-against", args.against])] * args.runs
    codes = []
    for i, (mode, extra) in enumerate(modes):
        steps.rows.clear()
        plugin = Profiler(steps, args.out, args.profile and i == 0)
        budget = ["--perfguard-case-budget", str(args.case_budget)] if args.case_budget else []
        argv = ["tests/perf", "-q", "-p", "no:cacheprovider", *plugin_args(), "--perfguard", "-k", expr, *budget]
        argv += [*extra, "--perfguard-json", str(args.out / f"run{i}.json")]
        codes.append(int(pytest.main(argv, plugins=[plugin])))
        print(f"\n## run {i}: {mode} (pytest exit {codes[-1]})\n")
        print("| case | step | ms | cudaMalloc | cudaFree |\n|---|---|---:|---:|---:|")
        for case, name, ms, allocs, frees in steps.rows:
            print(f"| {case} | {name} | {ms:.2f} | {allocs} | {frees} |")
    if args.profile:
        print(f"\nprofiles of each case's first check: {args.out}/profile_*.txt")
    return 0 if all(c in (0, 1) for c in codes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
