"""Baseline store: one deterministic JSON file per device model.

A baseline file is reviewed in pull requests and merged by git, so it is written with sorted keys, a fixed
indent and no timestamps in keys, always atomically, and read strictly: a file that is truncated, half-merged,
hand-edited into invalid numbers or written by a newer version is refused with a message that names the file,
the problem and the fix, and is never rewritten behind the user's back. Nothing in a file is executed.

Format (``schema_version`` 1)::

    {"schema_version": 1,
     "device": {"slug": "nvidia-h100-80gb-hbm3", "name": "NVIDIA H100 80GB HBM3", ...},
     "cases": {"<test node id>": {"workload": "<sha256 hex>", "workload_desc": "...", "env": {...},
                                 "median_ns": 9123.4, "ci_ns": [9100.0, 9150.0],
                                 "ratio": 1.02, "ratio_ci": [1.01, 1.03],
                                 "noise": 0.004, "runs": 1, "blocks": 24, "updated": "2026-11-21"}}}

``noise`` is the between-run relative noise (standard deviation of ln(time) between update runs) and ``runs``
how many update runs were folded into it. Entries migrated from a legacy file carry ``workload == ""`` (unknown,
so it never matches a current workload), ``env == {}`` and ``blocks == 0`` (unknown); ``updated`` may be ``""``.

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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

from .jsonio import (
    LOCK_TIMEOUT_S,
    Invalid,
    JSONFileError,
    check_keys,
    dumps,
    integer,
    interval,
    iso_date,
    load_json_text,
    locked,
    number,
    restore_hint,
    string,
    write_text_atomic,
)

SCHEMA_VERSION = 1
DEFAULT_FOLDER = Path(".ci/baselines")
UNKNOWN_WORKLOAD = ""

_ENTRY_FIELDS = (
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
_TOP_FIELDS = ("schema_version", "device", "cases")
_HEX64 = re.compile(r"[0-9a-f]{64}")
SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_CONFLICT_PREFIXES = ("<<<<<<<", "=======", ">>>>>>>", "|||||||")


class BaselineError(JSONFileError):
    """A baseline file that cannot be read or written; the message names the file, the problem and the fix."""


@dataclass(frozen=True)
class BaselineEntry:
    """The stored timing of one perf case on one device model."""

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

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored under the case id (the id itself is the key, not a field)."""
        return {
            "workload": self.workload,
            "workload_desc": self.workload_desc,
            "env": dict(self.env),
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
        if not isinstance(case_id, str) or not case_id:
            raise Invalid("the case id must be a non-empty string")
        if not isinstance(obj, dict):
            raise Invalid(f"the entry must be a JSON object, got {type(obj).__name__}")
        check_keys(obj, _ENTRY_FIELDS, _ENTRY_FIELDS)
        workload = string(obj["workload"], "workload")
        if workload != UNKNOWN_WORKLOAD and not _HEX64.fullmatch(workload):
            raise Invalid(
                f"field 'workload' must be a sha256 hex digest (64 lowercase hex digits), got {workload[:70]!r}"
            )
        env_raw = obj["env"]
        if not isinstance(env_raw, dict):
            raise Invalid(f"field 'env' must be an object of strings, got {json.dumps(env_raw)[:60]}")
        env = {str(k): string(v, f"env.{k}") for k, v in env_raw.items()}
        median = number(obj["median_ns"], "median_ns", positive=True)
        ci = interval(obj["ci_ns"], "ci_ns", median, "median_ns")
        ratio: float | None = None
        ratio_ci: tuple[float, float] | None = None
        if obj["ratio"] is not None:
            ratio = number(obj["ratio"], "ratio", positive=True)
            if obj["ratio_ci"] is not None:
                ratio_ci = interval(obj["ratio_ci"], "ratio_ci", ratio, "ratio")
        elif obj["ratio_ci"] is not None:
            raise Invalid("field 'ratio_ci' must be null when 'ratio' is null")
        return cls(
            case_id=case_id,
            workload=workload,
            workload_desc=string(obj["workload_desc"], "workload_desc"),
            env=env,
            median_ns=median,
            ci_ns=ci,
            ratio=ratio,
            ratio_ci=ratio_ci,
            noise=number(obj["noise"], "noise", nonneg=True),
            runs=integer(obj["runs"], "runs", 1),
            blocks=integer(obj["blocks"], "blocks", 0),
            updated=iso_date(obj["updated"], "updated"),
        )


@dataclass
class BaselineFile:
    """A baseline file in memory; ``exists`` is False for a file not yet written."""

    path: Path
    exists: bool
    device: dict[str, Any]
    cases: dict[str, BaselineEntry]
    migrated_from: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The whole file as a JSON object in the current schema."""
        return {
            "schema_version": SCHEMA_VERSION,
            "device": self.device,
            "cases": {case_id: entry.to_json() for case_id, entry in self.cases.items()},
        }


def device_slug(name: str) -> str:
    """File-name-safe slug of a device model name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:100].strip("-")
    return slug or "unknown-device"


def baseline_path(folder: Path, device_name: str) -> Path:
    """Where the baseline of a device model lives."""
    return folder / f"{device_slug(device_name)}.json"


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


# --------------------------------------------------------------------------------------------- migrations


def _migrate_0_to_1(old: dict[str, Any]) -> dict[str, Any]:
    """Legacy hand-kept file (see the module docstring) -> schema 1; unknown facts get the 'unknown' values."""
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


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {0: _migrate_0_to_1}
"""MIGRATIONS[v] turns a schema-v object into a schema-(v+1) object; applied in memory, in order."""


# --------------------------------------------------------------------------------------------- read / write


def parse_baseline(path: Path, obj: Any) -> BaselineFile:
    """Validate an already-parsed baseline object (migrating it in memory if it is older)."""

    def bad(problem: str) -> NoReturn:
        raise BaselineError(f"{path}: {problem}; fix it or {restore_hint(path)}")

    if not isinstance(obj, dict):
        bad(f"the top level must be a JSON object, got {type(obj).__name__}")
    if obj.get("kind") == "perfguard-results":
        raise BaselineError(
            f"{path}: this is a results file (--perfguard-json), not a baseline file; "
            f"use `perfguard compare` or `perfguard validate` on it"
        )
    if "schema_version" not in obj:
        bad(
            "missing 'schema_version'; if this is a legacy hand-kept baseline "
            '({"cases": {id: {"median_ms": ...}}}), add "schema_version": 0 and run `perfguard migrate` on it'
        )
    version = obj["schema_version"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        bad(f"'schema_version' must be a non-negative integer, got {json.dumps(version)[:40]}")
    if version > SCHEMA_VERSION:
        raise BaselineError(
            f"{path}: written by a newer pytest-perfguard (schema {version} > {SCHEMA_VERSION}): "
            f"upgrade pytest-perfguard"
        )
    migrated_from: int | None = None
    if version < SCHEMA_VERSION:
        migrated_from = version
        while version < SCHEMA_VERSION:
            migration = MIGRATIONS.get(version)
            if migration is None:
                bad(f"schema {version} is too old to migrate (oldest supported: {min(MIGRATIONS)})")
            try:
                obj = migration(obj)
            except Invalid as exc:
                bad(f"cannot migrate from schema {migrated_from}: {exc}")
            version += 1
        device = obj.get("device")
        if isinstance(device, dict) and "slug" not in device and "name" not in device:
            device.update(slug=device_slug(path.stem), name=path.stem)
    try:
        check_keys(obj, _TOP_FIELDS, _TOP_FIELDS)
        device = check_device(obj["device"])
    except Invalid as exc:
        bad(str(exc))
    cases_raw = obj["cases"]
    if not isinstance(cases_raw, dict):
        bad(f"'cases' must be a JSON object, got {type(cases_raw).__name__}")
    cases = {case_id: BaselineEntry.from_json(case_id, entry, path) for case_id, entry in cases_raw.items()}
    return BaselineFile(path=path, exists=True, device=device, cases=cases, migrated_from=migrated_from)


def read_baseline(path: Path) -> BaselineFile:
    """Read and validate a baseline file; a missing file is an empty baseline. Never modifies the file."""
    path = Path(path)
    obj, exists = load_json_text(path, BaselineError, "baseline")
    if not exists:
        return BaselineFile(path=path, exists=False, device={}, cases={})
    return parse_baseline(path, obj)


def write_baseline(bf: BaselineFile) -> None:
    """Validate and atomically write a baseline file in the current schema."""
    obj = bf.to_json()
    try:
        text = dumps(obj)
    except (ValueError, TypeError) as exc:
        raise BaselineError(f"{bf.path}: refusing to write a value JSON cannot hold exactly ({exc})") from None
    parse_baseline(bf.path, json.loads(text))  # never write what we would refuse to read
    write_text_atomic(bf.path, text, BaselineError)
    bf.exists = True
    bf.migrated_from = None


@dataclass
class UpdateSummary:
    """What an update did, for the terminal summary."""

    path: Path
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    reset: list[str] = field(default_factory=list)
    kept: int = 0
    migrated_from: int | None = None


CENTER_WINDOW = 8  # the first runs are averaged equally; past this many, each new run weighs 1/CENTER_WINDOW
NOISE_K = 4.0  # a case's threshold is at least this many times its between-run noise (case_threshold)


def _center_weight(runs: int) -> float:
    """Weight of a new run in the stored centre after ``runs`` runs were folded in."""
    return 1.0 / (min(runs, CENTER_WINDOW - 1) + 1)


def fold_noise(old: BaselineEntry, new_median_ns: float, noise_floor: float) -> float:
    """Between-run noise after one more run of the same workload and environment.

    Pooled standard deviation of ln(time) between runs: the old estimate weighs ``old.runs``, and the new
    run adds one squared difference from the stored centre, ln(new/centre)**2, scaled down by the variance
    of that difference, s**2 * (1 + w) for a centre that is the mean of 1/w runs (w = 1 after one run:
    the difference of two runs has variance 2*s**2).
    """
    step = math.log(new_median_ns / old.median_ns)
    pooled = math.sqrt((old.noise**2 * old.runs + step**2 / (1.0 + _center_weight(old.runs - 1))) / (old.runs + 1))
    return max(noise_floor, pooled)


def _geo(old: float, new: float, w: float) -> float:
    return math.exp((1.0 - w) * math.log(old) + w * math.log(new))


def _scaled(ci: tuple[float, float] | None, factor: float) -> tuple[float, float] | None:
    return None if ci is None else (ci[0] * factor, ci[1] * factor)


def fold_run(old: BaselineEntry, new: BaselineEntry, noise_floor: float) -> BaselineEntry:
    """One more run of an unchanged case: the stored time and SDPA ratio become the geometric mean of the
    runs since the case last changed (equal weights up to CENTER_WINDOW runs, then an exponential mean in
    which each new run weighs 1/CENTER_WINDOW), not the last run's, so one slow or fast
    process does not become the reference every later run is judged against. The stored intervals keep
    the last run's relative width around the new centre."""
    w = _center_weight(old.runs)
    center = _geo(old.median_ns, new.median_ns, w)
    ratio, ratio_ci = new.ratio, new.ratio_ci
    if old.ratio is not None and new.ratio is not None:
        ratio = _geo(old.ratio, new.ratio, w)
        ratio_ci = _scaled(new.ratio_ci, ratio / new.ratio)
    return replace(
        new,
        median_ns=center,
        ci_ns=(new.ci_ns[0] * center / new.median_ns, new.ci_ns[1] * center / new.median_ns),
        ratio=ratio,
        ratio_ci=ratio_ci,
        noise=fold_noise(old, new.median_ns, noise_floor),
        runs=old.runs + 1,
    )


def case_threshold(margin: float, noise: float, noise_floor: float, noise_k: float = NOISE_K) -> float:
    """A case's threshold (a fraction): the margin, or ``noise_k`` times its between-run noise (never below
    the floor), whichever is larger. The verdict's gates (verdict.Policy.delta) and the update's "same
    kernel?" test (change_limit) both use it."""
    return max(margin, noise_k * max(noise, noise_floor))


def change_limit(old: BaselineEntry, change_threshold: float, noise_floor: float, noise_k: float) -> float:
    """How far (a fraction) a run may move from the stored time and still be the same kernel: the guard's
    own threshold for the case (``case_threshold``). A move the guard would not call a regression is noise,
    and is folded in."""
    return case_threshold(change_threshold, old.noise, noise_floor, noise_k)


def merge_entry(
    old: BaselineEntry | None,
    new: BaselineEntry,
    noise_floor: float,
    change_threshold: float | None = None,
    noise_k: float = 0.0,
) -> tuple[BaselineEntry, str]:
    """The entry to store and what happened to it: 'added', 'updated' (run folded in) or 'reset'.

    With ``change_threshold`` (a fraction, the guard's margin), a run that moved the median by more than
    ``change_limit`` is a changed kernel, not another sample of the same one: folding it would inflate the
    stored noise and with it the margin, silently blinding the guard for that case after every intended
    speed-up. (The plugin first checks such a run in a fresh process and holds it back when the move
    belongs to the process, so a run that reaches this point moved in two processes.)
    """
    if old is None:
        return replace(new, noise=max(noise_floor, new.noise), runs=1), "added"
    same = old.workload == new.workload and old.workload != UNKNOWN_WORKLOAD and old.env == new.env
    moved = change_threshold is not None and abs(math.log(new.median_ns / old.median_ns)) > math.log1p(
        change_limit(old, change_threshold, noise_floor, noise_k)
    )
    if same and not moved:
        return fold_run(old, new, noise_floor), "updated"
    return replace(new, noise=max(noise_floor, new.noise), runs=1), "reset"


def update_baseline(
    path: Path,
    device: dict[str, Any],
    entries: dict[str, BaselineEntry],
    *,
    noise_floor: float,
    lock_timeout: float = LOCK_TIMEOUT_S,
    change_threshold: float | None = None,
    noise_k: float = 0.0,
) -> UpdateSummary:
    """Store ``entries`` in the baseline at ``path``, keeping every other case, under an inter-process lock.

    The file is re-read under the lock, so two update runs at once lose no entries. ``device`` replaces the
    stored device description (versions move on), but must be the same device model.
    """
    path = Path(path)
    if not math.isfinite(noise_floor) or noise_floor < 0:
        raise ValueError(f"noise_floor must be a finite number >= 0, got {noise_floor}")
    try:
        check_device(device)
    except Invalid as exc:
        raise BaselineError(f"{path}: cannot update: the given {exc}") from None
    with locked(path, lock_timeout, BaselineError):
        bf = read_baseline(path)
        stored_slug = bf.device.get("slug")
        if bf.exists and stored_slug != device["slug"]:
            raise BaselineError(
                f"{path}: holds device {stored_slug!r}, not {device['slug']!r}; a baseline file is for one "
                f"device model: write to {baseline_path(path.parent, str(device['name']))} instead"
            )
        summary = UpdateSummary(path=path, migrated_from=bf.migrated_from)
        cases = dict(bf.cases)
        for case_id in sorted(entries):
            new = entries[case_id]
            if new.case_id != case_id:
                raise ValueError(f"entry key {case_id!r} differs from its case_id {new.case_id!r}")
            merged, what = merge_entry(cases.get(case_id), new, noise_floor, change_threshold, noise_k)
            cases[case_id] = merged
            getattr(summary, what).append(case_id)
        summary.kept = sum(1 for case_id in bf.cases if case_id not in entries)
        write_baseline(BaselineFile(path=path, exists=bf.exists, device=dict(device), cases=cases))
    return summary


def remove_cases(path: Path, case_ids: set[str], *, lock_timeout: float = LOCK_TIMEOUT_S) -> list[str]:
    """Delete stored cases (stale ones) under the lock; returns the ids actually removed, sorted."""
    path = Path(path)
    with locked(path, lock_timeout, BaselineError):
        bf = read_baseline(path)
        gone = sorted(case_id for case_id in case_ids if case_id in bf.cases)
        if gone:
            for case_id in gone:
                del bf.cases[case_id]
            write_baseline(bf)
    return gone


def migrate_file(path: Path, *, lock_timeout: float = LOCK_TIMEOUT_S) -> int | None:
    """Rewrite an old-schema file in the current schema; returns the old version, or None if already current."""
    path = Path(path)
    with locked(path, lock_timeout, BaselineError):
        bf = read_baseline(path)
        if not bf.exists:
            raise BaselineError(f"{path}: no such baseline file")
        if bf.migrated_from is None:
            return None
        old = bf.migrated_from
        write_baseline(bf)
    return old


def stale_entries(bf: BaselineFile, selected_ids: set[str]) -> list[str]:
    """Stored case ids not among the collected ones, sorted; call only when nothing was deselected."""
    return sorted(case_id for case_id in bf.cases if case_id not in selected_ids)
