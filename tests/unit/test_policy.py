"""The stored baseline's decision rules (policy.py): the prediction bound, the moderated spread, which
process disagrees, and the machine-moved rule of the time gate."""

from __future__ import annotations

import math
import random
import re

import pytest
from scipy import stats as sps

from pytest_perfguard.judge import policy, reference
from pytest_perfguard.judge import verdict as vd
from pytest_perfguard.judge.baseline import BaselineEntry, ProcessSample
from pytest_perfguard.judge.stats import log_interval, t_quantile


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 6, 9, 15, 30, 60])
@pytest.mark.parametrize("p", [0.9, 0.975, 0.99, 0.995, 0.025])
def test_t_quantile_matches_scipy(df: int, p: float) -> None:
    assert t_quantile(p, df) == pytest.approx(sps.t.ppf(p, df), rel=1e-7)


def test_prediction_bound_is_t_times_spread_times_root_one_plus_one_over_k() -> None:
    assert policy.prediction_bound(0.01, 3) == pytest.approx(sps.t.ppf(0.99, 2) * 0.01 * math.sqrt(4 / 3))
    with pytest.raises(ValueError):
        policy.prediction_bound(0.01, 1)


def test_threshold_never_below_the_margin_and_one_process_falls_back_to_k_times_noise() -> None:
    assert policy.sample_threshold(0.05, 0.0, 3, 0.005) >= 0.05
    assert policy.sample_threshold(0.05, 0.03, 1, 0.005) == pytest.approx(4 * 0.03)
    wide = policy.sample_threshold(0.05, 0.03, 3, 0.005)
    assert wide == pytest.approx(math.expm1(sps.t.ppf(0.99, 2) * 0.03 * math.sqrt(4 / 3)))


def test_a_files_typical_spread_moderates_three_processes() -> None:
    """Three processes alone give 2 degrees of freedom (t = 6.96); borrowing the file's typical spread
    gives 6 and a threshold a third as wide, while a case noisier than the rest keeps a wider one."""
    alone = policy.sample_threshold(0.01, 0.01, 3, 0.0)
    shared = policy.sample_threshold(0.01, 0.01, 3, 0.0, prior=0.01)
    noisy = policy.sample_threshold(0.01, 0.05, 3, 0.0, prior=0.01)
    assert shared < alone / 2 and noisy > shared
    sd, dof = policy.moderated_spread(0.02, 3, 0.01)
    assert dof == 6 and sd == pytest.approx(math.sqrt((2 * 0.02**2 + 4 * 0.01**2) / 6))
    assert policy.prior_spread([0.01, 0.5, 0.02]) == 0.02  # the median: one noisy case does not set it


def test_discordant_names_the_process_apart_from_the_others() -> None:
    limit = policy.discord_limit(0.05, 0.005)
    assert limit == pytest.approx(math.log1p(0.05) / 2)
    assert policy.discordant([12.19, 8.37, 8.40], limit) == [0]  # the fresh machine's first process
    assert policy.discordant([8.37, 8.40, 8.45], limit) == []
    assert policy.discordant([8.0, 10.0], limit) == [0, 1]  # two that disagree: neither can be trusted
    assert policy.discord_limit(0.05, 0.005, [0.02]) == pytest.approx(0.08)  # a wide in-run interval widens it


def test_the_discordance_rule_on_recorded_h200_noise_rarely_fires() -> None:
    """Process medians of real H200 block noise (tests/data), three processes a case: the rule calls few
    unchanged cases discordant, so an update re-measures little on a quiet GPU."""
    import json
    import lzma
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "h200_attention_timing_samples.json.xz"
    data = json.loads(lzma.decompress(path.read_bytes()))
    rng = random.Random(5)
    fired = total = 0
    for case in data["cases"].values():
        blocks = [sorted(b)[len(b) // 2] for b in case["sdpa_l2flush"]]
        for _ in range(50):
            medians = [sorted(rng.sample(blocks, 10))[5] for _ in range(3)]
            fired += bool(policy.discordant(medians, policy.discord_limit(0.05, 0.005)))
            total += 1
    assert fired / total < 0.01


def _sampled(times: list[float], against: list[float]) -> BaselineEntry:
    return BaselineEntry.from_samples(
        "t::c",
        [ProcessSample(t, (t, t), t / a, a) for t, a in zip(times, against, strict=True)],
        workload="w",
        workload_desc="",
        env={},
        updated="",
    )


def _blocks(centre: float, n: int = 30, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [centre * math.exp(rng.gauss(0.0, 0.003)) for _ in range(n)]


def test_a_slower_machine_makes_the_time_gate_not_comparable_and_the_ratio_gate_decides() -> None:
    stored = _sampled([1000.0, 1002.0, 998.0], [800.0, 801.0, 799.0])
    policy_ = vd.Policy(margin=0.05, noise_floor=0.005, ratio_noise_floor=0.005)
    kw = {"workload": "w", "policy": policy_, "max_ratio": None, "incomparable": []}
    # the whole machine 10% slower: variant and reference alike
    moved = vd.decide(_blocks(1100.0), _blocks(880.0, seed=2), stored, **kw)
    time_gate, ratio_gate = moved.gates
    assert time_gate.status is vd.NOT_COMPARABLE and reference.MACHINE_MOVED in time_gate.reason
    assert ratio_gate.status is vd.PASS and moved.status is vd.NOT_COMPARABLE
    # the variant alone 10% slower: a regression, by both gates
    slower = vd.decide(_blocks(1100.0), _blocks(800.0, seed=2), stored, **kw)
    assert [g.status for g in slower.gates] == [vd.REGRESSED, vd.REGRESSED]
    # the machine 10% slower and the variant 25% slower: the ratio gate still fails it
    both = vd.decide(_blocks(1250.0), _blocks(880.0, seed=2), stored, **kw)
    assert both.status is vd.REGRESSED


def test_an_unstable_entry_is_inconclusive_never_pass_or_fail() -> None:
    stored = _sampled([1000.0, 1300.0, 1000.0], [800.0, 800.0, 800.0])
    unstable = BaselineEntry.from_samples(
        "t::c", stored.samples, workload="w", workload_desc="", env={}, updated="", unstable=True
    )
    kw = {"workload": "w", "policy": vd.Policy(margin=0.05), "max_ratio": None, "incomparable": []}
    for centre in (1000.0, 2000.0):
        v = vd.decide(_blocks(centre), _blocks(800.0, seed=2), unstable, **kw)
        assert v.status is vd.INCONCLUSIVE and "unstable baseline" in v.gates[0].reason


def test_the_bound_for_a_mean_of_m_processes_is_t_times_spread_times_root_one_over_m_plus_one_over_k() -> None:
    assert policy.mean_prediction_bound(0.01, 3, 2) == pytest.approx(
        sps.t.ppf(0.99, 2) * 0.01 * math.sqrt(1 / 2 + 1 / 3)
    )
    assert policy.mean_prediction_bound(0.01, 5, 1) == pytest.approx(policy.prediction_bound(0.01, 5))
    assert policy.mean_prediction_bound(0.01, 3, 2, dof=6) == pytest.approx(
        sps.t.ppf(0.99, 6) * 0.01 * math.sqrt(1 / 2 + 1 / 3)
    )
    with pytest.raises(ValueError):
        policy.mean_prediction_bound(0.01, 1, 2)
    with pytest.raises(ValueError):
        policy.mean_prediction_bound(0.01, 3, 0)


def test_the_threshold_of_two_processes_is_narrower_than_one_processes_and_never_below_the_margin() -> None:
    # a noisy case: both bounds above the margin, the mean's narrower by sqrt((1/2 + 1/k) / (1 + 1/k))
    one = policy.sample_threshold(0.05, 0.03, 4, 0.005)
    two = policy.mean_threshold(0.05, 0.03, 4, 0.005)
    assert 0.05 < two < one
    assert math.log1p(two) / math.log1p(one) == pytest.approx(math.sqrt((1 / 2 + 1 / 4) / (1 + 1 / 4)))
    # a quiet case (the 98 cases on freshly started H100s): both at the margin
    assert policy.mean_threshold(0.05, 0.002, 3, 0.005, prior=0.003) == 0.05
    # the floor and the file's typical spread enter as in the one-process threshold
    floored = policy.mean_threshold(0.01, 0.0, 3, 0.05)
    assert floored == pytest.approx(math.expm1(sps.t.ppf(0.99, 2) * 0.05 * math.sqrt(1 / 2 + 1 / 3)))
    sd, dof = policy.moderated_spread(0.03, 3, 0.01)
    assert policy.mean_threshold(0.01, 0.03, 3, 0.0, prior=0.01) == pytest.approx(
        math.expm1(sps.t.ppf(0.99, dof) * sd * math.sqrt(1 / 2 + 1 / 3))
    )


def test_two_processes_judged_together_pass_within_the_threshold_and_not_beyond() -> None:
    """+8.1% in the guard's process and +0.9% in the fresh one: a mean of +4.4%, within 5%. +11% and +2%
    is +6.4%: beyond it, and the case stays inconclusive."""
    assert policy.process_mean([1.081, 1.009]) == pytest.approx(math.sqrt(1.081 * 1.009))
    assert policy.within_together([1.081, 1.009], 0.05)
    assert not policy.within_together([1.11, 1.02], 0.05)
    # a fresh process that reads faster pulls the mean down; one that reads slower, up
    assert policy.within_together([1.09, 0.99], 0.05) and not policy.within_together([1.09, 1.02], 0.05)
    with pytest.raises(ValueError):
        policy.process_mean([1.1, 0.0])
    with pytest.raises(ValueError):
        policy.process_mean([])


def test_a_ratio_taken_while_the_reference_ran_far_from_its_stored_time_decides_nothing() -> None:
    """Fresh H200 (2026-11-26): variant and reference ran +43% and +31% from their stored times during one
    case and the ratio read +9%, though the case read as stored in the next runs. Where the machine moved
    past policy.MACHINE_MOVED_RATIO_LIMIT the ratio gate calls neither a regression nor a speed-up; below
    it the ratio still decides."""
    stored = _sampled([1000.0, 1002.0, 998.0], [800.0, 801.0, 799.0])
    policy_ = vd.Policy(margin=0.05, noise_floor=0.005, ratio_noise_floor=0.005)
    kw = {"workload": "w", "policy": policy_, "max_ratio": None, "incomparable": []}
    far = vd.decide(_blocks(1430.0), _blocks(1050.0, seed=2), stored, **kw)  # reference +31%, ratio +9%
    time_gate, ratio_gate = far.gates
    assert time_gate.status is vd.NOT_COMPARABLE
    assert ratio_gate.status is vd.INCONCLUSIVE and "the reference itself ran +31.1%" in ratio_gate.reason
    # the interval it was decided on, at the decision level, lies wholly beyond the limit
    found = re.search(r"CI ([+-][\d.]+)% \.\. ([+-][\d.]+)%, beyond 20%", ratio_gate.reason)
    assert found, ratio_gate.reason
    lo, hi = float(found.group(1)), float(found.group(2))
    assert 20 < lo < 31.1 < hi
    assert far.status is vd.INCONCLUSIVE
    faster = vd.decide(_blocks(1150.0), _blocks(1050.0, seed=2), stored, **kw)  # ratio -12%, reference +31%
    assert faster.gates[1].status is vd.INCONCLUSIVE
    near = vd.decide(_blocks(1200.0), _blocks(880.0, seed=2), stored, **kw)  # reference +10%, ratio +9%
    assert [g.status for g in near.gates] == [vd.NOT_COMPARABLE, vd.REGRESSED]


def test_a_ratio_that_moved_because_the_reference_alone_ran_faster_decides_nothing() -> None:
    """Freshly started H100 (2026-11-26), cuda_scalar B8 H8 S256 unchanged: the update's three processes
    read 232.1 / 231.8 / 232.9 us beside SDPA at 14.06 / 14.11 / 13.91 us; both guards read the variant
    +1.5% and SDPA at 13.3 us, a ratio +7.1% that the fresh process repeated (+6.0%), and the case failed.
    With the same torch and SDPA backend (else the entry is not comparable) the reference's code is the
    stored one: its move is the machine's, and the ratio calls neither a pass nor a failure."""
    stored = _sampled([232.07, 231.82, 232.86], [14.06, 14.11, 13.91])
    # the file's typical spreads in that update: 0.77% (time) and 0.63% (ratio)
    policy_ = vd.Policy(
        margin=0.05, noise_floor=0.005, ratio_noise_floor=0.005, prior_spread=0.0077, prior_ratio_spread=0.0063
    )
    kw = {"workload": "w", "policy": policy_, "max_ratio": None, "incomparable": []}
    seen = vd.decide(_blocks(235.7), _blocks(13.3, seed=2), stored, **kw)
    time_gate, ratio_gate = seen.gates
    assert time_gate.status is vd.PASS and ratio_gate.status is vd.INCONCLUSIVE
    assert "the variant's own time passed (+1.5%)" in ratio_gate.reason
    assert re.search(r"the reference ran -5\.[0-9]% from its stored time", ratio_gate.reason), ratio_gate.reason
    assert seen.status is vd.INCONCLUSIVE
    # the variant itself 10% slower beside the same faster reference: the time gate fails it
    slower = vd.decide(_blocks(255.3), _blocks(13.3, seed=2), stored, **kw)
    assert [g.status for g in slower.gates] == [vd.REGRESSED, vd.REGRESSED] and slower.status is vd.REGRESSED
    # the reference as stored and the variant's time passing: a ratio cannot regress; a variant that is
    # slower but within the time gate's interval straddling it stays as the gates say
    steady = vd.decide(_blocks(233.0), _blocks(14.03, seed=2), stored, **kw)
    assert [g.status for g in steady.gates] == [vd.PASS, vd.PASS]
    # the reference alone 40% faster, the variant as stored: still not the variant's regression
    alone = vd.decide(_blocks(232.3), _blocks(8.4, seed=2), stored, **kw)
    assert [g.status for g in alone.gates] == [vd.PASS, vd.INCONCLUSIVE]


def test_a_time_gate_failing_alone_on_a_gpu_the_baseline_never_saw_is_inconclusive() -> None:
    """Three fresh H100s (2026-11-26): cuda_scalar S2048 causal read 1.104 ms in one host's update and
    1.201 ms on another, a confirmed +8.8% against the first host's baseline with the code unchanged. On a
    GPU none of the entry's processes ran on, a time gate failing alone decides nothing; on a GPU they ran
    on, or with the ratio gate failing too, the case fails."""

    def on(device: str) -> BaselineEntry:
        return BaselineEntry.from_samples(
            "t::c",
            [ProcessSample(t, (t, t), t / 40.0, 40.0, device=device) for t in (1104.0, 1106.9, 1098.1)],
            workload="w",
            workload_desc="",
            env={},
            updated="",
        )

    policy_ = vd.Policy(margin=0.05, noise_floor=0.005, ratio_noise_floor=0.005, prior_spread=0.008)
    kw = {"workload": "w", "policy": policy_, "max_ratio": None, "incomparable": []}
    slower, reference = _blocks(1201.0), _blocks(40.0 * 1201.0 / 1104.0 * 0.96, seed=2)
    other = vd.decide(slower, reference, on("gpu-b"), device="gpu-c", **kw)
    assert [g.status for g in other.gates] == [vd.INCONCLUSIVE, vd.PASS], [g.reason for g in other.gates]
    assert vd.UNSEEN_DEVICE in other.gates[0].reason and "--perfguard-update-baseline here" in other.gates[0].reason
    assert other.status is vd.INCONCLUSIVE
    same = vd.decide(slower, reference, on("gpu-c"), device="gpu-c", **kw)
    assert [g.status for g in same.gates] == [vd.REGRESSED, vd.PASS] and same.status is vd.REGRESSED
    unknown = vd.decide(slower, reference, on(""), device="gpu-c", **kw)  # samples that name no device
    assert unknown.status is vd.REGRESSED
    both = vd.decide(slower, _blocks(40.0, seed=2), on("gpu-b"), device="gpu-c", **kw)
    assert [g.status for g in both.gates] == [vd.REGRESSED, vd.REGRESSED] and both.status is vd.REGRESSED


def _h200_block_medians() -> list[list[float]]:
    """Per series of the recorded H200 noise (tests/data), its 30 block medians, the cold first launch of each
    block left out."""
    import json
    import lzma
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "h200_attention_timing_samples.json.xz"
    data = json.loads(lzma.decompress(path.read_bytes()))
    return [
        [sorted(b[1:])[len(b[1:]) // 2] for b in case[kernel]]
        for case in data["cases"].values()
        for kernel in ("sdpa_l2flush", "naive")
    ]


def test_a_pass_needs_the_95_percent_interval_and_a_failure_the_family_wise_one() -> None:
    """A stored gate passes where its 95% interval lies below its margin, and fails only where its 99.9% one
    (Bonferroni over 98 cases) lies above it. Before, a pass needed the 99.9% interval too: a fresh H200's
    guard left one unchanged case unverified, "+1.8% (95% CI -1.5% .. +5.2%) straddles the 6.2% margin at
    99.90% (+1.6% .. +6.9%)" after three measurements (2026-11-28). On recorded H200 block noise: unchanged
    cases pass far more often than under the old rule and never fail; a slowdown of twice the case's margin
    never passes; one of the margin itself passes rarely."""
    rng = random.Random(7)
    policy_ = vd.Policy(margin=0.05, noise_floor=0.005, family_size=98)
    kw = {"workload": "w", "policy": policy_, "max_ratio": None, "incomparable": []}
    counts = {"unchanged": [0, 0, 0], "at_margin": [0, 0, 0], "twice": [0, 0, 0]}  # pass, inconclusive, regressed
    index = {vd.PASS: 0, vd.FASTER: 0, vd.INCONCLUSIVE: 1, vd.REGRESSED: 2}
    old_rule_pass = 0
    for series in _h200_block_medians():
        for _ in range(40):
            stored = _sampled([sorted(rng.sample(series, 10))[5] for _ in range(3)], [1.0, 1.0, 1.0])
            base = rng.sample(series, 12)
            margin = policy_.baseline_delta(stored)
            for name, factor in (("unchanged", 1.0), ("at_margin", 1 + margin), ("twice", 1 + 2 * margin)):
                gate = vd.decide([x * factor for x in base], None, stored, **kw).gates[0]
                counts[name][index[gate.status]] += 1
            dec = log_interval(base, policy_.decision_confidence)
            old_rule_pass += dec.hi - math.log(stored.median_ns) < math.log1p(margin)
    total = sum(counts["unchanged"])
    assert counts["unchanged"][2] == 0, counts
    assert counts["unchanged"][0] / total > 0.9, counts
    assert counts["unchanged"][0] > old_rule_pass, (counts, old_rule_pass)
    assert counts["twice"][0] == 0, counts
    assert counts["at_margin"][0] / total < 0.05, counts


@pytest.mark.parametrize("spread", [0.0, 0.005, 0.021, 0.03, 0.08])
@pytest.mark.parametrize("k", [1, 3, 4, 16])
@pytest.mark.parametrize("half_width", [0.0, 0.004, 0.02])
def test_the_detectable_margin_is_where_the_mde_reaches_twice_the_margin(
    spread: float, k: int, half_width: float
) -> None:
    """detectable_margin solves verdict.minimum_detectable_effect (with a confirmation, at the planned decision
    level) = MDE_MARGINS * T for T: a guard that measures as the entry's processes did sees twice the margin."""
    margin = policy.detectable_margin(spread, k, half_width, 0.005)
    # the guard's in-run width is planned as the wider of the processes' and their spread
    planned = max(half_width, spread) if k >= 2 else half_width  # one process has no spread of its own
    h = planned * sps.norm.ppf(0.5 + policy.DETECT_CONFIDENCE / 2) / sps.norm.ppf(0.975)
    dec = vd.Interval(0.0, -h, h, policy.DETECT_CONFIDENCE, 30)
    mde = vd.minimum_detectable_effect(dec, math.log1p(margin), max(spread, 0.005), k, confirm=True)
    assert mde == pytest.approx(policy.MDE_MARGINS * margin, rel=1e-9)
    assert not policy.could_hide(mde * (1 - 1e-9), margin)
    # a margin too wide to promise anything: none is returned as finite
    assert math.isinf(policy.detectable_margin(0.5, 3, 0.0, 0.005))


def test_an_entry_whose_processes_spread_is_judged_at_a_margin_it_can_see_twice() -> None:
    """The stored entry of a fresh H200's cuda_scalar S2048 causal (2026-11-28): five processes reading 1.09 or
    1.15 ms, each within +-0.1% in-run, under a 5% margin. Judged at the prediction bound alone (6.9%), guards
    read MDEs of 13.69-13.80% against a 13.75% ceiling: the ones that sat in one mode met it to the fourth
    digit, the ones whose blocks moved between the modes (in-run +2.3%) did not, and CI went red for a case no
    guard process could decide. Its margin is now the one a process moving between the modes can see twice,
    said at update time; a guard whose blocks mix the modes passes with the ceiling met. Planned at the
    update's in-run width alone, the same guard's MDE is past the ceiling."""
    times = [1090.3e3, 1088.2e3, 1148.8e3, 1147.0e3, 1091.8e3]
    stored = BaselineEntry.from_samples(
        "t::c",
        [ProcessSample(t, (t * 0.999, t * 1.001), 1.0, t) for t in times],
        workload="w",
        workload_desc="",
        env={},
        updated="",
    )
    # the file's typical spread (0.5%) moderates the five processes' own, as on the host
    policy_ = vd.Policy(margin=0.05, noise_floor=0.005, family_size=98, confirm=True, prior_spread=0.005)
    threshold = policy_.baseline_delta(stored)
    assert 0.12 < threshold < 0.16
    kw = {"workload": "w", "policy": policy_, "max_ratio": None, "incomparable": []}
    rng = random.Random(3)
    mixed = [rng.choice((1090e3, 1148e3)) * math.exp(rng.gauss(0.0, 0.002)) for _ in range(56)]
    gate = vd.decide(mixed, None, stored, **kw).gates[0]
    assert gate.status is vd.PASS and gate.mde is not None
    assert not policy.could_hide(gate.mde, threshold)
    planned_alone = policy.detectable_margin(0.0, stored.runs, stored.half_width, 0.005)  # spread left out of h
    spread_only = max(planned_alone, policy.sample_threshold(0.05, stored.noise, 5, 0.005, prior=0.005))
    dec = log_interval(mixed, policy_.decision_confidence)
    dec = vd.Interval(
        dec.estimate - math.log(stored.median_ns),
        dec.lo - math.log(stored.median_ns),
        dec.hi - math.log(stored.median_ns),
        dec.confidence,
        dec.n,
    )
    before = vd.minimum_detectable_effect(dec, math.log1p(spread_only), stored.noise, stored.runs, confirm=True)
    assert policy.could_hide(before, spread_only)


def test_a_slowdown_of_twice_the_widened_margin_still_fails_on_recorded_noise() -> None:
    """What would get past a widened margin: a slowdown it can no longer see. On the recorded H200 block noise,
    with each process (the update's four and the guard's) shifted by its own offset of 2.1% sd, a slowdown of
    twice the margin each entry is judged at is called a regression in the guard's process at least 95% of the
    time, as the rule promises of one detection (it plans for two at 95% together)."""
    rng = random.Random(11)
    policy_ = vd.Policy(margin=0.05, noise_floor=0.005, family_size=98)
    kw = {"workload": "w", "policy": policy_, "max_ratio": None, "incomparable": []}
    caught = trials = 0
    for series in _h200_block_medians():
        for _ in range(25):
            offsets = [math.exp(rng.gauss(0.0, 0.021)) for _ in range(5)]
            medians = [sorted(rng.sample(series, 10))[5] * o for o in offsets[:4]]
            samples = [ProcessSample(t, (t * 0.998, t * 1.002), 1.0, t) for t in medians]
            stored = BaselineEntry.from_samples("t::c", samples, workload="w", workload_desc="", env={}, updated="")
            margin = policy_.baseline_delta(stored)
            blocks = [x * offsets[4] * (1 + 2 * margin) for x in rng.sample(series, 12)]
            caught += vd.decide(blocks, None, stored, **kw).gates[0].status is vd.REGRESSED
            trials += 1
    assert caught / trials >= 0.95, (caught, trials)


def test_a_spread_no_margin_can_see_past_leaves_the_threshold_finite() -> None:
    """A time spread of 1.6x modes (a process state that slows variant and reference alike): no margin lets one
    process see twice it, and the threshold stays the prediction bound's, a finite number that a results file
    can hold (an inf there made the file unwritable and the confirmation's process fail)."""
    assert math.isinf(policy.detectable_margin(0.3, 3, 0.001, 0.05))
    wide = policy.sample_threshold(0.05, 0.3, 3, 0.05, half_width=0.001)
    assert math.isfinite(wide) and wide == policy.sample_threshold(0.05, 0.3, 3, 0.05)
    assert math.isfinite(policy.mean_threshold(0.05, 0.3, 3, 0.05, half_width=0.001))


def test_a_detectable_margin_past_the_wide_limit_widens_nothing() -> None:
    """What would get past the widening: an entry of two speeds 1.3x apart (CPU) has a detectable margin of
    hundreds of percent; widened to it, an update 3x slower joined the entry as the same kernel. Past
    WIDE_MARGIN the margin is not widened: the prediction bound judges, and a pass stays unverified by its MDE."""
    spread = policy.log_spread([1.0, 1.0, 1.3, 1.3])
    assert policy.detectable_margin(spread, 4, 0.001, 0.05) > 3.0
    got = policy.sample_threshold(0.05, spread, 4, 0.05, half_width=0.001)
    assert got == policy.sample_threshold(0.05, spread, 4, 0.05) < 2.0
    # within the limit it widens
    assert policy.sample_threshold(0.05, 0.02, 4, 0.005, half_width=0.001) > 0.05


def test_a_file_whose_processes_read_exactly_alike_still_has_a_typical_spread() -> None:
    """A typical spread of 0 is a measurement, not its absence: the entry of three processes that read alike
    is judged at least as tightly as one whose processes differ by 0.1%, and an update can store it. Before,
    0 meant "no prior": 2 degrees of freedom put its threshold at 49% against 20%, past what an update stores
    at once (it measured such cases once more). A file with no entry of two processes has none."""
    margin, floor = 0.05, 0.05
    alike = policy.medians_threshold(margin, [1000.0] * 3, floor, prior=policy.prior_spread([0.0] * 4))
    near = [1000.0, 1001.0, 1002.0]
    apart = policy.medians_threshold(margin, near, floor, prior=policy.prior_spread([policy.log_spread(near)] * 4))
    assert alike <= apart and not policy.too_wide(alike, 3, margin, floor), (alike, apart)
    assert math.isnan(policy.prior_spread([]))
    assert policy.moderated_spread(0.02, 3, policy.prior_spread([])) == (0.02, 2)
