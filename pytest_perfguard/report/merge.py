"""Results from several runners in one file: `perfguard merge` and the reader of merged files.

A run writes one results file (`--perfguard-json`, kind ``perfguard-results``) for one device. A merged
file (kind ``perfguard-merged-results``) holds the runs it was made from side by side, each exactly as its
runner wrote it, plus the file it came from::

    {"kind": "perfguard-merged-results", "schema_version": 1,
     "runs": [{"source": "l4/results.json", "schema_version": 1, "device": {...}, "results": [...]}, ...]}

Why a container and not one flat list: each run keeps its device (runners of several kinds each run
their own cases), every record stays valid under the strict per-run loader (`results.parse_results`),
and each source's device, run information and summary survive unchanged. Its own schema version counts
the container layout; each run keeps the results schema it was written in, and runs written in different
results schemas are not merged, because their records may mean different things. A merge also refuses
one case from two devices (a case's verdicts come from one kind of hardware), runs of different commits
or base revisions, and a run that records none where another does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The one place that names where the strict JSON reader and the atomic writer live.
from ..jsonio import load_json_text, write_text_atomic
from .results import RESULTS_KIND, ResultsError, ResultsFile, parse_results

MERGED_KIND = "perfguard-merged-results"
MERGED_SCHEMA_VERSION = 1


class MergeError(ResultsError):
    """Results files that cannot be merged; the message names the files and what to run."""


@dataclass(frozen=True)
class Run:
    """One runner's results: its raw JSON object (v1 results layout), validated, and where it came from."""

    source: str
    doc: dict[str, Any]
    checked: ResultsFile

    @property
    def slug(self) -> str:
        return str(self.checked.device["slug"])

    @property
    def schema_version(self) -> int:
        return int(self.doc["schema_version"])


def _run_object(run: Mapping[str, Any]) -> dict[str, Any]:
    """A merged file's run as the results file it was: every key its runner wrote, whatever it was."""
    return {**{key: value for key, value in run.items() if key != "source"}, "kind": RESULTS_KIND}


def read_runs(path: Path) -> list[Run]:
    """Read a results file or a merged file strictly; every record is validated by the per-run loader."""
    path = Path(path)
    obj, exists = load_json_text(path, ResultsError, "results")
    if not exists:
        raise ResultsError(f"{path}: no such results file; write one with pytest --perfguard-json {path}")
    return runs_in(obj, path)


def runs_in(doc: Any, path: Path | None = None) -> list[Run]:
    """The runs of a results or merged document already in memory (read from `path`, if from a file), read
    strictly: the reports' one way in, so that they show typed records and never read the JSON a second way."""
    label = Path(path) if path is not None else Path("results")
    if isinstance(doc, dict) and doc.get("kind") == MERGED_KIND:
        return _merged_runs(label, doc)
    return [Run(source=str(path) if path is not None else "", doc=doc, checked=parse_results(label, doc))]


def _merged_runs(path: Path, obj: dict[str, Any]) -> list[Run]:
    def bad(problem: str) -> MergeError:
        return MergeError(f"{path}: {problem}; merge the runners' results files again with `perfguard merge`")

    version = obj.get("schema_version")
    if version != MERGED_SCHEMA_VERSION:
        if isinstance(version, int) and not isinstance(version, bool) and version > MERGED_SCHEMA_VERSION:
            raise MergeError(
                f"{path}: merged by a newer pytest-perfguard (merged schema {version} > "
                f"{MERGED_SCHEMA_VERSION}): upgrade pytest-perfguard"
            )
        raise bad(f"'schema_version' of a merged file must be {MERGED_SCHEMA_VERSION}, got {json.dumps(version)}")
    raw = obj.get("runs")
    if not isinstance(raw, list) or not raw:
        raise bad("'runs' must be a non-empty JSON list")
    runs = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("source"), str):
            raise bad(f"run #{index} must be an object with a 'source' string")
        label = Path(f"{path} (run from {item['source']})")
        runs.append(Run(source=item["source"], doc=_run_object(item), checked=parse_results(label, _run_object(item))))
    _check_unique(runs, one_device=False)  # files merged before the one-device rule still read
    return runs


def _check_unique(runs: Sequence[Run], *, one_device: bool = True) -> None:
    """A case runs on one device: the same case twice is two answers to one question, and on two devices
    its verdicts would come from unlike hardware (each runner kind keeps its own cases and baseline)."""
    seen: dict[tuple[str, str], Run] = {}
    for run in runs:
        for record in run.checked.results:
            first = seen.setdefault((record.id, "" if one_device else run.slug), run)
            if first is run:
                continue
            if first.slug == run.slug:
                raise MergeError(
                    f"{run.source}: case {record.id!r} on device {run.slug!r} is also in {first.source}; "
                    f"merge results of different cases, or drop one of the two files"
                )
            raise MergeError(
                f"{run.source}: case {record.id!r} ran on device {run.slug!r} here and on {first.slug!r} in "
                f"{first.source}; a case runs on one runner kind only: select each case on one kind of runner"
            )


def _revision(run: Run, key: str) -> str | None:
    """A revision the run records ("git_sha" or "base_sha"): in its run information (RunInfo)."""
    info = run.checked.info
    if key == "git_sha":
        # uncommitted changes make another revision of the code: two digests do not merge as one commit
        return f"{info.git_sha}+{info.git_dirty}" if info.git_sha and info.git_dirty else info.git_sha
    return info.base_sha


def _unrecorded(run: Run, key: str) -> str:
    """Why a run has no revision of this kind, in the words of the refusal."""
    if key == "git_sha":
        return "records no commit (it ran outside a git checkout, or with an older pytest-perfguard)"
    against = run.checked.info.against
    if against:
        return f"has no base revision (its --perfguard-against {against} did not resolve)"
    return "was not run against a base revision (no --perfguard-against)"


def _check_revisions(runs: Sequence[Run]) -> None:
    """Runs of one merge measured one commit (and, under --perfguard-against, against one base): results of
    two commits in one summary would judge code that no single revision holds. Once one run records a
    revision, every run must record the same one: a run that records none cannot be shown to match."""
    for key, what in (("git_sha", "commit"), ("base_sha", "base revision")):
        claims = [(run, _revision(run, key)) for run in runs]
        first_run, first = next(((run, sha) for run, sha in claims if sha), (None, None))
        if first_run is None or first is None:
            continue  # none records one: nothing to compare
        for run, sha in claims:
            if sha is None:
                raise MergeError(
                    f"{run.source}: {_unrecorded(run, key)}, but {first_run.source} has {what} {first[:12]}; "
                    f"merge the results of one {what}: run every runner on the same checkout with the same options"
                )
            if sha != first:
                raise MergeError(
                    f"{run.source}: results of {what} {sha[:12]}, but {first_run.source} has {first[:12]}; "
                    f"merge the results of one {what} (re-run the runners on the same checkout)"
                )


def _check_schemas(claims: Sequence[tuple[str, int]]) -> None:
    """Runs written in different results schemas are refused: their records may mean different things."""
    versions = sorted({version for _, version in claims})
    if len(versions) > 1:
        first = {v: next(source for source, version in claims if version == v) for v in versions}
        listed = ", ".join(f"{source} is results schema {v}" for v, source in first.items())
        raise MergeError(
            f"results schemas differ ({listed}); re-run the older runners with the same pytest-perfguard "
            f"version, then merge"
        )


def _peek_schemas(path: Path) -> list[tuple[str, int]]:
    """The results schemas a file claims, read leniently, so that a mismatch is reported as one even when
    a newer file would not load; a file that does not parse is left to the strict reader."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return []
    if not isinstance(obj, dict):
        return []
    items = obj.get("runs") if obj.get("kind") == MERGED_KIND else [obj]
    if not isinstance(items, list):
        return []
    return [
        (str(path), item["schema_version"])
        for item in items
        if isinstance(item, dict) and type(item.get("schema_version")) is int
    ]


def merge_files(paths: Sequence[Path]) -> dict[str, Any]:
    """The merged document of results or merged files; raises ResultsError naming the file at fault."""
    if not paths:
        raise MergeError("nothing to merge: name at least one results file (perfguard merge A.json B.json -o all.json)")
    repeated = sorted({str(p) for p in paths if list(paths).count(p) > 1})
    if repeated:
        raise MergeError(f"{repeated[0]}: named twice; give each results file once")
    _check_schemas([claim for path in paths for claim in _peek_schemas(Path(path))])
    runs = [run for path in paths for run in read_runs(Path(path))]
    _check_schemas([(run.source, run.schema_version) for run in runs])
    _check_unique(runs)
    _check_revisions(runs)
    if not any(run.checked.results for run in runs):
        names = ", ".join(str(p) for p in paths)
        raise MergeError(
            f"nothing to merge: {names} hold no results; check that the runs collected perf cases "
            f"(pytest --perfguard --perfguard-json FILE)"
        )
    return merged_document(runs)


def merged_document(runs: Sequence[Run]) -> dict[str, Any]:
    """The merged file's object; each run as its runner wrote it, with the file it came from."""
    return {
        "kind": MERGED_KIND,
        "schema_version": MERGED_SCHEMA_VERSION,
        "runs": [{**run.doc, "source": run.source} for run in runs],
    }


def read_document(path: Path) -> dict[str, Any]:
    """A results or merged file, validated, as the object the reports render."""
    runs = read_runs(path)
    return runs[0].doc if len(runs) == 1 and runs[0].source == str(path) else merged_document(runs)


def write_merged(path: Path, doc: Mapping[str, Any]) -> None:
    """Write atomically: a reader sees the old file or the whole new one, never a part."""
    text = json.dumps(doc, sort_keys=True, indent=2, allow_nan=False) + "\n"
    write_file(path, text)


def write_file(path: Path, text: str) -> None:
    """Atomic write of a report or merged file; a missing folder is created (it is an output)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ResultsError(f"{path}: cannot create folder {path.parent} ({exc.strerror or exc})") from None
    write_text_atomic(path, text, ResultsError)
