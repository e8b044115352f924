"""What ``perfguard explain`` found for one case, as stored in the results file and shown by every report.

An `Explanation` holds the raw numbers of the profiler diff (each metric at head and at base, in canonical
units) and where they came from (ncu version, GPU, clock control, the two revisions). The terminal, the
HTML report and the Markdown summary format them here, through one ordering: duration first, then the
metrics that moved most, so the three cannot disagree on what changed.

Stored under the case's record in the results file (``CaseRecord.explain``), validated strictly like the
rest of the record: a field this version does not know is an error naming it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tabulate import tabulate

from .jsonio import Invalid, check_keys, number, string

KINDS = ("time", "freq", "count", "bytes", "rate", "pct")  # ns, GHz, count, bytes, bytes/s, percent
# A percentage that moves from 0.2% to 0.6% is not news: changes of percentages are scored against at
# least this many points, so small utilisations do not outrank a real move.
PCT_FLOOR = 5.0
# A row that moved at least this much (scored as below) is marked in the reports.
MOVED = 0.05


# ------------------------------------------------------------------------------------------- formatting


def show(value: float | None, kind: str) -> str:
    """A metric value in the unit a kernel engineer reads it in."""
    if value is None:
        return "-"
    if kind == "time":
        for unit, size in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
            if value >= size:
                return f"{value / size:.2f} {unit}"
        return f"{value:.0f} ns"
    if kind == "freq":
        return f"{value:.3f} GHz"
    if kind in ("bytes", "rate"):
        suffix = "/s" if kind == "rate" else ""
        for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
            if value >= size:
                return f"{value / size:.2f} {unit}{suffix}"
        return f"{value:.0f} B{suffix}"
    if kind == "pct":
        return f"{value:.1f}%"
    return f"{value:g}"


def change(head: float | None, base: float | None, kind: str) -> str:
    """Head against base: points for percentages, a difference for counts, else a relative change."""
    if head is None or base is None:
        return "-"
    if kind == "pct":
        return "same" if abs(head - base) < 0.05 else f"{head - base:+.1f} pt"
    if kind == "count":
        return "same" if head == base else f"{head - base:+g}"
    if base == 0:
        return "same" if head == 0 else "was 0"
    ratio = head / base - 1
    return "same" if abs(ratio) < 0.0005 else f"{ratio * 100:+.1f}%"


def score(head: float | None, base: float | None, kind: str) -> float:
    """How far a metric moved, from 0 (same) to 1 (appeared, vanished), comparable across units; -1 when
    one side is missing, so such rows go last."""
    if head is None or base is None:
        return -1.0
    if head == base:
        return 0.0
    scale = max(abs(head), abs(base), PCT_FLOOR if kind == "pct" else 0.0)
    return min(1.0, abs(head - base) / scale)


# ------------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class MetricDiff:
    """One profiler metric of one kernel at head and at base, in canonical units (see KINDS)."""

    metric: str  # the ncu metric name
    label: str
    kind: str
    head: float | None
    base: float | None

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "label": self.label, "kind": self.kind, "head": self.head, "base": self.base}

    @classmethod
    def from_json(cls, obj: Any) -> MetricDiff:
        if not isinstance(obj, dict):
            raise Invalid(f"a metric must be a JSON object, got {type(obj).__name__}")
        check_keys(obj, ("metric", "label", "kind", "head", "base"), ("metric", "label", "kind", "head", "base"))
        kind = string(obj["kind"], "kind")
        if kind not in KINDS:
            raise Invalid(f"field 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
        return cls(
            metric=string(obj["metric"], "metric"),
            label=string(obj["label"], "label"),
            kind=kind,
            head=None if obj["head"] is None else number(obj["head"], "head"),
            base=None if obj["base"] is None else number(obj["base"], "base"),
        )


@dataclass(frozen=True)
class Row:
    """A displayed row: metric, head, base, change, and how far it moved (for the order and the marking)."""

    label: str
    head: str
    base: str
    change: str
    score: float

    @property
    def moved(self) -> bool:
        return self.score >= MOVED


@dataclass(frozen=True)
class KernelDiff:
    """One kernel launch at head beside its counterpart at base (either may be missing)."""

    head: str | None  # the kernel's name, None when only base launched it
    base: str | None
    head_grid: str = ""
    base_grid: str = ""
    head_block: str = ""
    base_block: str = ""
    metrics: tuple[MetricDiff, ...] = ()

    @property
    def title(self) -> str:
        names = [n for n in (self.head, self.base) if n is not None]
        if len(set(names)) == 1:
            only = "" if len(names) == 2 else " (head only)" if self.base is None else " (base only)"
            return names[0] + only
        return " | ".join(f"{n} ({side})" for n, side in ((self.head, "head"), (self.base, "base")) if n is not None)

    def value(self, metric: str, side: str) -> float | None:
        found = next((m for m in self.metrics if m.metric == metric), None)
        return None if found is None else found.head if side == "head" else found.base

    def rows(self) -> list[Row]:
        """Duration first (the thing to explain), then the rest by how far they moved; ties keep order."""
        rows = [
            Row(
                m.label,
                show(m.head, m.kind),
                show(m.base, m.kind),
                change(m.head, m.base, m.kind),
                score(m.head, m.base, m.kind),
            )
            for m in self.metrics
            if m.head is not None or m.base is not None
        ]
        for label, h, b in (("grid", self.head_grid, self.base_grid), ("block", self.head_block, self.base_block)):
            if h or b:
                both = bool(h and b)
                rows.append(
                    Row(
                        label,
                        h or "-",
                        b or "-",
                        "-" if not both else "same" if h == b else "changed",
                        1.0 * (h != b) if both else -1.0,
                    )
                )
        first = [r for r in rows if r.label == "duration"]
        return first + sorted((r for r in rows if r.label != "duration"), key=lambda r: -r.score)

    def to_json(self) -> dict[str, Any]:
        return {
            "head": self.head,
            "base": self.base,
            "head_grid": self.head_grid,
            "base_grid": self.base_grid,
            "head_block": self.head_block,
            "base_block": self.base_block,
            "metrics": [m.to_json() for m in self.metrics],
        }

    @classmethod
    def from_json(cls, obj: Any) -> KernelDiff:
        if not isinstance(obj, dict):
            raise Invalid(f"a kernel must be a JSON object, got {type(obj).__name__}")
        keys = ("head", "base", "head_grid", "base_grid", "head_block", "base_block", "metrics")
        check_keys(obj, keys, ("head", "base", "metrics"))
        names = [None if obj[k] is None else string(obj[k], k) for k in ("head", "base")]
        if names == [None, None]:
            raise Invalid("a kernel needs a 'head' or a 'base' name")
        if not isinstance(obj["metrics"], list):
            raise Invalid("field 'metrics' must be a list")
        return cls(
            head=names[0],
            base=names[1],
            head_grid=string(obj.get("head_grid", ""), "head_grid"),
            base_grid=string(obj.get("base_grid", ""), "base_grid"),
            head_block=string(obj.get("head_block", ""), "head_block"),
            base_block=string(obj.get("base_block", ""), "base_block"),
            metrics=tuple(MetricDiff.from_json(m) for m in obj["metrics"]),
        )


DURATION = "gpu__time_duration.sum"


def totals(kernels: Sequence[KernelDiff]) -> tuple[float, float] | None:
    """Summed kernel duration at head and at base (ns), when every launch on both sides has one."""
    heads = [k.value(DURATION, "head") for k in kernels if k.head is not None]
    bases = [k.value(DURATION, "base") for k in kernels if k.base is not None]
    if not heads or not bases or None in heads or None in bases:
        return None
    return sum(h for h in heads if h is not None), sum(b for b in bases if b is not None)


def text(kernels: Sequence[KernelDiff]) -> str:
    """The terminal's tables: one per kernel launch, and the total duration when there are several."""
    blocks = [
        f"kernel {number} of {len(kernels)}: {k.title}\n"
        + tabulate(
            [[r.label, r.head, r.base, r.change] for r in k.rows()],
            headers=["metric", "head", "base", "change"],
            disable_numparse=True,
        )
        for number, k in enumerate(kernels, 1)
    ]
    both = totals(kernels)
    if len(kernels) > 1 and both is not None:
        head_n = sum(1 for k in kernels if k.head is not None)
        base_n = sum(1 for k in kernels if k.base is not None)
        blocks.append(
            f"total duration of {head_n} head / {base_n} base kernel launches: "
            f"{show(both[0], 'time')} vs {show(both[1], 'time')} ({change(both[0], both[1], 'time')})"
        )
    return "\n\n".join(blocks)


@dataclass(frozen=True)
class Explanation:
    """Nsight Compute's view of one case at head and at base: what `perfguard explain` attaches to a record."""

    against: str  # the revision as the user named it
    base_sha: str
    head_sha: str | None  # the commit of the profiled working tree
    head_dirty: bool  # the working tree had uncommitted changes
    device: str  # the GPU, as the profiled process named it
    ncu: str  # the ncu version
    clock_control: str  # ncu --clock-control: "none" (as the timing ran) or "base" (locked)
    kernels: tuple[KernelDiff, ...] = ()

    def totals(self) -> tuple[float, float] | None:
        return totals(self.kernels)

    def headline(self, top: int = 3) -> str:
        """One line: the duration change, then the metrics that moved most (of the longest kernel)."""
        parts = []
        both = self.totals()
        if both is not None:
            head, base = both
            parts.append(f"duration {change(head, base, 'time')} ({show(head, 'time')} vs {show(base, 'time')})")
        longest = max(self.kernels, key=lambda k: k.value(DURATION, "head") or 0.0, default=None)
        if longest is not None:
            moved = [r for r in longest.rows() if r.label != "duration" and r.moved][:top]
            if moved:
                parts.append("moved most: " + ", ".join(f"{r.label} {r.change}" for r in moved))
        return "; ".join(parts) or "no kernel metric to compare"

    def source(self) -> str:
        """Which profiler, GPU, clocks and revisions the numbers came from."""
        head = self.head_sha[:12] if self.head_sha else "unknown commit"
        tree = "working tree with uncommitted changes" if self.head_dirty else "working tree"
        base = self.base_sha[:12]
        named = self.against.startswith(base) or self.base_sha.startswith(self.against)
        against = base if named else f"{self.against} = {base}"
        clocks = "clocks locked to base" if self.clock_control == "base" else "clocks not locked"
        return f"{self.ncu} on {self.device}, {clocks}; head {head} ({tree}) vs base {against}"

    def text(self) -> str:
        return text(self.kernels)

    def to_json(self) -> dict[str, Any]:
        return {
            "against": self.against,
            "base_sha": self.base_sha,
            "head_sha": self.head_sha,
            "head_dirty": self.head_dirty,
            "device": self.device,
            "ncu": self.ncu,
            "clock_control": self.clock_control,
            "kernels": [k.to_json() for k in self.kernels],
        }

    @classmethod
    def from_json(cls, obj: Any) -> Explanation:
        """Strict: raises jsonio.Invalid naming the field (and the kernel) at fault."""
        if not isinstance(obj, Mapping):
            raise Invalid(f"must be a JSON object, got {type(obj).__name__}")
        keys = ("against", "base_sha", "head_sha", "head_dirty", "device", "ncu", "clock_control", "kernels")
        check_keys(dict(obj), keys, keys)
        if not isinstance(obj["head_dirty"], bool):
            raise Invalid("field 'head_dirty' must be true or false")
        raw = obj["kernels"]
        if not isinstance(raw, list):
            raise Invalid("field 'kernels' must be a list")
        kernels = []
        for index, item in enumerate(raw):
            try:
                kernels.append(KernelDiff.from_json(item))
            except Invalid as exc:
                raise Invalid(f"kernel #{index}: {exc}") from None
        return cls(
            against=string(obj["against"], "against"),
            base_sha=string(obj["base_sha"], "base_sha"),
            head_sha=None if obj["head_sha"] is None else string(obj["head_sha"], "head_sha"),
            head_dirty=obj["head_dirty"],
            device=string(obj["device"], "device"),
            ncu=string(obj["ncu"], "ncu"),
            clock_control=string(obj["clock_control"], "clock_control"),
            kernels=tuple(kernels),
        )


def lenient(obj: Any) -> Explanation | None:
    """For the reports, which show what a file holds: an explanation that does not parse is left out."""
    try:
        return None if obj is None else Explanation.from_json(obj)
    except Invalid:
        return None
