"""Settings for this project's own test suite."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import forkserver

LOCK_DIR_ENV = "PERFGUARD_LOCK_DIR"

# One intra-op thread in this process and in every process it starts (xdist workers, pytester subprocesses,
# fresh confirmation processes, act jobs). The tensors here are tiny, and the suite keeps both cores of the
# CI machine busy: there torch's default of one OpenMP thread per core made a 16x16 attention reference
# take 16 ms of spinning threads instead of 72 us.
_ONE_THREAD = "OMP_NUM_THREADS" not in os.environ
if _ONE_THREAD:
    os.environ["OMP_NUM_THREADS"] = "1"

# Bytecode for the processes this suite starts that are new interpreters (the fork servers of
# tests/forkserver.py, act jobs, and every process where that is off: xdist workers, pytester subprocesses,
# fresh confirmation and update processes, a few hundred of them), each importing torch and the plugin. Where the
# environment sets PYTHONDONTWRITEBYTECODE (the machines this suite was profiled on do) over a venv that
# pip installed with --no-compile (.ci/run), no .pyc is ever written: each of them compiled torch's
# sources again, about 6 s of CPU an import instead of 2.5 s. Then the compiled files go to a folder of the
# suite's own, removed at its end, so nothing is written beside the sources; the first process to import
# a module compiles it for all the others.
PYCACHE_ENV = "PYTHONPYCACHEPREFIX"
_PYCACHE_DIR: str | None = None
if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get(PYCACHE_ENV):
    _PYCACHE_DIR = tempfile.mkdtemp(prefix="perfguard-test-pycache-")
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ[PYCACHE_ENV] = _PYCACHE_DIR
    sys.pycache_prefix = _PYCACHE_DIR
    sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def _not_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs these tests start are local runs unless a test says otherwise: under CI, a guard run that
    compared nothing fails (state.under_ci), and the CI machine running this suite sets CI=true."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)


def pytest_configure(config: pytest.Config) -> None:
    """On a host without an NVIDIA GPU, the Python processes this session starts are forks of one that
    imported torch (tests/forkserver.py); never in a run of the guarded suite alone (tests/perf, the main job),
    whose fresh processes are part of what it measures.

    The device and file locks of the runs this suite starts live in a folder of the suite's own (xdist
    workers inherit it), so they never wait on another pytest session of this machine, or it on them.

    The one intra-op thread is set here, in every process that runs tests, and not in an xdist controller,
    which runs none and imports no torch (measure/visible.py), tests/perf's included.
    """
    if not hasattr(config, "workerinput") and not _guarded_suite_only(config) and forkserver.start():
        config.add_cleanup(forkserver.stop)
    if _ONE_THREAD and (hasattr(config, "workerinput") or getattr(config.option, "dist", "no") == "no"):
        import torch

        torch.set_num_threads(1)
    if _PYCACHE_DIR is not None:  # set by this process (the xdist controller), not inherited
        pycache = _PYCACHE_DIR
        config.add_cleanup(lambda: shutil.rmtree(pycache, ignore_errors=True))
    if LOCK_DIR_ENV not in os.environ:
        folder = tempfile.mkdtemp(prefix="perfguard-test-locks-")
        os.environ[LOCK_DIR_ENV] = folder
        config.add_cleanup(lambda: (os.environ.pop(LOCK_DIR_ENV, None), shutil.rmtree(folder, ignore_errors=True)))


@pytest.fixture(autouse=True)
def _fresh_interpreter(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked ``fresh_interpreter`` starts new interpreters, not forks of the one that imported torch:
    it checks what a process does not import."""
    if request.node.get_closest_marker("fresh_interpreter") is not None:
        monkeypatch.setenv(forkserver.SWITCH_ENV, "0")


@pytest.fixture
def pytester(
    pytester: pytest.Pytester, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[pytest.Pytester]:
    """pytester, with two settings for its runs and what they start (fresh confirmation processes, xdist
    workers), set after pytester's own set-up, which clears PYTEST_ADDOPTS:

    - a device lock of the test's own: runs timed on a fake clock cannot disturb each other, and under the
      shared lock one test's timing would hold up the other xdist worker's. A test marked ``real_timer``
      keeps the suite's lock, so that it measures alone, as on a GPU;
    - no hypothesis pytest plugin: it imports hypothesis in its terminal summary, about 1.5 s of CPU per
      process, and again per in-process run, which unloads what the run imported. No run here uses it.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTEST_ADDOPTS", "-p no:hypothesispytest")
        if request.node.get_closest_marker("real_timer") is None:
            mp.setenv(LOCK_DIR_ENV, str(tmp_path_factory.mktemp("locks")))
        yield pytester


def _guarded_suite_only(config: pytest.Config) -> bool:
    """Whether every path the run was given lies in tests/perf."""
    perf = Path(__file__).parent / "perf"
    paths = [Path(config.invocation_params.dir, arg.split("::")[0]).resolve() for arg in config.args]
    return bool(paths) and all(path == perf or perf in path.parents for path in paths)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """How this session's Python processes were started (tests/forkserver.py), in its controller."""
    if not hasattr(config, "workerinput") and not _guarded_suite_only(config):
        terminalreporter.write_line(forkserver.tally())


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `-n N` with xdist's default distribution, let an idle worker take queued tests from a busy one.

    The slow tests sit together in a few modules (tests/test_plugin.py, tests/test_workflows.py). The
    default scheduler hands out large batches early, so at the end of a run one worker can hold minutes of
    them while the other has nothing left to do; work stealing (`--dist worksteal`) moves them.

    A run of the guarded suite alone (tests/perf) keeps xdist's own scheduler: it is the plugin's first
    user, and its timings on a multi-GPU host should be what a user's suite gets.
    """
    if config.getvalue("dist") != "load" or _guarded_suite_only(config):
        return None
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)


def pytest_collection_finish(session: pytest.Session) -> None:
    """In-process pytester runs restore sys.modules afterwards (to what it was when the test's pytester was
    made), dropping what they imported; so does a test's end. What must stay is imported once, here, before
    any pytester exists, in a process whose tests use it (tests/perf's never do, and it would cost each of
    its processes seconds of CPU):

    - torch._dynamo (which torch.manual_seed imports on first use) registers a TORCH_LIBRARY when imported
      and cannot be imported twice in one process;
    - the plugin's modules that it imports only when a case runs (an xdist controller never does): dropped
      after a run, a module stays an attribute of its package, and the next run's
      `from pytest_perfguard.run import timed` would patch that stale copy, not the one its cases use."""
    if any("pytester" in getattr(item, "fixturenames", ()) for item in session.items):
        import torch._dynamo  # noqa: F401

        import pytest_perfguard.run.runner  # noqa: F401


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker: the end-to-end tests (marked slow, those that run act first among them) before
    the others, each group in its own order. A worker runs the tests it is given in the order collected, and
    an idle one takes the queued tests of another from their end: with the long tests first, the last ones
    left are short, and neither core waits for the other through a minute-long test at the end of the run."""
    if not hasattr(config, "workerinput"):
        return

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("slow") is None:
            return 2
        return 0 if item.path.name == "test_workflows.py" else 1

    items.sort(key=rank)
