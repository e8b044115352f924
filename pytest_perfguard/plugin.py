"""pytest hooks and fixtures of pytest-perfguard. Hooks only: the work lives in the other modules."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from . import settings as st
from . import usage
from .judge import baseline as bl
from .judge import storage
from .marker import MARK_NAME, VARIANT_ARG, PerfCase
from .measure.visible import device_index
from .record import CaseRecord
from .report.writers import asked
from .run import xdist as xd
from .run.role import ROLE, Role, role_of
from .run.session import finish
from .run.state import (
    MERGED,
    STATE,
    SUMMARY,
    Merged,
    RunSummary,
    baseline_file,
    device_id,
    make_state,
    state_of,
)

if TYPE_CHECKING:
    from .run.caseitem import CaseItem
    from .run.item import ItemRun


def pytest_addoption(parser: pytest.Parser) -> None:
    st.add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """A mistyped --perfguard option names the nearest one, before pytest's bare "unrecognized arguments"."""
    groups = [parser.getgroup(name) for name in ("perfguard", "perfguard explain")]
    known = [n for group in groups for opt in group.options for n in opt.names()]
    message = usage.misspelled(args, known)
    if message is not None:
        raise pytest.UsageError(message)


def _pick_device(config: pytest.Config, wanted: str, *, enabled: bool) -> str:
    if wanted == "cpu":
        return "cpu"
    if xd.is_controller(config):
        # It runs no case: the driver's list of GPUs serves, and its workers start without waiting for torch
        # (measure/visible.py).
        count = len(xd.gpu_names())
    else:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not count:
        return "cpu"  # variants that need CUDA skip (or fail under --perfguard-require-gpu)
    device = wanted if wanted.startswith("cuda:") else xd.worker_gpu(config, enabled=enabled)
    index = device_index(device)
    if index >= count:
        raise pytest.UsageError(
            f"--perfguard-device {device}: this host has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
        )
    if index and not xd.is_controller(config):
        import torch

        # A process timing on cuda:N (an xdist worker, its fresh confirmation process, a --perfguard-device
        # choice) makes it current from the start, not only inside a case: whatever takes the current device
        # outside one (a kernel library's load, a warm-up) would open a context on cuda:0, and did on a
        # two-H100 host (532 MiB on the other worker's GPU, beside a case that ran out of memory there).
        torch.cuda.set_device(torch.device(device))
    return device


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    return xd.auto_workers(config)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARK_NAME}(case): set by @perf_case; one item per kernel variant, checked for correctness and, "
        "with --perfguard, timed",
    )
    mistake = usage.rootdir_mistake(config)
    if mistake is not None:
        raise pytest.UsageError(mistake)
    role = config.stash[ROLE] = Role.of(config)  # decided once: everything reads this value
    settings = st.from_config(config)
    for name, value in (xd.worker_paths(config) or {}).items():
        setattr(settings, name, Path(value))  # the controller's resolution: every process reads the same files
    settings.device = _pick_device(config, settings.device, enabled=settings.enabled)
    for writer, _ in asked(settings):
        if (lack := writer.missing()) is not None:
            option = st.BY_NAME[writer.setting].option
            raise pytest.UsageError(f"{option} {lack}, or drop {option}.")
    if settings.require_gpu and not settings.device.startswith("cuda"):
        # Checked per item too (so the failure names the case); this is the early, clear message.
        config.issue_config_time_warning(
            pytest.PytestWarning("--perfguard-require-gpu: no CUDA GPU is visible; GPU variants will fail"),
            stacklevel=2,
        )
    state = make_state(settings, config.rootpath, runs_cases=not xd.is_controller(config), role=role)
    if settings.enabled and not role.worker and not role.child:  # a child's parent session sweeps for itself
        _sweep_leftovers(settings)
    if settings.enabled:
        try:
            state.baseline = storage.read_baseline(baseline_file(state))
        except bl.BaselineError as exc:
            raise pytest.UsageError(f"perfguard: {exc}") from None
    if settings.against:
        from .run.ab import open_base, use_stored_offset

        state.base = open_base(config, settings.against)
        # The per-process offset fitted on this device model from the baseline file's A/A readings, unless set.
        where = st.shown(baseline_file(state))
        state.base.offsets = use_stored_offset(settings, state.baseline, device_id(state), where)
    config.stash[STATE] = state
    config.stash[MERGED] = Merged()
    state.on_timeout = lambda message, item: _flush_on_timeout(config, message, item)
    if settings.update and settings.update_processes > 1 and not role.worker:
        from .run.fresh import start_fresh_cases

        per_case = settings.case_timeout

        def fresh_cases(ids: list[str], given: st.Settings) -> Any:
            timeout = 2 * per_case * len(ids) + 120 if per_case else None
            return start_fresh_cases(config, ids, given, timeout, update=True).result

        state.fresh_cases = fresh_cases
    if settings.enabled:
        from .run.confirm import Batch

        Batch.install(config, state)  # regressions past the single confirmations: confirmed together
    xd.controller_setup(config)
    if state.fresh_cases is not None:
        state.fresh_devices = xd.update_devices(config)


def _sweep_leftovers(settings: st.Settings) -> None:
    """What killed sessions left: confirmation temp folders, temp files of interrupted atomic writes."""
    from .run.cleanup import sweep_atomic_temps, sweep_confirm_dirs

    sweep_confirm_dirs()
    for folder in {settings.baseline_dir, *(path.parent for _, path in asked(settings))}:
        sweep_atomic_temps(Path(folder))


def pytest_sessionstart(session: pytest.Session) -> None:
    """The progress display: here, because pytest's terminal reporter does not exist yet at our configure."""
    config, state = session.config, state_of(session.config)
    if state.settings.enabled:
        from .run import progress

        distributed = getattr(config.option, "dist", "no") != "no"
        line = progress.setup(config, lambda: state.records, worker=role_of(config).worker, distributed=distributed)
        state.progress = line.callback if line is not None and line.live else None


def pytest_collection_finish(session: pytest.Session) -> None:
    """The checks' one-time costs, paid here, before the first case, in every process that runs cases (an
    xdist controller collects nothing and never gets here); a fresh confirmation process pays its own."""
    state = state_of(session.config)
    if not state.settings.enabled or not session.items:
        return
    from .measure.integrity import warm_up

    costs = warm_up(state.settings.device, profiler=any(_declares_kernels(item) for item in session.items))
    if costs:
        state.warmups.append(costs)


def _declares_kernels(item: pytest.Item) -> bool:
    """The item is a variant with `not_kernels`: its case profiles a call."""
    mark = item.get_closest_marker(MARK_NAME)
    callspec = getattr(item, "callspec", None)
    if mark is None or callspec is None:
        return False
    case: PerfCase = mark.args[0]
    variant = case.variants.get(callspec.params.get(VARIANT_ARG, ""))
    return variant is not None and bool(variant.not_kernels)


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = state_of(config)
    if not state.settings.enabled:
        return []
    path = baseline_file(state)
    held = len(state.baseline.cases) if state.baseline is not None else 0
    exists = state.baseline is not None and state.baseline.exists
    where = f"{st.shown(path)} ({held} case(s) stored)" if exists else f"{st.shown(path)} (no such file yet)"
    lines = [f"perfguard: baseline {where}", *xd.gpu_header(config, state.settings)]
    if state.base is not None:
        lines.append(f"perfguard: against {state.base.describe()}")
        lines += [use.line() for use in state.base.offsets or ()]
    return lines


def _flush_on_timeout(config: pytest.Config, message: str, item: CaseItem) -> None:
    """The hung-kernel exit path: say so past pytest's output capture and write what the run has so far;
    then the watchdog ends the process. A worker sends the case's failure (and its record) to the
    controller first, which starts a fresh worker for the remaining cases."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        capman.suspend_global_capture(in_=True)
    sys.stderr.write(f"\nperfguard: {message}\n")
    sys.stderr.flush()
    from .run.confirm import abandon_batch

    abandon_batch(config, "the session ended on a timeout before the batch confirmation")  # records kept
    if role_of(config).worker:
        xd.send_timeout(config, item.nodeid, item.location, message)
        return
    state = state_of(config)
    summary = finish(state, list(state.records), collected_ids=None)
    for line in [*summary.messages, *summary.errors]:
        print(line, flush=True)


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    mark = metafunc.definition.get_closest_marker(MARK_NAME)
    if mark is None:
        return
    case: PerfCase = mark.args[0]
    names = list(case.variants)
    metafunc.parametrize(VARIANT_ARG, names, ids=names)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    perf = [i for i in items if i.get_closest_marker(MARK_NAME) is not None]
    # A batch's fresh process judges each case as a single confirmation does: a family of one.
    state = state_of(config)
    state.family_size = 1 if state.role.alone else max(1, len(perf))
    config.stash[MERGED].collected = {i.nodeid for i in perf}
    if role_of(config).worker and state.baseline is not None:
        xd.longest_first(items, state.baseline.cases)


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items and MERGED in items[0].config.stash:
        items[0].config.stash[MERGED].deselected = True


@pytest.fixture
def perfguard_runner(request: pytest.FixtureRequest) -> ItemRun:
    """Runs the current perf item (used by @perf_case; not meant to be requested directly)."""
    from .run.caseitem import CaseItem
    from .run.item import ItemRun
    from .run.runner import Runner

    return ItemRun(Runner(state_of(request.config), CaseItem.of(request.node)))


@pytest.fixture
def perfguard_device(request: pytest.FixtureRequest) -> str:
    """The device perf cases run on: "cuda:N" when a GPU is visible (one per xdist worker), else "cpu"."""
    return state_of(request.config).settings.device


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    _skip_at_the_test(item, report)
    _skipped_before_the_case(item, report)
    xd.mark_report(item, report)
    return report


def _skipped_before_the_case(item: pytest.Item, report: pytest.TestReport) -> None:
    """A perf item that pytest skipped before the plugin ran it (a skipif mark, a skip in a fixture) is kept
    as a skipped record, so that the table's skip count is pytest's."""
    if not (report.when == "setup" and report.skipped) or item.get_closest_marker(MARK_NAME) is None:
        return
    callspec = getattr(item, "callspec", None)
    variant = callspec.params.get(VARIANT_ARG) if callspec is not None else None
    if variant is None or STATE not in item.config.stash:
        return
    from .run.caseitem import display_params

    longrepr = report.longrepr
    reason = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else "skipped"
    reason = reason.removeprefix("Skipped: ")
    state_of(item.config).records.append(
        CaseRecord(
            id=item.nodeid,
            test=getattr(item, "originalname", item.name),
            variant=str(variant),
            params=display_params(item),
            reasons=[reason],
        )
    )


def _skip_at_the_test(item: pytest.Item, report: pytest.TestReport) -> None:
    """A skip the plugin raises is reported at the test, not at the line that raised it (the plugin's, or
    pytest's own when the plugin's frames are hidden from tracebacks)."""
    if not (report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3):
        return
    where = Path(item.config.invocation_params.dir, str(report.longrepr[0])).resolve().parent
    if where not in (Path(__file__).resolve().parent, Path(inspect.getfile(pytest.Item)).resolve().parent):
        return
    mark = item.get_closest_marker(MARK_NAME)
    code = getattr(mark.kwargs.get("factory") if mark is not None else None, "__code__", None)
    if code is not None:  # the user's test function (pytest's own location is the plugin's wrapper)
        report.longrepr = (code.co_filename, code.co_firstlineno, report.longrepr[2])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    result = yield
    xd.exit_if_poisoned(item)
    return result


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if role_of(config).worker:
        xd.worker_output(config)
        return
    state, merged = state_of(config), config.stash[MERGED]
    records = merged.records + state.records
    collected = None if merged.deselected else set(merged.collected)
    if not state.settings.enabled and not records:
        config.stash[SUMMARY] = RunSummary()
        return
    summary = finish(state, records, collected_ids=collected)
    summary.messages[:0] = merged.notes
    config.stash[SUMMARY] = summary
    merged.final = records
    if summary.errors and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    xd.node_down(node)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if role_of(config).worker or SUMMARY not in config.stash:
        return
    state = state_of(config)
    summary = config.stash[SUMMARY]
    records = config.stash[MERGED].final
    if not (state.settings.enabled or summary.errors):
        return
    from .report.terminal import terminal_lines

    info = state.device_info
    terminalreporter.write_sep(
        "=", f"perfguard: {info.get('name')} ({state.settings.device}), torch {info.get('torch')}"
    )
    if getattr(config.option, "numprocesses", None):  # the title names the controller's GPU, not the workers'
        for line in xd.gpu_header(config, state.settings):
            terminalreporter.write_line(line)
    if state.base is not None:  # pytest's own header is gone under -q; the table must say what it compared with
        terminalreporter.write_line(f"perfguard: against {state.base.describe()}")
        for use in state.base.offsets or ():
            terminalreporter.write_line(use.line())
    for line in terminal_lines(records, verbose=config.get_verbosity() > 0, margin=state.settings.margin):
        terminalreporter.write_line(line)
    for line in summary.messages:
        terminalreporter.write_line(line)
    for line in summary.errors:
        terminalreporter.write_line(line, red=True, bold=True)
