#!/usr/bin/env bash
# A neighbour on the GPU during a guard (issue: an undecided verdict is not a pass). Against a baseline folder
# an earlier update recorded (BL), two guards of a few cases under CI=true:
#   idle  another process holds a CUDA context and does nothing: not a disturbance, so the cases are judged
#         as on a quiet GPU (expected: exit 0, every case decided);
#   busy  another process runs matmuls back to back (benchmarks/gpu_load.py): every case waits for it, is
#         measured again, and ends unverified naming the process (expected: exit 1, no case "pass" while
#         the load ran, the pid and name in the reasons).
#
#   BL=DIR bash benchmarks/neighbour_gpu.sh [OUT] [-k EXPRESSION]
#
# Writes OUT/neighbour_marks.txt and OUT/neighbour.tar.xz (each run's results JSON and log).
set -u
OUT=${1:-benchmarks/out/neighbour_gpu}
K=${2:-"B1-H1-S128 and (sdpa or triton_flash)"}
: "${BL:?BL: the baseline folder an update recorded}"
mkdir -p "$OUT/neighbour"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# shellcheck disable=SC2207
PLUGIN=($(python benchmarks/_plugin.py))

guard() {
  local name=$1
  local t0=$SECONDS
  CI=true python -m pytest tests/perf "${PLUGIN[@]}" -p no:cacheprovider -q -k "$K" --perfguard \
    --perfguard-baseline-dir "$BL" --perfguard-json "$OUT/neighbour/$name.json" >"$OUT/neighbour/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc wall=$((SECONDS - t0))s $(grep -h 'timed case(s):' "$OUT/neighbour/$name.log" | tail -n 1)" |
    tee -a "$OUT/neighbour_marks.txt"
  tar -C "$OUT" -cJf "$OUT/neighbour.tar.xz" neighbour
}

python -c "import sys, time, torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize(); time.sleep(3600)" &
idle=$!
sleep 5
guard idle
kill "$idle" 2>/dev/null
wait "$idle" 2>/dev/null

python benchmarks/gpu_load.py --device cuda:0 &
busy=$!
sleep 5
guard busy
kill "$busy" 2>/dev/null
wait "$busy" 2>/dev/null
