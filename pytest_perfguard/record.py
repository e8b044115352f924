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


@dataclass
class CaseRecord:
    """What one perf case did in one process. Timing fields stay None for a case that was not timed."""

    id: str
    test: str = ""
    variant: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    outcome: Outcome = Outcome.SKIPPED
    verdict: Status | None = None
    reasons: list[str] = field(default_factory=list)
    seeds: list[int] | None = None
    workload: str | None = None
    workload_desc: str | None = None
    correctness: dict[str, Any] | None = None
    env: dict[str, str] | None = None
    # timing
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
    gates: list[dict[str, Any]] = field(default_factory=list)
    mde: float | None = None
    notes: list[str] = field(default_factory=list)
    disturbances: list[str] = field(default_factory=list)
    variant_blocks: list[float] | None = None
    against_blocks: list[float] | None = None
    base_blocks: list[float] | None = None
    ab: dict[str, Any] | None = None  # the head/base comparison under --perfguard-against
    updated: str | None = None
    confirmation: dict[str, Any] | None = None
    baseline_hold: str | None = None
    sticky: bool = False  # the case poisoned the CUDA context
    crashed: bool = False  # its worker process died while running it
    explain: Explanation | None = None  # Nsight Compute's head/base diff, attached by `perfguard explain`

    @property
    def timed(self) -> bool:
        return self.median_ns is not None

    def gate(self, name: str) -> dict[str, Any] | None:
        return next((g for g in self.gates if g.get("gate") == name), None)

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
            elif isinstance(value, Explanation):
                value = value.to_json()
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
        for key in ("ci_ns", "ratio_ci"):
            data[key] = _interval(data.get(key))
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
