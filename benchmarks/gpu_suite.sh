#!/usr/bin/env bash
# The guarded suite on a GPU host, end to end: record a baseline, then guard against it in a fresh
# process (an A/A rerun: it must pass). Results, logs and the baseline go to OUTDIR (for example
# benchmarks/out/gpu_suite, which git ignores).
#   bash benchmarks/gpu_suite.sh OUTDIR [update|guard|both] [extra pytest args...]
set -uo pipefail
out=${1:?usage: gpu_suite.sh OUTDIR [update|guard|both] [pytest args...]}
what=${2:-both}
shift $(( $# >= 2 ? 2 : 1 ))
. "$(dirname "$0")/_suite.sh"
mkdir -p "$out" .ci/baselines
export PYTHONUNBUFFERED=1
status=0
if [ "$what" = update ] || [ "$what" = both ]; then
  suite_pytest --perfguard-update-baseline --perfguard-json "$out/update.json" "$@" 2>&1 | tee "$out/update.log"
  status=$(( status | PIPESTATUS[0] ))
fi
if [ "$what" = guard ] || [ "$what" = both ]; then
  suite_pytest --perfguard --perfguard-json "$out/guard.json" "$@" 2>&1 | tee "$out/guard.log"
  status=$(( status | PIPESTATUS[0] ))
fi
cp .ci/baselines/*.json "$out/" 2>/dev/null || true
exit "$status"
