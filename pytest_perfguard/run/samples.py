"""What one process measured of a case, as a baseline keeps it: a timed record made a process sample (with its
A/A reading, if any) and an entry of such samples. The update (update.py) stores these; nothing here decides."""

from __future__ import annotations

import math
from datetime import date

from ..judge import baseline as bl
from ..record import CaseRecord


def aa_reading(r: CaseRecord) -> tuple[float, tuple[float, float]] | None:
    """The head/base ratio and its 95% interval of a record timed against its own twin at HEAD (an update's
    A/A process); None for a record without one (no base revision, or no usable twin)."""
    gate = r.gate("ab")
    if gate is None or gate.estimate is None or gate.ci is None:
        return None
    (lo, hi), est = gate.ci, gate.estimate
    return (est, (lo, hi)) if 0 < lo <= est <= hi < math.inf else None


def sample_of(r: CaseRecord, device: str = "") -> bl.ProcessSample:
    """What one process measured of a case, as a baseline entry keeps it (with its A/A reading, if any), on
    the device its record names (``device`` for a record that names none)."""
    assert r.median_ns is not None and r.ci_ns is not None
    ratio = float(r.ratio) if r.ratio is not None else None
    aa = aa_reading(r)
    return bl.ProcessSample(
        median_ns=float(r.median_ns),
        ci_ns=(min(float(r.ci_ns[0]), float(r.median_ns)), max(float(r.ci_ns[1]), float(r.median_ns))),
        ratio=ratio,
        against_ns=float(r.median_ns) / ratio if ratio else None,
        device=r.device or device,
        date=str(r.updated or date.today().isoformat()),
        blocks=int(r.blocks or 0),
        host_ns=r.host_ns,
        host_ratio=r.host_ratio,
        aa_ratio=aa[0] if aa is not None else None,
        aa_ci=aa[1] if aa is not None else None,
    )


def entry_of(
    r: CaseRecord, noise: float, samples: list[bl.ProcessSample] | None = None, unstable: bool = False
) -> bl.BaselineEntry:
    """The baseline entry an update makes of a timed record and the samples of its processes (by default
    the record's own process alone)."""
    assert r.median_ns is not None and r.ci_ns is not None and r.workload is not None
    return bl.BaselineEntry.from_samples(
        r.id,
        samples if samples else [sample_of(r)],
        workload=r.workload,
        workload_desc=r.workload_desc or "",
        env={k: str(v) for k, v in (r.env or {}).items()},
        updated=str(r.updated or date.today().isoformat()),
        noise=noise,
        unstable=unstable,
    )
