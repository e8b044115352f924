#!/usr/bin/env bash
# What a new user installs, checked as they meet it: the wheel alone in a fresh venv (no extras, CPU torch
# pinned as the README says), then `pytest --help`, the README's "Use it in your own project" install line
# and example exactly as written there, `perfguard --help`, `--version` and every subcommand's `--help`;
# then each extra with the command it exists for. The [dev] venv of .ci/run hides a missing dependency
# (scipy pulls numpy), so this venv has nothing but what the wheel declares.
#
# Usage: .ci/clean_install.sh [--with-extras]   (from anywhere; needs python3 and pip's index)
# .ci/run runs the base check only: the extras' installs (Apache Otava brings Google Cloud packages) more
# than doubled its time on a loaded 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
started=$SECONDS
extras=0
[ "${1:-}" = "--with-extras" ] && extras=1

work=$(mktemp -d "${TMPDIR:-/tmp}/perfguard-clean-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1
# The example's runs are local runs: under CI a guard run that compared nothing fails by design.
unset CI GITHUB_ACTIONS GITHUB_STEP_SUMMARY

step() { echo "== clean install: $* ($((SECONDS - started)) s)"; }

step "build the wheel"
python3 -m pip wheel -q --no-deps -w "$work/dist" "$repo" >"$work/wheel.log" 2>&1 || { cat "$work/wheel.log"; exit 1; }
wheel=$(ls "$work"/dist/pytest_perfguard-*.whl)

step "fresh venv; the README's install line with the wheel for /path/to/pytest-perfguard"
python3 -m venv "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
project="$work/project"
mkdir -p "$project"
python - "$repo/README.md" "$project" <<'EOF'
"""Copies the README's "Use it in your own project" install line and example, so the README cannot drift."""
import re
import sys
from pathlib import Path

text = Path(sys.argv[1]).read_text(encoding="utf-8")
section = text[text.index("## Use it in your own project") :]
section = section[: section.index("\n## ", 1)]
install = re.search(r"```bash\n(.*?)```", section, re.S)
example = re.search(r"```python\n(.*?)```", section, re.S)
if install is None or example is None:
    sys.exit("README.md: 'Use it in your own project' needs a ```bash install line and a ```python example")
if "torch==" not in install.group(1):
    sys.exit("README.md: the install line must pin torch (the CPU build) before the plugin")
Path(sys.argv[2], "install.sh").write_text(install.group(1), encoding="utf-8")
Path(sys.argv[2], "test_attention.py").write_text(example.group(1), encoding="utf-8")
EOF
sed -i "s#/path/to/pytest-perfguard#$wheel#g" "$project/install.sh"
cat "$project/install.sh"
# --no-compile: byte-compiling all of torch costs more than the checks; Python compiles what it imports.
PIP_NO_COMPILE=1 bash -euo pipefail "$project/install.sh" -q >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
python -m pip list --format=freeze | grep -iE '^(torch|numpy|pytest-perfguard)=' || true

cd "$project"
check() { # name, then the command; its output is shown only when it fails
  local name=$1
  shift
  if ! "$@" >"$work/out.txt" 2>&1; then
    cat "$work/out.txt"
    echo "clean install: FAILED: $name: $*" >&2
    exit 1
  fi
}

step "pytest --help with the plugin loaded"
check "pytest --help" python -m pytest --help
grep -q -- "--perfguard-ci-target" "$work/out.txt" || { echo "pytest --help does not list perfguard's options" >&2; exit 1; }

step "the README's example: correctness, then timed"
check "README example" python -m pytest -p no:cacheprovider test_attention.py -q
grep -qE "[0-9]+ passed" "$work/out.txt" || { cat "$work/out.txt"; echo "README example: nothing passed" >&2; exit 1; }
check "README example --perfguard" python -m pytest -p no:cacheprovider test_attention.py -q --perfguard \
  --perfguard-case-budget 0.2 --perfguard-json results.json
grep -q "perfguard:" "$work/out.txt" || { cat "$work/out.txt"; echo "no perfguard table" >&2; exit 1; }

step "perfguard --help, --version and every subcommand's --help"
check "perfguard --help" perfguard --help
check "perfguard --version" perfguard --version
commands=$(python -c '
import argparse
from pytest_perfguard.commands.cli import build_parser
sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
print(" ".join(sub.choices))')
for command in $commands; do
  check "perfguard $command --help" perfguard "$command" --help
done
check "perfguard validate" perfguard validate results.json

if [ "$extras" -eq 1 ]; then
  step "extra [report]: the HTML report"
  check "pip install [report]" python -m pip install -q --no-compile "$wheel[report]"
  check "perfguard report --html" perfguard report results.json --html report.html
  step "extra [plot] and [history]: the history, its change points and its plot"
  check "pip install [plot,history]" python -m pip install -q --no-compile "$wheel[plot,history]"
  check "perfguard history add" perfguard history add results.json --history h.sqlite \
    --sha 0123456789abcdef0123456789abcdef01234567 --commit-time 2026-01-01T00:00:00
  check "perfguard history changes" perfguard history changes --history h.sqlite
  check "perfguard history show --plot" perfguard history show --history h.sqlite --plot history.png
fi
deactivate
step "passed"
