"""The usual cut of a raw archive (benchmarks/slim_raw.py) and the A/B rotation table's per-process ratio
(benchmarks/ab_rotation_table.py), on archives built here."""

from __future__ import annotations

import csv
import io
import json
import math
import tarfile
from pathlib import Path

from benchmarks.ab_rotation_table import process_ratios
from benchmarks.slim_raw import BIG_LOG, KEEP, slim

RESULT = {
    "id": "tests/perf/test_attention.py::test_attention_grid[cuda_scalar-B8-H8-S256]",
    "verdict": "regressed",
    "median_ns": 233_000.0,
    "ci_ns": [232_000.0, 234_000.0],
    "reasons": ["time vs base revision +3.1%"],
    "ab": {"against": "HEAD", "sha": "abc", "group_ratios": [1.03, 1.032], "groups": [0, 0, 1, 1]},
    "variant_blocks": [233_000.0] * 40,
    "against_blocks": [7_000.0] * 40,
    "correctness": {"max_abs": 1e-3, "details": "x" * 500},
    "env": {"torch": "2.11.0"},
}
BASELINE = {
    "schema_version": 3,
    "device": {"slug": "nvidia-h100-80gb-hbm3", "name": "NVIDIA H100 80GB HBM3"},
    "cases": {
        "t::a": {
            "unstable": False,
            "samples": [
                {"median_ns": 10.0, "ratio": 1.5, "against_ns": 6.7, "aa_ratio": None, "date": "d", "device": "u"},
                {"median_ns": 11.0, "ratio": 1.6, "against_ns": 6.9, "aa_ratio": 1.001, "date": "d", "device": "u"},
            ],
        }
    },
}


def _archive(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _read(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:xz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_the_cut_keeps_what_figures_read_and_drops_the_rest(tmp_path: Path) -> None:
    lines = [f"line {i}" for i in range(20_000)]
    log = "\n".join([*lines[:10_000], "perfguard: baseline written", *lines[10_000:]]).encode()
    assert len(log) > BIG_LOG
    src = tmp_path / "raw.tar.xz"
    _archive(
        src,
        {
            "host/guard1.json": json.dumps({"summary": {"failed": 1}, "results": [RESULT]}).encode(),
            "host/baseline.json": json.dumps(BASELINE).encode(),
            "host/guard1.xml": b"<testsuite/>",
            "host/nvml_update.csv": b"t,clock\n0,1980\n",
            "host/runs.txt": b"guard1: rc=1\n",
            "host/update.log": log,
        },
    )
    before, after = slim(src, tmp_path / "slim.tar.xz")
    assert after < before
    got = _read(tmp_path / "slim.tar.xz")
    assert sorted(got) == ["host/baseline_processes.csv", "host/guard1.json", "host/runs.txt", "host/update.log"]
    doc = json.loads(got["host/guard1.json"])
    assert doc["summary"] == {"failed": 1}
    (r,) = doc["results"]
    assert r["ab"]["group_ratios"] == [1.03, 1.032] and r["verdict"] == "regressed" and r["ci_ns"] == RESULT["ci_ns"]
    assert not {"variant_blocks", "against_blocks", "correctness", "env"} & set(r)
    rows = list(csv.DictReader(io.StringIO(got["host/baseline_processes.csv"].decode())))
    assert [(x["id"], x["process"], x["median_ns"], x["aa_ratio"]) for x in rows] == [
        ("t::a", "1", "10.0", ""),
        ("t::a", "2", "11.0", "1.001"),
    ]
    cut = got["host/update.log"].decode().splitlines()
    assert cut[0] == "perfguard: baseline written" and cut[-1] == "line 19999" and len(cut) == 42
    assert got["host/runs.txt"] == b"guard1: rc=1\n"


def test_a_deeper_cut_drops_the_group_ratios_and_a_test_s_archive_keeps_more(tmp_path: Path) -> None:
    src = tmp_path / "raw.tar.xz"
    _archive(src, {"host/aa.json": json.dumps({"results": [{**RESULT, "gates": [{"gate": "ab"}]}]}).encode()})
    slim(src, tmp_path / "deep.tar.xz", group_ratios=False)
    (r,) = json.loads(_read(tmp_path / "deep.tar.xz")["host/aa.json"])["results"]
    assert r["ab"] == {"against": "HEAD", "sha": "abc"} and r["verdict"] == "regressed" and "gates" not in r
    slim(src, tmp_path / "kept.tar.xz", (*KEEP, "gates"))
    (r,) = json.loads(_read(tmp_path / "kept.tar.xz")["host/aa.json"])["results"]
    assert r["gates"] == [{"gate": "ab"}] and r["ab"]["group_ratios"] == [1.03, 1.032]


def test_the_rotation_table_reads_a_process_s_head_base_as_its_groups_geometric_mean(tmp_path: Path) -> None:
    path = tmp_path / "off_1.json"
    other = {**RESULT, "id": "t::no_ab", "ab": None}
    path.write_text(json.dumps({"results": [RESULT, other]}))
    got = process_ratios(path)
    assert list(got) == ["test_attention_grid[cuda_scalar-B8-H8-S256]"]
    ratio, verdict = got["test_attention_grid[cuda_scalar-B8-H8-S256]"]
    assert ratio == math.sqrt(1.03 * 1.032) and verdict == "regressed"
