#!/usr/bin/env bash
# The guarded suite on a host with two or more GPUs: `-n 0` (one GPU) against `-n 2` (one worker per GPU),
# A/A in A/B mode (against HEAD: commit first, so that every case compares identical code), and a planted
# +5% judged both ways. Run from the repository root; steps in order, e.g. `aa1 aa2 aa3 plant`:
#   update  --perfguard-update-baseline with `-n 2`: the host's own baseline, with the A/A readings that give
#           each case its own A/B offset (policy.case_offset); the file is copied to OUT
#   aa<N>   one `-n 0` run, then one `-n 2` run, A/A against HEAD
#   plant   the +5% of benchmarks/_plant_kernel.py in triton_flash and cuda_wmma against HEAD, `-n 0` then
#           `-n 2`, no confirmation (the verdicts are compared case by case)
# Every run's results, log, junit XML and timeline (benchmarks/_timeline.py) go to OUT (default
# benchmarks/out/two_gpu), one line each in OUT/runs.txt. Every run reads and writes its baseline in BL (default
# benchmarks/out/two_gpu_bl, kept between calls as an ignored folder).
set -uo pipefail
. "$(dirname "$0")/_suite.sh"
out=${OUT:-benchmarks/out/two_gpu}
bl=${BL:-benchmarks/out/two_gpu_bl}
mkdir -p "$out" "$bl"
export PYTHONUNBUFFERED=1
suite_device "$out"
uptime > "$out/uptime.txt"
run() {  # name, pytest arguments...
  PERFGUARD_TIMELINE="$out/$1.timeline" suite_run "$out" "$1" -p benchmarks._timeline \
    --perfguard-json="$out/$1.json" --junitxml="$out/$1.xml" --perfguard-baseline-dir="$bl" "${@:2}"
}
for step in "$@"; do
  case $step in
    update) run update -n 2 --perfguard-update-baseline; cp "$bl"/*.json "$out/" ;;
    aa*)   for n in 0 2; do run "${step}_n$n" -n "$n" --perfguard --perfguard-against HEAD; done ;;
    plant) suite_plant_on "$out"
           for n in 0 2; do
             PLANT_VARIANTS=triton_flash,cuda_wmma PLANT_X=0.05 run "plant_n$n" -n "$n" --perfguard \
               --perfguard-against HEAD -k "triton_flash or cuda_wmma" --perfguard-no-confirm
           done
           suite_plant_off "$out" ;;
    *) echo "unknown step: $step" >&2; exit 2 ;;
  esac
done
python -m benchmarks._timeline "$out"/*.timeline > "$out/timeline.txt" 2>&1
