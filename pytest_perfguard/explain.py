"""``perfguard explain -k CASE [--against REV]``: why a kernel got slower, from Nsight Compute counters.

A verdict says a case is slower; the profiler says why. This profiles the selected variant's kernels once
at head (the working tree) and once at REV (its tree from the A/B cache, ab.materialise) with ``ncu``, and
diffs the metrics that explain kernel time: duration and SM clock, registers and spills (local-memory
traffic), achieved occupancy, DRAM and L2 throughput and the L2 hit rate, tensor-pipe utilisation and the
launch configuration.

Only the one call of the variant is profiled (explain_probe.py, ``--profile-from-start off``). Clocks are
left as the timing saw them (``--clock-control none``), so a clock drop shows in the SM clock row;
``--lock-clocks`` locks them to base instead, for a duration diff free of boost. Without ncu, or without
permission to read the GPU's counters, it says what it needs and exits 2.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

from .gitrev import GitError, git
from .pinned import child_env, pin, pytest_command


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
    "perfguard explain needs Nsight Compute: the `ncu` command on PATH (it ships with the CUDA toolkit and as "
    "the nsight-compute package) and permission to read the GPU's performance counters (run as root, or load "
    "the NVIDIA driver with NVreg_RestrictProfilingToAdminUsers=0; ncu reports ERR_NVGPUCTRPERM without it). "
    "Then run: perfguard explain -k CASE --against REV"
)
NO_PERMISSION = (
    "ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM): run as root, or load the NVIDIA "
    "driver with NVreg_RestrictProfilingToAdminUsers=0"
)

_PREFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_SHORT_TIME = {"ns": "nsecond", "us": "usecond", "ms": "msecond", "s": "second"}
_BASE_WORDS = ("byte", "second", "cycle", "hz")


class ExplainError(Exception):
    """Profiling could not be done; the message says what to do."""


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


def _show(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "time":
        for unit, size in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
            if value >= size:
                return f"{value / size:.2f} {unit}"
        return f"{value:.0f} ns"
    if kind == "freq":
        return f"{value:.3f} GHz"
    if kind in ("bytes", "rate"):
        suffix = "/s" if kind == "rate" else ""
        for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
            if value >= size:
                return f"{value / size:.2f} {unit}{suffix}"
        return f"{value:.0f} B{suffix}"
    if kind == "pct":
        return f"{value:.1f}%"
    return f"{value:g}"


def _change(head: float | None, base: float | None, kind: str) -> str:
    if head is None or base is None:
        return "-"
    if kind == "pct":
        return "same" if abs(head - base) < 0.05 else f"{head - base:+.1f} pt"
    if kind == "count":
        return "same" if head == base else f"{head - base:+g}"
    if base == 0:
        return "same" if head == 0 else "was 0"
    ratio = head / base - 1
    return "same" if abs(ratio) < 0.0005 else f"{ratio * 100:+.1f}%"


def _pairs(head: Sequence[Kernel], base: Sequence[Kernel]) -> list[tuple[Kernel | None, Kernel | None]]:
    """Kernels in launch order side by side; by name (n-th launch of each) when the launch counts differ."""
    if len(head) == len(base):
        return list(zip(head, base, strict=True))
    left = {(k.name, sum(1 for j in head[:i] if j.name == k.name)): k for i, k in enumerate(head)}
    right = {(k.name, sum(1 for j in base[:i] if j.name == k.name)): k for i, k in enumerate(base)}
    keys = list(left) + [key for key in right if key not in left]
    return [(left.get(key), right.get(key)) for key in keys]


def diff_table(head: Sequence[Kernel], base: Sequence[Kernel], metrics: Sequence[Metric] = METRICS) -> str:
    """One head/base/change table per kernel launch, and the total duration when there are several."""
    blocks: list[str] = []
    pairs = _pairs(head, base)
    for number, (h, b) in enumerate(pairs, 1):
        names = {k.short for k in (h, b) if k is not None}
        title = " | ".join(f"{k.short} ({side})" for k, side in ((h, "head"), (b, "base")) if k is not None)
        if len(names) == 1:
            title = next(iter(names)) + (
                "" if h is not None and b is not None else " (head only)" if b is None else " (base only)"
            )
        rows = []
        for m in metrics:
            hv = h.values.get(m.name) if h is not None else None
            bv = b.values.get(m.name) if b is not None else None
            if hv is None and bv is None:
                continue
            rows.append([m.label, _show(hv, m.kind), _show(bv, m.kind), _change(hv, bv, m.kind)])
        for label, attr in (("grid", "grid"), ("block", "block")):
            hs = getattr(h, attr) if h is not None else ""
            bs = getattr(b, attr) if b is not None else ""
            if hs or bs:
                rows.append([label, hs or "-", bs or "-", "same" if hs == bs else "changed" if hs and bs else "-"])
        table = tabulate(rows, headers=["metric", "head", "base", "change"], disable_numparse=True)
        blocks.append(f"kernel {number} of {len(pairs)}: {title}\n{table}")
    duration = METRICS[0]
    if len(pairs) > 1:
        th = sum(k.values.get(duration.name, 0.0) for k in head)
        tb = sum(k.values.get(duration.name, 0.0) for k in base)
        blocks.append(
            f"total duration of {len(head)} head / {len(base)} base kernel launches: "
            f"{_show(th, 'time')} vs {_show(tb, 'time')} ({_change(th, tb, 'time')})"
        )
    return "\n\n".join(blocks)


# ---------------------------------------------------------------------------------------- profiling


def find_ncu() -> str | None:
    return shutil.which("ncu")


def _ncu_run(ncu: str, command: Sequence[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ncu, *command], cwd=cwd, env=env, capture_output=True, text=True, check=False)


def profile(
    ncu: str, cwd: Path, case: str, pytest_args: Sequence[str], work: Path, side: str, lock_clocks: bool
) -> list[Kernel]:
    """Profile the one call of the selected variant in `cwd`; metrics that this ncu or GPU lacks are dropped
    (after ncu names them) and the profile is taken again without them."""
    report = work / side
    metrics = [m.name for m in METRICS]
    for _attempt in range(2):
        command = [
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
            "pytest_perfguard.explain_probe",
            "-p",
            "no:cacheprovider",
            "-k",
            case,
            *pytest_args,
        ]
        proc = _ncu_run(ncu, command, cwd, child_env(work / "plugin"))
        output = proc.stdout + proc.stderr
        (work / f"{side}.log").write_text(output, encoding="utf-8")
        if "ERR_NVGPUCTRPERM" in output:
            raise ExplainError(NO_PERMISSION)
        errors = [line for line in output.splitlines() if line.startswith("==ERROR==")]
        unknown = [m for m in metrics if any(m in line for line in errors)]
        if unknown and len(unknown) < len(metrics):
            print(f"perfguard explain: {side}: ncu does not know {', '.join(unknown)} here; profiling without")
            metrics = [m for m in metrics if m not in unknown]
            continue
        break
    rep = report.with_suffix(".ncu-rep")
    if proc.returncode != 0 or not rep.is_file():
        tail = " | ".join(line for line in output.splitlines()[-4:] if line.strip())
        raise ExplainError(
            f"{side}: ncu or pytest failed (exit {proc.returncode}): {tail}; full log in {work / (side + '.log')}"
        )
    text = _ncu_run(ncu, ["--import", str(rep), "--csv", "--page", "raw"], cwd, dict(os.environ)).stdout
    kernels = parse_ncu_csv(text)
    if not kernels:
        raise ExplainError(
            f"{side}: no CUDA kernel ran in the profiled call (is the case on the GPU?); "
            f"log in {work / (side + '.log')}"
        )
    return kernels


def _base_tree(top: Path, rev: str) -> tuple[str, Path]:
    try:
        sha = git(top, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except GitError:
        raise ExplainError(f"--against {rev}: unknown git revision (git rev-parse {rev} finds none)") from None
    import pytest

    from .ab import materialise

    try:
        return sha, materialise(top, sha)
    except pytest.UsageError as exc:
        raise ExplainError(str(exc)) from None


def default_against(top: Path) -> str:
    """$PERFGUARD_AGAINST, as the A/B gate would use it; else HEAD when the tree has uncommitted changes."""
    env = os.environ.get("PERFGUARD_AGAINST")
    if env:
        return env
    if git(top, "status", "--porcelain", "--untracked-files=no"):
        return "HEAD"
    raise ExplainError(
        "nothing to compare with: the tree is clean and --against is not given; pass "
        "--against REV (the revision the case was fast at, e.g. --against origin/main)"
    )


def explain(case: str, against: str | None, pytest_args: Sequence[str], cwd: Path, lock_clocks: bool) -> int:
    ncu = find_ncu()
    if ncu is None:
        print(f"perfguard: error: {NO_NCU}", file=sys.stderr)
        return 2
    try:
        top = Path(git(cwd, "rev-parse", "--show-toplevel"))
    except GitError as exc:
        raise ExplainError(f"{cwd} is not in a git repository ({exc}); --against needs one") from None
    rev = against or default_against(top)
    sha, tree = _base_tree(top, rev)
    base_cwd = tree / cwd.resolve().relative_to(top.resolve())
    work = Path(tempfile.mkdtemp(prefix="perfguard-explain-"))
    pin(work / "plugin")
    print(
        f"perfguard explain: -k {case!r}: head (working tree) vs {rev} ({sha[:12]}), one call each under ncu; "
        f"reports in {work}",
        flush=True,
    )
    head = profile(ncu, cwd, case, pytest_args, work, "head", lock_clocks)
    base = profile(ncu, base_cwd, case, pytest_args, work, "base", lock_clocks)
    print(diff_table(head, base))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    try:
        return explain(args.k, args.against, args.pytest_args, Path.cwd(), args.lock_clocks)
    except (ExplainError, GitError) as exc:
        print(f"perfguard: error: explain: {exc}", file=sys.stderr)
        return 1


def add_explain_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``explain`` subcommand; arguments it does not know go to pytest."""
    parser = sub.add_parser(
        "explain",
        allow_abbrev=False,
        usage="perfguard explain -k CASE [--against REV] [--lock-clocks] [PYTEST_ARG ...]",
        help="profile one case with Nsight Compute at head and at REV and diff what explains kernel time",
        description="Arguments after -k CASE go to pytest (e.g. tests/perf).",
    )
    parser.add_argument("-k", required=True, metavar="CASE", help="pytest -k expression selecting exactly one case")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="revision to compare with (default: $PERFGUARD_AGAINST, else HEAD if the tree is dirty)",
    )
    parser.add_argument(
        "--lock-clocks",
        action="store_true",
        help="lock GPU clocks to base while profiling (ncu --clock-control base)",
    )
    parser.set_defaults(func=cmd_explain, pytest_args=[], passes_unknown_args=True)
