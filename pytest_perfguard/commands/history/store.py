"""History on main: one SQLite file of per-case summaries per run, and change points over it.

A per-PR gate sees one step at a time; ten +0.5% commits each pass it. The history keeps every run on main
so that steps and drifts show up afterwards, and E-Divisive (Apache Otava's implementation, not ours) finds
where they happened.

Storage is one SQLite file (stdlib ``sqlite3``) so that CI can keep it in a cache or an artifact as a single
file. Writes take ``BEGIN IMMEDIATE`` with a busy timeout in the default rollback journal: a run is added
whole or not at all, concurrent writers queue, and no ``-wal`` file sits beside it between runs. A file that
is not a history of this schema (corrupt, another program's, newer) is refused and never written.

Layout (schema 1), integer keys throughout so that a row repeats no string::

    meta(key, value)                       schema_version, written_by
    runs(id, sha, commit_time, added, digest)   one per results file; digest makes re-adding idempotent
    cases(id, name)                        test node ids
    envs(id, fingerprint, json)            device + per-case environment, stored once each
    verdicts(id, name)
    samples(run_id, case_id, estimate_ps, lo_ppm, hi_ppm, noise_ppm, mde_ppm,
            ratio_ppm, ratio_lo_ppm, ratio_hi_ppm, verdict_id, env_id)

Every figure is an integer, because SQLite stores a small integer in 1-4 bytes and a REAL always in 8: the
time in picoseconds, relative figures in parts per million (bounds as ln(bound / estimate), the ratio as
ln(ratio), noise and MDE as fractions). A ppm and a picosecond are far below what any timing resolves. Sizes measured
with ``benchmarks/history_size.py`` (see
``benchmarks/results/cpu_2026-11-23/history.md``).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import math
import sqlite3
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pytest_perfguard.gitrev import GitError, git
from pytest_perfguard.judge.stats import Interval
from pytest_perfguard.record import CaseRecord
from pytest_perfguard.report.results import read_results

SCHEMA_VERSION = 1
DEFAULT_PATH = Path(".ci/history.sqlite")
BUSY_TIMEOUT_S = 60.0
PPM = 1e6
# Points on each side of a change that its size is estimated from (fewer where another change is closer).
SIZE_WINDOW = 30

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    sha TEXT NOT NULL,
    commit_time INTEGER NOT NULL,
    added INTEGER NOT NULL,
    digest BLOB NOT NULL UNIQUE
);
CREATE TABLE cases (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE envs (id INTEGER PRIMARY KEY, fingerprint BLOB NOT NULL UNIQUE, json TEXT NOT NULL);
CREATE TABLE verdicts (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE samples (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    case_id INTEGER NOT NULL REFERENCES cases(id),
    estimate_ps INTEGER NOT NULL,
    lo_ppm INTEGER,
    hi_ppm INTEGER,
    noise_ppm INTEGER,
    mde_ppm INTEGER,
    ratio_ppm INTEGER,
    ratio_lo_ppm INTEGER,
    ratio_hi_ppm INTEGER,
    verdict_id INTEGER REFERENCES verdicts(id),
    env_id INTEGER NOT NULL REFERENCES envs(id),
    PRIMARY KEY (run_id, case_id)
) WITHOUT ROWID;
"""
# (run_id, case_id) keys arrive in ascending order, so pages fill completely; a per-case read scans the
# table, which for 100 cases x 10,000 commits takes well under a second (history.md).


class HistoryError(Exception):
    """A history that cannot be read or written; the message names the file, the problem and what to run."""


@dataclass(frozen=True)
class CaseSummary:
    """What the history keeps of one timed case of one run (times in ns, relative figures as fractions)."""

    case: str
    estimate_ns: float
    ci_ns: tuple[float, float] | None
    noise: float | None
    mde: float | None
    ratio: float | None
    ratio_ci: tuple[float, float] | None
    verdict: str | None
    env: dict[str, Any]


@dataclass(frozen=True)
class Point:
    """One case in one run, read back from the history, in commit order."""

    run_id: int
    sha: str
    commit_time: int
    summary: CaseSummary
    env_id: int


@dataclass(frozen=True)
class AddOutcome:
    run_id: int
    added: int  # cases stored
    untimed: int  # records without a time (skipped, failed before timing): not stored
    already: bool  # this results file was in the history before: nothing was written


# ------------------------------------------------------------------------------------------ summaries


def block_noise(blocks: Sequence[float]) -> float | None:
    """Robust sd of ln(block median): the spread one block shows, which the CI shrinks with more blocks.

    1.4826 x MAD, so that a stray slow block does not set it. None with fewer than 3 blocks.
    """
    values = [b for b in blocks if isinstance(b, (int, float)) and b > 0]
    if len(values) < 3:
        return None
    logs = np.log(np.asarray(values, dtype=np.float64))
    return float(1.4826 * np.median(np.abs(logs - np.median(logs))))


def fingerprint(env: dict[str, Any]) -> bytes:
    """16 bytes that differ when anything in the environment does (canonical JSON, sha256)."""
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode("utf-8")).digest()[:16]


def _record_field(record: CaseRecord, name: str) -> Any:
    return getattr(record, name)


def summarize(record: CaseRecord, device: dict[str, Any]) -> CaseSummary | None:
    """A record's summary, or None for a record that was not timed."""
    if record.median_ns is None:
        return None
    env = dict(device)
    case_env = _record_field(record, "env")
    if isinstance(case_env, dict):
        env.update({f"case.{key}": value for key, value in case_env.items()})
    blocks = _record_field(record, "variant_blocks")
    mde = _record_field(record, "mde")
    return CaseSummary(
        case=record.id,
        estimate_ns=record.median_ns,
        ci_ns=record.ci_ns,
        noise=block_noise(blocks) if isinstance(blocks, list) else None,
        mde=float(mde) if isinstance(mde, (int, float)) and math.isfinite(mde) else None,
        ratio=record.ratio,
        ratio_ci=record.ratio_ci,
        verdict=None if record.verdict is None else str(record.verdict),
        env=env,
    )


def _ppm(value: float | None) -> int | None:
    return None if value is None or not math.isfinite(value) else round(value * PPM)


def _log_ppm(value: float | None, centre: float | None) -> int | None:
    if value is None or centre is None or value <= 0 or centre <= 0:
        return None
    return _ppm(math.log(value / centre))


def _unppm(value: int | None) -> float | None:
    return None if value is None else value / PPM


def _bound(centre: float | None, offset: int | None) -> float | None:
    return None if centre is None or offset is None else centre * math.exp(offset / PPM)


def _pair(lo: float | None, hi: float | None) -> tuple[float, float] | None:
    return None if lo is None or hi is None else (lo, hi)


# ------------------------------------------------------------------------------------------- git


def _git(args: list[str], cwd: Path | None) -> str | None:
    try:
        return git(cwd or Path.cwd(), *args)
    except GitError:
        return None


def parse_commit_time(text: str) -> int:
    """ISO 8601 to Unix seconds; a time without a zone is taken as UTC."""
    try:
        moment = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise HistoryError(
            f"--commit-time {text!r} is not an ISO 8601 time; give one like 2026-11-23T14:05:00+00:00"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp())


def resolve_commit(sha: str | None, commit_time: str | None, cwd: Path | None = None) -> tuple[str, int]:
    """The run's commit and its commit time: as given, or asked of git in ``cwd``."""
    if sha is None:
        sha = _git(["rev-parse", "--verify", "HEAD^{commit}"], cwd)
        if sha is None:
            raise HistoryError(
                "cannot tell which commit this run measured: not in a git repository (or git is missing); "
                "pass --sha SHA --commit-time ISO"
            )
    if commit_time is not None:
        return sha, parse_commit_time(commit_time)
    stamp = _git(["show", "-s", "--format=%ct", f"{sha}^{{commit}}"], cwd)
    if stamp is None or not stamp.isdigit():
        raise HistoryError(
            f"cannot find the commit time of {sha} with git (not in a git repository, or an unknown "
            f"commit); pass --commit-time ISO"
        )
    return sha, int(stamp)


def format_commit_time(stamp: int) -> str:
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


# ------------------------------------------------------------------------------------------- store


class History:
    """An open history file. Use ``open_history`` (a context manager) to get one."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._db = connection
        self._envs: dict[int, dict[str, Any]] = {}
        self._ids: dict[tuple[str, Any], int] = {}

    # --- internals shared by the writers

    def _intern(self, table: str, column: str, value: Any, extra: dict[str, Any] | None = None) -> int:
        """The id of ``value`` in a lookup table, inserted if new; committed ids never change, so they are cached."""
        key = (table, value)
        if key in self._ids:
            return self._ids[key]
        row = self._db.execute(f"SELECT id FROM {table} WHERE {column} = ?", (value,)).fetchone()
        if row is None:
            names = [column, *(extra or {})]
            marks = ", ".join("?" for _ in names)
            cursor = self._db.execute(
                f"INSERT INTO {table} ({', '.join(names)}) VALUES ({marks})", (value, *(extra or {}).values())
            )
            assert cursor.lastrowid is not None
            row = (cursor.lastrowid,)
        self._ids[key] = int(row[0])
        return self._ids[key]

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """One transaction that takes the write lock at once, so two writers queue instead of deadlocking."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            self._ids.clear()  # ids handed out in the rolled-back transaction no longer exist
            raise
        self._db.execute("COMMIT")

    # --- writing

    def add_run(
        self,
        summaries: Sequence[CaseSummary],
        digest: bytes,
        sha: str,
        commit_time: int,
        *,
        source: str,
        untimed: int = 0,
    ) -> AddOutcome:
        """Store one run's summaries, all or nothing; ``digest`` identifies the run's source (``source``)."""
        with self._write():
            row = self._db.execute("SELECT id, sha FROM runs WHERE digest = ?", (digest,)).fetchone()
            if row is not None:
                if row[1] != sha:
                    raise HistoryError(
                        f"{self.path}: {source} is already in the history as run {row[0]} of commit "
                        f"{row[1]}, not {sha}; nothing was added (one results file measures one commit)"
                    )
                return AddOutcome(int(row[0]), 0, untimed, already=True)
            cursor = self._db.execute(
                "INSERT INTO runs (sha, commit_time, added, digest) VALUES (?, ?, ?, ?)",
                (sha, commit_time, int(datetime.datetime.now(datetime.timezone.utc).timestamp()), digest),
            )
            assert cursor.lastrowid is not None
            run_id = cursor.lastrowid
            for s in sorted(summaries, key=lambda s: s.case):
                self._insert(run_id, s)
        return AddOutcome(run_id, len(summaries), untimed, already=False)

    def _insert(self, run_id: int, s: CaseSummary) -> None:
        env_json = json.dumps(s.env, sort_keys=True)
        self._db.execute(
            "INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                self._intern("cases", "name", s.case),
                round(s.estimate_ns * 1e3),
                _log_ppm(s.ci_ns[0] if s.ci_ns else None, s.estimate_ns),
                _log_ppm(s.ci_ns[1] if s.ci_ns else None, s.estimate_ns),
                _ppm(s.noise),
                _ppm(s.mde),
                _log_ppm(s.ratio, 1.0),
                _log_ppm(s.ratio_ci[0] if s.ratio_ci else None, s.ratio),
                _log_ppm(s.ratio_ci[1] if s.ratio_ci else None, s.ratio),
                None if s.verdict is None else self._intern("verdicts", "name", s.verdict),
                self._intern("envs", "fingerprint", fingerprint(s.env), {"json": env_json}),
            ),
        )

    # --- reading

    def case_names(self, pattern: str | None = None) -> list[str]:
        """Case names containing ``pattern`` (plain substring, case-insensitive), sorted."""
        names = [str(row[0]) for row in self._db.execute("SELECT name FROM cases ORDER BY name")]
        if pattern:
            names = [name for name in names if pattern.lower() in name.lower()]
        return names

    def run_count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM runs").fetchone()[0])

    def env(self, env_id: int) -> dict[str, Any]:
        if env_id not in self._envs:
            row = self._db.execute("SELECT json FROM envs WHERE id = ?", (env_id,)).fetchone()
            self._envs[env_id] = json.loads(row[0]) if row else {}
        return self._envs[env_id]

    def series(self, case: str) -> list[Point]:
        """The case's points in commit order (commit time, then the order runs were added)."""
        rows = self._db.execute(
            """SELECT r.id, r.sha, r.commit_time, s.estimate_ps, s.lo_ppm, s.hi_ppm, s.noise_ppm, s.mde_ppm,
                      s.ratio_ppm, s.ratio_lo_ppm, s.ratio_hi_ppm, v.name, s.env_id
               FROM samples s JOIN runs r ON r.id = s.run_id JOIN cases c ON c.id = s.case_id
               LEFT JOIN verdicts v ON v.id = s.verdict_id
               WHERE c.name = ? ORDER BY r.commit_time, r.id""",
            (case,),
        ).fetchall()
        points = []
        for run_id, sha, ctime, est_ps, lo, hi, noise, mde, ratio_ppm, rlo, rhi, verdict, env_id in rows:
            ratio = None if ratio_ppm is None else math.exp(ratio_ppm / PPM)
            est = est_ps / 1e3
            summary = CaseSummary(
                case=case,
                estimate_ns=est,
                ci_ns=_pair(_bound(est, lo), _bound(est, hi)),
                noise=_unppm(noise),
                mde=_unppm(mde),
                ratio=ratio,
                ratio_ci=_pair(_bound(ratio, rlo), _bound(ratio, rhi)),
                verdict=verdict,
                env=self.env(env_id),
            )
            points.append(Point(run_id, sha, ctime, summary, env_id))
        return points


def _restore_hint(path: Path) -> str:
    return (
        f"it was left untouched; move it away to start a new history, or restore the copy CI keeps "
        f"(perfguard history show --history {path} reads it once it is back)"
    )


def _check_schema(db: sqlite3.Connection, path: Path) -> None:
    tables = {str(row[0]) for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "meta" not in tables:
        raise HistoryError(f"{path}: an SQLite file but not a perfguard history (no meta table); {_restore_hint(path)}")
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = row[0] if row else None
    if not isinstance(version, str) or not version.isdigit():
        raise HistoryError(f"{path}: history without a valid schema_version ({version!r}); {_restore_hint(path)}")
    if int(version) > SCHEMA_VERSION:
        raise HistoryError(
            f"{path}: written by a newer pytest-perfguard (history schema {version} > {SCHEMA_VERSION}); "
            f"upgrade pytest-perfguard (pip install -U pytest-perfguard) to read it; the file was left untouched"
        )
    if int(version) < SCHEMA_VERSION:
        raise HistoryError(
            f"{path}: history schema {version} is older than any this version reads; {_restore_hint(path)}"
        )


def _create_schema(db: sqlite3.Connection) -> None:
    db.execute("BEGIN IMMEDIATE")
    try:
        exists = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone()
        if not exists:  # another writer may have created it while this one waited for the lock
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.executemany(
                "INSERT INTO meta VALUES (?, ?)",
                [("schema_version", str(SCHEMA_VERSION)), ("written_by", "pytest-perfguard")],
            )
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


@contextlib.contextmanager
def open_history(path: Path, *, create: bool = False) -> Iterator[History]:
    """Open (or with ``create``, make) a history; any SQLite failure becomes a HistoryError naming the file.

    Only a missing or empty (0-byte) file is ever created; anything else must already be a history of this
    schema, so a damaged file is reported, not replaced. 0 bytes holds nothing to lose, and it is what a
    concurrent creator leaves for an instant before its first commit.
    """
    path = Path(path)
    if path.is_dir():
        raise HistoryError(f"{path}: is a folder, not a history file; pass --history FILE")
    fresh = not path.exists() or path.stat().st_size == 0
    if fresh and not create:
        raise HistoryError(f"{path}: no history yet; add a run with `perfguard history add RESULTS --history {path}`")
    if fresh:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HistoryError(f"{path}: cannot create folder {path.parent} ({exc.strerror or exc})") from None
    mode = "rwc" if fresh else ("rw" if create else "ro")
    try:
        db = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode={mode}", uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None
        )
    except sqlite3.Error as exc:
        raise HistoryError(f"{path}: cannot open the history ({exc})") from None
    try:
        if fresh:
            _create_schema(db)
        _check_schema(db, path)
        yield History(path, db)
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise HistoryError(
                f"{path}: still locked by another writer after {BUSY_TIMEOUT_S:.0f} s; run again when it is done"
            ) from None
        raise HistoryError(f"{path}: cannot use the history ({exc}); {_restore_hint(path)}") from None
    except sqlite3.DatabaseError as exc:
        raise HistoryError(f"{path}: not a readable history ({exc}); {_restore_hint(path)}") from None
    finally:
        db.close()


def add_results(history_path: Path, results_path: Path, sha: str, commit_time: int) -> AddOutcome:
    """Read a results file and add it as one run; the same file added again changes nothing."""
    results = read_results(results_path)
    digest = hashlib.sha256(Path(results_path).read_bytes()).digest()[:16]
    summaries = [summarize(record, results.device) for record in results.results]
    timed = [s for s in summaries if s is not None]
    with open_history(history_path, create=True) as history:
        return history.add_run(
            timed, digest, sha, commit_time, source=str(results_path), untimed=len(summaries) - len(timed)
        )


# -------------------------------------------------------------------------------------- change points


@dataclass(frozen=True)
class Change:
    """A change point: ``index`` is the first point after it in the case's series."""

    case: str
    index: int
    before: Point  # last point before the change
    after: Point  # first point after it
    size: Interval  # ratio scale, after / before (1.05 is 5% slower)
    pvalue: float
    n_before: int
    n_after: int
    env_note: str  # "" when the environment did not change at or near the change


def shift_interval(before: Sequence[float], after: Sequence[float], confidence: float = 0.95) -> Interval:
    """Two-sample Hodges-Lehmann shift (after - before) with its Mann-Whitney interval.

    stats.hodges_lehmann is the one-sample (paired) form; here the two segments are independent runs.
    The interval uses the normal approximation of the Mann-Whitney U and is the whole line when too few
    points support the confidence.
    """
    x = np.asarray(before, dtype=np.float64)
    y = np.asarray(after, dtype=np.float64)
    if x.size == 0 or y.size == 0:
        raise ValueError("shift_interval needs points on both sides")
    d = np.sort(np.subtract.outer(y, x).ravel())
    n, m = x.size, y.size
    estimate = float(np.median(d))
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2.0)
    k = math.floor(n * m / 2.0 - z * math.sqrt(n * m * (n + m + 1) / 12.0))
    if k < 1:
        return Interval(estimate, -math.inf, math.inf, confidence, int(n + m))
    return Interval(estimate, float(d[k - 1]), float(d[d.size - k]), confidence, int(n + m))


def env_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    """'key old -> new; ...' for what differs, '' when nothing does."""
    return "; ".join(
        f"{key} {a.get(key)} -> {b.get(key)}" for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)
    )


def _env_note(points: Sequence[Point], index: int, reach: int = 2) -> str:
    """What changed in the environment at the change, or within ``reach`` points of it."""
    for offset in sorted(range(-reach, reach + 1), key=abs):
        j = index + offset
        if 1 <= j < len(points) and points[j].env_id != points[j - 1].env_id:
            where = "at the change" if offset == 0 else f"{abs(offset)} run(s) {'after' if offset > 0 else 'before'} it"
            return f"{where}: {env_difference(points[j - 1].summary.env, points[j].summary.env)}"
    return ""


def change_indices(values: Sequence[float], max_pvalue: float, min_change: float) -> list[tuple[int, float]]:
    """(index, p-value) of each change point that Otava's E-Divisive finds in ``values``.

    Otava's ``compute_change_points`` is Hunter's form of E-Divisive (Fleming et al., ICPE 2023): the split
    runs in sliding windows and a t-test judges each candidate, which is deterministic (no permutations).
    """
    try:
        from otava.analysis import compute_change_points
    except ImportError:
        raise HistoryError(
            "change-point detection needs Apache Otava: pip install 'pytest-perfguard[history]'"
        ) from None
    if len(values) < 4:
        return []
    # A list, not an ndarray: Otava 0.8's detector slices its window only out of a non-array series.
    points, _weak = compute_change_points([float(v) for v in values], max_pvalue=max_pvalue, min_magnitude=min_change)
    return [(int(cp.index), float(cp.stats.pvalue)) for cp in points if 0 < cp.index < len(values)]


def find_changes(
    points: Sequence[Point],
    *,
    metric: str = "time",
    max_pvalue: float = 1e-4,
    min_change: float = 0.0,
    window: int = SIZE_WINDOW,
) -> list[Change]:
    """Change points of one case's series of estimates (``metric`` time, or ratio to the in-run reference)."""
    pairs = [(p, p.summary.ratio if metric == "ratio" else p.summary.estimate_ns) for p in points]
    usable = [p for p, value in pairs if value is not None]
    values = [value for _, value in pairs if value is not None]
    found = change_indices(values, max_pvalue, min_change)
    logs = [math.log(value) for value in values]
    bounds = [0, *(index for index, _ in found), len(values)]
    changes = []
    for number, (index, pvalue) in enumerate(found):
        start = max(bounds[number], index - window)
        stop = min(bounds[number + 2], index + window)
        size = shift_interval(logs[start:index], logs[index:stop]).exp()
        changes.append(
            Change(
                case=usable[index].summary.case,
                index=index,
                before=usable[index - 1],
                after=usable[index],
                size=size,
                pvalue=pvalue,
                n_before=index - start,
                n_after=stop - index,
                env_note=_env_note(usable, index),
            )
        )
    return changes
