#!/usr/bin/env bash
# What the first processes on a freshly started GPU machine measure, with NVML sampled throughout.
# Process 1 records a baseline (as a user's first job of the day would), processes 2..N guard against it.
# Each process's results (pI.json), log and line in OUT_DIR/runs.txt (its start in seconds from the
# script's start, the time axis of nvml.csv); benchmarks/_suite.sh runs them.
# Usage: benchmarks/fresh_machine.sh OUT_DIR N_PROCESSES [pytest -k expression]
set -uo pipefail
out=${1:?out dir}; n=${2:-3}; sel=${3:-}
SUITE_T0=$(date +%s.%N)
. "$(dirname "$0")/_suite.sh"
mkdir -p "$out"; bl=$(mktemp -d)
nvidia-smi -q -d PERFORMANCE,CLOCK,POWER > "$out/smi_start.txt" 2>&1
python benchmarks/nvml_trace.py --out "$out/nvml.csv" --interval 0.1 --t0 "$SUITE_T0" & trace=$!
args=(--perfguard-baseline-dir "$bl")
[ -n "$sel" ] && args+=(-k "$sel")
for i in $(seq 1 "$n"); do
  if [ "$i" -eq 1 ]; then mode=(--perfguard-update-baseline); else mode=(--perfguard); fi
  suite_run "$out" "p$i" "${args[@]}" "${mode[@]}" --perfguard-json "$out/p$i.json"
done
kill "$trace"; wait "$trace" 2>/dev/null
nvidia-smi -q -d PERFORMANCE,CLOCK,POWER > "$out/smi_end.txt" 2>&1
tail -n 3 "$out"/p*.log
