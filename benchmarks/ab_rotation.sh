#!/usr/bin/env bash
# A/A in A/B mode (against HEAD: commit first) with and without the input-copy rotation, alternating, on one
# GPU: does spreading head and base over eight input copies shrink the per-process head/base offset of a
# kernel whose speed depends on where its data lies? Run from the repository root:
#   benchmarks/ab_rotation.sh ROUNDS [-k EXPR]
# Each round runs the arm without the rotation, then the arm with it (benchmarks/_ab_rotation.py), each a
# fresh pytest process without confirmation. Results go to OUT (default benchmarks/out/ab_rotation);
# `python benchmarks/ab_rotation_table.py OUT` prints each case's head/base ratios per arm.
set -uo pipefail
. "$(dirname "$0")/_suite.sh"
out=${OUT:-benchmarks/out/ab_rotation}
rounds=${1:-3}
shift || true
mkdir -p "$out"
export PYTHONUNBUFFERED=1
suite_device "$out"
for r in $(seq 1 "$rounds"); do
  for arm in off on; do
    [ "$arm" = on ] && export AB_ROTATION=1 || export AB_ROTATION=0
    suite_run "$out" "${arm}_$r" -p benchmarks._ab_rotation --perfguard --perfguard-against HEAD \
      --perfguard-no-confirm --perfguard-json="$out/${arm}_$r.json" "$@"
  done
done
