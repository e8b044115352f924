"""Cut a recorded run's raw archive down to what its summary's figures are computed from, so that the
repository keeps the evidence small: each results file keeps its cases' verdicts, times, intervals, ratios,
reasons and sample sizes (not their per-block times, checks or environment); each baseline becomes a CSV of
its processes' medians; JUnit XML and NVML traces go. Logs and small text files stay. The whole archive stays
in the commit that added it: name that commit in the summary.

    python benchmarks/slim_raw.py ARCHIVE.tar.xz [--out SLIM.tar.xz] [--keep FIELD ...]   (default: replace ARCHIVE)

`--keep` keeps more of each case, for archives that a test reads (e.g. `gates`, which
benchmarks/ab_campaign.py reads for the offset fit). `--no-group-ratios` also drops the A/B capture-group
ratios (most of an A/B results file), for an archive whose figures no test or script recomputes.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import lzma
import sys
import tarfile
from pathlib import Path
from typing import Any

# What a summary's figures read from a results file's cases.
KEEP = (
    "id",
    "verdict",
    "median_ns",
    "ci_ns",
    "ratio",
    "ratio_ci",
    "reasons",
    "notes",
    "disturbances",
    "blocks",
    "reps",
    "samples_per_block",
    "stop_reason",
    "mode",
    "elapsed_s",
    "case_s",
    "ab",
    "confirmation",
)
DROP_SUFFIXES = (".xml", "nvml_update.csv")
BIG_LOG = 64 << 10  # a log over this size keeps its perfguard lines and its last lines


def slim_results(doc: dict[str, Any], keep: tuple[str, ...] = KEEP, group_ratios: bool = True) -> dict[str, Any]:
    out = {k: v for k, v in doc.items() if k != "results"}
    out["results"] = [{k: r[k] for k in keep if k in r} for r in doc["results"]]
    if not group_ratios:
        for r in out["results"]:
            if isinstance(r.get("ab"), dict):
                r["ab"] = {k: v for k, v in r["ab"].items() if k not in ("group_ratios", "groups")}
    return out


def baseline_csv(doc: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["id", "process", "median_ns", "ratio", "against_ns", "aa_ratio", "date", "device", "unstable"])
    for case_id, entry in sorted(doc["cases"].items()):
        for i, s in enumerate(entry.get("samples") or []):
            w.writerow(
                [
                    case_id,
                    i + 1,
                    s.get("median_ns"),
                    s.get("ratio"),
                    s.get("against_ns"),
                    s.get("aa_ratio"),
                    s.get("date"),
                    s.get("device"),
                    entry.get("unstable"),
                ]
            )
    return buf.getvalue()


def slim_member(
    name: str, data: bytes, keep: tuple[str, ...] = KEEP, group_ratios: bool = True
) -> tuple[str, bytes] | None:
    """The slim form of one file of the archive: (name, bytes), or None to leave it out."""
    if name.endswith(DROP_SUFFIXES):
        return None
    if name.endswith(".json"):
        try:
            doc = json.loads(data)
        except ValueError:
            return name, data
        if isinstance(doc, dict) and isinstance(doc.get("results"), list):
            return name, json.dumps(slim_results(doc, keep, group_ratios), separators=(",", ":")).encode()
        if isinstance(doc, dict) and isinstance(doc.get("cases"), dict) and "device" in doc:
            return name[: -len(".json")] + "_processes.csv", baseline_csv(doc).encode()
        return name, data
    if name.endswith(".log") and len(data) > BIG_LOG:
        lines = data.decode(errors="replace").splitlines()
        kept = [line for line in lines if "perfguard:" in line] + ["[... cut ...]"] + lines[-40:]
        return name, "\n".join(kept).encode()
    return name, data


def slim(src: Path, dst: Path, keep: tuple[str, ...] = KEEP, group_ratios: bool = True) -> tuple[int, int]:
    """Write the slim archive, each case cut to `keep`; the sizes before and after."""
    members: list[tuple[str, bytes]] = []
    with tarfile.open(src, "r:xz") as tar:
        for info in tar.getmembers():
            if not info.isfile():
                continue
            f = tar.extractfile(info)
            if f is None:
                continue
            got = slim_member(info.name, f.read(), keep, group_ratios)
            if got is not None:
                members.append(got)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    before = src.stat().st_size
    dst.write_bytes(lzma.compress(raw.getvalue(), preset=9 | lzma.PRESET_EXTREME))
    return before, dst.stat().st_size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archive", type=Path)
    ap.add_argument("--out", type=Path, help="where to write (default: replace the archive)")
    ap.add_argument("--keep", action="append", default=[], help="a further field of each case to keep")
    ap.add_argument("--no-group-ratios", action="store_true", help="drop the A/B capture-group ratios too")
    args = ap.parse_args()
    before, after = slim(args.archive, args.out or args.archive, KEEP + tuple(args.keep), not args.no_group_ratios)
    print(f"{args.archive}: {before / 1e3:.0f} kB -> {after / 1e3:.0f} kB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
