#!/usr/bin/env bash
# An A/A campaign on one GPU host: record a fresh baseline over UPDATES update runs (separate processes),
# then run the guard in fresh processes until SECONDS have passed. Nothing changes between the runs, so
# every "regressed" verdict in a guard run is a false alarm. Several calls can share one campaign: with
# UPDATES=0 the call only adds guard runs against the baseline in .ci/baselines/.
#   [AA_START=K] bash benchmarks/aa_campaign.sh OUTDIR UPDATES SECONDS [pytest args...]
# OUTDIR: for example benchmarks/out/aa (git ignores benchmarks/out/). Each run's results, its log and a
# line in OUTDIR/runs.txt (benchmarks/_suite.sh); the baseline is copied to OUTDIR at the end.
# Then: python benchmarks/aa_rejudge.py OUTDIR/<device>.json OUTDIR/aa_{1..N}.json  (numeric order: the
# fresh-process confirmation is modelled by pairing run i with run i+1)
set -uo pipefail
out=${1:?usage: aa_campaign.sh OUTDIR UPDATES SECONDS [pytest args...]}
updates=${2:?UPDATES}
budget=${3:?SECONDS}
shift 3
. "$(dirname "$0")/_suite.sh"
mkdir -p "$out" .ci/baselines
export PYTHONUNBUFFERED=1
start=$SECONDS
suite_device "$out"
run() {  # NAME pytest-args...: one run; pytest exit codes above 1 (interrupted, internal or usage error,
  # no tests collected) end the campaign rather than repeat the same failure until SECONDS are spent
  suite_run "$out" "$1" --perfguard-json "$out/$1.json" "${@:2}"
  local rc=$?
  if (( rc > 1 )); then
    echo "aa_campaign.sh: $1 ended with pytest exit code $rc, not a verdict; see $out/$1.log. Campaign stopped." >&2
    exit "$rc"
  fi
}
if (( updates > 0 )); then
  rm -f .ci/baselines/*.json  # a fresh baseline for this machine, not folded into another machine's
  for i in $(seq 1 "$updates"); do
    run "update_$i" --perfguard-update-baseline "$@"
  done
fi
cp .ci/baselines/*.json "$out/"
n=${AA_START:-0}  # number guard runs on from here when a campaign spans several calls
last=60
while (( SECONDS - start + last + 15 < budget )); do
  n=$((n + 1))
  t0=$SECONDS
  run "aa_$n" --perfguard "$@"
  last=$((SECONDS - t0))
done
