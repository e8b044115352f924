"""The suite's fork server (tests/forkserver.py): a process started through it is the process that was asked
for - its arguments, folder, environment, streams, exit status and signals - or a new interpreter where a
fork could not be that process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import forkserver

pytestmark = pytest.mark.skipif(
    not os.environ.get(forkserver.SOCKET_ENV) or os.environ.get(forkserver.SWITCH_ENV) == "0",
    reason="the fork server is off in this session (a GPU host, or PERFGUARD_TEST_FORKSERVER=0)",
)

PROBE = textwrap.dedent(
    """
    import json, os, sys
    print(json.dumps({
        "forked": "torch" in sys.modules,  # a new interpreter has imported nothing yet
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "marker": os.environ.get("PROBE_MARKER"),
        "gone": "PROBE_GONE" in os.environ,
        "path0": sys.path[0],
        "extra": [p for p in sys.path if p.endswith("extra-path")],
        "stdin": sys.stdin.read(),
        "umask": os.umask(0),
        "cpus": sorted(os.sched_getaffinity(0)),
    }))
    sys.stderr.write("to stderr\\n")
    sys.exit(int(sys.argv[-1]))
    """
)


def _run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PROBE_MARKER": "here", "PYTHONPATH": str(tmp_path / "extra-path"), **env}
    full.pop("PROBE_GONE", None)
    return subprocess.run(
        [sys.executable, *args], cwd=tmp_path, env=full, input="from stdin", capture_output=True, text=True, timeout=60
    )


def test_a_forked_process_is_the_process_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.setenv("PROBE_GONE", "1")  # set here, removed from the child's environment
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "extra-path").mkdir()
    (tmp_path / "probemod.py").write_text(PROBE)
    old = os.umask(0o027)
    try:
        runs = {
            "-c": _run(["-c", PROBE, "a", "3"], tmp_path),
            "script": _run([str(tmp_path / "probe.py"), "a", "4"], tmp_path),
            "-m": _run(["-m", "probemod", "a", "5"], tmp_path),
            "-mjoined": _run(["-mprobemod", "a", "6"], tmp_path),
        }
    finally:
        os.umask(old)
    path0 = {"-c": "", "script": str(tmp_path), "-m": str(tmp_path), "-mjoined": str(tmp_path)}
    for (how, proc), code in zip(runs.items(), (3, 4, 5, 6), strict=True):
        assert proc.returncode == code, (how, proc.stderr)
        assert proc.stderr == "to stderr\n", how
        got = json.loads(proc.stdout)
        assert got["forked"], how
        assert got["argv"][1:] == ["a", str(code)], (how, got["argv"])
        assert got["cwd"] == str(tmp_path) and got["path0"] == path0[how], (how, got)
        assert (got["marker"], got["gone"], got["stdin"]) == ("here", False, "from stdin"), how
        assert got["extra"] == [str(tmp_path / "extra-path")], how
        assert got["umask"] == 0o027 and got["cpus"] == sorted(os.sched_getaffinity(0)), how
    assert json.loads(runs["script"].stdout)["argv"][0] == str(tmp_path / "probe.py")


def test_what_a_fork_cannot_be_runs_in_a_new_interpreter(tmp_path: Path) -> None:
    """An interpreter option, or a variable torch reads when imported that differs from the server's."""
    import json

    (tmp_path / "extra-path").mkdir()
    for args, env in ((["-E", "-c", PROBE, "0"], {}), (["-c", PROBE, "0"], {"OMP_NUM_THREADS": "3"})):
        proc = _run(args, tmp_path, **env)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["forked"] is False, args


def test_forks_do_not_all_share_one_hash_seed(tmp_path: Path) -> None:
    """New interpreters draw a hash seed each; two workers that iterate a set must be able to disagree."""
    seeds = {
        _run(["-c", "import sys; print(hash('perfguard'), 'torch' in sys.modules)"], tmp_path).stdout for _ in range(20)
    }
    assert len(seeds) == 2 and all(seed.endswith(" True\n") for seed in seeds), seeds


def _tallied() -> tuple[int, int]:
    """The session's starts so far, and how many were forks (forkserver.tally's line)."""
    found = re.search(r"(\d+) Python starts, (\d+) of them forks", forkserver.tally())
    assert found, forkserver.tally()
    return int(found[1]), int(found[2])


def test_the_tally_counts_forks_and_new_interpreters(tmp_path: Path) -> None:
    """The session's last line says how its processes started: each start counts, a fork as a fork."""
    starts, forks = _tallied()
    assert _run(["-c", "pass"], tmp_path).returncode == 0  # a fork
    assert _run(["-E", "-c", "pass"], tmp_path).returncode == 0  # an option a fork cannot take: a new interpreter
    now, now_forks = _tallied()  # the other xdist worker's starts may count too
    assert now >= starts + 2 and now_forks >= forks + 1 and now - now_forks >= starts - forks + 1


def test_an_uncaught_exception_is_printed_and_exits_1(tmp_path: Path) -> None:
    proc = _run(["-c", "raise ValueError('boom')"], tmp_path)
    assert proc.returncode == 1 and "ValueError: boom" in proc.stderr


def test_files_left_open_are_flushed_at_exit(tmp_path: Path) -> None:
    """The fork skips the interpreter's teardown; a file its program never closed still gets its data."""
    target = tmp_path / "left-open.txt"
    code = f"f = open({str(target)!r}, 'w'); f.write('kept'); import atexit; atexit.register(print, 'atexit ran')"
    proc = _run(["-c", code], tmp_path)
    assert proc.returncode == 0 and proc.stdout == "atexit ran\n"
    assert target.read_text() == "kept"


def test_a_signal_to_the_launcher_reaches_the_process(tmp_path: Path) -> None:
    code = "import time\ntry:\n    print('ready', flush=True); time.sleep(60)\nexcept KeyboardInterrupt:\n    exit(7)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 7


def test_a_killed_launcher_takes_its_process_with_it(tmp_path: Path) -> None:
    """A timeout kills the process it started (the launcher): the fork must not run on."""
    code = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(120)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    assert pid != proc.pid  # the fork, not the launcher
    proc.kill()
    proc.wait(10)
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the fork outlived its launcher"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
