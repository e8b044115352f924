#!/usr/bin/env bash
# The stored baseline across freshly started GPU hosts of one model (results:
# benchmarks/results/stored_baseline_h100_2026-11-26/README.md). Run from the repository root, steps in order:
#   cross<N>              guard against another host's baseline, copied beforehand into benchmarks/out/other
#   update                --perfguard-update-baseline (3 processes by default), NVML traced at 0.2 s
#   join                  a later update that adds its processes to the stored ones (--perfguard-join)
#   guard<N>              guard against this host's baseline
#   plant10 plant05       a real +10% / +5% in triton_flash and cuda_wmma (benchmarks/_plant_kernel.py:
#                         the variant, then a calibrated GPU spin), judged without confirmation
#   probe                 what graph replays read with and without the stream held (benchmarks/launch_hold.py)
#   poison                an update into benchmarks/out/bl_poisoned with a foreign GPU load (benchmarks/gpu_load.py)
#                         during its second process only: that process must be outvoted, re-measured or
#                         kept out as disturbed, and no entry stored slow (compare with the update step's)
#   pguard<N>             guard against the poisoned update's baseline
# The baseline lives in benchmarks/out/bl (ignored), so later calls on the same machine find it. Every run's
# results, log and junit XML go to OUT (default benchmarks/out/hosts), one line each in OUT/runs.txt
# (benchmarks/_suite.sh). CASES="-k EXPR" (EXPR without spaces) selects cases for every step.
set -uo pipefail
. "$(dirname "$0")/_suite.sh"
out=${OUT:-benchmarks/out/hosts}; bl=benchmarks/out/bl; other=benchmarks/out/other
mkdir -p "$out" "$bl"
export PYTHONUNBUFFERED=1
suite_device "$out"
uptime > "$out/uptime.txt"
run() {  # name, pytest arguments...
  # shellcheck disable=SC2086  # CASES is "-k EXPR" or empty: split on purpose
  suite_run "$out" "$1" --perfguard-json="$out/$1.json" --junitxml="$out/$1.xml" ${CASES:-} "${@:2}"
}
plant() {  # name x
  suite_plant_on "$out"
  PLANT_VARIANTS=triton_flash,cuda_wmma PLANT_X=$2 run "$1" --perfguard --perfguard-baseline-dir="$bl" \
    -k "triton_flash or cuda_wmma" --perfguard-no-confirm
  suite_plant_off "$out"
}
for step in "$@"; do
  case $step in
    update) python benchmarks/nvml_trace.py --out "$out/nvml_update.csv" --interval 0.2 --t0 "$SUITE_T0" & trace=$!
            run update --perfguard-update-baseline --perfguard-baseline-dir="$bl"; kill "$trace"
            cp "$bl"/*.json "$out/baseline.json" ;;
    join)   run join --perfguard-update-baseline --perfguard-join --perfguard-baseline-dir="$bl"
            cp "$bl"/*.json "$out/baseline_joined.json" ;;
    guard*) run "$step" --perfguard --perfguard-baseline-dir="$bl" ;;
    pguard*) run "$step" --perfguard --perfguard-baseline-dir=benchmarks/out/bl_poisoned ;;
    cross*) run "$step" --perfguard --perfguard-baseline-dir="$other" ;;
    plant10) plant plant10 0.10 ;;
    plant05) plant plant05 0.05 ;;
    poison) mkdir -p benchmarks/out/bl_poisoned
            run poison --perfguard-update-baseline --perfguard-baseline-dir=benchmarks/out/bl_poisoned & update=$!
            until grep -q "update process 2 of" "$out/poison.log" 2>/dev/null || ! kill -0 "$update" 2>/dev/null; do
              sleep 0.5; done
            python benchmarks/gpu_load.py > "$out/gpu_load.log" 2>&1 & load=$!
            echo "poison: load on at $(_suite_since "$SUITE_T0")s" | tee -a "$out/runs.txt"
            until grep -q "update process 3 of\|re-measurement of" "$out/poison.log" 2>/dev/null \
                || ! kill -0 "$update" 2>/dev/null; do sleep 0.5; done
            kill "$load"; wait "$load"
            echo "poison: load off at $(_suite_since "$SUITE_T0")s" | tee -a "$out/runs.txt"
            wait "$update"
            cp benchmarks/out/bl_poisoned/*.json "$out/baseline_poisoned.json" ;;
    probe)  python benchmarks/launch_hold.py --json "$out/launch_hold.json" > "$out/probe.log" 2>&1
            echo "probe: rc=$?" | tee -a "$out/runs.txt" ;;
    *) echo "unknown step: $step" >&2; exit 2 ;;
  esac
done
