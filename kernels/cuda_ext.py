"""The CUDA attention kernels (kernels/cuda/*.cu) as Python variants, built on first use.

Every variant is ``fn(q, k, v, causal) -> Tensor`` on contiguous (B, H, S, D) fp16/bf16 CUDA tensors with
D in {64, 128}. The extension is compiled with ``torch.utils.cpp_extension.load`` into a build folder keyed
by a hash of the sources, flags, torch version and their folder, so an edit or a torch upgrade rebuilds and
nothing else does. ``unavailable_reason`` says why the kernels cannot run here (and never raises), so tests can skip
with that sentence. ``nvcc_compile_check`` compiles one .cu file alone and reads ptxas' resource report,
which is how the CPU-only test suite proves that no kernel spills registers.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "ARCHS",
    "CUDA_DIR",
    "CU_SOURCES",
    "VARIANTS",
    "CompileReport",
    "KernelResources",
    "build_key",
    "cuda_scalar",
    "cuda_splitkv",
    "cuda_tiled",
    "cuda_wmma",
    "find_nvcc",
    "load",
    "nvcc_compile_check",
    "nvcc_compile_checks",
    "ptxas_log_for",
    "splitkv_num_splits",
    "unavailable_reason",
]

CUDA_DIR = Path(__file__).resolve().parent / "cuda"
CU_SOURCES: tuple[Path, ...] = tuple(
    CUDA_DIR / name for name in ("cuda_scalar.cu", "cuda_tiled.cu", "cuda_wmma.cu", "cuda_splitkv.cu")
)
_BINDINGS = CUDA_DIR / "bindings.cpp"
_HEADERS: tuple[Path, ...] = tuple(CUDA_DIR / name for name in ("attention.h", "common.cuh", "flash_mma.cuh"))

# Architectures always built: Ada (L4, L40S) and Hopper (H100, H200). The current GPU's is added if different.
ARCHS: tuple[str, ...] = ("sm_89", "sm_90")
MIN_CAPABILITY = (8, 0)  # cp.async, ldmatrix and bf16 mma.sync need sm_80

# The defines torch passes to every extension's nvcc; the standalone check uses them too, so its register
# counts are those of the kernels that actually run.
_TORCH_NVCC_DEFINES: tuple[str, ...] = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
)
_NVCC_OPT_FLAGS: tuple[str, ...] = ("-O3", "-std=c++17", "-lineinfo")

_lock = threading.Lock()
_module: ModuleType | None = None
_build_error: str | None = None


def _arch_digits(arch: str) -> str:
    """'sm_90', 'compute_90', '9.0' or '90' -> '90' (an 'a'/'f' suffix such as sm_90a is kept)."""
    m = re.fullmatch(r"(?:sm_|compute_)?(\d+)\.?(\d*)([af]?)", arch.strip())
    if m is None:
        raise ValueError(f"unrecognised CUDA arch {arch!r}; expected e.g. 'sm_90' or '9.0'")
    return m.group(1) + m.group(2) + m.group(3)


def _gencode(arch: str) -> list[str]:
    digits = _arch_digits(arch)
    return ["-gencode", f"arch=compute_{digits},code=sm_{digits}"]


def _build_archs() -> list[str]:
    """ARCHS plus the current GPU's architecture, so the extension also runs on an A100 or a B200."""
    archs = list(ARCHS)
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            current = f"sm_{major}{minor}"
            if current not in archs:
                archs.append(current)
    except Exception:  # no device to ask: the fixed list is still a valid build
        pass
    return archs


def _cuda_cflags(archs: list[str]) -> list[str]:
    """The extension's nvcc flags. ``--threads`` lets nvcc compile a file's architectures at once (ninja
    already compiles the files in parallel, so the build lasts as long as its slowest file). Measured alone
    it moved a cold build by 1.2 s of 25.8, within noise, while bindings.cpp was the slowest file; with
    bindings.cpp cut by a third the two together took it from 20.2 s to 14.8 s (benchmarks/build_time.py,
    H200, 2026-11-27). Not in ``nvcc_compile_checks``, whose ptxas reports must not interleave."""
    flags = [*_NVCC_OPT_FLAGS, "--threads", str(len(archs))]
    for arch in archs:
        flags += _gencode(arch)
    return flags


def build_key(cflags: list[str], torch_version: str) -> str:
    """The build's key: sources, flags, torch version, and the folder the sources are in.

    The folder is in the key because an A/B run loads this module twice, from the head's tree and from the
    base revision's, and torch passes the include folder to the build: two trees sharing one build folder
    and module name made torch rename the second ("_v1") and ninja rebuild both in every process, about a
    minute per process on an H100 (benchmarks/results/ab_2026-11-25). Keyed apart, each tree builds once.
    """
    h = hashlib.sha256()
    h.update(str(CUDA_DIR).encode())
    for path in (_BINDINGS, *CU_SOURCES, *_HEADERS):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update("\0".join(cflags).encode())
    h.update(torch_version.encode())
    return h.hexdigest()[:16]


def find_nvcc() -> str | None:
    """Path of the nvcc torch would use ($CUDA_HOME/bin/nvcc, else the one on PATH), or None."""
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:
        CUDA_HOME = None
    if CUDA_HOME:
        candidate = Path(CUDA_HOME) / "bin" / "nvcc"
        if candidate.is_file():
            return str(candidate)
    return shutil.which("nvcc")


def _summarise_build_error(exc: BaseException) -> str:
    """First compiler error lines, not the whole ninja log, so a skip reason stays one readable line."""
    text = str(exc)
    errors = [line.strip() for line in text.splitlines() if re.search(r"\berror\b", line, re.IGNORECASE)]
    picked = errors[:3] if errors else [line.strip() for line in text.splitlines() if line.strip()][:3]
    summary = " | ".join(picked)
    if len(summary) > 600:
        summary = summary[:600] + "..."
    return f"build failed ({type(exc).__name__}): {summary}"


def load(verbose: bool = False) -> ModuleType:
    """Build (or reuse) the extension and return it; raises on a build error.

    The build folder is ``$TORCH_EXTENSIONS_DIR/<name>`` when that variable is set, else
    ``~/.cache/pytest-perfguard/kernels-<hash>``, the hash covering sources, flags, torch version and the
    sources' folder (`build_key`).
    """
    global _module, _build_error
    with _lock:
        if _module is not None:
            return _module
        reason = _cheap_reason()
        if reason is not None:
            raise RuntimeError(f"CUDA attention kernels unavailable: {reason}")
        import torch
        from torch.utils.cpp_extension import load as cpp_load

        cflags = _cuda_cflags(_build_archs())
        digest = build_key(cflags, torch.__version__)
        name = f"perfguard_attn_{digest[:10]}"
        kwargs: dict[str, Any] = {}
        if not os.environ.get("TORCH_EXTENSIONS_DIR"):
            build_dir = Path.home() / ".cache" / "pytest-perfguard" / f"kernels-{digest}"
            build_dir.mkdir(parents=True, exist_ok=True)
            kwargs["build_directory"] = str(build_dir)
        try:
            module: ModuleType = cpp_load(
                name=name,
                sources=[str(_BINDINGS), *(str(p) for p in CU_SOURCES)],
                extra_cflags=["-O3"],
                extra_cuda_cflags=cflags,
                extra_include_paths=[str(CUDA_DIR)],
                verbose=verbose,
                **kwargs,
            )
        except Exception as exc:
            _build_error = _summarise_build_error(exc)
            raise
        _module = module
        _build_error = None
        return _module


def extension_path() -> Path | None:
    """The built shared object (for cuobjdump), or None before a successful load."""
    if _module is None or getattr(_module, "__file__", None) is None:
        return None
    return Path(str(_module.__file__))


def _cheap_reason() -> str | None:
    """Reasons that need no compilation: torch, device, capability, nvcc."""
    try:
        import torch
    except Exception as exc:
        return f"torch not importable: {exc}"
    if torch.version.cuda is None:
        return "torch built without CUDA"
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < MIN_CAPABILITY:
        return f"compute capability {major}.{minor} < {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} required"
    if find_nvcc() is None:
        return "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    return None


def unavailable_reason() -> str | None:
    """Why the CUDA variants cannot run in this process, or None when they can. Never raises.

    Checks cheap facts first (torch, device, capability, nvcc) and only then builds, so on a CPU machine
    the answer costs no compilation.
    """
    try:
        reason = _cheap_reason()
        if reason is not None:
            return reason
        if _build_error is not None:
            return _build_error
        try:
            load()
        except Exception:
            return _build_error or "build failed"
        return None
    except Exception as exc:  # the contract is "never raises"
        return f"CUDA kernels unavailable: {type(exc).__name__}: {exc}"


def cuda_scalar(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """One warp per query row, online softmax in fp32: the slow, obviously correct baseline."""
    return load().scalar(q, k, v, bool(causal))


def cuda_tiled(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """Shared-memory K/V tiles, warp-shuffle reductions, 16-byte loads, CUDA-core math."""
    return load().tiled(q, k, v, bool(causal))


def cuda_wmma(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """Tensor cores (mma.sync m16n8k16) for QK^T and PV, cp.async double buffering, swizzled smem."""
    return load().wmma(q, k, v, bool(causal))


def cuda_splitkv(q: Any, k: Any, v: Any, causal: bool, num_splits: int = -1) -> Any:
    """KV chunks in parallel CTAs with fp32 partials merged by a combine kernel; num_splits <= 0 picks one."""
    return load().splitkv(q, k, v, bool(causal), int(num_splits))


def splitkv_num_splits(q: Any, causal: bool, num_splits: int = -1) -> int:
    """The number of KV splits ``cuda_splitkv`` uses for q's shape on q's device."""
    return int(load().splitkv_num_splits(q, bool(causal), int(num_splits)))


VARIANTS = {
    "cuda_scalar": cuda_scalar,
    "cuda_tiled": cuda_tiled,
    "cuda_wmma": cuda_wmma,
    "cuda_splitkv": cuda_splitkv,
}


# --- standalone compile check -------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelResources:
    """ptxas' resource report for one kernel (entry function) on one architecture."""

    name: str
    mangled: str
    registers: int
    spill_stores: int
    spill_loads: int
    smem_bytes: int  # static shared memory only; dynamic smem is set at launch and not seen by ptxas
    stack_bytes: int

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


@dataclass(frozen=True)
class CompileReport:
    """Outcome of compiling one .cu file for one architecture with ``-Xptxas -v``."""

    source: Path
    arch: str
    ok: bool
    returncode: int
    command: list[str]
    log: str
    seconds: float
    kernels: list[KernelResources] = field(default_factory=list)

    @property
    def spilling(self) -> list[KernelResources]:
        return [kr for kr in self.kernels if kr.spills]

    def table(self) -> str:
        """Plain-text resource table, one kernel per line."""
        lines = [f"{self.source.name} [{self.arch}] {'ok' if self.ok else 'FAILED'} in {self.seconds:.1f}s"]
        for kr in self.kernels:
            lines.append(
                f"  regs={kr.registers:3d} spill_st={kr.spill_stores:4d} spill_ld={kr.spill_loads:4d} "
                f"smem={kr.smem_bytes:6d} stack={kr.stack_bytes:4d}  {kr.name}"
            )
        return "\n".join(lines)


_RE_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_RE_PROPS = re.compile(r"Function properties for (\S+)")
_RE_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_RE_USED = re.compile(r"Used (\d+) registers")
_RE_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> list[tuple[str, int, int, int, int, int]]:
    """(mangled name, registers, spill stores, spill loads, smem, stack) per entry function in a ptxas -v log."""
    props: dict[str, tuple[int, int, int]] = {}
    used: dict[str, tuple[int, int]] = {}
    order: list[str] = []
    entry: str | None = None
    props_for: str | None = None
    for line in log.splitlines():
        if m := _RE_ENTRY.search(line):
            entry = m.group(1)
            if entry not in order:
                order.append(entry)
            continue
        if m := _RE_PROPS.search(line):
            props_for = m.group(1)
            continue
        if (m := _RE_STACK.search(line)) and props_for is not None:
            props[props_for] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            continue
        if (m := _RE_USED.search(line)) and entry is not None:
            sm = _RE_SMEM.search(line)
            used[entry] = (int(m.group(1)), int(sm.group(1)) if sm else 0)
    rows = []
    for name in order:
        stack, st, ld = props.get(name, (0, 0, 0))
        regs, smem = used.get(name, (0, 0))
        rows.append((name, regs, st, ld, smem, stack))
    return rows


def ptxas_log_for(log: str, arch: str) -> str:
    """The lines of a ptxas -v log about ``arch`` (``sm_90``): from each "Compiling entry function ... for
    'sm_90'" line to the next entry line of another architecture, as one nvcc call for several writes them."""
    kept: list[str] = []
    current: str | None = None
    for line in log.splitlines():
        if m := _RE_ENTRY.search(line):
            current = m.group(2)
        if current == arch:
            kept.append(line)
    return "\n".join(kept)


def _demangle(names: list[str]) -> list[str]:
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if tool is None or not names:
        return names
    try:
        out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=30)
        lines = out.stdout.splitlines()
        return lines if len(lines) == len(names) else names
    except (OSError, subprocess.SubprocessError):
        return names


def nvcc_compile_check(arch: str, source: Path, nvcc: str | None = None, timeout_s: float = 600.0) -> CompileReport:
    """Compile ``source`` alone (``nvcc -c -O3 -Xptxas -v``) for ``arch`` into a temp dir; parse ptxas.

    Raises FileNotFoundError when nvcc is absent; a compile error is a report with ``ok=False`` and the log.
    """
    return nvcc_compile_checks([arch], source, nvcc, timeout_s)[0]


def nvcc_compile_checks(
    archs: Sequence[str], source: Path, nvcc: str | None = None, timeout_s: float = 600.0
) -> list[CompileReport]:
    """``nvcc_compile_check`` for several architectures in one nvcc call: one report per architecture, each
    with the whole log. nvcc compiles the host code once and the device code once per architecture."""
    nvcc_path = nvcc or find_nvcc()
    if nvcc_path is None:
        raise FileNotFoundError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    source = Path(source)
    with tempfile.TemporaryDirectory(prefix="perfguard-nvcc-") as tmp:
        cmd = [
            nvcc_path,
            "-c",
            *_NVCC_OPT_FLAGS,
            *_TORCH_NVCC_DEFINES,
            *(flag for arch in archs for flag in _gencode(arch)),
            "-Xptxas",
            "-v",
            "-I",
            str(source.parent),
            str(source),
            "-o",
            str(Path(tmp) / (source.stem + ".o")),
        ]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            returncode, log = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            partial = b"".join(x if isinstance(x, bytes) else x.encode() for x in (exc.stdout, exc.stderr) if x)
            returncode, log = -1, f"timed out after {timeout_s:.0f}s\n" + partial.decode(errors="replace")
        seconds = time.perf_counter() - start
    reports = []
    for arch in (f"sm_{_arch_digits(a)}" for a in archs):
        rows = parse_ptxas(ptxas_log_for(log, arch))
        names = _demangle([r[0] for r in rows])
        kernels = [
            KernelResources(
                name=n,
                mangled=r[0],
                registers=r[1],
                spill_stores=r[2],
                spill_loads=r[3],
                smem_bytes=r[4],
                stack_bytes=r[5],
            )
            for n, r in zip(names, rows, strict=True)
        ]
        reports.append(
            CompileReport(
                source=source,
                arch=arch,
                ok=returncode == 0,
                returncode=returncode,
                command=cmd,
                log=log,
                seconds=seconds,
                kernels=kernels,
            )
        )
    return reports
