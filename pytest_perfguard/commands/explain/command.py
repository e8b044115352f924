"""``perfguard explain -k CASE [--against REV] [--results FILE]``: why a kernel got slower, from Nsight Compute.

A verdict says a case is slower; the profiler says why. This profiles the selected variant's kernels once
at head (the working tree) and once at REV (its tree from the A/B cache, ab.materialise) with ``ncu``, and
diffs the metrics that explain kernel time: duration and SM clock, registers and spills (local-memory
traffic), achieved occupancy, DRAM and L2 throughput and the L2 hit rate, tensor-pipe utilisation and the
launch configuration.

Only the one call of the variant is profiled (probe.py, ``--profile-from-start off``). Clocks are
left as the timing saw them (``--clock-control none``), so a clock drop shows in the SM clock row;
``--lock-clocks`` locks them to base instead, for a duration diff free of boost. Without ncu, or without
permission to read the GPU's counters, it says what it needs and exits 2.

After a red run, ``--results FILE`` attaches the diff to the case's record in that run's results file (under
a lock, atomically; a file that does not validate is refused before anything is profiled and never
written), where ``perfguard report`` and the Markdown summary show it; ``--regressed`` explains every case
the file marks regressed, against the base revision the run compared with, two profiles per case.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...explanation import Explanation, KernelDiff, MetricDiff, text
from ...gitrev import GitError, git
from ...jsonio import JSONFileError, dumps, load_json_text, locked, write_text_atomic
from ...record import CaseRecord, Status
from ...report.results import ResultsError, ResultsFile, parse_results, set_record_field
from ...settings import from_env
from ..pinned import child_env, pin, pytest_command


@dataclass(frozen=True)
class Metric:
    """One row of the diff: an ncu metric, the label users read and how its values compare."""

    label: str
    name: str
    kind: str  # time (ns), freq (GHz), count, bytes, rate (byte/s), pct


METRICS: tuple[Metric, ...] = (
    Metric("duration", "gpu__time_duration.sum", "time"),
    Metric("SM clock", "sm__cycles_elapsed.avg.per_second", "freq"),
    Metric("registers / thread", "launch__registers_per_thread", "count"),
    Metric("local loads (spills)", "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "bytes"),
    Metric("local stores (spills)", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum", "bytes"),
    Metric("achieved occupancy", "sm__warps_active.avg.pct_of_peak_sustained_active", "pct"),
    Metric("theoretical occupancy", "sm__maximum_warps_per_active_cycle_pct", "pct"),
    Metric("DRAM throughput", "dram__bytes.sum.per_second", "rate"),
    Metric("DRAM % of peak", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "pct"),
    Metric("L2 throughput", "lts__t_bytes.sum.per_second", "rate"),
    Metric("L2 % of peak", "lts__throughput.avg.pct_of_peak_sustained_elapsed", "pct"),
    Metric("L2 hit rate", "lts__t_sector_hit_rate.pct", "pct"),
    Metric("tensor pipe active", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed", "pct"),
    Metric("shared memory / block (dynamic)", "launch__shared_mem_per_block_dynamic", "bytes"),
    Metric("shared memory / block (static)", "launch__shared_mem_per_block_static", "bytes"),
)

NO_NCU = (
    "perfguard explain needs Nsight Compute: the `ncu` command on PATH, in $CUDA_HOME/bin or in "
    "/usr/local/cuda/bin, or named with --ncu PATH (it ships with the CUDA toolkit and as the nsight-compute "
    "package), and permission to read the GPU's performance counters (run as root, or load the NVIDIA driver "
    "with NVreg_RestrictProfilingToAdminUsers=0; ncu reports ERR_NVGPUCTRPERM without it). "
    "Then run: perfguard explain -k CASE --against REV"
)
NO_PERMISSION = (
    "ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM): run as root (in a container, "
    "one started with --cap-add SYS_ADMIN), or have the NVIDIA driver loaded with "
    "NVreg_RestrictProfilingToAdminUsers=0; see https://developer.nvidia.com/ERR_NVGPUCTRPERM"
)
DEFAULT_CUDA = Path("/usr/local/cuda")
# Each explained case costs two profiled pytest runs (head and base); --regressed stops at this many cases.
MAX_CASES = 10

_PREFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_SHORT_TIME = {"ns": "nsecond", "us": "usecond", "ms": "msecond", "s": "second"}
_BASE_WORDS = ("byte", "second", "cycle", "hz")


class ExplainError(Exception):
    """Profiling could not be done; the message says what to do."""


class NcuUnusable(ExplainError):
    """ncu cannot profile anything here (no permission, cannot start): no other case would fare better."""


@dataclass
class Kernel:
    """One profiled kernel launch: its name, launch shape and metric values in canonical units."""

    name: str
    block: str = ""
    grid: str = ""
    values: dict[str, float] = field(default_factory=dict)

    @property
    def short(self) -> str:
        name = self.name[5:] if self.name.startswith("void ") else self.name
        name = name.split("(")[0]
        return name if len(name) <= 60 else name[:57] + "..."


# ------------------------------------------------------------------------------------------- parsing


def _scale(unit: str) -> float | None:
    """The factor from `unit` to its base unit (byte, second, cycle, hz, per second), or None if unknown."""
    unit = unit.strip()
    if not unit or unit in ("%", "register/thread", "thread", "block", "warp", "inst", "sector"):
        return 1.0
    if "/" in unit:
        num, den = unit.split("/", 1)
        a, b = _scale(num), _scale(den)
        return None if a is None or b is None else a / b
    unit = _SHORT_TIME.get(unit, unit)
    lowered = unit.lower()
    for word in _BASE_WORDS:
        if lowered.endswith(word):
            prefix = unit[: len(unit) - len(word)]
            return _PREFIX.get(prefix, _PREFIX.get(prefix.upper()))
    return None


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None  # "n/a", "" or a name


def _canonical(value: float, unit: str, kind: str) -> float | None:
    """ns for time, GHz for clocks, bytes, bytes per second; counts and percentages as given."""
    scale = _scale(unit)
    if scale is None:
        return None
    base = value * scale
    if kind == "time":
        return base * 1e9
    if kind == "freq":
        return base / 1e9
    return base


def _csv_rows(text: str) -> list[list[str]]:
    """The CSV part of ncu's output: from the header line ("ID",...) on; what the program printed is skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ExplainError('no ncu CSV table in the output (no line starting with "ID")')
    rows = list(csv.reader(io.StringIO("\n".join(line for line in lines[start:] if line.startswith('"')))))
    return rows


def parse_ncu_csv(text: str, metrics: Sequence[Metric] = METRICS) -> list[Kernel]:
    """Kernels in launch order from ``ncu --csv --page raw`` (one row per kernel, a units row under the
    header) or from the details page (one row per metric: Metric Name, Metric Unit, Metric Value)."""
    rows = _csv_rows(text)
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    kinds = {m.name: m.kind for m in metrics}
    kernels: dict[str, Kernel] = {}

    def kernel(row: list[str]) -> Kernel:
        key = row[col["ID"]]
        if key not in kernels:
            kernels[key] = Kernel(
                name=row[col["Kernel Name"]],
                block=row[col["Block Size"]].replace(" ", "") if "Block Size" in col else "",
                grid=row[col["Grid Size"]].replace(" ", "") if "Grid Size" in col else "",
            )
        return kernels[key]

    if "Metric Name" in col:
        for row in body:
            if len(row) < len(header) or row[col["Metric Name"]] not in kinds:
                continue
            name = row[col["Metric Name"]]
            number = _number(row[col["Metric Value"]])
            value = None if number is None else _canonical(number, row[col["Metric Unit"]], kinds[name])
            if value is not None:
                kernel(row).values[name] = value
        return list(kernels.values())
    units = body[0] if body and not body[0][col["ID"]].strip() else [""] * len(header)
    for row in body:
        if len(row) < len(header) or not row[col["ID"]].strip():
            continue
        k = kernel(row)
        for name, kind in kinds.items():
            if name in col:
                number = _number(row[col[name]])
                value = None if number is None else _canonical(number, units[col[name]], kind)
                if value is not None:
                    k.values[name] = value
    return list(kernels.values())


# --------------------------------------------------------------------------------------------- diff


def _pairs(head: Sequence[Kernel], base: Sequence[Kernel]) -> list[tuple[Kernel | None, Kernel | None]]:
    """Kernels in launch order side by side; by name (n-th launch of each) when the launch counts differ."""
    if len(head) == len(base):
        return list(zip(head, base, strict=True))
    left = {(k.name, sum(1 for j in head[:i] if j.name == k.name)): k for i, k in enumerate(head)}
    right = {(k.name, sum(1 for j in base[:i] if j.name == k.name)): k for i, k in enumerate(base)}
    keys = list(left) + [key for key in right if key not in left]
    return [(left.get(key), right.get(key)) for key in keys]


def kernel_diffs(
    head: Sequence[Kernel], base: Sequence[Kernel], metrics: Sequence[Metric] = METRICS
) -> tuple[KernelDiff, ...]:
    """Each head launch beside its base counterpart, with every metric either side has."""
    out = []
    for h, b in _pairs(head, base):
        rows = []
        for m in metrics:
            hv = h.values.get(m.name) if h is not None else None
            bv = b.values.get(m.name) if b is not None else None
            if hv is not None or bv is not None:
                rows.append(MetricDiff(metric=m.name, label=m.label, kind=m.kind, head=hv, base=bv))
        out.append(
            KernelDiff(
                head=h.short if h is not None else None,
                base=b.short if b is not None else None,
                head_grid=h.grid if h is not None else "",
                base_grid=b.grid if b is not None else "",
                head_block=h.block if h is not None else "",
                base_block=b.block if b is not None else "",
                metrics=tuple(rows),
            )
        )
    return tuple(out)


def diff_table(head: Sequence[Kernel], base: Sequence[Kernel], metrics: Sequence[Metric] = METRICS) -> str:
    """One head/base/change table per kernel launch (duration first, then what moved most), and the total
    duration when there are several."""
    return text(kernel_diffs(head, base, metrics))


# ---------------------------------------------------------------------------------------- profiling


def find_ncu(explicit: str | None = None) -> str | None:
    """ncu: as named, else on PATH, else in the CUDA toolkit ($CUDA_HOME, /usr/local/cuda), where it lives
    on hosts whose PATH holds only nvcc's wrapper or nothing of CUDA."""
    if explicit:
        return shutil.which(explicit)
    found = shutil.which("ncu")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), str(DEFAULT_CUDA)):
        if root and shutil.which(str(Path(root) / "bin" / "ncu")):
            return str(Path(root) / "bin" / "ncu")
    return None


def _ncu_run(ncu: str, command: Sequence[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([ncu, *command], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise NcuUnusable(f"cannot run {ncu}: {exc.strerror or exc}") from None


def ncu_version(ncu: str) -> str:
    """ "Nsight Compute 2025.1.1.0", from ``ncu --version`` (its last line names the version)."""
    out = _ncu_run(ncu, ["--version"], Path.cwd(), dict(os.environ)).stdout
    line = next((x.strip() for x in out.splitlines() if x.strip().startswith("Version")), None)
    return f"Nsight Compute {line.split()[1]}" if line and len(line.split()) > 1 else f"Nsight Compute ({ncu})"


def _tail(output: str) -> str:
    """What a reader needs of a failed run: ncu's and pytest's error lines, else its last lines."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    wanted = ("==ERROR==", "ERROR:", "perfguard explain:", "E   ", "SKIPPED", "Error")
    picked = [line for line in lines if line.startswith(wanted) or "Error:" in line]
    return " | ".join((picked or lines)[-4:]) or "no output"


@dataclass(frozen=True)
class Profiled:
    """One side's profile: the kernels of the one call, and which case on which GPU the probe ran."""

    kernels: list[Kernel]
    case_id: str
    device: str


def _ncu_command(
    work: Path,
    report: Path,
    probe_out: Path,
    metrics: Sequence[str],
    lock_clocks: bool,
    select: Sequence[str],
    pytest_args: Sequence[str],
) -> list[str]:
    """ncu's arguments: a pytest run of the pinned plugin with the probe loaded, profiled only where the
    probe turns the profiler on (around the one call), its report exported to `report`."""
    return [
        "--target-processes",
        "all",
        "--profile-from-start",
        "off",
        "--clock-control",
        "base" if lock_clocks else "none",
        "--metrics",
        ",".join(metrics),
        "--export",
        str(report),
        "--force-overwrite",
        *pytest_command(work / "plugin"),
        "-p",
        "pytest_perfguard.commands.explain.probe",
        "-p",
        "no:cacheprovider",
        "--perfguard-explain-out",
        str(probe_out),
        *select,
        *pytest_args,
    ]


def profile(
    ncu: str, cwd: Path, select: Sequence[str], pytest_args: Sequence[str], work: Path, side: str, lock_clocks: bool
) -> Profiled:
    """Profile the one call of the selected variant in `cwd`; metrics that this ncu or GPU lacks are dropped
    (after ncu names them) and the profile is taken again without them."""
    report = work / side
    probe_out = work / f"{side}.case.json"
    log = work / f"{side}.log"
    metrics = [m.name for m in METRICS]
    for _attempt in range(2):
        probe_out.unlink(missing_ok=True)
        command = _ncu_command(work, report, probe_out, metrics, lock_clocks, select, pytest_args)
        proc = _ncu_run(ncu, command, cwd, child_env(work / "plugin"))
        output = proc.stdout + proc.stderr
        log.write_text(output, encoding="utf-8")
        if "ERR_NVGPUCTRPERM" in output:
            raise NcuUnusable(NO_PERMISSION)
        errors = [line for line in output.splitlines() if line.startswith("==ERROR==")]
        unknown = [m for m in metrics if any(m in line for line in errors)]
        if unknown and len(unknown) < len(metrics):
            print(f"perfguard explain: {side}: ncu does not know {', '.join(unknown)} here; profiling without")
            metrics = [m for m in metrics if m not in unknown]
            continue
        break
    rep = report.with_suffix(".ncu-rep")
    if proc.returncode != 0:
        raise ExplainError(f"{side}: ncu or pytest failed (exit {proc.returncode}): {_tail(output)}; log: {log}")
    if not probe_out.is_file():
        raise ExplainError(
            f"{side}: the case did not run (skipped, or failed before its call?): {_tail(output)}; log: {log}"
        )
    if not rep.is_file():
        raise ExplainError(
            f"{side}: ncu wrote no report (no CUDA kernel in the profiled call?): {_tail(output)}; log: {log}"
        )
    imported = _ncu_run(ncu, ["--import", str(rep), "--csv", "--page", "raw"], cwd, dict(os.environ))
    if imported.returncode != 0:
        raise ExplainError(f"{side}: ncu could not read its report {rep}: {_tail(imported.stdout + imported.stderr)}")
    kernels = parse_ncu_csv(imported.stdout)
    if not kernels:
        raise ExplainError(f"{side}: no CUDA kernel ran in the profiled call (is the case on the GPU?); log: {log}")
    try:
        info = json.loads(probe_out.read_text(encoding="utf-8"))
        return Profiled(kernels, str(info["id"]), str(info["device"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ExplainError(f"{side}: unreadable {probe_out} ({exc})") from None


def _base_tree(top: Path, rev: str) -> tuple[str, Path]:
    try:
        sha = git(top, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except GitError:
        raise ExplainError(f"--against {rev}: unknown git revision (git rev-parse {rev} finds none)") from None
    import pytest

    from ...run.ab import materialise

    try:
        return sha, materialise(top, sha)
    except pytest.UsageError as exc:
        raise ExplainError(str(exc)) from None


def default_against(top: Path, results: ResultsFile | None = None) -> str:
    """The base the results file's run compared with (an A/B run); else $PERFGUARD_AGAINST, as the A/B
    gate would use it; else HEAD when the tree has uncommitted changes."""
    if results is not None:
        recorded = results.run.get("base_sha") or next(
            (r.ab.sha for r in results.results if r.ab is not None and r.ab.sha is not None), None
        )
        if isinstance(recorded, str) and recorded:
            return recorded
    env: str | None = from_env("against")
    if env:
        return env
    if git(top, "status", "--porcelain", "--untracked-files=no"):
        return "HEAD"
    raise ExplainError(
        "nothing to compare with: the tree is clean and --against is not given"
        + (" (and the results file's run had no base revision)" if results is not None else "")
        + "; pass --against REV (the revision the case was fast at, e.g. --against origin/main)"
    )


# ------------------------------------------------------------------------------------ the results file


def read_results_for_update(path: Path) -> ResultsFile:
    """The results file explain will write into, checked before anything is profiled."""
    from ...report.merge import MERGED_KIND

    obj, exists = load_json_text(path, ResultsError, "results")
    if not exists:
        raise ResultsError(f"{path}: no such results file; write one with pytest --perfguard --perfguard-json {path}")
    if isinstance(obj, dict) and obj.get("kind") == MERGED_KIND:
        raise ResultsError(
            f"{path}: a merged file (perfguard merge); explain writes into one run's results file: "
            "explain that run's file, then merge again"
        )
    return parse_results(path, obj)


def attach(path: Path, case_id: str, explanation: Explanation) -> None:
    """Put the explanation under the case's record, changing nothing else in the file.

    Read, change and write under the file's lock, so explanations written side by side are all kept; the
    file is validated before and after, and replaced atomically, so a file that does not validate (corrupt,
    or from a newer pytest-perfguard) is left as it is."""
    with locked(path, error=ResultsError):
        obj, exists = load_json_text(path, ResultsError, "results")
        if not exists:
            raise ResultsError(f"{path}: the results file is gone (removed while explain ran); nothing written")
        set_record_field(path, obj, case_id, "explain", explanation.to_json())
        write_text_atomic(path, dumps(obj), ResultsError)


def _worst_first(record: CaseRecord) -> float:
    """The largest change among the gates that found the regression (1.3 = 30% slower)."""
    estimates = [g.estimate for g in record.gates if g.status is Status.REGRESSED and g.estimate is not None]
    return -max(estimates, default=0.0)


# ------------------------------------------------------------------------------------------ the command


@dataclass
class Setup:
    """What every explained case shares: ncu, both trees, the work folder and the file to write into."""

    ncu: str
    version: str
    cwd: Path
    base_cwd: Path
    against: str
    sha: str
    head_sha: str | None
    dirty: bool
    work: Path
    pytest_args: list[str]
    lock_clocks: bool
    results: ResultsFile | None = None


def _setup(args: argparse.Namespace, cwd: Path, results: ResultsFile | None) -> Setup | None:
    ncu = find_ncu(args.ncu)
    if ncu is None:
        where = f"--ncu {args.ncu}: not found or not executable. " if args.ncu else ""
        print(f"perfguard: error: {where}{NO_NCU}", file=sys.stderr)
        return None
    try:
        top = Path(git(cwd, "rev-parse", "--show-toplevel"))
    except GitError as exc:
        raise ExplainError(f"{cwd} is not in a git repository ({exc}); --against needs one") from None
    rev = args.against or default_against(top, results)
    sha, tree = _base_tree(top, rev)
    base_cwd = tree / cwd.resolve().relative_to(top.resolve())
    if not base_cwd.is_dir():
        raise ExplainError(f"the folder {base_cwd.relative_to(tree)} does not exist at {rev}; run from one that does")
    head_sha = git(top, "rev-parse", "HEAD", check=False) or None
    dirty = bool(git(top, "status", "--porcelain", "--untracked-files=no", check=False))
    work = Path(tempfile.mkdtemp(prefix="perfguard-explain-"))
    pin(work / "plugin")
    return Setup(
        ncu=ncu,
        version=ncu_version(ncu),
        cwd=cwd,
        base_cwd=base_cwd,
        against=rev,
        sha=sha,
        head_sha=head_sha,
        dirty=dirty,
        work=work,
        pytest_args=list(args.pytest_args),
        lock_clocks=args.lock_clocks,
        results=results,
    )


def explain_case(s: Setup, select: Sequence[str], label: str, tag: str = "") -> Explanation:
    """Profile one case at head and at base, print the diff, and attach it when there is a results file
    (a case that file does not hold is refused after the head profile, before the base one is taken)."""
    print(
        f"perfguard explain: {label}: head (working tree) vs {s.against} ({s.sha[:12]}), one call each under ncu; "
        f"reports in {s.work}",
        flush=True,
    )
    head = profile(s.ncu, s.cwd, select, s.pytest_args, s.work, f"{tag}head", s.lock_clocks)
    if s.results is not None and head.case_id not in s.results.by_id():
        raise ExplainError(
            f"{s.results.path} has no record of {head.case_id} (the case {label} selected); explain a case of "
            "that run, or leave out --results"
        )
    base = profile(s.ncu, s.base_cwd, select, s.pytest_args, s.work, f"{tag}base", s.lock_clocks)
    if base.case_id != head.case_id:
        print(f"perfguard explain: note: at base the probe ran {base.case_id}, at head {head.case_id}")
    if base.device != head.device:
        print(f"perfguard explain: note: head ran on {head.device}, base on {base.device}")
    explanation = Explanation(
        against=s.against,
        base_sha=s.sha,
        head_sha=s.head_sha,
        head_dirty=s.dirty,
        device=head.device,
        ncu=s.version,
        clock_control="base" if s.lock_clocks else "none",
        kernels=kernel_diffs(head.kernels, base.kernels),
    )
    print(f"{head.case_id}\n{explanation.source()}\n\n{explanation.text()}\n", flush=True)
    if s.results is not None:
        attach(s.results.path, head.case_id, explanation)
        print(f"perfguard explain: attached to its record in {s.results.path}", flush=True)
    return explanation


def _regressed(s: Setup, max_cases: int) -> int:
    """Explain every regressed case of the results file not yet explained against this base; worst first."""
    assert s.results is not None
    regressed = sorted((r for r in s.results.results if r.verdict is Status.REGRESSED), key=_worst_first)
    if not regressed:
        print(f"perfguard explain: {s.results.path} marks no case regressed; nothing to explain")
        return 0
    done = [r for r in regressed if r.explain is not None and r.explain.base_sha == s.sha]
    todo = [r for r in regressed if r not in done]
    for r in done:
        print(f"perfguard explain: {r.id}: already explained against {s.sha[:12]}; -k selects it to explain it again")
    chosen, left = todo[:max_cases], todo[max_cases:]
    if chosen:
        print(
            f"perfguard explain: {len(chosen)} regressed case(s), worst first: two ncu profiles each "
            f"(head and {s.against})",
            flush=True,
        )
    failed: list[str] = []
    for number, record in enumerate(chosen, 1):
        try:
            explain_case(s, ["--perfguard-explain-id", record.id], record.id, tag=f"case{number}-")
        except NcuUnusable:
            raise
        except (ExplainError, JSONFileError) as exc:
            print(f"perfguard: error: explain: {record.id}: {exc}", file=sys.stderr, flush=True)
            failed.append(record.id)
    if left:
        print(
            f"perfguard explain: {len(left)} more regressed case(s) not explained (--max-cases {max_cases}): "
            + ", ".join(r.id for r in left[:5])
            + (" ..." if len(left) > 5 else "")
            + "; run again to explain them (explained cases are skipped), or raise --max-cases"
        )
    if failed:
        print(f"perfguard explain: {len(failed)} of {len(chosen)} could not be explained (errors above)")
    return 1 if failed else 0


def explain(args: argparse.Namespace, cwd: Path) -> int:
    results = read_results_for_update(Path(args.results)) if args.results else None
    if results is not None:
        _note_head(results, cwd)
    s = _setup(args, cwd, results)
    if s is None:
        return 2
    if args.regressed:
        status = _regressed(s, args.max_cases)
    else:
        explain_case(s, ["-k", args.k], f"-k {args.k!r}")
        status = 0
    if results is not None:
        print(f"perfguard explain: see it in the report: perfguard report {results.path} --html report.html")
    return status


def _note_head(results: ResultsFile, cwd: Path) -> None:
    """Say so when the working tree is not the commit the results file measured: head is profiled as it is."""
    measured = results.run.get("git_sha")
    now = git(cwd, "rev-parse", "HEAD", check=False)
    if isinstance(measured, str) and measured and now and now != measured:
        print(
            f"perfguard explain: note: {results.path} measured {measured[:12]}, the working tree is at {now[:12]}; "
            f"head is profiled as the working tree is (git checkout {measured[:12]} to profile what the run measured)"
        )


def _usage_error(args: argparse.Namespace) -> str | None:
    if args.regressed and args.k:
        return "-k and --regressed: choose one (-k explains one case, --regressed every regressed case)"
    if not args.regressed and not args.k:
        return "say what to explain: -k CASE, or --regressed --results RESULTS"
    if args.regressed and not args.results:
        return "--regressed needs --results RESULTS: the run whose regressed cases to explain"
    if args.max_cases < 1:
        return f"--max-cases must be at least 1, got {args.max_cases}"
    return None


def cmd_explain(args: argparse.Namespace) -> int:
    problem = _usage_error(args)
    if problem:
        print(f"perfguard: error: explain: {problem}", file=sys.stderr)
        return 2
    try:
        return explain(args, Path.cwd())
    except NcuUnusable as exc:
        print(f"perfguard: error: explain: {exc}", file=sys.stderr)
        return 2
    except (ExplainError, GitError, JSONFileError) as exc:
        print(f"perfguard: error: explain: {exc}", file=sys.stderr)
        return 1


def add_explain_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``explain`` subcommand; arguments it does not know go to pytest."""
    parser = sub.add_parser(
        "explain",
        allow_abbrev=False,
        usage=(
            "perfguard explain (-k CASE | --regressed) [--against REV] [--results RESULTS] [--max-cases N] "
            "[--lock-clocks] [--ncu PATH] [PYTEST_ARG ...]"
        ),
        help="profile one case with Nsight Compute at head and at REV and diff what explains kernel time",
        description="Arguments it does not know go to pytest (e.g. tests/perf).",
    )
    parser.add_argument("-k", metavar="CASE", help="pytest -k expression selecting exactly one case")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="revision to compare with (default: the base revision of the --results run, else "
        "$PERFGUARD_AGAINST, else HEAD if the tree is dirty)",
    )
    parser.add_argument(
        "--results",
        metavar="RESULTS",
        help="results file of the run (--perfguard-json): the explanation is written into the case's record, "
        "where perfguard report shows it",
    )
    parser.add_argument(
        "--regressed",
        action="store_true",
        help="explain every case RESULTS marks regressed, worst first (two ncu profiles per case)",
    )
    parser.add_argument(
        "--max-cases",
        type=int,
        default=MAX_CASES,
        metavar="N",
        help=f"with --regressed, explain at most N cases (default {MAX_CASES})",
    )
    parser.add_argument(
        "--lock-clocks",
        action="store_true",
        help="lock GPU clocks to base while profiling (ncu --clock-control base)",
    )
    parser.add_argument("--ncu", metavar="PATH", help="the ncu to run (default: on PATH, else in the CUDA toolkit)")
    parser.set_defaults(func=cmd_explain, pytest_args=[], passes_unknown_args=True)
