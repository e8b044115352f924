#!/usr/bin/env bash
# What the first processes on a freshly started GPU machine measure, with NVML sampled throughout.
# Process 1 records a baseline (as a user's first job of the day would), processes 2..N guard against it.
# Usage: benchmarks/fresh_machine.sh OUT_DIR N_PROCESSES [pytest -k expression]
set -uo pipefail
out=${1:?out dir}; n=${2:-3}; sel=${3:-}
mkdir -p "$out"; bl=$(mktemp -d)
t0=$(date +%s.%N)
nvidia-smi -q -d PERFORMANCE,CLOCK,POWER > "$out/smi_start.txt" 2>&1
python benchmarks/nvml_trace.py --out "$out/nvml.csv" --interval 0.1 --t0 "$t0" & trace=$!
args=(tests/perf -p pytest_perfguard.plugin -p no:cacheprovider --perfguard-baseline-dir "$bl")
[ -n "$sel" ] && args+=(-k "$sel")
for i in $(seq 1 "$n"); do
  echo "process $i start $(python -c "import time; print(round(time.time()-$t0, 3))")" >> "$out/marks.txt"
  if [ "$i" -eq 1 ]; then mode=(--perfguard-update-baseline); else mode=(--perfguard); fi
  PYTHONPATH=. python -m pytest "${args[@]}" "${mode[@]}" --perfguard-json "$out/p$i.json" > "$out/p$i.log" 2>&1
  echo "process $i end rc=$? $(python -c "import time; print(round(time.time()-$t0, 3))")" >> "$out/marks.txt"
done
kill "$trace"; wait "$trace" 2>/dev/null
nvidia-smi -q -d PERFORMANCE,CLOCK,POWER > "$out/smi_end.txt" 2>&1
cat "$out/marks.txt"; tail -n 3 "$out"/p*.log
