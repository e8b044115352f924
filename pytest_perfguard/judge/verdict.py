"""Verdicts: a slowdown is judged against a margin, never against zero, and every gate has three outcomes.

For a gate with threshold tau = ln(1 + delta) on the log scale:
  REGRESSED     the interval's lower bound is above tau (slower by more than the margin, confidently);
  PASS          the upper bound is below tau (FASTER when it is even below -tau);
  INCONCLUSIVE  the interval straddles tau: measure more, then say so.
delta is the configured margin, but never less than the prediction bound of the baseline's sample of process
medians (policy.sample_threshold: t(k-1, 0.99) * spread * sqrt(1 + 1/k)), or, for a one-process entry, K = 4
times its stored noise: within-run samples cannot shrink the between-process noise. The difference of two runs
has sqrt(2) times their sd, so K = 4 is a 2.8-sigma threshold: about 0.23% per gate per case when the stored
noise sets it and the noise is Gaussian. Measured between-run spreads are heavier-tailed than that (see
benchmarks/results/h200_2026-11-21), which is why the default margin (5%) sits above the noise floor.

Failing decisions use an interval widened for the number of timed cases (Bonferroni: each case at
alpha / m). That controls the family-wise rate of the within-run sampling error only; the between-run
drift, which dominates on a GPU once a case has measured for 0.3 s, is handled by the margin, not by the
correction. The reported intervals stay at 95%.

A pass of a stored gate (time, ratio, host) needs only its shown 95% interval below tau: the correction guards
against false failures among many unchanged cases, and a pass claims no effect, so it has no family to correct
for. A true slowdown of the margin passes a case with at most 2.5% probability; of twice the margin, not at all
where the MDE rule holds (policy.could_hide). Deciding passes at 99.9% too left a case whose time depends on
where its inputs lie straddling "+1.6% .. +6.9%" against a 6.2% margin after three measurements, its 95%
interval -1.5% .. +5.2% (H200, 2026-11-28): unverified, for want of evidence the run already had.

Each baseline and ratio gate also reports its minimum detectable effect (MDE): the smallest true slowdown it
catches with 95% probability. With h the decision half-width below the estimate, the sampling sd is s = h / z
(z the decision interval's normal quantile) and the between-run sd of a new run against a centre of k update
runs is b = noise * sqrt(1 + 1/k), k the stored processes (at most policy.MAX_SAMPLES). A true log slowdown x
is flagged when its estimate exceeds tau + h, so P(flag) = Phi((x - tau - h) / sqrt(s^2 + b^2)); with the
fresh-process confirmation a case must be flagged twice, P(flag)^2, so the power is solved at sqrt(0.95). MDE
= expm1(tau + h + Phi^-1(power) * sqrt(s^2 + b^2)). The A/B gate has no stored centre; its b is the offset
each process adds to a head/base ratio (settings.AB_PROCESS_SD). It is a model (Gaussian drift, independent
processes), not a measurement: it tells a case that cannot see a 5% slowdown from one that can. A case's MDE
is its best gate's (case_mde): either gate fails the case.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..record import (
    Gate,  # the one gate type; judged here, kept in records
    Status,
)
from ..settings import DEFAULT_MARGIN
from . import reference
from .baseline import BaselineEntry
from .policy import (
    HOST_MARGIN,
    MAX_SAMPLES,
    MDE_POWER,
    NO_PRIOR,
    NOISE_K,
    case_threshold,
    mean_threshold,
    sample_threshold,
)
from .stats import Interval, combine_difference, log_interval, normal_quantile

PASS = Status.PASS
FASTER = Status.FASTER
REGRESSED = Status.REGRESSED
INCONCLUSIVE = Status.INCONCLUSIVE
NOT_COMPARABLE = Status.NOT_COMPARABLE
NO_BASELINE = Status.NO_BASELINE
_ORDER = (
    Status.REGRESSED,
    Status.INCONCLUSIVE,
    Status.NOT_COMPARABLE,
    Status.NO_BASE,
    Status.NEW,
    Status.NO_BASELINE,
    Status.FASTER,
    Status.PASS,
)


@dataclass(frozen=True)
class Policy:
    margin: float = DEFAULT_MARGIN
    alpha: float = 0.05
    family_size: int = 1
    noise_floor: float = 0.0
    ratio_noise_floor: float = 0.0
    confirm: bool = False  # a regression must repeat in a fresh process: the MDE needs two detections
    noise_k: float = NOISE_K  # the threshold is at least noise_k times the stored between-run noise
    # the typical between-process sd of the baseline file's sampled entries (policy.prior_spread): each
    # case's own spread is moderated by it (policy.moderated_spread)
    prior_spread: float = NO_PRIOR
    prior_ratio_spread: float = NO_PRIOR

    @property
    def decision_confidence(self) -> float:
        return 1.0 - 2.0 * self.alpha / max(1, self.family_size)

    def delta(self, noise: float) -> float:
        return case_threshold(self.margin, noise, self.noise_floor, self.noise_k)

    def ratio_delta(self, noise: float) -> float:
        """The in-run ratio cancels machine-to-machine drift but not a kernel's own run-to-run spread
        (autotuning, placement), which the stored noise carries."""
        return case_threshold(self.margin, noise, self.ratio_noise_floor, self.noise_k)

    def _made_of(self, entry: BaselineEntry, gate: str) -> tuple[float, float, float]:
        """The spread, noise floor and file prior a stored gate's threshold is made of: the ratio gate's of the
        stored ratios (the in-run ratio cancels machine drift, not a kernel's own spread), the time gate's of
        the stored times."""
        if gate == "ratio":
            return entry.ratio_noise, self.ratio_noise_floor, self.prior_ratio_spread
        return entry.noise, self.noise_floor, self.prior_spread

    def stored_threshold(self, entry: BaselineEntry, gate: str, processes: int = 1) -> float:
        """A stored gate's threshold ("baseline" or "ratio"): the prediction bound of the entry's spread for
        one new process, or for the mean of ``processes`` (a confirmation's two), never below the margin the
        entry can see twice (policy.sample_threshold, mean_threshold)."""
        spread, floor, prior = self._made_of(entry, gate)
        if processes > 1:
            return mean_threshold(
                self.margin, spread, entry.runs, floor, processes, prior=prior, half_width=entry.half_width
            )
        return sample_threshold(
            self.margin, spread, entry.runs, floor, self.noise_k, prior=prior, half_width=entry.half_width
        )

    def baseline_delta(self, entry: BaselineEntry) -> float:
        """The time gate's threshold against a stored sample: its prediction bound, never below the margin."""
        return self.stored_threshold(entry, "baseline")

    def ratio_baseline_delta(self, entry: BaselineEntry) -> float:
        """The ratio gate's threshold: the prediction bound of the stored ratios' own spread."""
        return self.stored_threshold(entry, "ratio")


@dataclass
class Verdict:
    gates: list[Gate] = field(default_factory=list)
    disturbances: list[str] = field(default_factory=list)  # throttling, other processes: never a regression
    notes: list[str] = field(default_factory=list)  # informational
    # The gates that decide the case; the others are reported only. Under --perfguard-against the head/base
    # gate decides (with max_ratio): a stored number from another process would bring its drift back.
    deciding: frozenset[str] | None = None
    # The timing cannot be believed (the reference moved beyond REFERENCE_BAND beside the case): the runner
    # flags the case with this message.
    flag: str | None = None
    # ln(reference now / its stored centre) where the entry holds the reference's times: the run's end
    # compares it with the other cases' (outcome.moved_alone).
    reference_move: float | None = None

    def deciding_gates(self) -> list[Gate]:
        return [g for g in self.gates if self.deciding is None or g.name in self.deciding]

    @property
    def status(self) -> Status:
        statuses = {g.status for g in self.deciding_gates()}
        if self.disturbances:
            # A disturbed measurement decides nothing: its times say what the machine did, not what the code
            # does. Never a failure, a pass, faster, or (in an update) a new baseline; a stored figure that
            # cannot be compared stays not comparable.
            statuses = {INCONCLUSIVE if x in (REGRESSED, FASTER, PASS, NO_BASELINE) else x for x in statuses}
            if not statuses:
                return INCONCLUSIVE
        for s in _ORDER:
            if s in statuses:
                return s
        return PASS

    @property
    def needs_remeasure(self) -> bool:
        return any(g.status in (REGRESSED, INCONCLUSIVE) for g in self.deciding_gates())


def _rescale(half_width: float, to_confidence: float) -> float:
    """A stored 95% half-width rescaled to another confidence (normal approximation)."""
    return half_width * normal_quantile(0.5 + to_confidence / 2) / normal_quantile(0.975)


def _stored_log_half_width(median: float, ci: tuple[float, float] | None) -> float:
    if ci is None:
        return 0.0
    lo, hi = ci
    return max(math.log(median / lo) if lo > 0 else 0.0, math.log(hi / median) if hi > 0 else 0.0)


def decision_interval(log_now: Interval, stored_center: float, stored_ci: tuple[float, float] | None) -> Interval:
    """The interval a gate decides on, ln(now / stored): ``log_now`` (at the decision confidence) minus the
    stored centre, whose 95% half-width is rescaled to that confidence."""
    hw = _stored_log_half_width(stored_center, stored_ci)
    return combine_difference(log_now, math.log(stored_center), _rescale(hw, log_now.confidence))


def minimum_detectable_effect(
    dec: Interval | None,
    tau: float,
    noise: float,
    runs: int,
    *,
    confirm: bool = False,
    power: float = MDE_POWER,
    process_sd: float = 0.0,
    widen: float = 0.0,
) -> float | None:
    """The smallest true slowdown (a fraction) that a gate fails on with probability `power`; see the
    module docstring. dec: the decision interval (log scale); noise: the between-run sd of ln(time) that the
    gate's margin is set from; runs: the update runs in the stored centre; process_sd: an offset of its own
    that each process adds and its interval does not sample (the A/B gate's, settings.AB_PROCESS_SD); widen:
    what the gate adds to the decision interval's lower half-width for it (ab_gate). None without a decision
    interval (no baseline) or with an unbounded one (too few blocks for the confidence).
    """
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must be between 0 and 1, got {power}")
    if dec is None or not math.isfinite(dec.lo):
        return None
    h = dec.estimate - dec.lo
    s = h / normal_quantile(0.5 + dec.confidence / 2)
    b = math.hypot(noise * math.sqrt(1.0 + 1.0 / min(max(runs, 1), MAX_SAMPLES)), process_sd)
    p = math.sqrt(power) if confirm else power
    return math.expm1(tau + h + widen + normal_quantile(p) * math.hypot(s, b))


def ab_progress(
    group_ratios: Sequence[float], policy: Policy, margin: float, detect: float, process_sd: float = 0.0
) -> float:
    """How far an A/B measurement is from the gate's detection promise: (MDE - margin) / (detect - margin),
    where the MDE is the one ab_gate reports for these ratios. At most 1: a slowdown of `detect` fails the
    case with probability MDE_POWER, so a pass rules it out. inf while the interval is unbounded."""
    if not detect > margin:
        raise ValueError(f"the detectable slowdown {detect:g} must exceed the margin {margin:g}")
    if len(group_ratios) < 2:
        return math.inf
    dec = log_interval(group_ratios, policy.decision_confidence)
    mde = minimum_detectable_effect(dec, math.log1p(margin), 0.0, 1, confirm=policy.confirm, process_sd=process_sd)
    return math.inf if mde is None else (mde - margin) / (detect - margin)


def case_mde(gates: Sequence[Gate], *, variant_is_against: bool) -> float | None:
    """The case's minimum detectable effect: its best gate's. A variant's own slowdown moves its time and
    its ratio to the reference alike, and either gate fails the case. A variant that is the reference itself
    (an A/A control) moves both sides of its ratio, so only the time gate sees it."""
    seeing = [g.mde for g in gates if g.mde is not None and not (variant_is_against and g.name == "ratio")]
    return min(seeing, default=None)


def _judge(
    name: str,
    diff: Interval,
    report: Interval,
    tau: float,
    what: str,
    than: str = "the baseline",
    hint: str = "; update it",
    pass_at: Interval | None = None,
) -> Gate:
    """diff: decision interval (log scale); report: the 95% interval shown to people (log scale). A claim
    (regressed, faster) needs `diff`; a pass, `pass_at`'s upper bound below tau where given (else `diff`'s)."""
    gate = Gate(
        name,
        PASS,
        estimate=math.exp(report.estimate),
        lo=math.exp(report.lo) if math.isfinite(report.lo) else None,
        hi=math.exp(report.hi) if math.isfinite(report.hi) else None,
        threshold=math.exp(tau),
    )
    pct = (math.exp(report.estimate) - 1) * 100
    ci = f"95% CI {_pct(report.lo)} .. {_pct(report.hi)}"
    if diff.lo > tau:
        gate.status = REGRESSED
        gate.reason = f"{what} {pct:+.1f}% ({ci}), beyond the {math.expm1(tau) * 100:.1f}% margin"
    elif diff.hi < -tau:
        gate.status = FASTER
        gate.reason = f"{what} {pct:+.1f}% ({ci}): faster than {than} by more than the margin{hint}"
    elif (diff if pass_at is None else pass_at).hi < tau:
        gate.status = PASS
        gate.reason = f"{what} {pct:+.1f}% ({ci})"
    else:
        gate.status = INCONCLUSIVE
        # Where the 95% interval shown lies within the margin, the wider one the run decides at is what
        # straddles it: say so, with its bounds, or the reason contradicts its own figures.
        wider = (
            f" at the {diff.confidence:.2%} confidence the run decides at ({_pct(diff.lo)} .. {_pct(diff.hi)})"
            if -tau < report.lo and report.hi < tau
            else ""
        )
        gate.reason = (
            f"{what} {pct:+.1f}% ({ci}) {STRADDLES} the {math.expm1(tau) * 100:.1f}% margin{wider}: "
            "not enough evidence either way"
        )
    return gate


# In the reason of a gate whose interval straddles its threshold, the one undecided gate that more blocks
# can decide (run/timed.py measures it again); the other inconclusive reasons are about the entry or the machine.
STRADDLES = "straddles"


def _pct(log_value: float) -> str:
    if not math.isfinite(log_value):
        return "-inf%" if log_value < 0 else "+inf%"
    return f"{math.expm1(log_value) * 100:+.1f}%"


def decide(
    variant_blocks: Sequence[float],
    against_blocks: Sequence[float] | None,
    stored: BaselineEntry | None,
    *,
    workload: str,
    policy: Policy,
    max_ratio: float | None,
    incomparable: list[str],
    disturbances: Sequence[str] = (),
    device: str = "",
) -> Verdict:
    """All gates for one case from its block medians and its stored baseline (if any). The rules run in this
    order: an entry that cannot judge the case says why; otherwise the time gate, then the machine-moved
    check on it, then the ratio gate with its own check, then the unseen-GPU check of the time gate (``device``:
    this GPU's id as samples name it); max_ratio last, with or without an entry."""
    verdict = Verdict(disturbances=list(disturbances))
    conf = policy.decision_confidence
    now = (log_interval(variant_blocks), log_interval(variant_blocks, conf))
    ratio = _ratio_intervals(variant_blocks, against_blocks, conf)
    if stored is None:
        verdict.gates.append(Gate("baseline", NO_BASELINE, reason="no stored baseline for this case"))
    elif (unjudgeable := _unjudgeable(stored, workload, incomparable)) is not None:
        verdict.gates.append(unjudgeable)
    else:
        tau = math.log1p(policy.baseline_delta(stored))
        gate = _time_gate(now, stored, tau, policy)
        verdict.reference_move, verdict.flag = reference.reference_band(against_blocks, stored, conf)
        moved = against_blocks is not None and reference.machine_moved(gate, against_blocks, stored, tau, conf)
        verdict.gates.append(gate)
        if ratio is not None and stored.ratio is not None:
            gate_r = _ratio_gate(ratio, stored, stored.ratio, policy)
            if moved and against_blocks is not None:
                reference.reference_far(gate_r, against_blocks, stored, conf)
            elif against_blocks is not None:
                reference.reference_alone(
                    gate_r,
                    gate,
                    against_blocks,
                    stored,
                    conf=conf,
                    noise_floor=policy.noise_floor,
                    prior=policy.prior_spread,
                )
            verdict.gates.append(gate_r)
        _unseen_device(gate, verdict.gates[-1], stored, device)
    if max_ratio is not None and ratio is not None:
        verdict.gates.append(_max_ratio_gate(*ratio, max_ratio))
    return verdict


def _ratio_intervals(
    variant_blocks: Sequence[float], against_blocks: Sequence[float] | None, conf: float
) -> tuple[Interval, Interval] | None:
    """The log interval of the per-block ratios to the reference, shown (95%) and at the decision level;
    None without a reference."""
    if against_blocks is None:
        return None
    ratios = [v / a for v, a in zip(variant_blocks, against_blocks, strict=True)]
    return log_interval(ratios), log_interval(ratios, conf)


def _unjudgeable(stored: BaselineEntry, workload: str, incomparable: list[str]) -> Gate | None:
    """The baseline gate of a case its stored entry cannot judge, checked in this order: another workload
    under the same id, another environment, an entry whose processes disagreed; None when it can judge."""
    if stored.workload != workload:
        return Gate(
            "baseline",
            NOT_COMPARABLE,
            reason="not comparable: workload changed (different shapes, dtypes or arguments) under the same "
            "test id; re-baseline with pytest --perfguard-update-baseline",
        )
    if incomparable:
        return Gate(
            "baseline",
            NOT_COMPARABLE,
            reason="not comparable: "
            + ", ".join(incomparable)
            + "; if the change is intended, re-baseline with pytest --perfguard-update-baseline",
        )
    if stored.unstable:
        times = ", ".join(f"{x.median_ns / 1e3:.2f}" for x in stored.samples)
        return Gate(
            "baseline",
            INCONCLUSIVE,
            reason=f"inconclusive: unstable baseline (its {stored.runs} update processes disagreed beyond the "
            f"case's own spread: {times} us); re-record it on a quiet machine with pytest "
            "--perfguard-update-baseline",
        )
    return None


def _time_gate(now: tuple[Interval, Interval], stored: BaselineEntry, tau: float, policy: Policy) -> Gate:
    """This run's time against the stored centre, at the threshold ``tau`` of the entry's own spread."""
    noise = max(stored.noise, policy.noise_floor)
    figure = (stored.median_ns, stored.ci_ns)
    return _stored_gate("baseline", "time vs baseline", now, figure, tau, noise, stored.runs, policy.confirm)


def _ratio_gate(now: tuple[Interval, Interval], stored: BaselineEntry, ratio: float, policy: Policy) -> Gate:
    """This run's ratio to the reference against the stored ``ratio``, at the threshold of the stored
    ratios' own spread."""
    tau = math.log1p(policy.ratio_baseline_delta(stored))
    noise = max(stored.ratio_noise, policy.ratio_noise_floor)
    figure = (ratio, stored.ratio_ci)
    return _stored_gate("ratio", "ratio vs baseline ratio", now, figure, tau, noise, stored.runs, policy.confirm)


def _stored_gate(
    name: str,
    what: str,
    now: tuple[Interval, Interval],
    figure: tuple[float, tuple[float, float] | None],
    tau: float,
    noise: float,
    runs: int,
    confirm: bool,
) -> Gate:
    """One gate against a stored figure of ``runs`` processes (its centre and 95% interval): ``now`` is this
    run's log interval, shown and at the decision level; ``noise`` the between-run sd ``tau`` is set from."""
    shown_now, dec_now = now
    centre, ci = figure
    shown = combine_difference(shown_now, math.log(centre), _stored_log_half_width(centre, ci))
    # A sample of k >= 2 processes: the prediction bound in the threshold already counts the centre's
    # own uncertainty (its 1/k term), so the decision does not widen by the stored interval again.
    dec = decision_interval(dec_now, centre, None if runs >= 2 else ci)
    # a pass: the same interval at 95% (the module docstring)
    gate = _judge(name, dec, shown, tau, what, pass_at=decision_interval(shown_now, centre, None if runs >= 2 else ci))
    gate.mde = minimum_detectable_effect(dec, tau, noise, runs, confirm=confirm)
    return gate


# The end of the reason of an A/B "faster" that stands on a case whose stored entry holds no A/A reading
# (run/timed.py adds it; the session counts such claims in a line of their own).
UNCHECKED_FASTER = (
    "; no A/A reading of this case is stored, and only those rule out a per-process offset between its two"
    " copies (an update on a clean checkout stores them)"
)
UNSEEN_DEVICE = "not one the baseline's processes ran on"  # in the reason of a time gate _unseen_device judged


def _unseen_device(gate: Gate, other: Gate, stored: BaselineEntry, device: str) -> None:
    """A time gate that failed on a GPU none of the entry's processes ran on, while the ratio gate (``other``)
    did not fail too: the stored spread holds no host-to-host part, so the time alone cannot tell this GPU
    from the code. Measured on three freshly started H100s (2026-11-26): the stable cases' times differed
    between hosts by 0.9-1.0% at the median and by more than 5% in 3-5 of 79-85 cases a pair (at most 8.6%,
    and 32-34% for one case); cuda_scalar S2048 causal read 1.104 ms on one and 1.201 ms on two others, and
    failed a guard against the first one's baseline. Such a gate is inconclusive, saying how to fix it:
    record the baseline on the host that guards it. A ratio gate that fails as well fails the case."""
    devices = {x.device for x in stored.samples}
    if gate.status is not REGRESSED or not device or "" in devices or device in devices:
        return
    if other is not gate and other.name == "ratio" and other.status is REGRESSED:
        return
    gate.status = INCONCLUSIVE
    gate.reason = (
        f"inconclusive: {gate.reason}, but this GPU ({device[:8]}) is {UNSEEN_DEVICE} ({len(devices)} other), "
        "and hosts of one model differ in time by more than the stored spread; the ratio gate does not fail "
        "it. A baseline recorded on this host judges it: pytest --perfguard-update-baseline here"
    )


def host_gate(
    variant_blocks: Sequence[float], against_blocks: Sequence[float], stored: BaselineEntry, policy: Policy
) -> Gate | None:
    """The eager call's cost against the stored one: its per-block ratio to the reference's eager call
    (paired, so the host's own speed cancels) against the entry's processes' ratio, at HOST_MARGIN. None where
    the entry holds no eager reading (older than the gate, or recorded on CPU)."""
    centre = stored.host_ratio
    if centre is None or not against_blocks:
        return None
    ratios = [v / a for v, a in zip(variant_blocks, against_blocks, strict=True)]
    c = math.log(centre)

    def shifted(x: Interval) -> Interval:
        return Interval(x.estimate - c, x.lo - c, x.hi - c, x.confidence, x.n)

    shown, dec = shifted(log_interval(ratios)), shifted(log_interval(ratios, policy.decision_confidence))
    # A failure needs the run's family-wise confidence; a pass, the gate's own 95% (the module docstring): at
    # 99.9% a 12-block interval spans nearly every block, and one preempted block left unchanged cases
    # undecided (H100, 2026-11-28).
    what = "host time per eager call vs baseline"
    return _judge("host", dec, shown, math.log1p(HOST_MARGIN), what, hint="", pass_at=shown)


def _max_ratio_gate(log_r: Interval, log_r_dec: Interval, max_ratio: float) -> Gate:
    tau = math.log(max_ratio)
    r = log_r.exp()
    shown = f"ratio {r.estimate:.3f} (95% CI {r.lo:.3f}..{r.hi:.3f})"
    if log_r_dec.lo > tau:
        status, reason = REGRESSED, f"{shown} exceeds max_ratio {max_ratio:g}"
    elif log_r_dec.hi < tau:
        status, reason = PASS, f"{shown} within max_ratio {max_ratio:g}"
    else:
        status, reason = INCONCLUSIVE, f"{shown} {STRADDLES} max_ratio {max_ratio:g}"
    return Gate("max_ratio", status, r.estimate, r.lo, r.hi, max_ratio, reason)


def ab_gate(
    group_ratios: Sequence[float],
    policy: Policy,
    margin: float,
    process_sd: float = 0.0,
    absorbed: float | None = None,
    offset_from: str = "",
) -> Gate:
    """Head against its base revision, measured in the same blocks: the per-capture-group ratios decide.
    No stored figure enters, so no between-run noise either: the margin only has to cover what differs
    between two loaded copies of the same code (placement). The groups sample placement within the
    process; `process_sd` is the offset each process adds on top, which they cannot sample, and the MDE
    counts it, so that the detection it promises holds. The margin absorbs `absorbed` of it (the pooled
    offset it was set for; default all of it); the rest, a case's own offset beyond the pooled one
    (policy.case_offset), widens the interval that a regression or a speed-up must clear, so that such a
    case is not called regressed or faster by its offset alone. A pass needs what any case's pass needs.
    `offset_from` says where the case's offset comes from, for the reason."""
    tau = math.log1p(margin)
    shown = log_interval(group_ratios)
    dec = log_interval(group_ratios, policy.decision_confidence)
    own = math.sqrt(max(process_sd**2 - (process_sd if absorbed is None else absorbed) ** 2, 0.0))
    wide = combine_difference(dec, 0.0, normal_quantile(0.5 + dec.confidence / 2) * own) if own > 0 else dec
    gate = _judge("ab", wide, shown, tau, "time vs base revision", than="the base revision", hint="")
    if own > 0:
        # The offset stands in the way of a claim (regressed, faster), not of a pass: a reading within the
        # margin in this process passes, as for any case, and the MDE says how much the offset can hide.
        within = _judge("ab", dec, shown, tau, "time vs base revision", than="the base revision", hint="")
        if gate.status is INCONCLUSIVE and within.status is PASS:
            gate = within
        elif within.status is not gate.status:
            gate.reason += (
                f"; not claimed: this case's own per-process offset ({own:.2%} beyond the pooled one, in quadrature"
                f"{', ' + offset_from if offset_from else ''}) can explain it"
            )
    widen = (wide.estimate - wide.lo) - (dec.estimate - dec.lo)
    gate.mde = minimum_detectable_effect(dec, tau, 0.0, 1, confirm=policy.confirm, process_sd=process_sd, widen=widen)
    return gate


def unpaired_gate(status: Status, reason: str) -> Gate:
    """The A/B gate of a case without a usable twin at the base revision."""
    return Gate("ab", status, reason=reason)


def recorded_gate(
    name: str,
    new: tuple[float, tuple[float, float] | None],
    old: tuple[float, tuple[float, float] | None],
    tau: float,
    policy: Policy,
    what: str,
    than: str,
) -> Gate:
    """One gate on two recorded figures, each a median with its 95% CI (two results files, for `perfguard
    compare`): the plugin's decision with `old` as the stored figure. Without both intervals the runs
    cannot be told apart: inconclusive."""
    (new_m, new_ci), (old_m, old_ci) = new, old
    if new_ci is None or old_ci is None or min(new_m, old_m, *new_ci, *old_ci) <= 0:
        return Gate(name, INCONCLUSIVE, reason=f"{what}: no interval on one side, the runs cannot be told apart")
    est = math.log(new_m)
    lo_side, hi_side = est - math.log(new_ci[0]), math.log(new_ci[1]) - est
    now = Interval(est, est - lo_side, est + hi_side, 0.95, 0)
    conf = policy.decision_confidence
    now_dec = Interval(est, est - _rescale(lo_side, conf), est + _rescale(hi_side, conf), conf, 0)
    shown = combine_difference(now, math.log(old_m), _stored_log_half_width(old_m, old_ci))
    dec = decision_interval(now_dec, old_m, old_ci)
    return _judge(name, dec, shown, tau, what, than=than, hint="")
