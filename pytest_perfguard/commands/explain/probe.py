"""The pytest plugin that ``perfguard explain`` loads (``-p pytest_perfguard.commands.explain.probe``) under ncu.

It replaces the body of the one selected perf item: the variant runs a few times untimed (builds, autotuning,
lazy initialisation), then once between ``cudaProfilerStart`` and ``cudaProfilerStop``. ncu runs with
``--profile-from-start off``, so it profiles exactly the kernels of that one call, not the reference, the
correctness check or the warm-up. Inputs come from the test's own factory under a fixed seed, so head and
base see the same shapes and values.

``perfguard explain`` hands it two options: ``--perfguard-explain-id NODEID`` selects a case by its id (as a
results file names it), and ``--perfguard-explain-out FILE`` is where it writes which case it profiled and on
which GPU, so the explanation is attached to the right record and says where it was measured.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from ...marker import MARK_NAME, VARIANT_ARG, PerfCase

WARMUP_CALLS = 3
SEED = 0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perfguard explain", "set by perfguard explain, which loads this plugin")
    group.addoption("--perfguard-explain-id", dest="perfguard_explain_id", metavar="NODEID", help="the case to profile")
    group.addoption(
        "--perfguard-explain-out", dest="perfguard_explain_out", metavar="FILE", help="where to say what was profiled"
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    perf = [item for item in items if item.get_closest_marker(MARK_NAME) is not None]
    wanted = config.getoption("perfguard_explain_id")
    if wanted:
        found = [item for item in perf if item.nodeid == wanted]
        if not found:
            near = [item.nodeid for item in perf if item.nodeid.split("[")[0] == wanted.split("[")[0]]
            shown = ", ".join(near[:4]) + (" ..." if len(near) > 4 else "")
            raise pytest.UsageError(
                f"perfguard explain: no collected perf case has the id {wanted}"
                + (f" (its test has {shown})" if near else f" ({len(perf)} perf cases collected)")
                + ": renamed at this revision, or its folder not among the paths given (e.g. tests/perf)?"
            )
        perf = found
    if len(perf) != 1:
        shown = ", ".join(item.nodeid for item in perf[:8]) + (" ..." if len(perf) > 8 else "")
        raise pytest.UsageError(
            f"perfguard explain: -k selected {len(perf)} perf cases ({shown or 'none'}); it profiles one "
            "variant at one shape: make -k select exactly one, e.g. -k 'test_name and variant and 4096'"
        )
    items[:] = perf


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    mark = pyfuncitem.get_closest_marker(MARK_NAME)
    if mark is None:
        return None
    import torch

    if not torch.cuda.is_available():
        pytest.fail("perfguard explain: no CUDA device here; ncu profiles GPU kernels", pytrace=False)
    case: PerfCase = mark.args[0]
    factory: Any = mark.kwargs["factory"]
    variant = case.variants[str(pyfuncitem.funcargs[VARIANT_ARG])]
    names = inspect.signature(factory).parameters
    params = {name: pyfuncitem.funcargs[name] for name in names if name in pyfuncitem.funcargs}
    torch.manual_seed(SEED)
    value = factory(**params)
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict)):
        pytest.fail(f"{pyfuncitem.nodeid} must return (args, kwargs)", pytrace=False)
    args, kwargs = tuple(value[0]), dict(value[1])
    for _ in range(WARMUP_CALLS):
        variant.fn(*args, **kwargs)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()  # type: ignore[no-untyped-call]
    variant.fn(*args, **kwargs)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()  # type: ignore[no-untyped-call]
    out = pyfuncitem.config.getoption("perfguard_explain_out")
    if out:
        info = {"id": pyfuncitem.nodeid, "device": torch.cuda.get_device_name()}
        Path(out).write_text(json.dumps(info) + "\n", encoding="utf-8")
    return True
