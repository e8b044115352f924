#!/usr/bin/env bash
# The stored baseline on a freshly started GPU machine, as a user meets it (results:
# benchmarks/results/fresh_machine_2026-11-25/README.md).
#   record OUT   : the update as the machine's first process (3 processes by default)
#   guard OUT N  : N guard runs against that baseline
#   plant OUT X  : one guard run against the baseline with every stored time made X faster (a planted +X)
# The baseline lives in benchmarks/out/bl (ignored), so later calls on the same machine find it.
set -uo pipefail
phase=${1:?phase}; out=${2:?out dir}; arg=${3:-}
bl=benchmarks/out/bl; mkdir -p "$out" "$bl"
export PYTHONPATH=. PYTHONUNBUFFERED=1
run() {  # name, pytest arguments...
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  python -m pytest tests/perf -p pytest_perfguard.plugin -p no:cacheprovider -q "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc wall_s=$(python -c "import time; print(round(time.time()-$t0, 1))")" | tee -a "$out/marks.txt"
  tail -n 4 "$out/$name.log"
}
case $phase in
  record)
    python benchmarks/nvml_trace.py --out "$out/nvml.csv" --interval 0.2 & trace=$!
    run update --perfguard-update-baseline --perfguard-baseline-dir "$bl" --perfguard-json "$out/update.json"
    kill "$trace"; cp "$bl"/*.json "$out/baseline.json" ;;
  guard)
    for i in $(seq 1 "$arg"); do
      run "guard$i" --perfguard --perfguard-baseline-dir "$bl" --perfguard-json "$out/guard$i.json"
    done ;;
  plant)
    python benchmarks/plant_baseline.py write "$bl"/*.json "benchmarks/out/plant$arg" "$arg" > /dev/null
    run "plant$arg" --perfguard --perfguard-no-confirm --perfguard-baseline-dir "benchmarks/out/plant$arg" \
      --perfguard-json "$out/plant$arg.json"
    python benchmarks/plant_baseline.py summarize "$out/plant$arg.json" "$arg" | head -n 12 ;;
esac
