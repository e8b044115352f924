"""pytest hooks, options and fixtures of pytest-perfguard. Thin: the work lives in the other modules."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from . import baseline as bl
from .marker import MARK_NAME, VARIANT_ARG, PerfCase
from .runner import Runner, SessionState, Settings, make_state
from .session import Outcome, baseline_file, finish
from .verdict import DEFAULT_MARGIN

STATE = pytest.StashKey[SessionState]()
MERGED = pytest.StashKey[dict[str, Any]]()
OUTCOME = pytest.StashKey[Outcome]()

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}

# name -> (help, type, default); every setting has a CLI option, an env variable and an ini key.
_SETTINGS: dict[str, tuple[str, str, Any]] = {
    "baseline_dir": ("folder of the per-device baseline JSON files", "path", ".ci/baselines"),
    "margin": ("regression margin as a fraction (0.05 = 5%); never below 4x the stored between-run noise", "float", DEFAULT_MARGIN),
    "ci_target": ("stop measuring a case once the 95% CI half-width is under this fraction", "float", 0.01),
    "case_budget": ("seconds of measurement per case (per re-measurement)", "float", 5.0),
    "total_budget": ("seconds of measurement for the whole run; 0 = unlimited", "float", 0.0),
    "case_timeout": ("seconds one case may run before the session ends with TIMEOUT (hung kernel); 0 = none", "float", 900.0),
    "confirm": ("re-run a regressed case once in a fresh process and fail only if it regresses there too", "bool", True),
    "json": ("write every result to this JSON file", "path", None),
    "strict": ("fail on a missing baseline, an incomparable one, or an inconclusive verdict", "bool", False),
    "require_gpu": ("fail, not skip, when a variant needs a GPU that is not there", "bool", False),
    "device": ("where to run: auto (CUDA if available), cpu, cuda, cuda:N", "str", "auto"),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perfguard", "correctness and performance guard for kernels")
    group.addoption("--perfguard", action="store_true", dest="perfguard", default=None,
                    help="time every perf case against its reference and apply the baseline and ratio gates")
    group.addoption("--perfguard-update-baseline", action="store_true", dest="perfguard_update", default=None,
                    help="measure and record baselines (implies --perfguard)")
    group.addoption("--perfguard-prune", action="store_true", dest="perfguard_prune", default=None,
                    help="with --perfguard-update-baseline: remove stored cases that were not collected")
    group.addoption("--perfguard-seed", dest="perfguard_seed", default=None, type=int,
                    help="use seeds N, N+1, ... instead of fresh random ones (to reproduce a failure)")
    for name, (help_text, kind, default) in _SETTINGS.items():
        flag = "--perfguard-" + name.replace("_", "-")
        env = "PERFGUARD_" + name.upper()
        if kind == "bool" and default is True:
            group.addoption("--perfguard-no-" + name.replace("_", "-"), action="store_false", dest=f"perfguard_{name}",
                            default=None, help=f"do not {help_text} (env {env}=0, ini perfguard_{name} = false)")
        elif kind == "bool":
            group.addoption(flag, action="store_true", dest=f"perfguard_{name}", default=None,
                            help=f"{help_text} (env {env}, ini perfguard_{name})")
        else:
            group.addoption(flag, dest=f"perfguard_{name}", default=None,
                            help=f"{help_text} (env {env}, ini perfguard_{name}; default {default})")
        if kind == "bool":
            parser.addini(f"perfguard_{name}", help_text, type="bool", default=default)
        else:
            parser.addini(f"perfguard_{name}", help_text, type="string", default=default)


def _resolve(config: pytest.Config, name: str) -> Any:
    """CLI > env > ini > default, and say where a bad value came from."""
    _, kind, default = _SETTINGS[name]
    env = "PERFGUARD_" + name.upper()
    cli = config.getoption(f"perfguard_{name}")
    if cli is not None:
        raw, source = cli, f"--perfguard-{name.replace('_', '-')}"
    elif env in os.environ:
        raw, source = os.environ[env], f"environment variable {env}"
    else:
        raw, source = config.getini(f"perfguard_{name}"), f"ini option perfguard_{name}"
    if raw is None or raw == "":
        return default if kind != "path" or default is None else Path(default)
    try:
        return _convert(raw, kind, name)
    except ValueError as exc:
        raise pytest.UsageError(f"Invalid value {raw!r} from {source}: {exc}") from None


def _convert(raw: Any, kind: str, name: str) -> Any:
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError("expected one of 1/0, true/false, yes/no, on/off")
    if kind == "float":
        value = float(raw)
        if not value >= 0 or value != value or value == float("inf"):
            raise ValueError("expected a finite number >= 0")
        if name in ("margin", "ci_target") and not 0 < value < 1:
            raise ValueError("expected a fraction between 0 and 1 (0.02 means 2%)")
        if name == "case_budget" and value <= 0:
            raise ValueError("expected a positive number of seconds")
        return value
    if kind == "path":
        return Path(str(raw))
    text = str(raw)
    if name == "device" and not (text in ("auto", "cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit())):
        raise ValueError("expected auto, cpu, cuda or cuda:N")
    return text


def _pick_device(config: pytest.Config, wanted: str) -> str:
    import torch

    if wanted == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        return "cpu"  # variants that need CUDA skip (or fail under --perfguard-require-gpu)
    if wanted.startswith("cuda:"):
        return wanted
    worker = getattr(config, "workerinput", {}).get("workerid", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    return f"cuda:{index % torch.cuda.device_count()}"


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARK_NAME}(case): set by @perf_case; one item per kernel variant, checked for correctness and, with --perfguard, timed",
    )
    update = bool(config.getoption("perfguard_update"))
    settings = Settings(
        enabled=bool(config.getoption("perfguard")) or update,
        update=update,
        prune=bool(config.getoption("perfguard_prune")),
        baseline_dir=_resolve(config, "baseline_dir"),
        margin=_resolve(config, "margin"),
        ci_target=_resolve(config, "ci_target"),
        case_budget=_resolve(config, "case_budget"),
        total_budget=_resolve(config, "total_budget"),
        json_path=_resolve(config, "json"),
        strict=_resolve(config, "strict"),
        require_gpu=_resolve(config, "require_gpu"),
        seed=config.getoption("perfguard_seed"),
        case_timeout=_resolve(config, "case_timeout"),
        confirm=_resolve(config, "confirm"),
    )
    if settings.prune and not settings.update:
        raise pytest.UsageError("--perfguard-prune only works with --perfguard-update-baseline; add it or drop --perfguard-prune.")
    settings.device = _pick_device(config, _resolve(config, "device"))
    if settings.require_gpu and not settings.device.startswith("cuda"):
        # Checked per item too (so the failure names the case); this is the early, clear message.
        config.issue_config_time_warning(
            pytest.PytestWarning("--perfguard-require-gpu: no CUDA GPU is visible; GPU variants will fail"), stacklevel=2
        )
    state = make_state(settings)
    if settings.enabled:
        path = baseline_file(state)
        try:
            state.baseline = bl.read_baseline(path)
        except bl.BaselineError as exc:
            raise pytest.UsageError(f"perfguard: {exc}") from None
    config.stash[STATE] = state
    config.stash[MERGED] = {"records": [], "collected": set(), "deselected": False}
    state.on_timeout = lambda message, item: _flush_on_timeout(config, message, item)
    _controller_setup(config)


def _flush_on_timeout(config: pytest.Config, message: str, item: pytest.Item) -> None:
    """The hung-kernel exit path: say so past pytest's output capture and write what the run has so far;
    then the watchdog ends the process. A worker sends the case's failure (and its record) to the
    controller first, which starts a fresh worker for the remaining cases."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        capman.suspend_global_capture(in_=True)
    sys.stderr.write(f"\nperfguard: {message}\n")
    sys.stderr.flush()
    if _is_worker(config):
        report = pytest.TestReport(
            nodeid=item.nodeid, location=item.location, keywords={}, outcome="failed", longrepr=message, when="call"
        )
        _attach_records(config, report)
        config.hook.pytest_runtest_logreport(report=report)
        return
    state = _state(config)
    outcome = finish(state, list(state.records), collected_ids=None)
    for line in [*outcome.messages, *outcome.errors]:
        print(line, flush=True)


def _state(config: pytest.Config) -> SessionState:
    return config.stash[STATE]


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
    _state(config).family_size = max(1, len(perf))
    config.stash[MERGED]["collected"] = {i.nodeid for i in perf}


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        config = items[0].config
        if MERGED in config.stash:
            config.stash[MERGED]["deselected"] = True


@pytest.fixture
def perfguard_runner(request: pytest.FixtureRequest) -> Runner:
    """Runs the current perf item (used by @perf_case; not meant to be requested directly)."""
    return Runner(_state(request.config), request.node)


@pytest.fixture
def perfguard_device(request: pytest.FixtureRequest) -> str:
    """The device perf cases run on: "cuda:N" when a GPU is visible (one per xdist worker), else "cpu"."""
    return _state(request.config).settings.device


# ------------------------------------------------------------------------------------------- xdist
#
# Under xdist every record travels to the controller on the test report of the item that made it, the
# moment it is made, so a worker that dies (a segfault, a hung kernel, or on purpose after a sticky CUDA
# error) loses nothing it has already judged. The worker's end-of-session output carries only what the
# collection saw.

WORKER_POISONED_EXIT = 3
_RECORDS_ATTR = "perfguard_records"
_ITEM_ATTR = "perfguard_item"


def _attach_records(config: pytest.Config, report: pytest.TestReport) -> None:
    state = _state(config)
    sent = config.stash[MERGED].setdefault("sent", 0)
    if len(state.records) > sent:
        setattr(report, _RECORDS_ATTR, json.dumps(state.records[sent:], default=str))
        config.stash[MERGED]["sent"] = len(state.records)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if _is_worker(item.config) and STATE in item.config.stash:
        if item.get_closest_marker(MARK_NAME) is not None:
            setattr(report, _ITEM_ATTR, True)
        _attach_records(item.config, report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    result = yield
    config = item.config
    if _is_worker(config) and STATE in config.stash and _state(config).poisoned_by == item.nodeid:
        # Every later CUDA call in this process would fail. The failure is reported and the records are
        # sent; leaving now, before xdist marks the item complete, makes the controller start a fresh
        # worker and hand it this worker's remaining cases.
        sys.stderr.write(
            f"\nperfguard: {item.nodeid} poisoned the CUDA context of worker "
            f"{config.workerinput['workerid']}; the worker exits and xdist replaces it\n"  # type: ignore[attr-defined]
        )
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(WORKER_POISONED_EXIT)
    return result


class _Controller:
    """The xdist controller's side: collect records as reports arrive, and account for crashed workers."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.perf_items: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if getattr(report, _ITEM_ATTR, False):
            self.perf_items.add(report.nodeid)
        raw = getattr(report, _RECORDS_ATTR, None)
        if raw:
            self.config.stash[MERGED]["records"].extend(json.loads(raw))

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        merged = self.config.stash[MERGED]
        mine = [r for r in merged["records"] if r.get("id") == crashitem]
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "?")
        if any(r.get("sticky") or r.get("verdict") == "timeout" for r in mine):
            # The case has already failed with its own reason, and the worker left on purpose. Turn xdist's
            # "crashed" report into an empty teardown so the case is not counted twice.
            report.outcome = "passed"
            report.when = "teardown"
            report.longrepr = None
            why = "timed out" if any(r.get("verdict") == "timeout" for r in mine) else "poisoned its CUDA context"
            merged.setdefault("notes", []).append(
                f"perfguard: worker {worker} ended after {crashitem} {why}; a fresh worker ran its remaining cases"
            )
            return
        if crashitem in self.perf_items and not mine:
            merged["records"].append(
                {
                    "id": crashitem,
                    "outcome": "failed",
                    "verdict": "error",
                    "crashed": True,
                    "reasons": [f"worker {worker} crashed while running this case (the process died: segfault, abort or killed)"],
                }
            )


def _controller_setup(config: pytest.Config) -> None:
    if not _is_worker(config) and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_Controller(config), "perfguard-controller")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = _state(config)
    merged = config.stash[MERGED]
    if _is_worker(config):
        config.workeroutput["perfguard"] = json.dumps(  # type: ignore[attr-defined]
            {
                "collected": sorted(merged["collected"]),
                "deselected": merged["deselected"],
                "family_size": state.family_size,
            },
            default=str,
        )
        return
    records = merged["records"] + state.records
    collected = None if merged["deselected"] else set(merged["collected"])
    if not state.settings.enabled and not records:
        config.stash[OUTCOME] = Outcome()
        return
    outcome = finish(state, records, collected_ids=collected)
    outcome.messages[:0] = merged.get("notes", [])
    config.stash[OUTCOME] = outcome
    config.stash[MERGED]["final"] = records
    if outcome.errors and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    out = getattr(node, "workeroutput", None) or {}
    raw = out.get("perfguard")
    if not raw:
        return
    data = json.loads(raw)
    config = node.config
    merged = config.stash[MERGED]
    merged["collected"].update(data["collected"])
    merged["deselected"] = merged["deselected"] or data["deselected"]
    state = _state(config)
    state.family_size = max(state.family_size, int(data.get("family_size", 1)))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _is_worker(config) or OUTCOME not in config.stash:
        return
    state = _state(config)
    outcome = config.stash[OUTCOME]
    records = config.stash[MERGED].get("final") or []
    if not (state.settings.enabled or outcome.errors):
        return
    from .report import table

    tr: Callable[..., Any] = terminalreporter.write_sep
    tr("=", f"perfguard: {state.device_info.get('name')} ({state.settings.device}), torch {state.device_info.get('torch')}")
    if records:
        terminalreporter.write_line(table(records))
    for line in outcome.messages:
        terminalreporter.write_line(line)
    for line in outcome.errors:
        terminalreporter.write_line(line, red=True, bold=True)
