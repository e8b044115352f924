#!/usr/bin/env bash
# The guarded suite on a host with two or more GPUs: `-n 0` (one GPU) against `-n 2` (one worker per GPU),
# A/A in A/B mode (against HEAD: commit first, so that every case compares identical code), and a planted
# +5% judged both ways. Run from the repository root; steps in order, e.g. `build aa1 aa2 aa3 plant`:
#   update  --perfguard-update-baseline with `-n 2`: the host's own baseline, with the A/A readings that give
#           each case its own A/B offset (policy.case_offset); the file is copied to OUT
#   build   one A/B case per variant (`-n 0`, B1-H1-S128), no confirmation: builds the tree's and the base
#           revision's CUDA extensions, so that the pairs after it all find them built (the first A/B run on a
#           fresh host builds them inside its first case: 23-57 s on 2026-11-27, which favours `-n 2` when
#           `-n 0` comes first)
#           (its verdicts are no A/A evidence: no fresh-process confirmation, so a per-process offset stands)
#   fresh   on a fresh host with no built extensions, before any other step: `-n 2` as the first A/B run
#           (both workers wait on the builds inside their first CUDA cases, as a fresh runner's first job
#           does), then `-n 0` and `-n 2` again on the built extensions, A/A against HEAD
#   aa<N>   one `-n 0` run, then one `-n 2` run, A/A against HEAD
#   plant   the +5% of benchmarks/_plant_kernel.py in triton_flash and cuda_wmma against HEAD, `-n 0` then
#           `-n 2`, no confirmation (the verdicts are compared case by case)
# Every run's results, log, junit XML and timeline (benchmarks/_timeline.py) go to OUT (default
# benchmarks/out/two_gpu), one line each in OUT/runs.txt, and each GPU's peak memory in OUT/memory.txt. Every
# run reads and writes its baseline in BL (default benchmarks/out/two_gpu_bl, kept between calls as an ignored
# folder).
set -uo pipefail
. "$(dirname "$0")/_suite.sh"
out=${OUT:-benchmarks/out/two_gpu}
bl=${BL:-benchmarks/out/two_gpu_bl}
mkdir -p "$out" "$bl"
export PYTHONUNBUFFERED=1
suite_device "$out"
uptime > "$out/uptime.txt"
run() {  # name, pytest arguments...
  # GPU memory in use, every 0.5 s while the run lasts: its peak per GPU goes to OUT/memory.txt
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits -lms 500 \
    > "$out/$1.smi" 2>/dev/null &
  local smi=$!
  PERFGUARD_TIMELINE="$out/$1.timeline" suite_run "$out" "$1" -p benchmarks._timeline \
    --perfguard-json="$out/$1.json" --junitxml="$out/$1.xml" --perfguard-baseline-dir="$bl" "${@:2}"
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  awk -F', *' -v run="$1" '$2 + 0 > peak[$1] { peak[$1] = $2 + 0; total[$1] = $3 }
    END { for (g in peak) printf "%s: cuda:%s peak %d of %d MiB\n", run, g, peak[g], total[g] }' \
    "$out/$1.smi" | sort | tee -a "$out/memory.txt"
}
for step in "$@"; do
  case $step in
    update) run update -n 2 --perfguard-update-baseline; cp "$bl"/*.json "$out/" ;;
    build) run build -n 0 --perfguard --perfguard-against HEAD --perfguard-no-confirm -k "B1-H1-S128" ;;
    fresh) for name in first_n2 built_n0 built_n2; do
             run "$name" -n "${name: -1}" --perfguard --perfguard-against HEAD
           done ;;
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
