#!/usr/bin/env bash
# The stored baseline on a freshly started GPU machine, as a user meets it (results:
# benchmarks/results/fresh_machine_2026-11-25/README.md).
#   record OUT   : the update as the machine's first process (3 processes by default)
#   guard OUT N  : N guard runs against that baseline
#   plant OUT X  : one guard run against the baseline with every stored time made X faster (a planted +X)
# The baseline lives in benchmarks/out/bl (ignored), so later calls on the same machine find it. Each run's
# results, log and line in OUT/runs.txt: benchmarks/_suite.sh.
set -uo pipefail
phase=${1:?phase}; out=${2:?out dir}; arg=${3:-}
. "$(dirname "$0")/_suite.sh"
bl=benchmarks/out/bl; mkdir -p "$out" "$bl"
export PYTHONUNBUFFERED=1
run() {  # name, pytest arguments...
  local name=$1; shift
  suite_run "$out" "$name" "$@"
  tail -n 4 "$out/$name.log"
}
case $phase in
  record)
    python benchmarks/nvml_trace.py --out "$out/nvml.csv" --interval 0.2 --t0 "$SUITE_T0" & trace=$!
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
