"""False and missed change points per 1,000 synthetic histories built from recorded H200 noise.

A simulation on a CPU. Each series is one case's history on main: one estimate per run (commit), searched
by `perfguard history changes` (pytest_perfguard.commands.history.store.find_changes, Otava's E-Divisive).

Noise model, from `tests/data/h200_attention_timing_samples.json.xz` (12 series: 4 shapes x 3 kernels):
  * a block is the median of a resample of one recorded block's launches (the first launch of every
    recorded block is a cold launch and is left out, as in benchmarks/verdict_quality.py);
  * a run's estimate is the median of ``--blocks`` such blocks, times exp(g): g ~ N(0, s) is the
    between-run (between-process) shift that no number of blocks removes. ``--between survey98`` (default)
    draws s per series from the log-normal fitted to 98 cases over 4 fresh processes on one H200 (median
    0.4%, p90 1.3%, cap 3.8%; the model benchmarks/verdict_quality.py calls survey98); ``none`` keeps the
    within-run noise only;
  * classes as in verdict_quality: `device` (SDPA with the L2 flushed before each launch: events read the
    kernel, block cv 0.2-0.3%), `multi-kernel` (matmul+softmax+matmul: host dispatch shows at small shapes,
    block cv 0.01-8.5%), `launch-bound` (SDPA back to back on an idle queue: host launch latency, block cv
    up to 14%; a stress test, not what the CUDA-graph engine measures).
Scenarios: pure noise; one step of +2%, +5% or +10% at a random run in [15, 45); a drift of ten +0.5%
steps on ten consecutive runs starting in [15, 35). A planted change is found when a change point lies
within ``--tolerance`` runs of it (of any step, for the drift); every other change point is false.

    python benchmarks/changepoints.py                  # 1,000 series per scenario and class, about 2-4 min
    python benchmarks/changepoints.py --series 200 --max-pvalue 1e-3 --between none
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pytest_perfguard.research import change_indices

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "h200_attention_timing_samples.json.xz"
CLASSES = {"device": "sdpa_l2flush", "multi-kernel": "naive", "launch-bound": "sdpa"}
POOL_BLOCKS = 2000
RUNS = 60


def block_pools(kernel: str, rng: np.random.Generator, size: int = POOL_BLOCKS, path: Path = DATA) -> list[np.ndarray]:
    """Per recorded case, ``size`` synthetic block medians (ns) of ``kernel``."""
    cases = json.loads(lzma.decompress(path.read_bytes()))["cases"]
    pools = []
    for case in sorted(cases):
        blocks = [np.asarray(block[1:], dtype=np.float64) * 1e3 for block in cases[case][kernel]]
        picks = rng.integers(0, len(blocks), size)
        pools.append(np.array([np.median(rng.choice(blocks[i], size=blocks[i].size)) for i in picks], dtype=np.float64))
    return pools


def between_sd(rng: np.random.Generator, model: str) -> float:
    """Between-run sd of ln(time) for one simulated case (survey98: see the module docstring)."""
    if model == "none":
        return 0.0
    z = float(rng.standard_normal())
    return min(0.038, 0.004 * math.exp(z * math.log(1.3 / 0.4) / 1.2816))


def noise_series(pool: np.ndarray, rng: np.random.Generator, runs: int, blocks: int, sd: float) -> np.ndarray:
    """``runs`` run estimates: the median of ``blocks`` pool draws each, shifted by the between-run noise."""
    medians = np.median(rng.choice(pool, size=(runs, blocks)), axis=1)
    return np.asarray(medians * np.exp(rng.normal(0.0, sd, runs)) if sd > 0 else medians, dtype=np.float64)


@dataclass(frozen=True)
class Planted:
    """Relative steps applied from given runs on; the region where a found change point counts as a hit."""

    steps: tuple[tuple[int, float], ...]

    def apply(self, values: np.ndarray) -> np.ndarray:
        out = values.copy()
        for index, size in self.steps:
            out[index:] *= 1.0 + size
        return out

    def region(self, tolerance: int) -> tuple[int, int] | None:
        if not self.steps:
            return None
        return self.steps[0][0] - tolerance, self.steps[-1][0] + tolerance


def scenarios() -> dict[str, Callable[[np.random.Generator], Planted]]:
    def step(size: float) -> Callable[[np.random.Generator], Planted]:
        return lambda rng: Planted(((int(rng.integers(15, 45)), size),))

    def drift(rng: np.random.Generator) -> Planted:
        start = int(rng.integers(15, 35))
        return Planted(tuple((start + k, 0.005) for k in range(10)))

    return {
        "noise": lambda rng: Planted(()),
        "step +2%": step(0.02),
        "step +5%": step(0.05),
        "step +10%": step(0.10),
        "drift 10x +0.5%": drift,
    }


@dataclass
class Score:
    series: int = 0
    false: int = 0
    missed: int = 0
    planted: int = 0
    index_errors: list[int] | None = None

    def add(self, found: list[int], planted: Planted, tolerance: int) -> None:
        self.series += 1
        region = planted.region(tolerance)
        hits = [i for i in found if region is not None and region[0] <= i <= region[1]]
        self.false += len(found) - len(hits)
        if region is not None:
            self.planted += 1
            self.missed += not hits
            if hits and len(planted.steps) == 1:
                self.index_errors = [
                    *(self.index_errors or []),
                    min(abs(i - planted.steps[0][0]) for i in hits),
                ]

    def per_1000(self, count: int) -> float:
        return 1000.0 * count / max(self.series, 1)


def simulate(
    kernel: str,
    scenario: Callable[[np.random.Generator], Planted],
    *,
    n_series: int,
    seed: int,
    blocks: int = 20,
    between: str = "survey98",
    max_pvalue: float = 1e-4,
    tolerance: int = 2,
    pools: list[np.ndarray] | None = None,
) -> Score:
    """Score ``n_series`` histories of one noise class under one scenario (deterministic for a seed)."""
    rng = np.random.default_rng(seed)
    pools = pools if pools is not None else block_pools(kernel, rng)
    score = Score()
    for number in range(n_series):
        pool = pools[number % len(pools)]
        planted = scenario(rng)
        values = planted.apply(noise_series(pool, rng, RUNS, blocks, between_sd(rng, between)))
        found = [index for index, _ in change_indices(values.tolist(), max_pvalue, 0.0)]
        score.add(found, planted, tolerance)
    return score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=1000, help="series per scenario and class")
    parser.add_argument("--blocks", type=int, default=20, help="blocks per run")
    parser.add_argument("--between", choices=("survey98", "none"), default="survey98")
    parser.add_argument("--max-pvalue", type=float, default=1e-4, help="as `perfguard history changes`")
    parser.add_argument("--tolerance", type=int, default=2, help="runs a found change may be off by")
    parser.add_argument("--seed", type=int, default=20261123)
    args = parser.parse_args()
    print(
        f"{args.series} series of {RUNS} runs per row, {args.blocks} blocks per run, between-run noise "
        f"{args.between}, E-Divisive (Otava) p <= {args.max_pvalue:g}, tolerance +-{args.tolerance} runs, "
        f"seed {args.seed}"
    )
    print("| class | scenario | false per 1,000 series | missed per 1,000 series | median index error |")
    print("|---|---|---|---|---|")
    t0 = time.perf_counter()
    for cls, kernel in CLASSES.items():
        pools = block_pools(kernel, np.random.default_rng(args.seed))
        for number, (name, scenario) in enumerate(scenarios().items()):
            score = simulate(
                kernel,
                scenario,
                n_series=args.series,
                seed=args.seed + number,
                blocks=args.blocks,
                between=args.between,
                max_pvalue=args.max_pvalue,
                tolerance=args.tolerance,
                pools=pools,
            )
            missed = "-" if not score.planted else f"{score.per_1000(score.missed):.0f}"
            err = "-" if not score.index_errors else f"{np.median(score.index_errors):.0f}"
            print(f"| {cls} | {name} | {score.per_1000(score.false):.0f} | {missed} | {err} |", flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
