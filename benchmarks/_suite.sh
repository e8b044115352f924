# Sourced by the GPU shell scripts of benchmarks/: one pytest process over the guarded suite, run the same
# way by every script. The repository root is importable, the plugin is loaded as benchmarks/_plugin.py
# says (by module name only where it is not installed: loading it twice fails), and pytest caches nothing
# between processes.
#   . benchmarks/_suite.sh
#   suite_device OUT                    # GPU, driver and library versions, appended to OUT/device.txt
#   suite_run OUT NAME [pytest args]    # one process, its output in OUT/NAME.log, one line in OUT/runs.txt
#   suite_pytest [pytest args]          # the same process with its output on stdout
#   suite_plant_on OUT / suite_plant_off OUT   # kernels/__init__.py hooks benchmarks/_plant_kernel.py in while
#                                       # PLANT_VARIANTS is set (the original kept in OUT, put back on exit too)

SUITE_T0=${SUITE_T0:-$(date +%s.%N)}  # runs.txt gives each start in seconds from here (nvml_trace.py --t0)

suite_pytest() {
  local plugin
  plugin=$(python -m benchmarks._plugin) || return
  # shellcheck disable=SC2086  # $plugin is empty or "-p pytest_perfguard.plugin": split on purpose
  PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} python -m pytest tests/perf $plugin -p no:cacheprovider -q "$@"
}

_suite_since() {  # seconds from $1 (epoch seconds) to now, one decimal
  awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'
}

suite_run() {
  local out=$1 name=$2 start t0 rc last
  shift 2
  start=$(_suite_since "$SUITE_T0")
  t0=$(date +%s.%N)
  suite_pytest "$@" > "$out/$name.log" 2>&1
  rc=$?
  # the log's last non-blank line: pytest's summary, or the error that stopped it
  last=$(awk 'NF { line = $0 } END { print line }' "$out/$name.log")
  echo "$name: rc=$rc start=${start}s wall=$(_suite_since "$t0")s | $last" | tee -a "$out/runs.txt"
  return "$rc"
}

suite_device() {
  {
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,clocks.max.mem --format=csv
    python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  } >> "$1/device.txt" 2>&1
}

suite_plant_on() {
  cp kernels/__init__.py "$1/.kernels_init.py"
  # shellcheck disable=SC2064  # the folder is fixed now, on purpose
  trap "mv '$1/.kernels_init.py' kernels/__init__.py" EXIT
  printf '\nimport os as _os\nif _os.environ.get("PLANT_VARIANTS"):\n    import sys as _sys\n    _sys.path.insert(0, "benchmarks")\n    from _plant_kernel import plant as _plant\n\n    _plant(KERNELS)\n' >> kernels/__init__.py
}

suite_plant_off() {
  mv "$1/.kernels_init.py" kernels/__init__.py
  trap - EXIT
}
