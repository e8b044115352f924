"""Nsight Compute for `perfguard explain`: the metrics that explain kernel time, finding ``ncu``, profiling
the one call of a case under it (probe.py turns the profiler on around it), reading its CSV export into
kernels in canonical units, and the head/base diff of those kernels. The command itself is command.py."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...explanation import KernelDiff, MetricDiff, text
from ..pinned import child_env, pytest_command


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
