#!/usr/bin/env bash
# The same verdicts before and after a change that should not move them (a restructuring), on one GPU host:
# the perf suite (tests/perf) recorded once by this tree, then guarded under CI=true by this tree and by the
# BEFORE tree (an exported earlier commit) against that baseline, and again against a copy of it with every
# stored time planted X faster (every kernel reads X slower), each pair back to back.
#
#   git archive REV | tar -x -C before     # the earlier commit's tree, beside this one
#   BEFORE=before bash benchmarks/same_verdicts_gpu.sh [OUT] [X]    # OUT default benchmarks/out/same_verdicts
#
# Runs benchmarks/green_gpu.sh of each tree (XDIST=2: one pytest worker per GPU of a two-GPU host).
# Writes OUT/head/ and OUT/before/ (host.txt, marks.txt, raw.tar.xz: each run's results JSON and log), the
# baseline under OUT/baselines and the planted copy under OUT/planted. Compare with
# benchmarks/same_verdicts.py OUT.
set -u
OUT=$(realpath -m "${1:-benchmarks/out/same_verdicts}")
PLANT=${2:-0.20}
BEFORE=${BEFORE:?set BEFORE to the folder of the earlier commit}
mkdir -p "$OUT"
export XDIST=${XDIST:-2}
guard() {  # TREE NAME BASELINE_DIR RUN_NUMBER
  (cd "$1" && UPDATE=0 BL="$3" FIRST="$4" bash benchmarks/green_gpu.sh "$OUT/$2" "$4")
}
BL="$OUT/baselines" bash benchmarks/green_gpu.sh "$OUT/head" 0  # the update alone
python benchmarks/plant_baseline.py write "$(ls "$OUT"/baselines/*.json)" "$OUT/planted" "$PLANT"
guard . head "$OUT/baselines" 1
guard "$BEFORE" before "$OUT/baselines" 1
guard . head "$OUT/planted" 2
guard "$BEFORE" before "$OUT/planted" 2
