"""How good is the verdict? False alarms, detection power and time to verdict, on recorded H200 noise.

A simulation on a CPU, not a GPU run. Fake kernels advance a fake nanosecond clock by per-launch
durations resampled from `tests/data/h200_attention_timing_samples.json.xz`, and the plugin's real engine
(`measure` with `CpuTimer(clock=...)`), real baseline entry (`samples.entry_of` + `merge_entry`), real
`decide` and the runner's re-measure-once rule judge them. The same simulated runs are then judged by
the rules people use instead, so every rule sees exactly the same samples.

Noise model (one simulated *run* = one process):
  * the pool is each recorded block's launches but the first (a cold launch after the other kernels' blocks,
    1.2-2.5x slower in every series; `--keep-first-launch` keeps it);
  * within a run, the engine's blocks map onto recorded blocks: at the start of the run and after every
    engine block one of the 30 recorded blocks is drawn at random, and each call of either side draws a
    duration from that recorded block's launches (both sides use the same block index: the recorded
    blocks of the kernels alternate in time, so shared drift is kept, and so is the between-block spread);
  * between runs, each side is multiplied by exp(g + e): g ~ N(0, s_c) shared by both sides, e ~ N(0, s_e)
    per side, with s_c**2 + s_e**2 = sd**2 and 2*s_e**2 = ratio_sd**2 (a kernel's sd is at least
    ratio_sd/sqrt(2)). `--drift` picks (sd, ratio_sd) per simulated case: `survey98` (default) from a
    log-normal fitted to 98 cases over 4 processes on one H200 (median 0.4%, p90 1.3%; ratio median 0.7%,
    p90 1.8%), the model that reproduces the A/A false-alarm rates of the live H200 guard runs;
    `worst12` applies the worst spread of 12 fresh processes (0.42%, ratio 0.43%) to every case,
    `range12` draws from their range: well-behaved kernels;
  * a planted slowdown multiplies every variant duration.
A baseline is R simulated update runs folded by `merge_entry` (`--baseline-runs`, default 4, as the
committed H200 baseline was recorded; the plugin stores their geometric mean); fresh
runs are judged against it, as CI would.

Noise classes: `device` times SDPA with the L2 flushed before each launch (the queue is busy, so events
read the kernel: what graph replay sees), variant and reference both; `multi-kernel` times matmul+softmax
+matmul against that reference (host dispatch between kernels shows at small shapes); `launch-bound`
times SDPA back to back on an idle queue (host launch latency, up to 14% block spread): a stress test,
not what the CUDA-graph engine measures.

Rules compared on the same simulated runs (variant side, first measurement):
  * perfguard: `decide` with the runner's CUDA policy (the plugin's default margin unless --margin, its noise
    floors) and re-measure once; "perfguard F=20" judges at alpha/20, as in a run of 20 cases;
  * pytest-benchmark `--benchmark-compare-fail=min:5%` / `median:5%`: min / median of all per-call times
    of the run vs the stored run's (each pytest-benchmark round is one call);
  * do_bench 5%: one median over the first calls of the run worth `rep`=100 ms (with the 256 MiB flush
    before each launch counted in do_bench's `n_repeat`, as triton does), fail if > 5% above the stored one;
  * nvbench_compare: mean and relative stdev of per-call times; SLOW if the relative difference exceeds
    min(noise_ref, noise_cmp) (nvbench's nvbench_compare.py takes the smaller of the two noises).

Usage: python benchmarks/verdict_quality.py [--trials N] [--classes device,multi-kernel,launch-bound]
           [--drift worst12|range12|survey98|SD|LO:HI] [--baseline-runs R]
           [--margin M] [--target T] [--min-blocks B] [--noise-k K] [--json PATH]
The default (200 device verdicts per scenario, 40 per stress class) takes about two minutes on a CPU.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_perfguard.research import (
    NOISE_FLOOR,
    NOISE_K,
    RATIO_NOISE_FLOOR,
    BaselineEntry,
    Call,
    CaseRecord,
    CpuTimer,
    MeasureConfig,
    Measurement,
    Policy,
    PreparedSample,
    SampleTime,
    Settings,
    Status,
    Verdict,
    decide,
    entry_of,
    measure,
    pooled,
    update_rules,
)

FASTER, INCONCLUSIVE, PASS, REGRESSED = Status.FASTER, Status.INCONCLUSIVE, Status.PASS, Status.REGRESSED

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "h200_attention_timing_samples.json.xz"

DRIFTS = {
    # 12 fresh processes, SDPA and matmul+softmax+matmul, graph replay: median spread 0.02-0.42% (worst
    # applied to every case), naive/SDPA ratio 0.13-0.43%.
    "worst12": "0.42% on every case (ratio 0.43%): the worst of 12 processes on one H200",
    "range12": "log-uniform per case in 0.02-0.42% (ratio 0.13-0.43%): the range of 12 processes on one H200",
    # 98 cases over 4 fresh processes: sd of ln(time) median 0.4%, p90 1.3%, max 3.8% (Triton autotuning
    # picking different configs); ln(ratio) median 0.7%, p90 1.8%. Fitted log-normal per case.
    "survey98": "log-normal per case, median 0.4% / p90 1.3% (cap 3.8%), ratio median 0.7% / p90 1.8%: "
    "98 cases over 4 processes on one H200",
}


@dataclass(frozen=True)
class Drift:
    """Between-run spread of each simulated case: one of DRIFTS, or a fixed sd / log-uniform LO:HI."""

    kind: str = "survey98"

    def sds(self, u: float) -> tuple[float, float]:
        """(sd of a kernel's ln median, sd of the ln ratio) between runs, for the case at quantile u."""
        from scipy import stats

        if self.kind == "worst12":
            return 0.0042, 0.0043
        if self.kind == "range12":
            return _log_quantile((0.0002, 0.0042), u), _log_quantile((0.0013, 0.0043), u)
        if self.kind == "survey98":
            z = float(stats.norm.ppf(min(max(u, 1e-9), 1 - 1e-9)))
            return (
                min(0.038, 0.004 * math.exp(z * math.log(1.3 / 0.4) / 1.2816)),
                min(0.05, 0.007 * math.exp(z * math.log(1.8 / 0.7) / 1.2816)),
            )
        lo, _, hi = self.kind.partition(":")
        span = (float(lo), float(hi or lo))
        return _log_quantile(span, u), _log_quantile(span, u)

    def describe(self) -> str:
        return DRIFTS.get(self.kind, self.kind)


SIZES = (0.01, 0.02, 0.03, 0.05, 0.10)
FLUSH_US = 100.0  # zeroing 256 MiB before each do_bench launch (~2.7 TB/s): counts in do_bench's n_repeat
DO_BENCH_REP_MS = 100.0
FAMILY = 20
CLASSES: dict[str, tuple[str, str]] = {
    "device": ("sdpa_l2flush", "sdpa_l2flush"),
    "multi-kernel": ("naive", "sdpa_l2flush"),
    "launch-bound": ("sdpa", "sdpa"),
}
RULES = ("perfguard", "perfguard F=20", "pb min:5%", "pb median:5%", "do_bench 5%", "nvbench_compare")


def load_blocks(path: Path = DATA, *, keep_first_launch: bool = False) -> dict[str, dict[str, np.ndarray]]:
    """cases[case][kernel] -> array (blocks, launches) in ns.

    The first launch of every recorded block is a cold launch after the other kernels' blocks (1.2-2.5x the
    block median in every series): the engine's warm-up and discarded sample stand for it, so it is
    dropped unless asked for.
    """
    raw = json.loads(lzma.decompress(path.read_bytes()))
    scale = {"us": 1e3, "ms": 1e6, "ns": 1.0}[raw["unit"]]
    start = 0 if keep_first_launch else 1
    return {
        case: {k: np.asarray(v, dtype=np.float64)[:, start:] * scale for k, v in kernels.items()}
        for case, kernels in raw["cases"].items()
    }


# ------------------------------------------------------------------------------------- simulated device


class FakeDevice:
    """A fake GPU for one run: a nanosecond clock that fake kernels advance by resampled real durations.

    `next_block` is the engine's `on_block` hook, so recorded blocks change exactly at engine block
    boundaries. Per-call durations are logged only inside timed samples (what the other rules consume).
    """

    _BUF = 1024

    def __init__(
        self,
        variant_pool: np.ndarray,
        against_pool: np.ndarray,
        rng: np.random.Generator,
        *,
        variant_factor: float,
        against_factor: float,
    ) -> None:
        self.pools = (variant_pool, against_pool)
        self.factors = (variant_factor, against_factor)
        self.rng = rng
        self.now = 0.0
        self.recording = False
        self.logs: tuple[list[float], list[float]] = ([], [])
        self.bufs: list[list[float]] = [[], []]
        self.ptrs = [0, 0]
        self.next_block()

    def clock(self) -> int:
        return int(self.now)

    def next_block(self) -> str | None:
        j = int(self.rng.integers(self.pools[0].shape[0]))
        for side in (0, 1):
            self.bufs[side] = self._draw(side, j)
            self.ptrs[side] = 0
        self._block = j
        return None

    def _draw(self, side: int, j: int) -> list[float]:
        row = self.pools[side][j]
        drawn: list[float] = (row[self.rng.integers(row.size, size=self._BUF)] * self.factors[side]).tolist()
        return drawn

    def call(self, side: int) -> Call:
        def run() -> None:
            p = self.ptrs[side]
            buf = self.bufs[side]
            if p >= len(buf):
                buf = self.bufs[side] = self._draw(side, self._block)
                p = 0
            d = buf[p]
            self.ptrs[side] = p + 1
            self.now += d
            if self.recording:
                self.logs[side].append(d)

        return run


class _Recorded:
    """Wraps a prepared CPU sample so the fake kernels log their per-call durations while it runs."""

    def __init__(self, inner: PreparedSample, device: FakeDevice) -> None:
        self._inner = inner
        self._device = device
        self.reps = inner.reps
        self.mode = inner.mode

    def __call__(self) -> SampleTime:
        self._device.recording = True
        try:
            return self._inner()
        finally:
            self._device.recording = False


class RecordingTimer(CpuTimer):
    """The plugin's CPU timer on the fake clock; only adds the per-call log."""

    def __init__(self, device: FakeDevice) -> None:
        super().__init__(clock=device.clock)
        self.device = device

    def prepare(self, calls: Sequence[Call]) -> PreparedSample:
        return _Recorded(super().prepare(calls), self.device)


# ----------------------------------------------------------------------------------------------- a run


@dataclass
class Run:
    """One simulated process: its device, its first measurement, and (lazily) the re-measurement."""

    device: FakeDevice
    timer: RecordingTimer
    cfg: MeasureConfig
    rng: random.Random
    first: Measurement
    calls_v: list[float]  # per-call variant durations of the first measurement
    _second: Measurement | None = None

    def second(self) -> Measurement:
        if self._second is None:
            self._second = _measure(self.device, self.timer, self.cfg, self.rng, copies=self.first.reps)
        return self._second


def _measure(
    device: FakeDevice, timer: RecordingTimer, cfg: MeasureConfig, rng: random.Random, copies: int | None = None
) -> Measurement:
    def variant(_: int) -> Call:
        return device.call(0)

    def against(_: int) -> Call:
        return device.call(1)

    return measure(variant, against, timer, cfg, copies=copies, rng=rng, on_block=device.next_block)


def simulate_run(
    pools: tuple[np.ndarray, np.ndarray],
    slowdown: float,
    cfg: MeasureConfig,
    rng: np.random.Generator,
    run_sd: float,
    ratio_run_sd: float,
) -> Run:
    s_e = ratio_run_sd / math.sqrt(2.0)
    s_c = math.sqrt(max(run_sd**2 - s_e**2, 0.0))
    g = rng.normal(0.0, s_c)
    fv = math.exp(g + rng.normal(0.0, s_e)) * (1.0 + slowdown)
    fa = math.exp(g + rng.normal(0.0, s_e))
    device = FakeDevice(pools[0], pools[1], rng, variant_factor=fv, against_factor=fa)
    timer = RecordingTimer(device)
    py_rng = random.Random(int(rng.integers(2**63)))
    first = _measure(device, timer, cfg, py_rng)
    calls_v = list(device.logs[0])
    return Run(device, timer, cfg, py_rng, first, calls_v)


WORKLOAD = "0" * 64
ENV = {"name": "NVIDIA H200 (simulated)", "torch": "n/a"}


def _log_quantile(bounds: tuple[float, float], u: float) -> float:
    lo, hi = bounds
    return lo if hi <= lo else math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))


def baseline_entry(runs: Sequence[Run]) -> BaselineEntry:
    """The entry update runs store, built exactly as session.py does (record -> entry_of -> merge_entry, in
    turn): the runs' geometric-mean time and ratio, their between-run noise folded in."""
    floor = NOISE_FLOOR["cuda"]
    entry: BaselineEntry | None = None
    for run in runs:
        m = run.first
        record = CaseRecord(
            id="sim::case",
            workload=WORKLOAD,
            workload_desc="simulated",
            env=dict(ENV),
            median_ns=m.time.estimate,
            ci_ns=(m.time.lo, m.time.hi),
            ratio=m.ratio.estimate if m.ratio else None,
            ratio_ci=(m.ratio.lo, m.ratio.hi) if m.ratio else None,
            blocks=m.blocks,
        )
        entry, _ = update_rules.merge_entry(entry, entry_of(record, floor), floor)
    assert entry is not None
    return entry


@dataclass
class Judged:
    status: str
    samples: int  # timed samples, both sides, re-measurement included
    device_s: float  # simulated time from the first warm-up call to the verdict
    why: str = ""  # perfguard: the gates' reasons and the run's drift, to explain a false alarm


def ratio_noise(runs: Sequence[Run]) -> float:
    """Proposal: the ratio's own between-run noise, as an entry derives time's from its process samples (the
    sd of the logs over the update runs, never below the floor)."""
    floor = RATIO_NOISE_FLOOR["cuda"]
    logs = [math.log(r.first.ratio.estimate) for r in runs if r.first.ratio is not None]
    return max(floor, statistics.stdev(logs)) if len(logs) >= 2 else floor


def judge_perfguard(run: Run, stored: BaselineEntry, policy: Policy, ratio_noise: float | None = None) -> Judged:
    """decide() plus the runner's rule: a regressed/inconclusive case is re-measured once, blocks pooled.

    `ratio_noise` (a proposal) judges the ratio gate with the ratio's own folded noise instead of time's.
    """

    def decide_with(m: Measurement, entry: BaselineEntry) -> Verdict:
        return decide(
            m.variant_blocks,
            m.against_blocks,
            entry,
            workload=WORKLOAD,
            policy=policy,
            max_ratio=None,
            incomparable=[],
            disturbances=m.notes,
        )

    def verdict_of(m: Measurement) -> Verdict:
        v = decide_with(m, stored)
        if ratio_noise is not None:
            by_ratio = {g.name: g for g in decide_with(m, replace(stored, noise=ratio_noise)).gates}
            v.gates = [by_ratio[g.name] if g.name == "ratio" else g for g in v.gates]
        return v

    m = run.first
    verdict = verdict_of(m)
    samples = m.blocks * m.samples_per_block * 2
    if verdict.needs_remeasure:
        m2 = run.second()
        samples += m2.blocks * m2.samples_per_block * 2
        m = pooled(m, m2, run.cfg.confidence)
        verdict = verdict_of(m)
    fv, fa = run.device.factors
    why = "; ".join(g.reason for g in verdict.gates) + (
        f" [run drift: variant x{fv:.4f}, against x{fa:.4f}; stored noise {stored.noise:.4f}]"
    )
    return Judged(verdict.status, samples, m.elapsed_s, why)


@dataclass
class RuleStats:
    """The figures a fixed-threshold rule keeps from a run's per-call times."""

    minimum: float
    median: float
    mean: float
    rel_sd: float
    do_bench: float
    do_bench_n: int
    do_bench_s: float
    calls: int
    calls_s: float


def rule_stats(calls: Sequence[float]) -> RuleStats:
    a = np.asarray(calls)
    est_ns = float(np.median(a[:5])) + FLUSH_US * 1e3  # triton estimates from 5 launches, flush included
    n = max(1, int(DO_BENCH_REP_MS * 1e6 / est_ns))
    head = a[:n]
    return RuleStats(
        minimum=float(a.min()),
        median=float(np.median(a)),
        mean=float(a.mean()),
        rel_sd=float(a.std(ddof=1) / a.mean()) if a.size > 1 else math.inf,
        do_bench=float(np.median(head)),
        do_bench_n=int(head.size),
        do_bench_s=float(head.size * est_ns / 1e9),
        calls=int(a.size),
        calls_s=float(a.sum() / 1e9),
    )


def judge_rules(new: RuleStats, old: RuleStats) -> dict[str, Judged]:
    def fixed(now: float, then: float) -> str:
        return REGRESSED if now > then * 1.05 else PASS

    diff = (new.mean - old.mean) / old.mean
    noise = min(new.rel_sd, old.rel_sd)
    nv = PASS if abs(diff) <= noise else (REGRESSED if diff > 0 else FASTER)
    return {
        "pb min:5%": Judged(fixed(new.minimum, old.minimum), new.calls, new.calls_s),
        "pb median:5%": Judged(fixed(new.median, old.median), new.calls, new.calls_s),
        "do_bench 5%": Judged(fixed(new.do_bench, old.do_bench), new.do_bench_n, new.do_bench_s),
        "nvbench_compare": Judged(nv, new.calls, new.calls_s),
    }


# ------------------------------------------------------------------------------------------ experiment


@dataclass
class Cell:
    statuses: list[str] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    device_s: list[float] = field(default_factory=list)
    regressed_why: list[str] = field(default_factory=list)

    def add(self, j: Judged) -> None:
        self.statuses.append(j.status)
        self.samples.append(j.samples)
        self.device_s.append(j.device_s)
        if j.status == REGRESSED and j.why:
            self.regressed_why.append(j.why)

    def rate(self, status: str) -> float:
        return self.statuses.count(status) / len(self.statuses) if self.statuses else math.nan


@dataclass
class Config:
    trials: int = 200
    classes: tuple[str, ...] = ("device", "multi-kernel", "launch-bound")
    stress_fraction: float = 0.2  # the non-device classes get this share of the trials (they are slow)
    runs_per_baseline: int = 5
    keep_first_launch: bool = False
    seed: int = 20261121
    drift: Drift = field(default_factory=Drift)
    baseline_runs: int = 4  # update runs behind a baseline (the plugin folds their between-run noise)
    ratio_noise: bool = False  # proposal: the ratio gate uses the ratio's own folded between-run noise
    confirm: bool = True  # as the plugin: a regressed case is judged again in a fresh process (run)
    # As the runner builds it on CUDA: min_time_s = min(0.3, budget / 2).
    measure: MeasureConfig = field(default_factory=lambda: MeasureConfig(target=0.01, budget_s=5.0, min_time_s=0.3))
    policy: Policy = field(
        default_factory=lambda: Policy(
            margin=Settings().margin,
            alpha=Settings().alpha,
            family_size=1,
            noise_floor=NOISE_FLOOR["cuda"],
            ratio_noise_floor=RATIO_NOISE_FLOOR["cuda"],
        )
    )


def run_class(
    name: str, data: dict[str, dict[str, np.ndarray]], cfg: Config, trials: int, rng: np.random.Generator
) -> dict[str, dict[str, Cell]]:
    """cells[scenario][rule]; scenario "A/A" or "+1%" ...; about `trials` verdicts per scenario."""
    kv, ka = CLASSES[name]
    cases = sorted(data, key=lambda c: float(np.median(data[c][kv])))
    scenarios = [("A/A", 0.0)] + [(f"+{s * 100:g}%", s) for s in SIZES]
    cells = {sc: {r: Cell() for r in RULES} for sc, _ in scenarios}
    policies = {"perfguard": cfg.policy, "perfguard F=20": replace(cfg.policy, family_size=FAMILY)}
    per_case = max(1, math.ceil(trials / len(cases)))
    n_base = max(1, math.ceil(per_case / cfg.runs_per_baseline))
    for case in cases:
        pools = (data[case][kv], data[case][ka])
        done = 0
        for b in range(n_base):
            u = float(rng.random())
            sd, rsd = cfg.drift.sds(u)
            bases = [simulate_run(pools, 0.0, cfg.measure, rng, sd, rsd) for _ in range(cfg.baseline_runs)]
            base = bases[-1]
            stored = baseline_entry(bases)
            r_noise = ratio_noise(bases) if cfg.ratio_noise else None
            old = rule_stats(base.calls_v)
            k = min(cfg.runs_per_baseline, per_case - done) if b == n_base - 1 else cfg.runs_per_baseline
            for _ in range(k):
                for scenario, size in scenarios:
                    run = simulate_run(pools, size, cfg.measure, rng, sd, rsd)
                    for rule, pol in policies.items():
                        j = judge_perfguard(run, stored, pol, r_noise)
                        if j.status == REGRESSED and cfg.confirm:
                            # The plugin's confirmation: the case again in a fresh process (a fresh drift
                            # draw); it stays regressed only if it regresses there too.
                            again = judge_perfguard(
                                simulate_run(pools, size, cfg.measure, rng, sd, rsd), stored, pol, r_noise
                            )
                            j = Judged(
                                REGRESSED if again.status == REGRESSED else INCONCLUSIVE,
                                j.samples + again.samples,
                                j.device_s + again.device_s,
                                j.why,
                            )
                        cells[scenario][rule].add(j)
                    for rule, j in judge_rules(rule_stats(run.calls_v), old).items():
                        cells[scenario][rule].add(j)
            done += k
    return cells


def clopper_pearson_upper(k: int, n: int, conf: float = 0.95) -> float:
    from scipy import stats

    return 1.0 if k >= n else float(stats.beta.ppf(conf, k + 1, n - k))


def summarize(cells: dict[str, dict[str, Cell]]) -> list[dict[str, Any]]:
    rows = []
    aa = cells["A/A"]
    for rule in RULES:
        c = aa[rule]
        n = len(c.statuses)
        k = c.statuses.count(REGRESSED)
        row: dict[str, Any] = {
            "rule": rule,
            "n": n,
            "false_alarms": k,
            "false_alarm_rate": k / n if n else math.nan,
            "false_alarm_upper95": clopper_pearson_upper(k, n) if n else math.nan,
            "inconclusive_rate": c.rate(INCONCLUSIVE),
            "faster_rate": c.rate(FASTER),
            "false_alarm_examples": c.regressed_why[:10],
        }
        for sc in cells:
            if sc != "A/A":
                row[f"detect {sc}"] = cells[sc][rule].rate(REGRESSED)
                row[f"inconclusive {sc}"] = cells[sc][rule].rate(INCONCLUSIVE)
        secs = [x for sc in cells for x in cells[sc][rule].device_s]
        row["median_samples"] = statistics.median(c.samples)  # A/A: a case that did not change
        row["median_device_s"] = statistics.median(c.device_s)
        row["median_device_s_all"] = statistics.median(secs)  # all scenarios: near-margin ones re-measure
        row["max_device_s"] = max(secs)
        rows.append(row)
    return rows


def family_rate(cells: dict[str, dict[str, Cell]], rule: str = "perfguard F=20") -> dict[str, Any]:
    """Runs of FAMILY cases, each judged at alpha/FAMILY: share of runs with at least one false alarm."""
    st = cells["A/A"][rule].statuses
    groups = [st[i : i + FAMILY] for i in range(0, len(st) - FAMILY + 1, FAMILY)]
    bad = sum(REGRESSED in g for g in groups)
    per_case = st.count(REGRESSED) / len(st) if st else math.nan
    upper = clopper_pearson_upper(st.count(REGRESSED), len(st)) if st else math.nan
    return {
        "runs": len(groups),
        "runs_with_false_alarm": bad,
        "observed_rate": bad / len(groups) if groups else math.nan,
        "implied_rate": 1 - (1 - per_case) ** FAMILY,
        "implied_upper95": 1 - (1 - upper) ** FAMILY,
    }


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x * 100:.1f}%"


def table(rows: list[dict[str, Any]]) -> str:
    from tabulate import tabulate

    heads = ["rule", "A/A false alarm", "A/A inconcl."] + [f"detect +{s * 100:g}%" for s in SIZES]
    heads += ["A/A median samples", "median device s (A/A, all)", "max device s"]
    body = []
    for r in rows:
        body.append(
            [
                r["rule"],
                f"{r['false_alarms']}/{r['n']} (<= {_pct(r['false_alarm_upper95'])})",
                _pct(r["inconclusive_rate"]),
            ]
            + [_pct(r[f"detect +{s * 100:g}%"]) for s in SIZES]
            + [
                f"{r['median_samples']:.0f}",
                f"{r['median_device_s']:.3f}, {r['median_device_s_all']:.3f}",
                f"{r['max_device_s']:.2f}",
            ]
        )
    return tabulate(body, headers=heads, tablefmt="github")


def experiment(cfg: Config, data: dict[str, dict[str, np.ndarray]] | None = None) -> dict[str, Any]:
    data = data if data is not None else load_blocks(keep_first_launch=cfg.keep_first_launch)
    rng = np.random.default_rng(cfg.seed)
    out: dict[str, Any] = {"classes": {}}
    for name in cfg.classes:
        trials = cfg.trials if name == "device" else max(FAMILY, int(cfg.trials * cfg.stress_fraction))
        t0 = time.perf_counter()
        cells = run_class(name, data, cfg, trials, rng)
        out["classes"][name] = {
            "kernels": {"variant": CLASSES[name][0], "against": CLASSES[name][1]},
            "rows": summarize(cells),
            "family": family_rate(cells),
            "host_s": round(time.perf_counter() - t0, 1),
        }
    return out


def print_report(result: dict[str, Any], cfg: Config) -> None:
    m, p = cfg.measure, cfg.policy
    print(
        f"verdict quality: simulation on recorded H200 noise ({DATA.name}), {date.today().isoformat()}\n"
        f"engine: target {m.target:g}, budget {m.budget_s:g} s, min_blocks {m.min_blocks}, "
        f"samples_per_block {m.samples_per_block}; policy: margin {p.margin:g}, alpha {p.alpha:g}, "
        f"noise floors {p.noise_floor:g} / {p.ratio_noise_floor:g}; NOISE_K {p.noise_k:g}; "
        f"min_time {m.min_time_s:g} s\n"
        f"between-run drift: {cfg.drift.describe()}\n"
        f"baseline: {cfg.baseline_runs} update run(s), "
        "geometric mean of the update runs (plugin)"
        f"{'; ratio gate on its own folded noise (proposal)' if cfg.ratio_noise else ''}"
        f"{'; fresh-process confirmation' if cfg.confirm else '; no confirmation'}; seed {cfg.seed}"
    )
    for name, res in result["classes"].items():
        k = res["kernels"]
        print(f"\n## {name}: variant {k['variant']}, against {k['against']} ({res['host_s']} s on this host)\n")
        print(table(res["rows"]))
        f = res["family"]
        print(
            f"\nrun of {FAMILY} cases at alpha/{FAMILY} (perfguard F=20): {f['runs_with_false_alarm']}/{f['runs']} "
            f"runs with a false alarm; implied by the per-case rate {_pct(f['implied_rate'])} "
            f"(95% upper bound {_pct(f['implied_upper95'])})"
        )


def _finite(obj: Any) -> Any:
    """JSON has no NaN or infinity: such figures (an empty cell) become null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200, help="verdicts per scenario for the device class")
    ap.add_argument("--classes", default="device,multi-kernel,launch-bound")
    ap.add_argument("--stress-fraction", type=float, default=0.2, help="share of --trials for the stress classes")
    ap.add_argument("--seed", type=int, default=20261121)
    ap.add_argument(
        "--drift",
        default="survey98",
        # argparse %-formats help text: the drift descriptions carry percent signs
        help=("between-run spread: " + "; ".join(f"{k}: {v}" for k, v in DRIFTS.items()) + "; or SD or LO:HI").replace(
            "%", "%%"
        ),
    )
    ap.add_argument("--baseline-runs", type=int, default=4, help="update runs behind each baseline")
    ap.add_argument("--ratio-noise", action="store_true", help="proposal: ratio gate uses the ratio's own folded noise")
    ap.add_argument("--no-confirm", action="store_true", help="leave out the fresh-process confirmation")
    ap.add_argument("--min-time", type=float, default=0.3, help="MeasureConfig.min_time_s (runner on CUDA: 0.3)")
    ap.add_argument("--margin", type=float, default=Settings().margin, help="default: the plugin's")
    ap.add_argument("--target", type=float, default=0.01)
    ap.add_argument("--budget", type=float, default=5.0)
    ap.add_argument("--min-blocks", type=int, default=12)
    ap.add_argument("--samples-per-block", type=int, default=5)
    ap.add_argument("--noise-floor", type=float, default=NOISE_FLOOR["cuda"])
    ap.add_argument("--ratio-noise-floor", type=float, default=RATIO_NOISE_FLOOR["cuda"])
    ap.add_argument(
        "--noise-k",
        type=float,
        default=None,
        help="proposal: use K instead of the plugin's NOISE_K (delta = max(margin, K * noise)) in this run only",
    )
    ap.add_argument("--keep-first-launch", action="store_true", help="keep each recorded block's cold first launch")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    classes = tuple(c.strip() for c in args.classes.split(",") if c.strip())
    unknown = [c for c in classes if c not in CLASSES]
    if unknown:
        ap.error(f"unknown class {unknown}; choose from {sorted(CLASSES)}")
    cfg = Config(
        trials=args.trials,
        baseline_runs=args.baseline_runs,
        ratio_noise=args.ratio_noise,
        confirm=not args.no_confirm,
        drift=Drift(args.drift),
        keep_first_launch=args.keep_first_launch,
        classes=classes,
        stress_fraction=args.stress_fraction,
        seed=args.seed,
        measure=MeasureConfig(
            target=args.target,
            budget_s=args.budget,
            min_blocks=args.min_blocks,
            min_time_s=min(args.min_time, args.budget / 2),
            samples_per_block=args.samples_per_block,
        ),
        policy=Policy(
            margin=args.margin,
            alpha=Settings().alpha,
            family_size=1,
            noise_floor=args.noise_floor,
            ratio_noise_floor=args.ratio_noise_floor,
            # a what-if for the report; the plugin itself is unchanged
            noise_k=NOISE_K if args.noise_k is None else args.noise_k,
        ),
    )
    t0 = time.perf_counter()
    result = experiment(cfg)
    print_report(result, cfg)
    print(f"\n({time.perf_counter() - t0:.0f} s on this host)")
    if args.json is not None:
        m, p = cfg.measure, cfg.policy
        doc = {
            "kind": "perfguard-verdict-quality",
            "method": "simulation: fake kernels resampling recorded H200 per-launch times, driving the real engine",
            "data": DATA.name,
            "date": date.today().isoformat(),
            "config": {
                "trials": cfg.trials,
                "seed": cfg.seed,
                "drift": cfg.drift.kind,
                "drift_model": cfg.drift.describe(),
                "baseline_runs": cfg.baseline_runs,
                "ratio_noise": cfg.ratio_noise,
                "confirm": cfg.confirm,
                "keep_first_launch": cfg.keep_first_launch,
                "min_time_s": m.min_time_s,
                "target": m.target,
                "budget_s": m.budget_s,
                "min_blocks": m.min_blocks,
                "samples_per_block": m.samples_per_block,
                "margin": p.margin,
                "alpha": p.alpha,
                "noise_floor": p.noise_floor,
                "ratio_noise_floor": p.ratio_noise_floor,
                "family": FAMILY,
                "noise_k": p.noise_k,
            },
            **result,
        }
        args.json.write_text(json.dumps(_finite(doc), indent=2, sort_keys=True, allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
