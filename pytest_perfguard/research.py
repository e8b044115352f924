"""The names the project's research scripts (benchmarks/) and its studies use, in one place.

Not the user's API (that is ``pytest_perfguard``'s top level: ``perf_case``, ``Variant``, the timing engine's
``measure``): these are the package's internals a study re-judges, times or instruments with, listed here so
that a script never reaches into a module by its path. When the package moves a name, this module follows
and the scripts do not; a name no script uses any more leaves. No stability promise beyond the version.
"""

from __future__ import annotations

from .commands.history.store import CaseSummary, change_indices, find_changes, open_history
from .judge import policy, update_rules, verdict
from .judge.baseline import BaselineEntry, BaselineFile
from .judge.policy import NOISE_FLOOR, NOISE_K, RATIO_NOISE_FLOOR, fit_process_offset
from .judge.stats import log_interval
from .judge.storage import read_baseline, write_baseline
from .judge.verdict import Policy, Verdict, ab_gate, decide
from .marker import unmet_requirement
from .measure import copies, correctness, timing
from .measure.device import Disturbances, nvml, nvml_handle
from .measure.timers import Call, CpuTimer, CudaTimer, PreparedSample, SampleTime, make_timer
from .measure.timing import MeasureConfig, Measurement, measure, pooled
from .record import CaseRecord, Status
from .run.samples import entry_of
from .run.state import STATE
from .run.workload import describe_workload
from .settings import AB_PROCESS_SD, AB_SMALL_NS, AB_SMALL_PROCESS_SD, Settings

__all__ = [
    "AB_PROCESS_SD",
    "AB_SMALL_NS",
    "AB_SMALL_PROCESS_SD",
    "NOISE_FLOOR",
    "NOISE_K",
    "RATIO_NOISE_FLOOR",
    "STATE",
    "BaselineEntry",
    "BaselineFile",
    "Call",
    "CaseRecord",
    "CaseSummary",
    "CpuTimer",
    "CudaTimer",
    "Disturbances",
    "MeasureConfig",
    "Measurement",
    "Policy",
    "PreparedSample",
    "SampleTime",
    "Settings",
    "Status",
    "Verdict",
    "ab_gate",
    "change_indices",
    "copies",
    "correctness",
    "decide",
    "describe_workload",
    "entry_of",
    "find_changes",
    "fit_process_offset",
    "log_interval",
    "make_timer",
    "measure",
    "nvml",
    "nvml_handle",
    "open_history",
    "policy",
    "pooled",
    "read_baseline",
    "timing",
    "unmet_requirement",
    "update_rules",
    "verdict",
    "write_baseline",
]
