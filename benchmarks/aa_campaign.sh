#!/usr/bin/env bash
# An A/A campaign on one GPU host: record a fresh baseline over UPDATES update runs (separate processes),
# then run the guard in fresh processes until SECONDS have passed. Nothing changes between the runs, so
# every "regressed" verdict in a guard run is a false alarm. Several calls can share one campaign: with
# UPDATES=0 the call only adds guard runs against the baseline in .ci/baselines/.
#   [AA_START=K] bash benchmarks/aa_campaign.sh OUTDIR UPDATES SECONDS [pytest args...]
# OUTDIR: for example benchmarks/out/aa (git ignores benchmarks/out/).
# Then: python benchmarks/aa_rejudge.py OUTDIR/<device>.json OUTDIR/aa_{1..N}.json  (numeric order: the
# fresh-process confirmation is modelled by pairing run i with run i+1)
set -uo pipefail
out=${1:?usage: aa_campaign.sh OUTDIR UPDATES SECONDS [pytest args...]}
updates=${2:?UPDATES}
budget=${3:?SECONDS}
shift 3
mkdir -p "$out" .ci/baselines
export PYTHONUNBUFFERED=1
start=$SECONDS
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} >> "$out/device.txt" 2>&1
run() {  # run NAME pytest-args...
  local name=$1; shift
  local t0=$SECONDS
  python -m pytest tests/perf -p no:cacheprovider -q --perfguard-json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name: rc=$? $(tail -1 "$out/$name.log") [$((SECONDS - t0)) s]" | tee -a "$out/campaign.txt"
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
