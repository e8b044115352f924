"""Reading results files (``--perfguard-json``), strictly, for ``perfguard compare`` and CI scripts.

Layout: ``{"schema_version": 1, "kind": "perfguard-results", "device": {...}, "results": [record, ...]}``.
Every record has ``id`` and ``variant``. A timed record (``median_ns`` not null) also has ``ci_ns`` and
``blocks``; ``workload_desc``, ``ratio``, ``ratio_ci``, ``stop_reason``, ``tflops``, ``verdict`` and
``reasons`` may be absent or null in a record that was skipped or failed before timing. Other keys
(``outcome``, ``env``, ``gates``, ...) are kept in ``extra``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from pytest_perfguard.baseline import (
    JSONFileError,
    _check_device,
    _integer,
    _interval,
    _Invalid,
    _number,
    _string,
    load_json_text,
)

RESULTS_SCHEMA_VERSION = 1
RESULTS_KIND = "perfguard-results"
_FIELDS = (
    "id",
    "variant",
    "workload_desc",
    "median_ns",
    "ci_ns",
    "ratio",
    "ratio_ci",
    "blocks",
    "stop_reason",
    "tflops",
    "verdict",
    "reasons",
)


class ResultsError(JSONFileError):
    """A results file that cannot be used; the message names the file, the record and the problem."""


@dataclass(frozen=True)
class ResultRecord:
    """One case of one run; the timing fields are None for a case that was not timed."""

    id: str
    variant: str
    workload_desc: str
    median_ns: float | None
    ci_ns: tuple[float, float] | None
    ratio: float | None
    ratio_ci: tuple[float, float] | None
    blocks: int | None
    stop_reason: str | None
    tflops: float | None
    verdict: str | None
    reasons: list[str]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ResultsFile:
    """A results file in memory."""

    path: Path
    device: dict[str, Any]
    results: list[ResultRecord]

    def by_id(self) -> dict[str, ResultRecord]:
        """Records keyed by case id (ids are unique in a valid file)."""
        return {record.id: record for record in self.results}


def _optional_interval(
    value: Any, name: str, centre: float | None, centre_name: str
) -> tuple[float, float] | None:
    if value is None:
        return None
    if centre is None:
        raise _Invalid(f"field {name!r} must be null when {centre_name!r} is null")
    return _interval(value, name, centre, centre_name)


def _optional_string(value: Any, name: str) -> str | None:
    return None if value is None else _string(value, name)


def _record(obj: Any) -> ResultRecord:
    if not isinstance(obj, dict):
        raise _Invalid(f"a record must be a JSON object, got {type(obj).__name__}")
    for key in ("id", "variant"):
        if key not in obj:
            raise _Invalid(f"missing field {key!r}")
    case_id = _string(obj["id"], "id")
    if not case_id:
        raise _Invalid("field 'id' must not be empty")
    median_raw = obj.get("median_ns")
    median = None if median_raw is None else _number(median_raw, "median_ns", positive=True)
    if median is not None:
        for key in ("ci_ns", "blocks"):
            if obj.get(key) is None:
                raise _Invalid(f"timed record (median_ns set) is missing field {key!r}")
    ratio = None if obj.get("ratio") is None else _number(obj["ratio"], "ratio", positive=True)
    reasons = obj.get("reasons") or []
    if not isinstance(reasons, list) or not all(isinstance(reason, str) for reason in reasons):
        raise _Invalid(f"field 'reasons' must be a list of strings, got {json.dumps(reasons)[:60]}")
    blocks = obj.get("blocks")
    tflops = obj.get("tflops")
    return ResultRecord(
        id=case_id,
        variant=_string(obj["variant"], "variant"),
        workload_desc=_optional_string(obj.get("workload_desc"), "workload_desc") or "",
        median_ns=median,
        ci_ns=_optional_interval(obj.get("ci_ns"), "ci_ns", median, "median_ns"),
        ratio=ratio,
        ratio_ci=_optional_interval(obj.get("ratio_ci"), "ratio_ci", ratio, "ratio"),
        blocks=None if blocks is None else _integer(blocks, "blocks", 0),
        stop_reason=_optional_string(obj.get("stop_reason"), "stop_reason"),
        tflops=None if tflops is None else _number(tflops, "tflops", nonneg=True),
        verdict=_optional_string(obj.get("verdict"), "verdict"),
        reasons=list(reasons),
        extra={key: value for key, value in obj.items() if key not in _FIELDS},
    )


def parse_results(path: Path, obj: Any) -> ResultsFile:
    """Validate an already-parsed results object."""

    def bad(problem: str) -> NoReturn:
        raise ResultsError(f"{path}: {problem}; regenerate it with pytest --perfguard-json {path}")

    if not isinstance(obj, dict):
        bad(f"the top level must be a JSON object, got {type(obj).__name__}")
    if obj.get("kind") != RESULTS_KIND:
        if "cases" in obj:
            raise ResultsError(
                f"{path}: this is a baseline file, not a results file; use `perfguard show {path}`"
            )
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
        device = _check_device(obj.get("device"))
    except _Invalid as exc:
        bad(str(exc))
    raw = obj.get("results")
    if not isinstance(raw, list):
        bad(f"'results' must be a JSON list, got {type(raw).__name__}")
    records: list[ResultRecord] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        label = item.get("id") if isinstance(item, dict) and isinstance(item.get("id"), str) else f"#{index}"
        try:
            record = _record(item)
        except _Invalid as exc:
            bad(f"record {label!r}: {exc}")
        if record.id in seen:
            bad(f"record {record.id!r} appears twice")
        seen.add(record.id)
        records.append(record)
    return ResultsFile(path=path, device=device, results=records)


def read_results(path: Path) -> ResultsFile:
    """Read and validate a results file; a missing file is an error (there is nothing to compare)."""
    path = Path(path)
    obj, exists = load_json_text(path, ResultsError, "results")
    if not exists:
        raise ResultsError(f"{path}: no such results file; write one with pytest --perfguard-json {path}")
    return parse_results(path, obj)
