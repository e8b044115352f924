"""`perfguard bisect` on a real kernel slowdown hidden in a history of ordinary commits.

Method. The repository is copied into a scratch git repository whose first commit is GOOD. On top of it
go --commits commits (default 9): each edits a tracked file the way ordinary work does (the README, a
docstring in a benchmark), except commit --bad-at, which changes triton_flash's default tile for head
dim 64 to a slower configuration of the same kernel (half-width key tiles, no software pipelining): a real
code change, not a sleep. Then `perfguard bisect GOOD HEAD -k CASE tests/perf` runs in that repository,
and the script checks that it named the planted commit. Its output (each step's verdict with the A/B
change and CI, the first bad commit) is printed and kept under --out. With --explain it then runs
`perfguard explain -k CASE --against FIRST_BAD~1` at the first bad commit: Nsight Compute's diff of the
metrics that say why the kernel got slower.

Usage (GPU): PYTHONPATH=. python benchmarks/bisect_gpu.py --out DIR
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._output import DEFAULT_DIR  # noqa: E402
from benchmarks.ab_campaign import git, scratch_repo  # noqa: E402

SLOW_TILE = "64: (64, 32, 4, 1),"
CASE = "test_attention_grid and triton_flash and B8-H16-S4096"


def ordinary_change(repo: Path, i: int) -> str:
    """A harmless edit of a tracked file; returns the commit subject."""
    readme = repo / "README.md"
    readme.write_text(readme.read_text() + f"\n<!-- bisect scratch note {i} -->\n")
    return f"docs: note {i}"


def plant(repo: Path) -> str:
    """triton_flash's default D=64 tile becomes a slower one of the same kernel."""
    path = repo / "kernels" / "triton_flash.py"
    text = path.read_text()
    block = text[text.index("DEFAULT_CONFIGS: dict[int, TritonConfig] = {") :]
    block = block[: block.index("}") + 1]
    old = re.search(r"\n\s*64: \([^)]*\),", block)
    assert old is not None, "DEFAULT_CONFIGS has no D=64 entry: update the plant"
    new_block = block.replace(old.group(0), "\n    " + SLOW_TILE, 1)
    path.write_text(text.replace(block, new_block, 1))
    return "triton_flash: smaller key tiles, no pipelining for D=64"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_DIR / "bisect")
    ap.add_argument("--commits", type=int, default=9, help="commits after GOOD (at least 8)")
    ap.add_argument("--bad-at", type=int, default=6, help="which of them plants the slowdown (1-based)")
    ap.add_argument("-k", default=CASE, help="the case to bisect")
    ap.add_argument("--explain", action="store_true", help="then explain the first bad commit with ncu")
    args = ap.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    work, repo = scratch_repo("bisect-gpu-", "GOOD: the base")
    good = git(repo, "rev-parse", "HEAD").strip()
    planted = ""
    for i in range(1, args.commits + 1):
        subject = plant(repo) if i == args.bad_at else ordinary_change(repo, i)
        git(repo, "commit", "-qam", subject)
        if i == args.bad_at:
            planted = git(repo, "rev-parse", "HEAD").strip()
    log = git(repo, "log", "--oneline", f"{good}~0..HEAD")
    (out / "history.txt").write_text(log)
    print(log, flush=True)
    env = {**os.environ, "PYTHONPATH": str(repo), "PERFGUARD_CACHE_DIR": str(work / "cache")}
    cmd = [sys.executable, "-m", "pytest_perfguard.commands.cli", "bisect", good, "HEAD", "-k", args.k]
    cmd += ["--work-dir", str(out / "work"), "tests/perf"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    text = proc.stdout + proc.stderr
    (out / "bisect.log").write_text(text)
    print(text)
    named = re.search(r"^first bad commit: ([0-9a-f]+) ", text, re.MULTILINE)
    found = named.group(1) if named else None
    ok = proc.returncode == 0 and found is not None and planted.startswith(found)
    print(
        f"bisect over {args.commits} commits: exit {proc.returncode} in {wall:.0f} s; planted {planted[:12]}, "
        f"named {found or '-'}: {'RIGHT' if ok else 'WRONG'}"
    )
    if args.explain and found:
        git(repo, "checkout", "-q", "--detach", found)
        cmd = [
            sys.executable,
            "-m",
            "pytest_perfguard.commands.cli",
            "explain",
            "-k",
            args.k,
            "--against",
            f"{found}~1",
        ]
        proc = subprocess.run([*cmd, "tests/perf"], cwd=repo, env=env, capture_output=True, text=True)
        (out / "explain.log").write_text(proc.stdout + proc.stderr)
        print(proc.stdout + proc.stderr)
        print(f"explain: exit {proc.returncode}")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
