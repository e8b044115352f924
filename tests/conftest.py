"""Settings for this project's own test suite."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

# One intra-op thread in this process and in every process it starts (xdist workers, pytester subprocesses,
# fresh confirmation processes, act jobs). The tensors here are tiny, and the suite keeps both cores of the
# CI machine busy: there torch's default of one OpenMP thread per core made a 16x16 attention reference
# take 16 ms of spinning threads instead of 72 us.
if "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _not_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs these tests start are local runs unless a test says otherwise: under CI, a guard run that
    compared nothing fails (session.under_ci), and the CI machine running this suite sets CI=true."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `-n N` with xdist's default distribution, let an idle worker take queued tests from a busy one.

    The slow tests sit together in a few modules (tests/test_plugin.py, tests/test_workflows.py). The
    default scheduler hands out large batches early, so at the end of a run one worker can hold minutes of
    them while the other has nothing left to do; work stealing (`--dist worksteal`) moves them.
    """
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)
