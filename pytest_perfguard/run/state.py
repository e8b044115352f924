"""The run's state, kept in config.stash: one per process; what the end of a run says; where a process is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..judge import baseline as bl
from ..judge.policy import (
    NOISE_FLOOR,
    RATIO_NOISE_FLOOR,
    prior_spread,
)
from ..judge.verdict import Policy
from ..measure.visible import cpu_model, cuda_gpus, device_index
from ..record import CaseRecord, Status
from ..settings import Settings
from ..slugs import device_slug
from .role import Role

if TYPE_CHECKING:
    from ..measure.timing import Progress
    from ..measure.torchstate import Snapshot
    from .ab import BaseTree
    from .caseitem import CaseItem


# Verdicts of a timed case that compared it with nothing.
UNCOMPARED = (Status.NO_BASELINE, Status.NOT_COMPARABLE, Status.NO_BASE, Status.NEW)


# Verdicts of a timed case that failed before any comparison: a timing the guard did not believe, a crash
# after timing. They are counted as what they are, never as a case without a baseline entry.
UNJUDGED = (Status.FLAGGED, Status.ERROR, Status.INCORRECT, Status.TIMEOUT)


@dataclass
class SessionState:
    """Per-process run state (kept in config.stash)."""

    settings: Settings
    role: Role = field(default_factory=Role)  # which kind of process this is (role.py), decided at configure
    # the device dictionary (measure.device.fingerprint); None until first read (`device_info`): an xdist
    # controller takes its first worker's (xdist.node_down), so that it never waits for torch
    fingerprint: dict[str, Any] | None = None
    baseline: bl.BaselineFile | None = None
    family_size: int = 1
    records: list[CaseRecord] = field(default_factory=list)
    timing_spent_s: float = 0.0
    deciding_spent_s: float = 0.0  # seconds spent measuring undecided cases again (timed._decide_more)
    poisoned_by: str | None = None
    confirmations: int = 0
    on_timeout: Callable[[str, CaseItem], None] | None = None  # set by the plugin: flush results before the exit
    base: BaseTree | None = None  # the base revision's tree under --perfguard-against
    rootdir: Path = field(default_factory=Path.cwd)
    # set by the plugin: case name -> the live progress line's per-block callback (progress.py), or None
    progress: Callable[[str], Callable[[Progress], None] | None] | None = None
    # The checks' one-time costs, paid before the first case (integrity.warm_up): one entry per process
    # that ran cases (the controller gathers its workers'), reported once and never in a case's checks_s.
    warmups: list[dict[str, float]] = field(default_factory=list)
    # set by the plugin in the process that writes the baseline: starts one fresh process on these case ids,
    # in this order, with these settings, and returns what waits for it: their records (or why there are
    # none). An update's further processes.
    fresh_cases: Callable[[list[str], Settings], Callable[[], dict[str, CaseRecord] | str]] | None = None
    # set by the plugin in an xdist controller whose workers time on several GPUs: the devices an update's
    # further processes spread over, one fresh process on each at a time (xdist.update_devices)
    fresh_devices: list[str] = field(default_factory=list)
    # torch's process-wide switches as the session started (measure/torchstate.py): every case is timed in
    # this state; taken at configure time, before any test module is imported
    torch_state: Snapshot | None = None
    _prior: tuple[int, tuple[float, float]] | None = field(default=None, repr=False)  # cache of `prior`

    @property
    def kind(self) -> str:
        return "cuda" if self.settings.device.startswith("cuda") else "cpu"

    @property
    def device_info(self) -> dict[str, Any]:
        if self.fingerprint is None:
            from ..measure.device import fingerprint

            self.fingerprint = fingerprint(self.settings.device)
        return self.fingerprint

    @property
    def slug(self) -> str:
        """The name of this device's baseline file, without importing torch (measure/visible.py)."""
        if self.fingerprint is not None:
            return str(self.fingerprint["slug"])
        if self.kind == "cpu":
            return "cpu-" + device_slug(cpu_model())
        gpus, index = cuda_gpus(), device_index(self.settings.device)
        return device_slug(gpus[index].name) if index < len(gpus) else str(self.device_info["slug"])

    @property
    def noise_floor(self) -> float:
        return NOISE_FLOOR[self.kind]

    def policy(self) -> Policy:
        return Policy(
            margin=self.settings.margin,
            alpha=self.settings.alpha,
            family_size=self.family_size,
            noise_floor=self.noise_floor,
            ratio_noise_floor=RATIO_NOISE_FLOOR[self.kind],
            confirm=self.settings.confirm and not self.role.child,  # as confirm.confirm_regression decides
            prior_spread=self.prior[0],
            prior_ratio_spread=self.prior[1],
        )

    @property
    def prior(self) -> tuple[float, float]:
        """The baseline file's typical between-process spreads of time and ratio (policy.prior_spread)."""
        key = id(self.baseline)
        if self._prior is None or self._prior[0] != key:
            cases = self.baseline.cases.values() if self.baseline is not None else ()
            entries = [e for e in cases if e.runs >= 2]
            spreads = (prior_spread([e.noise for e in entries]), prior_spread([e.ratio_noise for e in entries]))
            self._prior = (key, spreads)
        return self._prior[1]


def make_state(
    settings: Settings, rootdir: Path | None = None, *, runs_cases: bool = True, role: Role | None = None
) -> SessionState:
    """The process's state. A process that runs no case (an xdist controller) reads its device's fingerprint
    later (`SessionState.device_info`)."""
    state = SessionState(settings=settings, role=role or Role())
    if runs_cases:
        state.device_info  # noqa: B018 (read now: a case's timing must not pay for it)
        if settings.enabled:  # before any test module is imported: the state every case is timed in
            from ..measure import torchstate

            state.torch_state = torchstate.snapshot()
    if rootdir is not None:
        state.rootdir = rootdir
    return state


@dataclass
class RunSummary:
    """What the end of a run says: messages, and errors that fail the run."""

    messages: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def baseline_file(state: SessionState) -> Path:
    """The baseline file of this run's device (absolute: see settings.py on relative paths)."""
    return state.settings.baseline_dir / f"{state.slug}.json"


def device_id(state: SessionState) -> str:
    """What a process sample names its device by: the GPU's UUID, or the host's CPU model."""
    return gpu_id(state.settings.device) if state.kind == "cuda" else cpu_model()


def gpu_id(device: str) -> str:
    """A CUDA device ("cuda:N", this process's numbering) by its GPU's UUID, as `device_id` names it; the
    string itself where no GPU of that index is visible."""
    gpus, index = cuda_gpus(), device_index(device)
    return gpus[index].uuid if index < len(gpus) else device


@dataclass
class Merged:
    """What the controller gathers from every process of the run."""

    records: list[CaseRecord] = field(default_factory=list)
    collected: set[str] = field(default_factory=set)
    deselected: bool = False
    notes: list[str] = field(default_factory=list)
    sent: int = 0  # a worker: how many of its records have travelled to the controller
    final: list[CaseRecord] = field(default_factory=list)


STATE = pytest.StashKey[SessionState]()


MERGED = pytest.StashKey[Merged]()


SUMMARY = pytest.StashKey[RunSummary]()


def state_of(config: pytest.Config) -> SessionState:
    return config.stash[STATE]
