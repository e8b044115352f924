"""Where the benchmark scripts write raw output: benchmarks/out/ (ignored by git) unless given a path.

A recorded run is summarised by hand in benchmarks/results/; its raw files never land in the source tree
by default.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parent / "out"


def output_paths(name: str, given: Path | str | None = None) -> list[Path]:
    """Where to write the raw file ``name``: the given path and ``$PERFGUARD_RESULTS_DIR/name`` when set,
    ``benchmarks/out/name`` when neither is. Parent folders are created."""
    paths = [Path(given)] if given else []
    env_dir = os.environ.get("PERFGUARD_RESULTS_DIR")
    if env_dir:
        paths.append(Path(env_dir) / name)
    if not paths:
        paths.append(DEFAULT_DIR / name)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
    return paths
