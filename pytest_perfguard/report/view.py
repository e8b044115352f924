"""The cases of a results document as the HTML report, the Markdown summary and the PR comment see them.

One reading of the record's fields for all three, so that they cannot disagree on what a case's status
is, which cases need a person's attention, in what order, and what command reproduces one. It reads a
results file (one run) and a merged file (several runs, see merge.py) alike.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..record import CaseRecord, Gate, id_order
from .formats import (
    FAILING,
    STATUS_ORDER,
    UNDECIDED,
    attention,
    format_change,
    shape_label,
    significant,
    status_of,
    status_rank,
)
from .merge import runs_in
from .results import DeviceInfo

# With the default case budget of 5 s, four times as much measuring halves the interval's width.
FIRMER_BUDGET_S = 20


@dataclass(frozen=True)
class Case:
    """One perf case of one run, as shown: the results file's typed record (`rec`, read by the results
    codec), where the case ran, and the three things the reports derive from it (test, shape, status)."""

    rec: CaseRecord
    device: str  # device slug: the same id on two devices is two cases
    device_name: str
    test: str
    shape: str
    status: str

    @classmethod
    def of(cls, rec: CaseRecord, device: DeviceInfo) -> Case:
        return cls(
            rec=rec,
            device=device.slug,
            device_name=device.name,
            test=rec.test or rec.id.split("[")[0].split("::")[-1],
            shape=shape_label(rec),
            status=status_of(rec),
        )

    @property
    def against(self) -> str | None:
        return self.rec.against or None

    @property
    def flops(self) -> float | None:
        return self.rec.flops

    @property
    def mde(self) -> float | None:
        return self.rec.mde

    @property
    def gates(self) -> list[Gate]:
        return self.rec.gates

    @property
    def variant_blocks(self) -> list[float]:
        return self.rec.variant_blocks or []

    @property
    def against_blocks(self) -> list[float]:
        return self.rec.against_blocks or []

    @property
    def base_blocks(self) -> list[float]:
        return self.rec.base_blocks or []

    @property
    def env(self) -> dict[str, str]:
        return self.rec.env or {}

    @property
    def id(self) -> str:
        return self.rec.id

    @property
    def failing(self) -> bool:
        return self.status in FAILING

    @property
    def needs_attention(self) -> bool:
        return attention(self.status)

    @property
    def tflops_ci(self) -> tuple[float, float] | None:
        """The FLOP count is exact, so the time's interval maps onto throughput (inverted)."""
        ci = self.rec.ci_ns
        if self.flops is None or ci is None or ci[0] <= 0:
            return None
        return self.flops / ci[1] / 1e3, self.flops / ci[0] / 1e3

    def decisive_reason(self) -> str:
        """The reason that made the verdict: the gate whose status is the case's; when no gate says it (a
        disturbance, an unconfirmed regression, an error), the first reason of the case's own."""
        gate = next((g for g in self.gates if g.status == self.status and g.reason), None)
        if gate is not None:
            return gate.reason
        own = [r for r in self.rec.reasons if all(r != g.reason for g in self.gates)]
        return (own or self.rec.reasons or ["no reason recorded"])[0]

    def command(self) -> str:
        """What to run to see this case again; an undecided case gets a longer budget for a firmer answer."""
        base = f"pytest {shlex.quote(self.id)} --perfguard"
        rev = (self.rec.ab.sha or self.rec.ab.against) if self.rec.ab is not None else None
        if rev:  # an A/B case is reproduced against the same base revision
            base += f" --perfguard-against {shlex.quote(str(rev))}"
        if self.status in UNDECIDED:
            return f"{base} --perfguard-case-budget {FIRMER_BUDGET_S}"
        return base


@dataclass
class Report:
    """A whole results document: its cases in display order and what is known of where they ran."""

    cases: list[Case]
    devices: dict[str, DeviceInfo]  # by slug
    sources: list[str]
    git_shas: list[str]
    margins: list[float]
    errors: list[str] = field(default_factory=list)

    def device_label(self, slug: str) -> str:
        """The device's name as its file records it, else its slug."""
        device = self.devices.get(slug)
        return device.label if device is not None and device.label else slug

    def counts(self) -> list[tuple[str, int]]:
        """Cases per status, in display order (statuses this version does not know come last)."""
        counter = Counter(case.status for case in self.cases)
        known = [(s, counter.pop(s)) for s in STATUS_ORDER if s in counter]
        return known + sorted(counter.items())

    def attention(self) -> list[Case]:
        return [case for case in self.cases if case.needs_attention]

    def tests(self) -> list[tuple[str, str, list[Case]]]:
        """(device slug, test function, its cases) in first-seen order: one grid per test and device."""
        groups: dict[tuple[str, str], list[Case]] = {}
        for case in sorted(self.cases, key=lambda c: (c.device, c.test, id_order(c.id))):
            groups.setdefault((case.device, case.test), []).append(case)
        return [(device, test, cases) for (device, test), cases in groups.items()]

    def against_backends(self) -> list[str]:
        return sorted({backend for case in self.cases if (backend := case.rec.against_backend)})


def _sort_key(case: Case) -> tuple[int, tuple[str | int, ...], str]:
    return status_rank(case.status), id_order(case.id), case.device


def build(doc: Mapping[str, Any]) -> Report:
    """The report's view of a results or merged document, read by the results codec (merge.runs_in)."""
    runs = runs_in(doc)
    cases: list[Case] = []
    devices: dict[str, DeviceInfo] = {}
    sources: list[str] = []
    shas: list[str] = []
    margins: list[float] = []
    errors: list[str] = []
    for run in runs:
        checked = run.checked
        device = checked.device_info
        devices.setdefault(device.slug, device)
        if run.source:
            sources.append(run.source)
        sha = checked.commit
        if sha and sha not in shas:
            shas.append(sha)
        margin = checked.margin
        if margin is not None and margin not in margins:
            margins.append(margin)
        prefix = f"{run.source}: " if len(runs) > 1 and run.source else ""
        errors += [prefix + e for e in checked.errors]
        cases += [Case.of(r, device) for r in checked.results]
    cases.sort(key=_sort_key)
    return Report(cases=cases, devices=devices, sources=sources, git_shas=shas, margins=margins, errors=errors)


# ------------------------------------------------------------------------------------------- formatting


def fmt_tflops(case: Case) -> str:
    tflops = case.rec.tflops
    if tflops is None:
        return "-"
    ci = case.tflops_ci
    text = significant(tflops)
    return text if ci is None else f"{text} [{significant(ci[0])}, {significant(ci[1])}]"


def gate_text(case: Case) -> str:
    """Every gate's change with its CI, "baseline +3.1% [+2.8, +3.4]; ratio ..."."""
    parts = [f"{g.name} {format_change(g.estimate, g.ci)}" for g in case.gates if g.estimate is not None]
    return "; ".join(parts) or "-"


_VERSIONS = (
    ("torch", "torch"),
    ("triton", "triton"),
    ("cuda", "CUDA"),
    ("capability", "capability"),
    ("driver", "driver"),
)


def _version_rows(device: DeviceInfo) -> list[tuple[str, str]]:
    """torch, triton and CUDA always (saying when not recorded); capability and driver when known."""
    values = {key: str(getattr(device, key)) for key, _label in _VERSIONS}
    return [
        (label, values[key] or "not recorded")
        for key, label in _VERSIONS
        if values[key] or key in ("torch", "triton", "cuda")
    ]


def margins_used(report: Report) -> list[float]:
    """The margins the baseline and ratio gates judged at (fractions): stored between-run noise widens a
    case's margin past the setting (verdict.py), so the setting alone is not the rule a case was held to."""
    used = {
        round(g.threshold - 1.0, 4)
        for c in report.cases
        for g in c.gates
        if g.name in ("baseline", "ratio") and g.threshold is not None and g.threshold > 1.0
    }
    return sorted(used)


def margin_text(report: Report) -> str:
    """ "5%", or "5% set; judged at 20.0% (...)" when the gates used other margins than the setting."""
    configured = ", ".join(f"{m:.0%}" for m in report.margins) or "not recorded"
    used = margins_used(report)
    if not used or all(any(abs(u - m) < 5e-4 for m in report.margins) for u in used):
        return configured
    judged = f"{used[0]:.1%}" if len(used) == 1 else f"{used[0]:.1%} to {used[-1]:.1%} by case"
    return f"{configured} set; judged at {judged} (widened by the cases' stored between-run noise)"


def environment(report: Report) -> list[tuple[str, str]]:
    """(label, value) of what the numbers belong to: device, versions, the reference's backend, commit.
    One row per device when the file holds several, so no version is shown against the wrong device."""
    rows: list[tuple[str, str]] = []
    if len(report.devices) == 1:
        device = next(iter(report.devices.values()))
        rows.append(("device", device.label or "not recorded"))
        rows += _version_rows(device)
    else:
        rows += [(d.label, ", ".join(f"{k} {v}" for k, v in _version_rows(d))) for d in report.devices.values()]
    rows.append(("SDPA backend", ", ".join(report.against_backends()) or "not recorded"))
    rows.append(("git SHA", ", ".join(report.git_shas) or "not recorded in the results file"))
    if report.margins or margins_used(report):
        rows.append(("margin", margin_text(report)))
    if len(report.sources) > 1:
        rows.append(("merged from", ", ".join(report.sources)))
    return rows


def counts_line(report: Report, sep: str = " · ") -> str:
    counts = report.counts()
    return sep.join(f"{n} {status}" for status, n in counts) + f" of {len(report.cases)} cases"


def shape_order(cases: Sequence[Case]) -> list[str]:
    """Shapes by the work they do (FLOPs), so an axis reads small to large."""
    work: dict[str, float] = {}
    for c in cases:
        work[c.shape] = max(work.get(c.shape, 0.0), c.flops or 0.0)
    return sorted(work, key=lambda s: (work[s], id_order(s)))
