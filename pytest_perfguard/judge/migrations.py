"""The baseline file's schema migrations: each turns an object of one schema version into the next, in memory
(storage.parse_baseline applies them in order; `perfguard migrate` writes the result back)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..jsonio import Invalid, check_keys, interval, number
from ..slugs import device_slug

# A schema-2 process sample's fields (schema 3 added the A/A reading).
V2_SAMPLE_FIELDS = ("median_ns", "ci_ns", "ratio", "against_ns", "device", "date", "blocks")
# A schema-1 entry's fields: one number per case, before process samples.
_V1_FIELDS = (
    "workload",
    "workload_desc",
    "env",
    "median_ns",
    "ci_ns",
    "ratio",
    "ratio_ci",
    "noise",
    "runs",
    "blocks",
    "updated",
)
UNKNOWN_WORKLOAD = ""  # a workload no file recorded (a migrated legacy entry): never the same as another


def _migrate_0_to_1(old: dict[str, Any]) -> dict[str, Any]:
    """Legacy hand-kept file (see baseline.py's docstring) -> schema 1; unknown facts get the 'unknown' values."""
    device_raw = old.get("device")
    device: dict[str, Any]
    if device_raw is None:
        device = {}  # read_baseline fills slug and name in from the file name
    elif isinstance(device_raw, str):
        device = {"slug": device_slug(device_raw), "name": device_raw}
    elif isinstance(device_raw, dict):
        device = dict(device_raw)
        if "name" in device and "slug" not in device and isinstance(device["name"], str):
            device["slug"] = device_slug(device["name"])
    else:
        raise Invalid(f"legacy 'device' must be a name or an object, got {type(device_raw).__name__}")
    cases_raw = old.get("cases")
    if not isinstance(cases_raw, dict):
        raise Invalid("legacy file has no 'cases' object")
    cases: dict[str, Any] = {}
    for case_id, legacy in cases_raw.items():
        if not isinstance(legacy, dict):
            raise Invalid(f"legacy case {case_id!r} must be an object")
        cases[case_id] = _migrate_case_0(case_id, legacy)
    return {"schema_version": 1, "device": device, "cases": cases}


_UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6}


def _migrate_case_0(case_id: str, legacy: dict[str, Any]) -> dict[str, Any]:
    medians = [unit for unit in _UNIT_NS if f"median_{unit}" in legacy]
    if len(medians) != 1:
        raise Invalid(f"legacy case {case_id!r} needs exactly one of median_ms, median_us, median_ns")
    scale = _UNIT_NS[medians[0]]
    median = number(legacy[f"median_{medians[0]}"], f"median_{medians[0]}", positive=True) * scale
    ci: list[float] = [median, median]
    for unit, unit_scale in _UNIT_NS.items():
        raw = legacy.get(f"ci_{unit}")
        if raw is not None:
            lo, hi = interval(raw, f"ci_{unit}", median / unit_scale, f"median_{medians[0]}")
            ci = [min(lo * unit_scale, median), max(hi * unit_scale, median)]  # rounding in the unit change
    desc = legacy.get("workload_desc", legacy.get("desc", ""))
    return {
        "workload": UNKNOWN_WORKLOAD,
        "workload_desc": desc if isinstance(desc, str) else str(desc),
        "env": {},
        "median_ns": median,
        "ci_ns": ci,
        "ratio": legacy.get("ratio"),
        "ratio_ci": legacy.get("ratio_ci") if legacy.get("ratio") is not None else None,
        "noise": legacy.get("noise", 0.0),
        "runs": 1,
        "blocks": legacy.get("blocks", 0),
        "updated": legacy.get("updated", ""),
    }


def _migrate_1_to_2(old: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 (one number per case) -> schema 2: the number becomes the entry's one process sample, and
    its stored noise is kept (a one-sample entry has no spread of its own)."""
    cases_raw = old.get("cases")
    if not isinstance(cases_raw, dict):
        raise Invalid("'cases' must be a JSON object")
    cases: dict[str, Any] = {}
    for case_id, entry in cases_raw.items():
        if not isinstance(entry, dict):
            raise Invalid(f"case {case_id!r}: the entry must be a JSON object")
        try:
            check_keys(entry, _V1_FIELDS, _V1_FIELDS)
            median = number(entry["median_ns"], "median_ns", positive=True)
        except Invalid as exc:
            raise Invalid(f"case {case_id!r}: {exc}") from None
        ratio = entry["ratio"]
        sample = {
            "median_ns": median,
            "ci_ns": entry["ci_ns"],
            "ratio": ratio,
            "against_ns": median / ratio if isinstance(ratio, int | float) and ratio > 0 else None,
            "device": "",
            "date": entry["updated"],
            "blocks": entry["blocks"],
        }
        migrated = {k: v for k, v in entry.items()}
        migrated.update(samples=[sample], unstable=False, runs=1)
        cases[case_id] = migrated
    return {**old, "schema_version": 2, "cases": cases}


def _migrate_2_to_3(old: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 -> 3: every process sample gains its A/A reading, null (schema 2 timed none)."""
    cases_raw = old.get("cases")
    if not isinstance(cases_raw, dict):
        raise Invalid("'cases' must be a JSON object")
    cases: dict[str, Any] = {}
    for case_id, entry in cases_raw.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("samples"), list):
            raise Invalid(f"case {case_id!r}: the entry must be a JSON object with a list of 'samples'")
        samples = []
        for i, sample in enumerate(entry["samples"]):
            if not isinstance(sample, dict):
                raise Invalid(f"case {case_id!r}: samples[{i}] must be a JSON object")
            try:
                check_keys(sample, V2_SAMPLE_FIELDS, V2_SAMPLE_FIELDS)
            except Invalid as exc:
                raise Invalid(f"case {case_id!r}: samples[{i}]: {exc}") from None
            samples.append({**sample, "aa_ratio": None, "aa_ci": None})
        cases[case_id] = {**entry, "samples": samples}
    return {**old, "schema_version": 3, "cases": cases}


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    0: _migrate_0_to_1,
    1: _migrate_1_to_2,
    2: _migrate_2_to_3,
}
"""MIGRATIONS[v] turns a schema-v object into a schema-(v+1) object; applied in memory, in order."""
