"""The baseline files on disk: where a device model's file lives, reading it strictly (migrating an older
schema in memory), writing it atomically, and the read-modify-write of an update, a removal or a migration
under an inter-process lock. The file's format and its record types are baseline.py's; what an update does
to an entry is update_rules.py's."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from ..jsonio import LOCK_TIMEOUT_S, Invalid, check_keys, dumps, load_json_text, locked, restore_hint, write_text_atomic
from ..slugs import device_slug
from .baseline import (
    SCHEMA_VERSION,
    TOP_FIELDS,
    BaselineEntry,
    BaselineError,
    BaselineFile,
    check_device,
)
from .migrations import MIGRATIONS
from .policy import NOISE_K
from .update_rules import merge_entry


def baseline_path(folder: Path, device_name: str) -> Path:
    """Where the baseline of a device model lives."""
    return folder / f"{device_slug(device_name)}.json"


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
        check_keys(obj, TOP_FIELDS, TOP_FIELDS)
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


def update_baseline(
    path: Path,
    device: dict[str, Any],
    entries: dict[str, BaselineEntry],
    *,
    noise_floor: float,
    lock_timeout: float = LOCK_TIMEOUT_S,
    change_threshold: float | None = None,
    noise_k: float = NOISE_K,
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
