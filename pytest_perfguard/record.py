"""The one record of one perf case, from the runner to the xdist controller, the report and the files.

A `CaseRecord` is made by the runner, travels to the xdist controller as JSON on the test report, is
merged and judged at the end of the session, printed, written to the results file and read back by
`perfguard compare`. Every field is typed here, once: a field added in one place and read with
`.get()` in another is how records drift.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .explanation import Explanation
from .jsonio import Invalid


class Status(str, Enum):
    """A case's verdict. The values are the words users see in tables and files."""

    PASS = "pass"
    FASTER = "faster"
    REGRESSED = "regressed"
    INCONCLUSIVE = "inconclusive"
    NOT_COMPARABLE = "not comparable"
    NO_BASELINE = "no baseline"
    NO_BASE = "no base"  # --perfguard-against: the base revision has no usable twin of this case
    NEW = "new"  # --perfguard-against: the case does not exist at the base revision
    CORRECT = "correct"  # correctness only (no --perfguard)
    INCORRECT = "incorrect"
    ERROR = "error"
    TIMEOUT = "timeout"
    FLAGGED = "flagged"  # the timing cannot be believed: the timer does not see the work

    def __str__(self) -> str:
        return self.value


class Outcome(str, Enum):
    """What pytest made of the case's item."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    NOT_RUN = "not run"

    def __str__(self) -> str:
        return self.value


Interval = tuple[float, float]


class RecordError(ValueError):
    """A record that does not fit the schema; the message names the field."""


def _interval(value: Any) -> Interval | None:
    if value is None:
        return None
    lo, hi = value
    return (float(lo), float(hi))


# A test parameter as a record keeps it: a plain JSON value (the runner writes any other value as its repr).
Param = int | float | str | bool | None


GATE_FIELDS = ("gate", "status", "estimate", "ci", "threshold", "reason", "mde")


def _fields(obj: Any, allowed: tuple[str, ...], what: str) -> dict[str, Any]:
    """`obj` as a JSON object of no other fields than `allowed`; a RecordError naming `what` otherwise."""
    if not isinstance(obj, dict):
        raise RecordError(f"{what} must be a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise RecordError(f"unknown {what} field(s) {unknown}")
    return obj


def _optional_number(obj: dict[str, Any], key: str, what: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise RecordError(f"{what} field {key!r} must be a number or null, got {json.dumps(value)[:60]}")
    return float(value)


def _optional_string(obj: dict[str, Any], key: str, what: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise RecordError(f"{what} field {key!r} must be a string or null, got {json.dumps(value)[:60]}")
    return value


def _list(obj: dict[str, Any], key: str, what: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise RecordError(f"{what} field {key!r} must be a list, got {json.dumps(value)[:60]}")
    return value


def _optional_integers(obj: dict[str, Any], key: str, what: str) -> list[int] | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise RecordError(f"{what} field {key!r} must be a list of integers or null, got {json.dumps(value)[:60]}")
    return list(value)


def _optional_interval(obj: dict[str, Any], key: str, what: str) -> Interval | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise RecordError(f"{what} field {key!r} must be [low, high] or null, got {json.dumps(value)[:60]}")
    lo, hi = (_optional_number({f"{key}[{i}]": x}, f"{key}[{i}]", what) for i, x in enumerate(value))
    if lo is None or hi is None:
        raise RecordError(f"{what} field {key!r} must be [low, high] or null, got {json.dumps(value)[:60]}")
    return lo, hi


@dataclass
class Gate:
    """One gate's decision (judge/verdict.py): an estimate on the ratio scale (1.03 = 3% slower), its 95%
    interval, the threshold it was judged at and why. In a record's JSON it is an object keyed "gate",
    "status", "estimate", "ci", "threshold", "reason", "mde" (`to_json`)."""

    name: str  # "baseline", "ratio", "max_ratio", "ab"
    status: Status
    estimate: float | None = None  # ratio scale: now/baseline, ratio/baseline ratio, or ratio
    lo: float | None = None
    hi: float | None = None
    threshold: float | None = None
    reason: str = ""
    mde: float | None = None  # minimum detectable effect at policy.MDE_POWER, a fraction (0.071 is +7.1%)

    @property
    def ci(self) -> tuple[float, float] | None:
        """The 95% interval, when both its ends are known."""
        return None if self.lo is None or self.hi is None else (self.lo, self.hi)

    @property
    def band(self) -> tuple[float, float] | None:
        """The margin band: slower than its top is a regression, faster than its bottom is 'faster'.
        A cap gate (max_ratio) has no band: its threshold is an absolute ratio, not a change."""
        if self.threshold is None or self.threshold <= 1.0 or self.name.startswith("max"):
            return None
        return 1.0 / self.threshold, self.threshold

    def to_json(self) -> dict[str, Any]:
        return {
            "gate": self.name,
            "status": self.status.value,
            "estimate": self.estimate,
            "ci": [self.lo, self.hi] if self.lo is not None else None,
            "threshold": self.threshold,
            "reason": self.reason,
            "mde": self.mde,
        }

    @classmethod
    def from_json(cls, obj: Any) -> Gate:
        """The inverse of `to_json`. Unknown fields are an error, as in a record."""
        obj = _fields(obj, GATE_FIELDS, "gate")
        name = obj.get("gate")
        if not isinstance(name, str) or not name:
            raise RecordError(f"a gate needs a 'gate' name, got {json.dumps(name)[:60]}")
        what = f"gate {name!r}:"
        try:
            status = Status(obj.get("status"))
        except ValueError as exc:
            raise RecordError(f"{what} {exc}") from None
        ci = obj.get("ci")
        if ci is not None and (not isinstance(ci, list | tuple) or len(ci) != 2):
            raise RecordError(f"{what} field 'ci' must be [low, high] or null, got {json.dumps(ci)[:60]}")
        bounds = {"ci[0]": ci[0], "ci[1]": ci[1]} if ci is not None else {}
        return cls(
            name=name,
            status=status,
            estimate=_optional_number(obj, "estimate", what),
            lo=_optional_number(bounds, "ci[0]", what),
            hi=_optional_number(bounds, "ci[1]", what),
            threshold=_optional_number(obj, "threshold", what),
            reason=_optional_string(obj, "reason", what) or "",
            mde=_optional_number(obj, "mde", what),
        )


CONFIRMED_FIELDS = ("verdict", "median_ns", "ci_ns", "ratio", "gates", "reasons", "elapsed_s", "error", "batch")


@dataclass
class Confirmed:
    """What a record keeps of its confirmation in a fresh process (run/confirm.py): what the fresh process
    measured of the case, or why it measured nothing (`error`), and the seconds it took. In JSON a failed
    confirmation is {"error", "elapsed_s"}, a measured one {"verdict", "median_ns", "ci_ns", "ratio",
    "gates", "reasons", "elapsed_s"}, either with "batch" when it ran in a batch of that many cases."""

    elapsed_s: float
    error: str | None = None
    verdict: Status | None = None
    median_ns: float | None = None
    ci_ns: Interval | None = None
    ratio: float | None = None
    gates: list[Gate] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    batch: int | None = None  # the size of the batch of regressions confirmed together (confirm.Batch)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any]
        if self.error is not None:
            out = {"error": self.error, "elapsed_s": self.elapsed_s}
        else:
            out = {
                "verdict": self.verdict.value if self.verdict is not None else None,
                "median_ns": self.median_ns,
                "ci_ns": list(self.ci_ns) if self.ci_ns is not None else None,
                "ratio": self.ratio,
                "gates": [g.to_json() for g in self.gates],
                "reasons": list(self.reasons),
                "elapsed_s": self.elapsed_s,
            }
        if self.batch is not None:
            out["batch"] = self.batch
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Confirmed:
        what = "confirmation"
        obj = _fields(obj, CONFIRMED_FIELDS, what)
        elapsed = _optional_number(obj, "elapsed_s", what)
        if elapsed is None:
            raise RecordError("a confirmation needs its 'elapsed_s'")
        batch = obj.get("batch")
        if batch is not None and (not isinstance(batch, int) or isinstance(batch, bool)):
            raise RecordError(f"confirmation field 'batch' must be an integer, got {json.dumps(batch)[:60]}")
        try:
            verdict = None if obj.get("verdict") is None else Status(obj["verdict"])
        except ValueError as exc:
            raise RecordError(f"{what}: {exc}") from None
        reasons = _list(obj, "reasons", what)
        if not all(isinstance(r, str) for r in reasons):
            raise RecordError("confirmation field 'reasons' must be a list of strings")
        return cls(
            elapsed_s=elapsed,
            error=_optional_string(obj, "error", what),
            verdict=verdict,
            median_ns=_optional_number(obj, "median_ns", what),
            ci_ns=_optional_interval(obj, "ci_ns", what),
            ratio=_optional_number(obj, "ratio", what),
            gates=[Gate.from_json(g) for g in _list(obj, "gates", what)],
            reasons=list(reasons),
            batch=batch,
        )


CORRECTNESS_FIELDS = ("passed", "seeds", "dtype", "max_abs", "rel_fro", "worst_index", "native_max_abs", "message")


@dataclass
class Correctness:
    """The correctness gate's summary (measure/correctness.py): whether the variant matched the float64
    reference on every seed, the inputs' dtype, the worst error (absolute, and relative in the Frobenius
    norm), where it was, the error of the reference computed in the inputs' own dtype there, and why it
    failed. In JSON an object of those eight keys."""

    passed: bool
    seeds: list[int] = field(default_factory=list)
    dtype: str = ""
    max_abs: float | None = None
    rel_fro: float | None = None
    worst_index: list[int] | None = None
    native_max_abs: float | None = None
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "seeds": list(self.seeds),
            "dtype": self.dtype,
            "max_abs": self.max_abs,
            "rel_fro": self.rel_fro,
            "worst_index": list(self.worst_index) if self.worst_index is not None else None,
            "native_max_abs": self.native_max_abs,
            "message": self.message,
        }

    @classmethod
    def from_json(cls, obj: Any) -> Correctness:
        what = "correctness"
        obj = _fields(obj, CORRECTNESS_FIELDS, what)
        passed = obj.get("passed")
        if not isinstance(passed, bool):
            raise RecordError(f"correctness field 'passed' must be true or false, got {json.dumps(passed)[:60]}")
        return cls(
            passed=passed,
            seeds=_optional_integers(obj, "seeds", what) or [],
            dtype=_optional_string(obj, "dtype", what) or "",
            max_abs=_optional_number(obj, "max_abs", what),
            rel_fro=_optional_number(obj, "rel_fro", what),
            worst_index=_optional_integers(obj, "worst_index", what),
            native_max_abs=_optional_number(obj, "native_max_abs", what),
            message=_optional_string(obj, "message", what) or "",
        )


AB_FIELDS = ("against", "sha", "group_ratios", "groups")


@dataclass
class AbComparison:
    """The head/base comparison of a case under --perfguard-against: the base revision as it was asked for
    (`against`) and as it resolved (`sha`), the head/base ratio of each capture group, which the A/B gate
    judges, and the capture group of each block. In JSON an object of those four keys."""

    against: str | None = None
    sha: str | None = None
    group_ratios: list[float] = field(default_factory=list)
    groups: list[int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "against": self.against,
            "sha": self.sha,
            "group_ratios": list(self.group_ratios),
            "groups": list(self.groups) if self.groups is not None else None,
        }

    @classmethod
    def from_json(cls, obj: Any) -> AbComparison:
        what = "ab"
        obj = _fields(obj, AB_FIELDS, what)
        ratios = _list(obj, "group_ratios", what)
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in ratios):
            raise RecordError(f"ab field 'group_ratios' must be a list of numbers, got {json.dumps(ratios)[:60]}")
        return cls(
            against=_optional_string(obj, "against", what),
            sha=_optional_string(obj, "sha", what),
            group_ratios=[float(x) for x in ratios],
            groups=_optional_integers(obj, "groups", what),
        )


@dataclass
class CaseRecord:
    """What one perf case did in one process. Timing fields stay None for a case that was not timed."""

    id: str
    test: str = ""
    variant: str = ""
    params: dict[str, Param] = field(default_factory=dict)  # the test's parameters, by name
    outcome: Outcome = Outcome.SKIPPED
    verdict: Status | None = None
    reasons: list[str] = field(default_factory=list)
    seeds: list[int] | None = None
    workload: str | None = None
    workload_desc: str | None = None
    correctness: Correctness | None = None
    env: dict[str, str] | None = None
    # timing
    device: str | None = None  # what it was timed on: the GPU's UUID, or the host's CPU model (state.device_id)
    median_ns: float | None = None
    ci_ns: Interval | None = None
    ci_rel: float | None = None
    ratio: float | None = None
    ratio_ci: Interval | None = None
    against: str | None = None
    blocks: int | None = None
    reps: int | None = None
    samples_per_block: int | None = None
    mode: str | None = None
    capture_error: str | None = None  # why the variant's calls could not be captured in a CUDA graph
    # The eager call as a user makes it (host and device, synchronised per block; hosttime.host_time), per call,
    # with its 95% interval, and its ratio to `against`'s eager call (paired per block): on a GPU, what a
    # launch-bound user pays, which graph replay does not see. None on CPU, where the timed figure is it.
    host_ns: float | None = None
    host_ci: Interval | None = None
    host_ratio: float | None = None
    host_ratio_ci: Interval | None = None
    # The run's decision on a timed case (policy.decision): "pass", "fail", "unverified" or "new"; set at the
    # end of the run, where the allowance for unverified cases is applied.
    decision: str | None = None
    reference_move: float | None = None  # ln(the reference's time / its stored centre), where the entry has it
    stop_reason: str | None = None
    elapsed_s: float | None = None
    wall_ratio: float | None = None
    flops: float | None = None
    tflops: float | None = None
    bytes: float | None = None
    gbps: float | None = None
    pct_peak_compute: float | None = None  # % of the device's peak for the inputs' dtype (peaks.py)
    pct_peak_bandwidth: float | None = None
    checks_s: float | None = None  # wall time the integrity checks took, outside the timed window
    checks: dict[str, float] | None = None  # checks_s by check (integrity.py), in seconds
    # Wall time of the whole case in this process: correctness gate, measurement, checks. Waits for the device
    # lock and fresh-process confirmations are left out, so checks_s / (case_s - checks_s) is what the checks
    # add to the case's device time.
    case_s: float | None = None
    # judgement
    gates: list[Gate] = field(default_factory=list)
    mde: float | None = None
    notes: list[str] = field(default_factory=list)
    disturbances: list[str] = field(default_factory=list)
    variant_blocks: list[float] | None = None
    against_blocks: list[float] | None = None
    base_blocks: list[float] | None = None
    ab: AbComparison | None = None  # the head/base comparison under --perfguard-against
    updated: str | None = None
    confirmation: Confirmed | None = None
    baseline_hold: str | None = None
    sticky: bool = False  # the case poisoned the CUDA context
    crashed: bool = False  # its worker process died while running it
    explain: Explanation | None = None  # Nsight Compute's head/base diff, attached by `perfguard explain`

    @property
    def timed(self) -> bool:
        return self.median_ns is not None

    @property
    def against_backend(self) -> str | None:
        """The SDPA backend the reference ran on, where the environment records one."""
        return (self.env or {}).get("against_backend") or None

    def gate(self, name: str) -> Gate | None:
        return next((g for g in self.gates if g.name == name), None)

    def to_json(self) -> dict[str, Any]:
        """A plain JSON object: enums as their words, intervals as lists, unset fields left out."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or value is False:
                continue
            if isinstance(value, Enum):
                value = value.value
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Explanation | Confirmed | AbComparison | Correctness):
                value = value.to_json()
            elif f.name == "gates":
                value = [g.to_json() for g in value]
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CaseRecord:
        """The inverse of `to_json`. Unknown fields are an error: a record is ours or it is not."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(obj) - names)
        if unknown:
            raise RecordError(f"unknown record field(s) {unknown}")
        if "id" not in obj:
            raise RecordError("a record needs an 'id'")
        data = dict(obj)
        try:
            data["outcome"] = Outcome(data.get("outcome", Outcome.SKIPPED))
            if data.get("verdict") is not None:
                data["verdict"] = Status(data["verdict"])
        except ValueError as exc:
            raise RecordError(str(exc)) from None
        for key in ("ci_ns", "ratio_ci", "host_ci", "host_ratio_ci"):
            data[key] = _interval(data.get(key))
        gates = data.get("gates") or []
        if not isinstance(gates, list):
            raise RecordError(f"field 'gates' must be a list, got {type(gates).__name__}")
        data["gates"] = [Gate.from_json(g) for g in gates]
        if data.get("confirmation") is not None:
            data["confirmation"] = Confirmed.from_json(data["confirmation"])
        if data.get("ab") is not None:
            data["ab"] = AbComparison.from_json(data["ab"])
        params = data.get("params", {})
        if not isinstance(params, dict) or not all(
            isinstance(v, int | float | str | bool) or v is None for v in params.values()
        ):
            raise RecordError(f"field 'params' must be an object of plain values, got {json.dumps(params)[:60]}")
        if data.get("correctness") is not None:
            data["correctness"] = Correctness.from_json(data["correctness"])
        try:
            data["explain"] = None if data.get("explain") is None else Explanation.from_json(data["explain"])
        except Invalid as exc:
            raise RecordError(f"field 'explain': {exc}") from None
        return cls(**data)


def id_order(text: str) -> tuple[str | int, ...]:
    """A sort key in which the numbers of a node id or shape compare as numbers (S256 before S1024)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def dumps_records(records: list[CaseRecord]) -> str:
    """Records as one JSON text, for the trip from an xdist worker to the controller."""
    return json.dumps([r.to_json() for r in records])


def loads_records(text: str) -> list[CaseRecord]:
    return [CaseRecord.from_json(obj) for obj in json.loads(text)]
