#!/usr/bin/env bash
# What green means on a GPU host: the honest perf suite (tests/perf, 98 cases) recorded by the machine's first
# process, then guarded under CI=true several times. Every guard run should end green (exit 0) with each
# unverified case named; each run's results file says pass / fail / unverified per case (`decision`).
#
#   bash benchmarks/green_gpu.sh [OUT] [GUARDS]     # OUT default benchmarks/out/green_gpu, GUARDS default 2
#
# With BL=DIR the runs read that baseline folder, and with UPDATE=0 no update is made (more guards on a host
# whose baseline an earlier call recorded); XDIST=2 runs each pytest with `-n 2` (one worker per GPU).
# Writes OUT/host.txt (device, driver, torch, uptime), OUT/marks.txt (each run's exit status and wall time) and
# OUT/raw.tar.xz (each run's results JSON and log). Summarise with benchmarks/green_summary.py OUT.
set -u
OUT=${1:-benchmarks/out/green_gpu}
GUARDS=${2:-2}
mkdir -p "$OUT/raw"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# shellcheck disable=SC2207
PLUGIN=($(python benchmarks/_plugin.py))  # -p pytest_perfguard.plugin where the package is not installed
BL=${BL:-"$OUT/raw/baselines"}
# The plugin creates the baseline folder but not a missing parent (a mistyped path would create a tree); on a
# fresh machine the ignored benchmarks/out is not there yet, and an update would store nothing.
mkdir -p "$(dirname "$BL")"
XDIST=${XDIST:-0}
{
  date -u
  uptime
  nvidia-smi --query-gpu=name,uuid,driver_version,persistence_mode,clocks.max.sm --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  git rev-parse --short HEAD 2>/dev/null
} >"$OUT/host.txt" 2>&1

run() {
  local name=$1
  shift
  local t0=$SECONDS
  CI=true python -m pytest tests/perf "${PLUGIN[@]}" -p no:cacheprovider -q -n "$XDIST" --perfguard --perfguard-baseline-dir "$BL" \
    --perfguard-json "$OUT/raw/$name.json" "$@" >"$OUT/raw/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc wall=$((SECONDS - t0))s $(grep -h 'timed case(s):' "$OUT/raw/$name.log" | tail -n 1)" | tee -a "$OUT/marks.txt"
  tar -C "$OUT" -cJf "$OUT/raw.tar.xz" raw  # after every run: a call cut off at its limit keeps what ran
}

if [ "${UPDATE:-1}" != 0 ]; then
  run update --perfguard-update-baseline
fi
for i in $(seq "${FIRST:-1}" "$GUARDS"); do
  run "guard$i"
done
