"""Two recorded A/A runs of the guarded suite on H100s (2026-11-25, hosts 7 and 9 of
benchmarks/results/ab_2026-11-25), read from that record's raw archive: real head/base noise for the tests."""

from __future__ import annotations

import json
import tarfile
from functools import cache
from pathlib import Path
from typing import Any

RAW = Path(__file__).resolve().parents[2] / "benchmarks/results/ab_2026-11-25/raw_h100_mde.tar.xz"
RUNS = ("host7/aa_0.json", "host9/aa_0.json")


@cache
def records() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with tarfile.open(RAW) as archive:
        for name in RUNS:
            member = archive.extractfile(name)
            assert member is not None, name
            out += json.load(member)["results"]
    return out
