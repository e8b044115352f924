"""How every output writes a figure: the terminal table, the progress lines, the Markdown summary, the HTML
report and the `perfguard` command all format times, ratios, changes, intervals and shapes here, and list
cases in one status order, so that no two of them print the same case differently.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from typing import Any

from ..record import CaseRecord

# ------------------------------------------------------------------------------------------------- numbers

_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns"))


def _unit(ns: float) -> tuple[float, str]:
    for scale, name in _UNITS:
        if ns >= scale:
            return scale, name
    return 1.0, "ns"


def _digits(value: float) -> int:
    """Decimals for about four significant figures."""
    return 1 if value >= 100 else 2 if value >= 10 else 3


def format_time(ns: float | None, ci: Sequence[float] | None = None) -> str:
    """A time in ns as "9.123 µs", with its CI "[9.100, 9.150]" in the same unit; "-" for none."""
    if ns is None or not math.isfinite(ns):
        return "-"
    scale, unit = _unit(ns)
    digits = _digits(ns / scale)
    text = f"{ns / scale:.{digits}f} {unit}"
    if ci is not None:
        text += f" [{ci[0] / scale:.{digits}f}, {ci[1] / scale:.{digits}f}]"
    return text


def significant(x: float, digits: int = 3) -> str:
    """`digits` significant figures, trailing zeros kept ("4.00", "24.1"); a whole number from 10**digits."""
    if not math.isfinite(x):
        return "-"
    if abs(x) >= 10**digits:
        return f"{x:.0f}"
    return f"{x:#.{digits}g}".rstrip(".")


def format_ratio(ratio: float | None, ci: Sequence[float] | None = None) -> str:
    """A ratio as times are written, its CI to the same decimals: "1.020 [1.010, 1.030]", "24.10"; "-" when
    no reference was timed."""
    if ratio is None or not math.isfinite(ratio):
        return "-"
    digits = _digits(ratio)
    text = f"{ratio:.{digits}f}"
    return text if ci is None else f"{text} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def format_change(estimate: float | None, ci: Sequence[float | None] | None = None) -> str:
    """A ratio-scale change in per cent, its CI in points: "+1.2% [+0.3, +2.1]"; "-" without an estimate."""
    if estimate is None:
        return "-"
    text = f"{(estimate - 1) * 100:+.1f}%"
    if ci is None or ci[0] is None or ci[1] is None:
        return text
    return f"{text} [{(ci[0] - 1) * 100:+.1f}, {(ci[1] - 1) * 100:+.1f}]"


def format_mde(mde: float | None) -> str:
    """The smallest slowdown a case fails on 95% of the time, as a change: "+1.9%"."""
    return "-" if mde is None else f"{mde * 100:+.1f}%"


def plus_minus(center: float | None, ci: Sequence[float | None] | None, unit: str = "%") -> str:
    """ "±1.2%": the larger side of the CI, relative to the center; "-" without one."""
    if center is None or not ci or ci[0] is None or ci[1] is None:
        return "-"
    half = max(center - float(ci[0]), float(ci[1]) - center) / center * 100
    return f"±{half:.{2 if half < 0.1 else 1}f}{unit}"


# --------------------------------------------------------------------------------------------------- shapes

_DTYPES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "float64": "fp64",
    "double": "fp64",
    "float8_e4m3fn": "fp8e4m3",
    "float8_e5m2": "fp8e5m2",
}


def _label(key: str, value: Any) -> str:
    """One parameter as a reader scans it: "S128", "bf16", "causal"; "" for an off flag or None."""
    if value is None or value is False:
        return ""
    if value is True:
        return key
    if isinstance(value, str):
        text = value.removeprefix("torch.")
        return _DTYPES.get(text, text)
    return f"{key}{value}" if len(key) <= 2 else f"{key}:{value}"


def shape_label(r: CaseRecord) -> str:
    """A short label of the case's parameters ("B4 H8 S128 D64", "S2048 D128 bf16 causal"): the table has
    120 columns for all of a case, and "B=4,H=8,dtype=torch.bfloat16,causal=False" spends most of them on noise.
    Without recorded parameters, the test id's after the variant ("S64"), else the workload's description."""
    if r.params:
        return " ".join(t for t in (_label(k, v) for k, v in r.params.items()) if t)
    return _id_label(r.id, r.variant) or str(r.workload_desc or "")


def _id_label(case_id: str, variant: str) -> str:
    """The parameters in a pytest id without the variant: "S64" of "test_x[v-S64]"; "" when none."""
    bracket = re.search(r"\[(.*)\]$", case_id)
    if not bracket:
        return ""
    label = bracket.group(1)
    for prefix in (f"{variant}-", variant):
        if variant and label.startswith(prefix):
            return label[len(prefix) :]
    return label


# --------------------------------------------------------------------------------------------------- status

# Cases are listed in this order everywhere: what failed the build, then what could not be decided, then the
# rest; within a status, by id. "failed" is the outcome of a case whose verdict did not fail it (a strict run).
FAILING = ("regressed", "incorrect", "error", "timeout", "flagged", "failed")
UNDECIDED = ("inconclusive",)
STATUS_ORDER = (
    *FAILING,
    *UNDECIDED,
    "not comparable",
    "no baseline",
    "no base",
    "new",
    "faster",
    "pass",
    "correct",
    "skipped",
    "not run",
)


def status_rank(status: str) -> int:
    """A status's place in STATUS_ORDER; one this version does not know comes last."""
    return STATUS_ORDER.index(status) if status in STATUS_ORDER else len(STATUS_ORDER)


def status_of(r: CaseRecord) -> str:
    """The word a case is listed under: its verdict, else what pytest made of it ("skipped")."""
    return str(r.verdict or r.outcome)


def attention(status: str) -> bool:
    """Failing and inconclusive: the statuses a person has to act on, shown first with their reason."""
    return status in FAILING or status in UNDECIDED


def escaped(text: object) -> str:
    """Text as HTML shows it literally (quotes too: it goes into attributes)."""
    return html.escape(str(text), quote=True)
