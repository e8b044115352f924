"""The results file (``--perfguard-json``): written by the plugin, read back strictly by ``perfguard compare``,
the reports and CI scripts.

Layout: ``{"schema_version": 1, "kind": "perfguard-results", "device": {...}, "results": [record, ...]}``.
Every record is a `CaseRecord` (record.py) and has ``id`` and ``variant``. A timed record (``median_ns``
not null) also has ``ci_ns`` and ``blocks``; the other fields may be absent or null in a record that was
skipped or failed before timing. A field this version does not know is an error naming it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn

from ..jsonio import Invalid, JSONFileError, integer, interval, load_json_text, number, string, write_text_atomic
from ..judge.baseline import check_device
from ..record import CaseRecord, RecordError

RESULTS_SCHEMA_VERSION = 1
RESULTS_KIND = "perfguard-results"


class ResultsError(JSONFileError):
    """A results file that cannot be used; the message names the file, the record and the problem."""


@dataclass(frozen=True)
class DeviceInfo:
    """A results file's device, as the reports show it: its slug and name, and the versions it recorded
    ("" where the file has none)."""

    slug: str
    name: str
    torch: str = ""
    triton: str = ""
    cuda: str = ""
    capability: str = ""
    driver: str = ""

    @classmethod
    def of(cls, device: Mapping[str, Any]) -> DeviceInfo:
        def text(key: str) -> str:
            value = device.get(key)
            return "" if value is None else str(value)

        return cls(**{f: text(f) for f in ("slug", "name", "torch", "triton", "cuda", "capability", "driver")})

    @property
    def label(self) -> str:
        return self.name or self.slug


@dataclass(frozen=True)
class RunInfo:
    """What a results file's run measured and compared with: the commit (marked when the tree had uncommitted
    changes), and under --perfguard-against the base as given and as resolved. Files of older versions kept
    the commit in their device."""

    git_sha: str | None = None
    git_dirty: str | None = None  # the digest of the uncommitted changes the run measured
    against: str | None = None
    base_sha: str | None = None

    @classmethod
    def of(cls, run: Mapping[str, Any], device: Mapping[str, Any]) -> RunInfo:
        def text(holder: Mapping[str, Any], key: str) -> str | None:
            value = holder.get(key)
            return value if isinstance(value, str) and value else None

        holder = run if text(run, "git_sha") or not text(device, "git_sha") else device
        return cls(
            git_sha=text(holder, "git_sha"),
            git_dirty=text(holder, "git_dirty"),
            against=text(run, "against"),
            base_sha=text(run, "base_sha"),
        )

    @property
    def commit(self) -> str | None:
        """The commit, marked when the tree had uncommitted changes: such a tree is not the commit."""
        if self.git_sha is None:
            return None
        return f"{self.git_sha} + uncommitted changes ({self.git_dirty})" if self.git_dirty else self.git_sha


@dataclass
class ResultsFile:
    """A results file in memory."""

    path: Path
    device: dict[str, Any]
    results: list[CaseRecord]
    run: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)  # the session's counts, margin and errors

    def by_id(self) -> dict[str, CaseRecord]:
        """Records keyed by case id (ids are unique in a valid file)."""
        return {record.id: record for record in self.results}

    @property
    def device_info(self) -> DeviceInfo:
        return DeviceInfo.of(self.device)

    @property
    def info(self) -> RunInfo:
        """What the run measured and compared with, as the file records it; never asked of git now (a report
        may be made long after the run, from another checkout)."""
        return RunInfo.of(self.run, self.device)

    @property
    def commit(self) -> str | None:
        return self.info.commit

    @property
    def margin(self) -> float | None:
        """The margin the run was set to (a fraction), if the summary records one."""
        margin = self.summary.get("margin")
        return float(margin) if isinstance(margin, int | float) and not isinstance(margin, bool) else None

    @property
    def errors(self) -> list[str]:
        """The session's errors the summary records."""
        return [str(e) for e in self.summary.get("errors") or []]


def results_document(
    records: Sequence[CaseRecord],
    device: Mapping[str, Any],
    summary: Mapping[str, Any],
    run: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A run as the results file holds it: records by id, so that two runs' files diff case by case."""
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "kind": RESULTS_KIND,
        "device": dict(device),
        "run": dict(run or {}),
        "summary": dict(summary),
        "results": [r.to_json() for r in sorted(records, key=lambda r: r.id)],
    }


def write_results(path: Path, doc: Mapping[str, Any]) -> None:
    """Sorted keys and a fixed indent, written atomically: a reader never sees half a file."""
    text = json.dumps(doc, sort_keys=True, indent=2, allow_nan=False, default=str) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text, ResultsError)


def _optional_interval(value: Any, name: str, centre: float | None, centre_name: str) -> tuple[float, float] | None:
    if value is None:
        return None
    if centre is None:
        raise Invalid(f"field {name!r} must be null when {centre_name!r} is null")
    return interval(value, name, centre, centre_name)


def _record(obj: Any) -> CaseRecord:
    if not isinstance(obj, dict):
        raise Invalid(f"a record must be a JSON object, got {type(obj).__name__}")
    for key in ("id", "variant"):
        if key not in obj:
            raise Invalid(f"missing field {key!r}")
    if not string(obj["id"], "id"):
        raise Invalid("field 'id' must not be empty")
    string(obj["variant"], "variant")
    median_raw = obj.get("median_ns")
    median = None if median_raw is None else number(median_raw, "median_ns", positive=True)
    if median is not None:
        for key in ("ci_ns", "blocks"):
            if obj.get(key) is None:
                raise Invalid(f"timed record (median_ns set) is missing field {key!r}")
    ratio = None if obj.get("ratio") is None else number(obj["ratio"], "ratio", positive=True)
    reasons = obj.get("reasons") or []
    if not isinstance(reasons, list) or not all(isinstance(reason, str) for reason in reasons):
        raise Invalid(f"field 'reasons' must be a list of strings, got {json.dumps(reasons)[:60]}")
    _optional_interval(obj.get("ci_ns"), "ci_ns", median, "median_ns")
    _optional_interval(obj.get("ratio_ci"), "ratio_ci", ratio, "ratio")
    if obj.get("blocks") is not None:
        integer(obj["blocks"], "blocks", 0)
    if obj.get("tflops") is not None:
        number(obj["tflops"], "tflops", nonneg=True)
    for key in ("workload_desc", "stop_reason", "verdict"):
        if obj.get(key) is not None:
            string(obj[key], key)
    data = {k: v for k, v in obj.items() if v is not None}
    data["reasons"] = list(reasons)
    try:
        return CaseRecord.from_json(data)
    except (RecordError, TypeError) as exc:
        raise Invalid(str(exc)) from None


def parse_results(path: Path, obj: Any) -> ResultsFile:
    """Validate an already-parsed results object."""

    def bad(problem: str) -> NoReturn:
        raise ResultsError(f"{path}: {problem}; regenerate it with pytest --perfguard-json {path}")

    if not isinstance(obj, dict):
        bad(f"the top level must be a JSON object, got {type(obj).__name__}")
    if obj.get("kind") != RESULTS_KIND:
        if "cases" in obj:
            raise ResultsError(f"{path}: this is a baseline file, not a results file; use `perfguard show {path}`")
        bad(f"'kind' must be {RESULTS_KIND!r}, got {json.dumps(obj.get('kind'))[:40]}")
    version = obj.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        bad(f"'schema_version' must be an integer, got {json.dumps(version)[:40]}")
    if version > RESULTS_SCHEMA_VERSION:
        raise ResultsError(
            f"{path}: written by a newer pytest-perfguard (schema {version} > {RESULTS_SCHEMA_VERSION}): "
            f"upgrade pytest-perfguard"
        )
    if version < RESULTS_SCHEMA_VERSION:
        bad(f"schema {version} is not a results schema this version reads")
    try:
        device = check_device(obj.get("device"))
    except Invalid as exc:
        bad(str(exc))
    raw = obj.get("results")
    if not isinstance(raw, list):
        bad(f"'results' must be a JSON list, got {type(raw).__name__}")
    records: list[CaseRecord] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        label = item.get("id") if isinstance(item, dict) and isinstance(item.get("id"), str) else f"#{index}"
        try:
            record = _record(item)
        except Invalid as exc:
            bad(f"record {label!r}: {exc}")
        if record.id in seen:
            bad(f"record {record.id!r} appears twice")
        seen.add(record.id)
        records.append(record)
    run, summary = obj.get("run") or {}, obj.get("summary") or {}
    for name, value in (("run", run), ("summary", summary)):
        if not isinstance(value, dict):
            bad(f"{name!r} must be a JSON object, got {type(value).__name__}")
    for key in (f.name for f in fields(RunInfo)):
        if run.get(key) is not None and not isinstance(run[key], str):
            bad(f"run field {key!r} must be a string or null, got {type(run[key]).__name__}")
    return ResultsFile(path=path, device=device, results=records, run=run, summary=summary)


def set_record_field(path: Path, obj: Any, case_id: str, key: str, value: Any) -> None:
    """Sets one field of one record of a results document (read from `path`) in place, every other byte of
    it left as it was; the document is validated before and after, so a change that does not validate is
    an error before anything is written."""
    parse_results(path, obj)
    record = next((r for r in obj["results"] if r.get("id") == case_id), None)
    if record is None:
        raise ResultsError(f"{path}: no record {case_id!r} (removed since it was read?); nothing written")
    record[key] = value
    parse_results(path, obj)


def read_results(path: Path) -> ResultsFile:
    """Read and validate a results file; a missing file is an error (there is nothing to compare)."""
    path = Path(path)
    obj, exists = load_json_text(path, ResultsError, "results")
    if not exists:
        raise ResultsError(f"{path}: no such results file; write one with pytest --perfguard-json {path}")
    return parse_results(path, obj)
