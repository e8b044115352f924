"""The integrity checks as pure functions: peaks of fake devices, the physics check, the unseen-work rule,
patched timers, the timed-output check, degenerate inputs and declared kernels."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from pytest_perfguard.measure import copies as timed_copies
from pytest_perfguard.measure import integrity, peaks, timers
from pytest_perfguard.measure.correctness import check
from pytest_perfguard.measure.peaks import DeviceSpec, Peak, impossible_speed, peak_for, percent_of_peak
from pytest_perfguard.measure.timers import CpuTimer


def _attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


# -------------------------------------------------------------------------------------------- peaks


@pytest.mark.parametrize(
    ("name", "tflops", "gbps"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4, 3350.0),
        ("NVIDIA H100 PCIe", 756.0, 2000.0),
        ("NVIDIA H200", 989.4, 4800.0),
        ("NVIDIA H200 NVL", 835.0, 4800.0),
        ("NVIDIA A100-SXM4-80GB", 312.0, 2039.0),
        ("NVIDIA L4", 121.0, 300.0),
        ("NVIDIA B200", 2250.0, 8000.0),
    ],
)
def test_the_table_knows_each_gpu_by_its_torch_name(name: str, tflops: float, gbps: float) -> None:
    peak = peak_for(DeviceSpec(name))
    assert peak is not None and peak.tensor_tflops == tflops and peak.gbps == gbps


def test_an_unknown_gpu_without_clocks_has_no_peak_and_one_with_clocks_is_computed() -> None:
    assert peak_for(DeviceSpec("NVIDIA Future 9000", (12, 0), 200)) is None
    # names that contain a known one are other GPUs: an L40S is not an L4, a GH200 not an H200
    assert peak_for(DeviceSpec("NVIDIA L40S", (8, 9), 142)) is None
    assert peak_for(DeviceSpec("NVIDIA GH200 480GB", (9, 0), 132)) is None
    # an H100 SXM described by its clocks alone: 132 SMs at 1830 MHz, HBM3 at 2619 MHz on 5120 bits
    spec = DeviceSpec("Some sm90 part", (9, 0), 132, 1830.0, 2619.0, 5120)
    peak = peak_for(spec)
    assert peak is not None
    assert peak.tensor_tflops == pytest.approx(989.4, rel=0.01)
    assert peak.gbps == pytest.approx(3352.0, rel=0.01)


H200 = Peak(989.4, 67.0, 4800.0, "test")


def test_the_physics_check_rejects_the_impossible_only() -> None:
    assert impossible_speed(H200, tflops=900.0, gbps=4000.0) is None
    msg = impossible_speed(H200, tflops=5600.0, gbps=None)
    assert msg == "impossible speed: 5600 TFLOP/s exceeds this GPU's peak 989.4: the timer does not see the work"
    msg = impossible_speed(H200, tflops=None, gbps=9000.0)
    assert msg == "impossible speed: 9000 GB/s exceeds this GPU's peak 4800: the timer does not see the work"


def test_percent_of_peak_uses_the_tensor_peak_for_half_precision() -> None:
    assert percent_of_peak(H200, tflops=494.7, gbps=2400.0, dtype="float16") == pytest.approx((50.0, 50.0))
    assert percent_of_peak(H200, tflops=33.5, gbps=None, dtype="float32") == pytest.approx((50.0, None))


# --------------------------------------------------------------------------------------- unseen work


def test_a_hidden_kernel_is_seen_at_every_size_and_replay_overhead_is_not() -> None:
    overhead = 8_000.0  # an empty graph's replay gap on a busy host
    # honest: a tiny kernel (64 calls in 200 us) with 30 us of host cost, and a long one with 3% clock disagreement
    assert integrity.unseen_work(30_000.0, 200_000.0, overhead, 64) is None
    assert integrity.unseen_work(300_000.0, 10_000_000.0, overhead, 4) is None
    # the side stream: 64 calls read 0.76 us each while 36 us each ran outside the events
    msg = integrity.unseen_work(64 * 35_000.0, 64 * 760.0, overhead, 64)
    assert msg is not None and msg.startswith("work outside the timed stream")
    # a small hidden kernel: 2 us of hidden work per call, 64 calls
    assert integrity.unseen_work(64 * 2_000.0, 200_000.0, overhead, 64) is not None


def test_a_capture_that_failed_on_an_unjoined_fork_is_work_outside_the_timed_stream() -> None:
    """Timed without a graph, a side stream's work can run under the spin the stream timer enqueues first,
    where the wall clock misses it too (an H100, 2026-11-23: 2.6 us read for a 36 us call). CUDA's own
    error for the failed capture names the fork; any other capture failure says nothing about the variant."""
    unjoined = (
        "RuntimeError: CUDA error: operation failed due to a previous error during capture\n"
        "CUDA error: capture sequence contains a fork that was not joined to the primary stream"
    )
    msg = integrity.forked_work(unjoined)
    assert msg is not None and msg.startswith("work outside the timed stream")
    assert "never joins it back" in msg and "fork that was not joined" in msg
    assert integrity.forked_work("cudaErrorStreamCaptureUnjoined") is not None
    # honest reasons to fall back: a host sync or a CPU tensor inside the call
    assert integrity.forked_work("RuntimeError: CUDA error: operation not permitted when stream is capturing") is None
    assert integrity.forked_work(None) is None and integrity.forked_work("") is None


# ------------------------------------------------------------------------------------ patched timers


def test_a_patched_clock_or_engine_function_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert integrity.patched_timers() == []
    monkeypatch.setattr(time, "perf_counter_ns", lambda: 0)
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", lambda self, other: 0.0)
    from pytest_perfguard.measure import hosttime, timers, timing

    monkeypatch.setattr(timers.CpuTimer, "prepare", lambda self, calls: None)
    monkeypatch.setattr(timing, "pooled", lambda *a: None)
    monkeypatch.setattr(hosttime, "host_time", lambda *a, **k: None)
    assert integrity.patched_timers() == [
        "time.perf_counter_ns",
        "torch.cuda.Event.elapsed_time",
        "pytest_perfguard.measure.timers.CpuTimer.prepare",
        "pytest_perfguard.measure.timing.pooled",
        "pytest_perfguard.measure.hosttime.host_time",
    ]
    marker = object()
    assert integrity.patched_timers({"runner.measure": (marker, object())})[-1] == "runner.measure"


@pytest.mark.parametrize("name", ["measure", "make_timer", "pooled", "host_time"])
def test_an_engine_function_patched_during_the_case_is_seen_after_timing(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The runner's checks read the timing step's bindings when they check, not when the case starts: a
    kernel that patches one in its first timed call is caught by the check after timing."""
    from contextlib import nullcontext

    from pytest_perfguard.run import timed
    from pytest_perfguard.run.checks import IntegrityChecks
    from pytest_perfguard.settings import Settings

    checks = IntegrityChecks(Settings(), "cpu", lambda *, exclusive: nullcontext(), timed.engine_bindings)
    assert checks._patched() is None
    monkeypatch.setattr(timed, name, lambda *a, **k: None)
    assert f"patched timer: pytest_perfguard.run.timed.{name} is not" in (checks._patched() or "")


# ------------------------------------------------------------------------------------- timed outputs


def _inputs(seed: int) -> tuple[tuple[torch.Tensor, ...], dict[str, object]]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, 8, 4, generator=g, dtype=torch.float64) for _ in range(3)), {}


def _sample(fn: object, inputs: tuple[tuple[torch.Tensor, ...], dict[str, object]], outputs: dict[int, object]):  # type: ignore[no-untyped-def]
    def run() -> None:
        outputs[0] = fn(*inputs[0])  # type: ignore[operator]

    return run


def _copies(
    fn: Callable[..., torch.Tensor], members: int = 2, reps: int = 3, clock: Callable[[], int] = time.perf_counter_ns
) -> timed_copies.TimedCopies:
    """`members` timed samples of `reps` calls of `fn`, each on its own input copy, as measure() leaves them:
    each call keeps its output, and new values come from seeds never drawn before. `clock` times them."""
    inputs = {i: _inputs(100 + i) for i in range(members * reps)}
    outputs: dict[int, object] = {}

    def member(j: int) -> Callable[[], timers.SampleTime]:
        def run() -> timers.SampleTime:
            t0 = clock()
            for i in range(j * reps, (j + 1) * reps):
                outputs[i] = fn(*inputs[i][0])
            per_call = (clock() - t0) / reps
            return timers.SampleTime(per_call, per_call)

        return run

    samples = [member(j) for j in range(members)]
    for sample in samples:
        sample()
    drawn = iter(range(1000, 10**6))

    def fresh(i: int) -> tuple[int, tuple[tuple[torch.Tensor, ...], dict[str, object]]]:
        seed = next(drawn)
        return seed, _inputs(seed)

    return timed_copies.TimedCopies(samples, reps, inputs, outputs, fresh)


def test_an_honest_kernel_passes_every_copy_and_gets_its_inputs_back() -> None:
    copies = _copies(_attn)
    before = {i: [t.clone() for t in x[0]] for i, x in copies.inputs.items()}
    assert timed_copies.timed_outputs(copies.outputs, copies.inputs[0], _attn, [], seed=100) is None
    assert timed_copies.every_copy(copies, _attn, []) is None
    assert all(torch.equal(a, b) for i, x in copies.inputs.items() for a, b in zip(before[i], x[0], strict=True))


def test_the_last_timed_output_is_judged_on_the_gates_oracle() -> None:
    calls = {"n": 0}

    def counted(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return _attn(q, k, v)

    report = check(_attn, counted, _inputs, [1, 2, 3], keep=2)
    inputs = _inputs(1)
    calls["n"] = 0
    assert (
        timed_copies.timed_outputs({0: _attn(*inputs[0])}, inputs, counted, [], seed=1, oracles=report.oracles) is None
    )
    assert calls["n"] == 0
    msg = timed_copies.timed_outputs({0: torch.zeros(1, 2, 8, 4, dtype=torch.float64)}, inputs, _attn, [], seed=1)
    assert msg is not None and msg.startswith("timed output wrong: the output of the last timed call")


def test_work_skipped_on_copies_other_than_the_first_fails_on_that_copy() -> None:
    """The held-out class: only copy 0 was verified, and a variant that did nothing on the other copies read
    45-49% faster. Every copy is checked now; the message names the copy."""
    first = _inputs(100)[0][0]

    def lazy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _attn(q, k, v) if q.data_ptr() == first.data_ptr() else torch.zeros_like(q)

    copies = _copies(lazy)
    copies.inputs[0][0][0].set_(first)  # copy 0 holds the tensor the variant recognises
    msg = timed_copies.every_copy(copies, _attn, [])
    assert msg is not None and msg.startswith("timed output wrong on input copy 2 of 6 (seed ")


def test_a_memo_of_values_the_gate_saw_fails_because_the_refill_is_new() -> None:
    """A memo keyed on input values, seeded by the correctness calls: the old refill wrote the gate's seeds
    back, which the memo knew. New seeds per copy find it."""
    memo: dict[bytes, torch.Tensor] = {}
    for seed in range(100, 106):  # what the correctness calls and the timed copies showed it
        q, k, v = _inputs(seed)[0]
        memo[q.numpy().tobytes()] = _attn(q, k, v)

    def memoised(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        key = q.numpy().tobytes()
        return memo[key].clone() if key in memo else torch.zeros_like(q)  # the "fast path" only

    assert timed_copies.every_copy(_copies(memoised), _attn, []) is not None


def test_a_cache_keyed_by_pointer_and_a_mutation_are_named() -> None:
    cache: dict[int, torch.Tensor] = {}

    def cached(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return cache.setdefault(q.data_ptr(), _attn(q, k, v)).clone()

    msg = timed_copies.every_copy(_copies(cached), _attn, [])
    assert msg is not None and msg.startswith("timed output wrong on input copy 1 of 6")

    def scaling(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = _attn(q, k, v)
        q.mul_(2.0)
        return out

    msg = timed_copies.every_copy(_copies(scaling), _attn, [])
    assert msg is not None and msg.startswith(
        "input mutation: the timed calls modified input arg0 in place on input copy 1"
    )


def _slow_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention with enough host work that a skipped half shows on a host timer."""
    out = _attn(q, k, v)
    for _ in range(40):
        out = out + 0.0 * _attn(q, k, v)
    return out


def _version_memo() -> Callable[..., torch.Tensor]:
    memo: dict[int, tuple[int, torch.Tensor]] = {}

    def versioned(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        hit = memo.get(q.data_ptr())
        if hit is not None and hit[0] == q._version:
            return hit[1].clone()
        out = _slow_attn(q, k, v)
        memo[q.data_ptr()] = (q._version, out)
        return out

    return versioned


def test_a_memo_on_tensor_versions_reads_faster_on_seen_values_and_is_flagged() -> None:
    """Stream-mode class: Python runs on every timed call, and a memo keyed on the inputs' version counters
    served every timed call after the first. The answers are right (every_copy passes); the time is not."""
    copies = _copies(_version_memo())
    assert timed_copies.every_copy(copies, _attn, []) is None
    seen = timed_copies.seen_values(copies, host=True)
    assert seen.flag is not None and seen.flag.startswith("memo on seen inputs: on new input values"), seen


def test_on_a_gpu_the_first_look_is_the_copies_check_and_a_memo_still_shows() -> None:
    """On a GPU, seen_values' first look is every_copy's pairs (one more run of each sample on the values it
    has just run) instead of its own rounds of draws: one pair per sample, and the version-counter memo reads
    faster on the second run and is flagged after the confirming rounds."""
    copies = _copies(_version_memo(), members=3)
    pairs: list[float] = []
    assert timed_copies.every_copy(copies, _attn, [], pairs=pairs) is None
    assert len(pairs) == 3 and min(pairs) > 2.0, pairs
    seen = timed_copies.seen_values(copies, host=False, first=pairs)
    assert seen.flag is not None and "median of 7 paired rounds" in seen.flag, seen


def test_the_second_run_of_a_sample_comes_after_its_check() -> None:
    """What would get past a first look taken before the check: a variant that leaves its output unwritten
    the first time it meets values and computes them the second time. The check reads the first run's
    outputs, so it fails there, with or without pairs."""
    met: set[bytes] = set()

    def second_sight(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        key = q.numpy().tobytes()
        if key in met:
            return _attn(q, k, v)
        met.add(key)
        return torch.zeros_like(q)

    msg = timed_copies.every_copy(_copies(second_sight), _attn, [], pairs=[])
    assert msg is not None and msg.startswith("timed output wrong on input copy 1 of 6"), msg


class _Watch:
    """A timers.Watch whose windows read disturbed while `load` holds a True (one per window, then clean)."""

    def __init__(self, *load: bool) -> None:
        self.load, self.windows = list(load), 0

    def start(self) -> None:
        self.windows += 1

    def stop(self) -> list[str]:
        return ["CPU contended (test)"] if self.load and self.load.pop(0) else []


def test_a_memo_read_on_disturbed_rounds_is_undecided_and_clean_rounds_decide() -> None:
    """A flag fails the case, so the confirming rounds are watched. Disturbed twice: neither a flag nor a pass
    (`disturbed`, which makes the case inconclusive). Disturbed once, then clean: the clean rounds decide,
    and a memo is still flagged. What would get past: a memo that waits for a loaded moment is undecided,
    never passed."""
    watch = _Watch(True, True)
    seen = timed_copies.seen_values(_copies(_version_memo()), host=True, watch=lambda: watch)
    assert watch.windows == 2 and seen.flag is None, seen
    assert seen.disturbed is not None and seen.disturbed.startswith(
        "the memo check's rounds were disturbed (CPU contended (test))"
    ), seen
    assert seen.note.startswith("seen-values check undecided:"), seen

    watch = _Watch(True, False)
    seen = timed_copies.seen_values(_copies(_version_memo()), host=True, watch=lambda: watch)
    assert watch.windows == 2 and seen.disturbed is None, seen
    assert seen.flag is not None and seen.flag.startswith("memo on seen inputs"), seen


def test_an_honest_kernel_on_a_loaded_host_is_not_held_by_the_watch() -> None:
    """The watch decides only rounds that read past the factor: an honest first look needs no confirming
    rounds, whatever the load. The kernel's time is a clock it advances (the real one moves under a loaded
    test run, which is this test's subject, not its input)."""
    now = [0]

    def fixed_cost(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        now[0] += 50_000
        return _attn(q, k, v)

    watch = _Watch(True, True)
    seen = timed_copies.seen_values(_copies(fixed_cost, clock=lambda: now[0]), host=True, watch=lambda: watch)
    assert seen.flag is None and seen.disturbed is None and watch.windows == 0, seen


def test_an_honest_kernel_reads_the_same_on_new_and_seen_values() -> None:
    seen = timed_copies.seen_values(_copies(_slow_attn), host=True)
    assert seen.flag is None and seen.note.startswith("seen-values check:"), seen
    copies, pairs = _copies(_slow_attn), []
    assert timed_copies.every_copy(copies, _attn, [], pairs=pairs) is None
    seen = timed_copies.seen_values(copies, host=True, first=pairs)
    assert seen.flag is None and "median of" in seen.note, seen


# ----------------------------------------------------------------------------- inputs and fallbacks


def test_constant_inputs_are_found_and_randomised_around_their_value() -> None:
    w, b, x = torch.ones(64), torch.zeros(64), torch.randn(4, 64)
    masked = torch.full((3,), float("-inf"))  # not finite: a mask, never randomised
    found = integrity.constant_inputs(((x, w), {"bias": b, "eps": torch.ones(1), "mask": masked}))
    assert [(c.name, c.value, c.numel) for c in found] == [("arg1", 1.0, 64), ("bias", 0.0, 64)]
    assert found[0].describe() == "arg1 holds one value (1) in all 64 elements"
    (x2, w2), kwargs = integrity.randomised(((x, w), {"bias": b}), found, seed=7)
    assert x2 is x and w2.shape == w.shape and w2.dtype == w.dtype
    assert float(w2.min()) >= 0.5 and float(w2.max()) <= 1.5 and len(set(w2.tolist())) > 1
    assert float(kwargs["bias"].min()) >= 0.0 and float(kwargs["bias"].max()) <= 1.0


class _Clock:
    """Fake nanoseconds that only the kernels below move."""

    def __init__(self) -> None:
        self.t = 0

    def __call__(self) -> int:
        return self.t


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], w, b)


def _kernel(clock: _Clock, fast_on_ones: bool = False, ignore_w: bool = False) -> Callable[..., torch.Tensor]:
    def kernel(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ones = bool((w == 1).all())
        clock.t += 100 if fast_on_ones and ones else 1_000
        return _layer_norm(x, torch.ones_like(w) if ignore_w else w, b)

    return kernel


def _degenerate(kernel: Callable[..., torch.Tensor], clock: _Clock, ns: float = 1_000.0) -> integrity.DegenerateResult:
    """The degenerate-input check on x (random), w = ones, b = zeros, after a measurement that read `ns`."""
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    first = ((x, torch.ones(32, dtype=torch.float64), torch.zeros(32, dtype=torch.float64)), {})
    timer = CpuTimer(clock)
    measured = timer.prepare([lambda: kernel(*first[0])] * 4)  # the measurement's sample on the constants
    return integrity.degenerate_inputs(
        kernel,
        first,
        integrity.constant_inputs(first),
        timer,
        measured,
        reps=4,
        degenerate_ns=ns,
        spent_ns=1e9,
        reference=_layer_norm,
        overrides=[],
        seed=11,
    )


def test_an_honest_kernel_with_an_all_ones_weight_and_a_zero_bias_passes() -> None:
    clock = _Clock()
    seen = _degenerate(_kernel(clock), clock)
    assert seen.flag is None
    assert seen.note.startswith("degenerate input: arg1 holds one value (1) in all 32 elements; arg2 holds one")
    assert seen.note.endswith("a randomised copy read 1.00x its time and computed the right output: no shortcut")
    assert clock.t == 3 * 2 * 4 * 1_000  # three screening rounds, both sides, 4 calls a sample: no more


def test_a_shortcut_on_an_all_ones_weight_is_flagged_with_both_times() -> None:
    clock = _Clock()
    seen = _degenerate(_kernel(clock, fast_on_ones=True), clock, ns=100.0)
    assert seen.flag is not None
    assert seen.flag == (
        "shortcut on degenerate input: arg1 holds one value (1) in all 32 elements; arg2 holds one value (0) in all "
        "32 elements; the variant takes 0.1 us per call on it vs 1 us on random data of the same shape (the fastest "
        "of 9 alternating samples each: 10.0x): its time would not hold for real inputs. Time it on random data "
        "(torch.randn)"
    )


def test_a_kernel_that_ignores_an_all_ones_weight_is_wrong_on_the_randomised_copy() -> None:
    clock = _Clock()
    seen = _degenerate(_kernel(clock, ignore_w=True), clock)
    assert seen.flag is not None
    assert seen.flag.startswith("degenerate input: arg1 holds one value (1) in all 32 elements; arg2 holds")
    assert "on a randomised copy of the same shape the variant's output fails the check: atol/rtol bound failed" in (
        seen.flag
    )


def test_a_kernel_that_refuses_random_values_is_not_judged_and_says_so() -> None:
    clock = _Clock()

    def only_ones(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not bool((w == 1).all()):
            raise ValueError("weights must be one")
        clock.t += 1_000
        return _layer_norm(x, w, b)

    seen = _degenerate(only_ones, clock)
    assert seen.flag is None and "not checked: the variant raised ValueError on a randomised copy" in seen.note


def test_a_declared_kernel_that_runs_sdpa_is_a_silent_fallback() -> None:
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    names = integrity.profiled_names(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), cuda=False)
    msg = integrity.forbidden_kernel(names, ["scaled_dot_product"])
    assert msg is not None and msg.startswith("silent fallback: the variant ran aten::")
    honest = integrity.profiled_names(lambda: _attn(q, k, v), cuda=False)
    assert integrity.forbidden_kernel(honest, ["scaled_dot_product"]) is None


def test_device_spec_reads_a_real_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device for its properties; the fallback formula is tested above")
    spec = peaks.device_spec(0, None)
    assert spec.name and spec.sm_count


def test_the_profiler_prints_and_warns_nothing_of_its_own(capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 26: Kineto's "USDT: ... profiler_start" lines and torch.profiler's "Profiler clears events"
    warning landed in every user's output and warnings summary."""
    import warnings

    from pytest_perfguard.measure.integrity import profiled_call

    x = torch.zeros(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            out, names, _ = profiled_call(lambda: x.add(1), None)
    printed = "".join(capfd.readouterr())
    assert "USDT" not in printed and "profiler_st" not in printed, printed
    assert not [w for w in caught if "Profiler" in str(w.message)]
    assert torch.equal(out, torch.ones(4)) and any("add" in n for n in names)
