"""Baseline store: one deterministic JSON file per device model.

A baseline file is reviewed in pull requests and merged by git, so it is written with sorted keys, a fixed
indent and no timestamps in keys, always atomically, and read strictly: a file that is truncated, half-merged,
hand-edited into invalid numbers or written by a newer version is refused with a message that names the file,
the problem and the fix, and is never rewritten behind the user's back. Nothing in a file is executed.

Format (``schema_version`` 3)::

    {"schema_version": 3,
     "device": {"slug": "nvidia-h100-80gb-hbm3", "name": "NVIDIA H100 80GB HBM3", ...},
     "cases": {"<test node id>": {"workload": "<sha256 hex>", "workload_desc": "...", "env": {...},
                                 "samples": [{"median_ns": 9123.4, "ci_ns": [9100.0, 9150.0], "ratio": 1.02,
                                              "against_ns": 8944.5, "device": "GPU-...", "date": "2026-11-25",
                                              "blocks": 24, "aa_ratio": 1.0007,
                                              "aa_ci": [0.9991, 1.0024]}, ...],
                                 "unstable": false,
                                 "median_ns": 9120.1, "ci_ns": [9101.0, 9139.3], "ratio": 1.02,
                                 "ratio_ci": [1.01, 1.03], "noise": 0.004, "runs": 3, "blocks": 24,
                                 "updated": "2026-11-25"}}}

An entry is a small sample: ``samples`` holds the medians of its last k (at most policy.MAX_SAMPLES)
independent processes, each with its time, ratio, the reference's time, device UUID and date. The other
numbers are derived from them (kept in the file so that a diff in a pull request reads as numbers) and must
agree with them: the centre is the geometric mean of the process medians, ``ci_ns`` the centre's 95%
interval, ``noise`` the between-process standard deviation of ln(time) and ``runs`` k. With k = 1 (a
migrated entry) ``noise`` is the stored value, not derived. ``aa_ratio`` and ``aa_ci`` (null when not
timed) are the process's A/A reading: the variant against its own twin at HEAD, head/base over capture groups
with its 95% interval (ab.aa_base). Pooled over the file, they fit the A/B gate's per-process offset on this
device model (`BaselineFile.ab_offset`, policy.fit_process_offset); the fit is derived when the file is read,
never stored, so that two branches that update different cases still merge cleanly. ``unstable`` marks an
entry whose update processes disagreed beyond the case's own spread even after a re-measurement: the guard
calls that case "inconclusive: unstable baseline", never pass or fail. Entries migrated from a legacy file carry
``workload == ""`` (unknown, so it never matches a current workload), ``env == {}`` and ``blocks == 0``
(unknown); ``updated`` and a sample's ``date`` may be ``""``.

Schema 1 held one number per case (``median_ns``, ``ci_ns``, ``ratio``, ``ratio_ci``, ``noise``, ``runs``,
``blocks``, ``updated``): it migrates to one sample, its ``noise`` kept. Schema 2 samples had no A/A reading:
they migrate with ``aa_ratio`` and ``aa_ci`` null.

Legacy format (``schema_version`` 0), the hand-kept file that came before this plugin::

    {"schema_version": 0,
     "device": "NVIDIA H100 80GB HBM3",            # optional; a name string or a device object
     "cases": {"<test node id>": {"median_ms": 0.5257,        # or median_us / median_ns (exactly one)
                                 "ci_ms": [0.52, 0.53],      # optional; or ci_us / ci_ns
                                 "ratio": 1.02, "ratio_ci": [1.0, 1.04],  # optional
                                 "noise": 0.01, "blocks": 20, "updated": "2025-10-16",  # optional
                                 "workload_desc": "..."}}}   # optional; "desc" is accepted too

Other legacy fields are dropped. A file without ``schema_version`` is refused rather than guessed at: add
``"schema_version": 0`` to a legacy file and run ``perfguard migrate``.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..jsonio import (
    Invalid,
    JSONFileError,
    check_keys,
    integer,
    interval,
    iso_date,
    number,
    restore_hint,
    string,
)
from ..settings import AB_SMALL_NS
from ..slugs import SLUG
from .migrations import UNKNOWN_WORKLOAD, V2_SAMPLE_FIELDS
from .policy import (
    AB_OFFSET_LEVEL,
    AB_OFFSET_MIN_READINGS,
    MAX_SAMPLES,
    OffsetFit,
    fit_process_offset,
)
from .stats import normal_quantile, t_quantile

SCHEMA_VERSION = 3
DEFAULT_FOLDER = Path(".ci/baselines")

_SAMPLE_FIELDS = (*V2_SAMPLE_FIELDS, "aa_ratio", "aa_ci")
# Optional in a sample: written where the process timed the eager call (on a GPU), absent in older files.
_SAMPLE_HOST_FIELDS = ("host_ns", "host_ratio")
_ENTRY_FIELDS = (
    "workload",
    "workload_desc",
    "env",
    "samples",
    "unstable",
    "median_ns",
    "ci_ns",
    "ratio",
    "ratio_ci",
    "noise",
    "runs",
    "blocks",
    "updated",
)
_DERIVED_FIELDS = ("median_ns", "ci_ns", "ratio", "ratio_ci", "noise", "runs")
TOP_FIELDS = ("schema_version", "device", "cases")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CONFLICT_PREFIXES = ("<<<<<<<", "=======", ">>>>>>>", "|||||||")


class BaselineError(JSONFileError):
    """A baseline file that cannot be read or written; the message names the file, the problem and the fix."""


@dataclass(frozen=True)
class ProcessSample:
    """One independent process's measurement of a case: its block median, the reference's, and where."""

    median_ns: float
    ci_ns: tuple[float, float]
    ratio: float | None = None
    against_ns: float | None = None
    device: str = ""  # the GPU's UUID (or the host's CPU model); "" unknown
    date: str = ""
    blocks: int = 0
    aa_ratio: float | None = None  # head/base of the variant against its own twin at HEAD (A/A), if timed
    aa_ci: tuple[float, float] | None = None  # its 95% interval over capture groups
    # The eager call, host and device, per call, and its ratio to the reference's (record.host_ns): GPU only.
    host_ns: float | None = None
    host_ratio: float | None = None

    @property
    def aa_reading(self) -> tuple[float, float] | None:
        """This process's A/A reading as the offset fit takes it: ln(head/base) and its in-process sd (from
        the 95% interval's width); None when the process timed no A/A."""
        if self.aa_ratio is None or self.aa_ci is None:
            return None
        lo, hi = self.aa_ci
        return math.log(self.aa_ratio), math.log(hi / lo) / (2.0 * normal_quantile(0.975))

    def to_json(self) -> dict[str, Any]:
        return {
            "median_ns": self.median_ns,
            "ci_ns": [self.ci_ns[0], self.ci_ns[1]],
            "ratio": self.ratio,
            "against_ns": self.against_ns,
            "device": self.device,
            "date": self.date,
            "blocks": self.blocks,
            "aa_ratio": self.aa_ratio,
            "aa_ci": None if self.aa_ci is None else [self.aa_ci[0], self.aa_ci[1]],
        } | {k: v for k, v in (("host_ns", self.host_ns), ("host_ratio", self.host_ratio)) if v is not None}

    @classmethod
    def parse(cls, obj: Any, where: str) -> ProcessSample:
        if not isinstance(obj, dict):
            raise Invalid(f"{where} must be a JSON object, got {type(obj).__name__}")
        check_keys(obj, (*_SAMPLE_FIELDS, *_SAMPLE_HOST_FIELDS), _SAMPLE_FIELDS)
        median = number(obj["median_ns"], f"{where}.median_ns", positive=True)
        ratio = None if obj["ratio"] is None else number(obj["ratio"], f"{where}.ratio", positive=True)
        against = None if obj["against_ns"] is None else number(obj["against_ns"], f"{where}.against_ns", positive=True)
        aa_ratio, aa_ci = None, None
        if obj["aa_ratio"] is not None:
            aa_ratio = number(obj["aa_ratio"], f"{where}.aa_ratio", positive=True)
            if obj["aa_ci"] is None:
                raise Invalid(f"field '{where}.aa_ci' must be an interval when 'aa_ratio' is set")
            aa_ci = interval(obj["aa_ci"], f"{where}.aa_ci", aa_ratio, f"{where}.aa_ratio")
        elif obj["aa_ci"] is not None:
            raise Invalid(f"field '{where}.aa_ci' must be null when 'aa_ratio' is null")
        return cls(
            median_ns=median,
            ci_ns=interval(obj["ci_ns"], f"{where}.ci_ns", median, f"{where}.median_ns"),
            ratio=ratio,
            against_ns=against,
            device=string(obj["device"], f"{where}.device"),
            date=iso_date(obj["date"], f"{where}.date"),
            blocks=integer(obj["blocks"], f"{where}.blocks", 0),
            aa_ratio=aa_ratio,
            aa_ci=aa_ci,
            host_ns=None if obj.get("host_ns") is None else number(obj["host_ns"], f"{where}.host_ns", positive=True),
            host_ratio=None
            if obj.get("host_ratio") is None
            else number(obj["host_ratio"], f"{where}.host_ratio", positive=True),
        )


def _log_mean_sd(values: list[float]) -> tuple[float, float]:
    logs = [math.log(v) for v in values]
    mean = math.fsum(logs) / len(logs)
    if len(logs) < 2:
        return mean, 0.0
    return mean, math.sqrt(math.fsum((x - mean) ** 2 for x in logs) / (len(logs) - 1))


def _centre_ci(mean: float, sd: float, k: int) -> tuple[float, float]:
    """The 95% interval of the geometric mean of k process medians."""
    half = t_quantile(0.975, k - 1) * sd / math.sqrt(k)
    return (math.exp(mean - half), math.exp(mean + half))


@dataclass(frozen=True)
class BaselineEntry:
    """The stored timing of one perf case on one device model: a sample of process medians and the
    centre, interval and spread derived from it (see the module docstring)."""

    case_id: str
    workload: str
    workload_desc: str
    env: dict[str, str]
    median_ns: float
    ci_ns: tuple[float, float]
    ratio: float | None
    ratio_ci: tuple[float, float] | None
    noise: float
    runs: int
    blocks: int
    updated: str
    samples: tuple[ProcessSample, ...] = ()
    unstable: bool = False

    def __post_init__(self) -> None:
        # A one-process entry's fields are its sample (so that dataclasses.replace keeps them one); an entry
        # of several processes is made from their samples (from_samples).
        if self.runs == 1:
            last = self.samples[-1] if self.samples else ProcessSample(self.median_ns, self.ci_ns)
            against = self.median_ns / self.ratio if self.ratio else None
            one = ProcessSample(
                self.median_ns,
                self.ci_ns,
                self.ratio,
                against,
                last.device,
                last.date or self.updated,
                self.blocks,
                last.aa_ratio,
                last.aa_ci,
            )
            object.__setattr__(self, "samples", (one,))
        elif len(self.samples) != self.runs:
            raise ValueError(f"{self.case_id}: an entry of {self.runs} processes needs their {self.runs} samples")

    @property
    def host_ratio(self) -> float | None:
        """The geometric mean of the processes' eager-call ratios to the reference; None where none has one."""
        got = [x.host_ratio for x in self.samples if x.host_ratio is not None]
        return math.exp(math.fsum(math.log(x) for x in got) / len(got)) if got else None

    @property
    def half_width(self) -> float:
        """Its processes' typical in-run 95% half-width (log scale, the wider side), the median over them: what a
        guard measuring as they did will see (policy.detectable_margin)."""
        widths = [
            max(math.log(x.median_ns / x.ci_ns[0]), math.log(x.ci_ns[1] / x.median_ns), 0.0)
            for x in self.samples
            if x.ci_ns[0] > 0
        ]
        return statistics.median(widths) if widths else 0.0

    @property
    def aa_readings(self) -> list[tuple[float, float]]:
        """The A/A readings of its processes (ProcessSample.aa_reading), one for each that timed one."""
        return [r for r in (sample.aa_reading for sample in self.samples) if r is not None]

    @classmethod
    def from_samples(
        cls,
        case_id: str,
        samples: Sequence[ProcessSample],
        *,
        workload: str,
        workload_desc: str,
        env: dict[str, str],
        updated: str,
        noise: float = 0.0,
        unstable: bool = False,
        ratio_ci: tuple[float, float] | None = None,
    ) -> BaselineEntry:
        """An entry whose numbers are derived from its samples (the last MAX_SAMPLES); ``noise`` is used
        only for one sample, which has no spread of its own."""
        kept = tuple(samples)[-MAX_SAMPLES:]
        if not kept:
            raise ValueError(f"{case_id}: a baseline entry needs at least one process sample")
        k = len(kept)
        mean, sd = _log_mean_sd([x.median_ns for x in kept])
        ratios = [x.ratio for x in kept]
        ratio: float | None = None
        if k == 1:  # one process: its own in-run intervals (a process sample keeps no ratio interval)
            ci = kept[0].ci_ns
            ratio = kept[0].ratio
            ratio_ci = ratio_ci if ratio is not None else None
        else:
            ci = _centre_ci(mean, sd, k)
            noise = sd
            ratio_ci = None
            if all(r is not None for r in ratios):
                r_mean, r_sd = _log_mean_sd([r for r in ratios if r is not None])
                ratio, ratio_ci = math.exp(r_mean), _centre_ci(r_mean, r_sd, k)
        centre = kept[0].median_ns if k == 1 else math.exp(mean)
        ci = (min(ci[0], centre), max(ci[1], centre))
        if ratio is not None and ratio_ci is not None:
            ratio_ci = (min(ratio_ci[0], ratio), max(ratio_ci[1], ratio))
        return cls(
            case_id=case_id,
            workload=workload,
            workload_desc=workload_desc,
            env=dict(env),
            median_ns=centre,
            ci_ns=ci,
            ratio=ratio,
            ratio_ci=ratio_ci,
            noise=noise,
            runs=k,
            blocks=kept[-1].blocks,
            updated=updated,
            samples=kept,
            unstable=unstable,
        )

    @property
    def ratio_noise(self) -> float:
        """The between-process sd of ln(ratio); the time's noise where there is no spread of ratios."""
        ratios = [x.ratio for x in self.samples if x.ratio is not None]
        if len(ratios) < 2 or len(ratios) != len(self.samples):
            return self.noise
        return _log_mean_sd(ratios)[1]

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored under the case id (the id itself is the key, not a field)."""
        return {
            "workload": self.workload,
            "workload_desc": self.workload_desc,
            "env": dict(self.env),
            "samples": [x.to_json() for x in self.samples],
            "unstable": self.unstable,
            "median_ns": self.median_ns,
            "ci_ns": [self.ci_ns[0], self.ci_ns[1]],
            "ratio": self.ratio,
            "ratio_ci": None if self.ratio_ci is None else [self.ratio_ci[0], self.ratio_ci[1]],
            "noise": self.noise,
            "runs": self.runs,
            "blocks": self.blocks,
            "updated": self.updated,
        }

    @classmethod
    def from_json(cls, case_id: str, obj: Any, path: Path) -> BaselineEntry:
        """Validate one stored entry; a bad value raises BaselineError naming file, case and field."""
        try:
            return cls._parse(case_id, obj)
        except Invalid as exc:
            raise BaselineError(f"{path}: case {case_id!r}: {exc}; fix the entry or {restore_hint(path)}") from None

    @classmethod
    def _parse(cls, case_id: str, obj: Any) -> BaselineEntry:
        """The entry of a stored object, checked field by field: its keys, its identity (workload, env), the
        derived fields as numbers, the samples, and last the derived fields against the samples."""
        if not isinstance(case_id, str) or not case_id:
            raise Invalid("the case id must be a non-empty string")
        if not isinstance(obj, dict):
            raise Invalid(f"the entry must be a JSON object, got {type(obj).__name__}")
        check_keys(obj, _ENTRY_FIELDS, _ENTRY_FIELDS)
        workload = _parse_workload(obj["workload"])
        env = _parse_env(obj["env"])
        _check_derived_numbers(obj)
        samples = _parse_samples(obj["samples"])
        if not isinstance(obj["unstable"], bool):
            raise Invalid(f"field 'unstable' must be true or false, got {json.dumps(obj['unstable'])[:40]}")
        entry = cls.from_samples(
            case_id,
            samples,
            workload=workload,
            workload_desc=string(obj["workload_desc"], "workload_desc"),
            env=env,
            updated=iso_date(obj["updated"], "updated"),
            noise=number(obj["noise"], "noise", nonneg=True),
            unstable=obj["unstable"],
        )
        if len(samples) == 1:
            entry = _with_stored_intervals(entry, obj)
        entry = replace(entry, blocks=integer(obj["blocks"], "blocks", 0))
        _check_derived_agree(obj, entry)
        return entry


def _parse_workload(raw: Any) -> str:
    """A sha256 digest as the plugin writes it, or unknown (a migrated entry's "", which matches nothing)."""
    workload = string(raw, "workload")
    if workload != UNKNOWN_WORKLOAD and not _HEX64.fullmatch(workload):
        raise Invalid(f"field 'workload' must be a sha256 hex digest (64 lowercase hex digits), got {workload[:70]!r}")
    return workload


def _parse_env(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise Invalid(f"field 'env' must be an object of strings, got {json.dumps(raw)[:60]}")
    return {str(k): string(v, f"env.{k}") for k, v in raw.items()}


def _check_derived_numbers(obj: dict[str, Any]) -> None:
    """The derived fields are checked as numbers first, so a bad one is named as such, before they are
    checked against the samples they are derived from (_check_derived_agree)."""
    median = number(obj["median_ns"], "median_ns", positive=True)
    interval(obj["ci_ns"], "ci_ns", median, "median_ns")
    if obj["ratio"] is not None:
        ratio = number(obj["ratio"], "ratio", positive=True)
        if obj["ratio_ci"] is not None:
            interval(obj["ratio_ci"], "ratio_ci", ratio, "ratio")
    elif obj["ratio_ci"] is not None:
        raise Invalid("field 'ratio_ci' must be null when 'ratio' is null")
    number(obj["noise"], "noise", nonneg=True)
    integer(obj["runs"], "runs", 1)
    integer(obj["blocks"], "blocks", 0)


def _parse_samples(raw: Any) -> list[ProcessSample]:
    """At least one process sample, at most the MAX_SAMPLES an update keeps."""
    if not isinstance(raw, list) or not raw:
        raise Invalid("field 'samples' must be a non-empty list of process samples")
    if len(raw) > MAX_SAMPLES:
        raise Invalid(f"field 'samples' holds {len(raw)} processes, more than {MAX_SAMPLES}")
    return [ProcessSample.parse(x, f"samples[{i}]") for i, x in enumerate(raw)]


def _with_stored_intervals(entry: BaselineEntry, obj: dict[str, Any]) -> BaselineEntry:
    """A one-process entry: its intervals are the stored ones (one process has no spread to derive them
    from), checked around its numbers."""
    ci = interval(obj["ci_ns"], "ci_ns", entry.median_ns, "median_ns")
    ratio_ci = None
    if obj["ratio_ci"] is not None:
        if entry.ratio is None:
            raise Invalid("field 'ratio_ci' must be null when 'ratio' is null")
        ratio_ci = interval(obj["ratio_ci"], "ratio_ci", entry.ratio, "ratio")
    return replace(entry, ci_ns=ci, ratio_ci=ratio_ci)


def _check_derived_agree(obj: dict[str, Any], entry: BaselineEntry) -> None:
    """The derived fields as stored equal those the samples give: the entry is made from its samples, so a
    hand edit of a derived field would otherwise be ignored without a word."""
    derived = entry.to_json()
    for name in _DERIVED_FIELDS:
        if not _same(obj[name], derived[name]):
            raise Invalid(
                f"field {name!r} is {json.dumps(obj[name])[:60]} but its samples give "
                f"{json.dumps(derived[name])[:60]}: the derived fields are written by pytest-perfguard, "
                "edit the samples (or re-record) instead"
            )


def _same(stored: Any, derived: Any) -> bool:
    """A derived number as stored equals the one recomputed (to rounding in the last digits)."""
    if isinstance(derived, list) and isinstance(stored, list) and len(stored) == len(derived):
        return all(_same(a, b) for a, b in zip(stored, derived, strict=True))
    if isinstance(derived, float) and isinstance(stored, int | float) and not isinstance(stored, bool):
        return math.isclose(float(stored), derived, rel_tol=1e-9, abs_tol=1e-12)
    return bool(stored == derived)


@dataclass(frozen=True)
class AbOffset:
    """The A/B gate's per-process offset on one device model, fitted from every A/A reading its baseline file
    holds (policy.fit_process_offset), per size class: ``small`` for cases under settings.AB_SMALL_NS, ``large``
    from there on (None: no reading of that size). ``devices`` are the GPUs (UUIDs) the readings were taken
    on, ``dates`` the first and last day, ``cases`` per class how many cases the readings came from."""

    small: OffsetFit | None
    large: OffsetFit | None
    small_cases: int
    large_cases: int
    devices: tuple[str, ...]
    dates: tuple[str, str]

    def describe(self) -> str:
        """Per size class, what an A/B run on this device model counts: the bound, or why the built-in value."""
        parts = []
        for size, fit, cases in (
            ("from 20 us", self.large, self.large_cases),
            ("under 20 us", self.small, self.small_cases),
        ):
            if fit is None:
                parts.append(f"{size}: no readings (the built-in value stays)")
            elif fit.readings < AB_OFFSET_MIN_READINGS:
                parts.append(
                    f"{size}: {fit.readings} reading(s), {AB_OFFSET_MIN_READINGS} needed (the built-in value stays)"
                )
            else:
                parts.append(
                    f"{size}: {fit.bound:.2%} (the {AB_OFFSET_LEVEL:.0%} upper bound of {fit.fit:.2%}, "
                    f"{fit.readings} readings of {cases} case(s))"
                )
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        def one(fit: OffsetFit | None, cases: int) -> dict[str, Any] | None:
            if fit is None:
                return None
            return {"sd": fit.bound, "fit": fit.fit, "readings": fit.readings, "dof": fit.dof, "cases": cases}

        return {
            "small": one(self.small, self.small_cases),
            "large": one(self.large, self.large_cases),
            "devices": list(self.devices),
            "dates": list(self.dates),
        }


def ab_offset_of(cases: dict[str, BaselineEntry]) -> AbOffset | None:
    """The per-process offset fitted from these entries' A/A readings; None when no sample holds one."""
    readings: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    owners: dict[bool, set[str]] = {True: set(), False: set()}
    devices: set[str] = set()
    dates: list[str] = []
    for case_id, entry in cases.items():
        for sample in entry.samples:
            reading = sample.aa_reading
            if reading is None:
                continue
            small = sample.median_ns < AB_SMALL_NS  # the runner picks the size class by the head's time
            readings[small].append(reading)
            owners[small].add(case_id)
            if sample.device:
                devices.add(sample.device)
            if sample.date:
                dates.append(sample.date)
    if not readings[True] and not readings[False]:
        return None
    return AbOffset(
        small=fit_process_offset(readings[True]),
        large=fit_process_offset(readings[False]),
        small_cases=len(owners[True]),
        large_cases=len(owners[False]),
        devices=tuple(sorted(devices)),
        dates=(min(dates), max(dates)) if dates else ("", ""),
    )


@dataclass
class BaselineFile:
    """A baseline file in memory; ``exists`` is False for a file not yet written."""

    path: Path
    exists: bool
    device: dict[str, Any]
    cases: dict[str, BaselineEntry]
    migrated_from: int | None = None

    def ab_offset(self) -> AbOffset | None:
        """The A/B gate's per-process offset fitted from the file's A/A readings (see AbOffset)."""
        return ab_offset_of(self.cases)

    def to_json(self) -> dict[str, Any]:
        """The whole file as a JSON object in the current schema."""
        return {
            "schema_version": SCHEMA_VERSION,
            "device": self.device,
            "cases": {case_id: entry.to_json() for case_id, entry in self.cases.items()},
        }


def check_device(device: Any) -> dict[str, Any]:
    if not isinstance(device, dict):
        raise Invalid(f"'device' must be a JSON object, got {type(device).__name__}")
    for key in ("slug", "name"):
        if key not in device:
            raise Invalid(f"'device' is missing field {key!r}")
        if not isinstance(device[key], str):
            raise Invalid(f"'device.{key}' must be a string, got {json.dumps(device[key])[:60]}")
    if not SLUG.fullmatch(device["slug"]):
        raise Invalid(f"'device.slug' {device['slug']!r} is not a slug (lowercase letters, digits and dashes)")
    return device
