"""torch's process-wide switches, read, compared and put back: the reference is timed in the state the
session started in, whatever a variant (or a library it imports) turned on or off.

A variant that turns SDPA's fast backends off slows the reference beside it: on an H100 (2026-11-27) such a
variant was 60-65% slower than honest code while SDPA moved +3,278% and +5,574%, the time gate called the
machine moved and the case passed. A library that flips a backend switch at import does the same by accident.
The runner snapshots the state before a variant's phases and after each (correctness, timing, checks): a
change a phase leaves behind is the variant's, flagged with what changed, and the state is put back before
anything else is timed. A change made outside any case (at import, by a fixture) is put back before the case
and said in its notes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# name -> (read, write). Each is read with a getter that exists in every torch the project supports (>= 2.4),
# skipped where one is missing.


def _sdp(name: str) -> tuple[Callable[[], Any], Callable[[Any], None]] | None:
    cuda = torch.backends.cuda
    read, write = getattr(cuda, f"{name}_sdp_enabled", None), getattr(cuda, f"enable_{name}_sdp", None)
    return (read, write) if read is not None and write is not None else None


def _attribute(owner: Any, attr: str) -> tuple[Callable[[], Any], Callable[[Any], None]] | None:
    if owner is None or not hasattr(owner, attr):
        return None
    return (lambda: getattr(owner, attr)), (lambda value: setattr(owner, attr, value))


def _precisions() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]] | None]:
    """The float32 precision switches (TF32 and lower). torch 2.9 and newer keep them as `fp32_precision`
    attributes and raise when a legacy getter (allow_tf32, get_float32_matmul_precision) reads a state set
    through the new ones; the legacy setters write the new state, so the new attributes see both. Older
    torch has the legacy ones only."""
    backends = torch.backends
    if hasattr(getattr(backends.cuda, "matmul", None), "fp32_precision"):
        owners = {
            "torch.backends": backends,
            "torch.backends.cuda.matmul": backends.cuda.matmul,
            "torch.backends.cudnn": backends.cudnn,
            "torch.backends.cudnn.conv": getattr(backends.cudnn, "conv", None),
            "torch.backends.cudnn.rnn": getattr(backends.cudnn, "rnn", None),
            "torch.backends.mkldnn": getattr(backends, "mkldnn", None),
            "torch.backends.mkldnn.matmul": getattr(getattr(backends, "mkldnn", None), "matmul", None),
            "torch.backends.mkldnn.conv": getattr(getattr(backends, "mkldnn", None), "conv", None),
        }
        return {f"{name}.fp32_precision": _attribute(owner, "fp32_precision") for name, owner in owners.items()}
    return {
        "torch.backends.cuda.matmul.allow_tf32": _attribute(backends.cuda.matmul, "allow_tf32"),
        "torch.get_float32_matmul_precision()": (
            torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision,
        ),
        "torch.backends.cudnn.allow_tf32": _attribute(backends.cudnn, "allow_tf32"),
    }


def _switches() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn
    matmul = getattr(cuda, "matmul", None)
    found: dict[str, tuple[Callable[[], Any], Callable[[Any], None]] | None] = {
        "torch.backends.cuda.flash_sdp_enabled()": _sdp("flash"),
        "torch.backends.cuda.mem_efficient_sdp_enabled()": _sdp("mem_efficient"),
        "torch.backends.cuda.math_sdp_enabled()": _sdp("math"),
        "torch.backends.cuda.cudnn_sdp_enabled()": _sdp("cudnn"),
        **_precisions(),
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": _attribute(
            matmul, "allow_fp16_reduced_precision_reduction"
        ),
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": _attribute(
            matmul, "allow_bf16_reduced_precision_reduction"
        ),
        "torch.backends.cudnn.enabled": _attribute(cudnn, "enabled"),
        "torch.backends.cudnn.benchmark": _attribute(cudnn, "benchmark"),
        "torch.backends.cudnn.deterministic": _attribute(cudnn, "deterministic"),
        "torch.are_deterministic_algorithms_enabled()": (
            lambda: (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            ),
            lambda value: torch.use_deterministic_algorithms(value[0], warn_only=value[1]),
        ),
        "torch.get_default_dtype()": (torch.get_default_dtype, torch.set_default_dtype),
        "torch.is_grad_enabled()": (torch.is_grad_enabled, lambda value: torch._C._set_grad_enabled(value)),
        "torch.get_num_threads()": (torch.get_num_threads, torch.set_num_threads),
    }
    get_device = getattr(torch, "get_default_device", None)
    if get_device is not None:
        found["torch.get_default_device()"] = (get_device, torch.set_default_device)
    for device_type in ("cpu", "cuda"):
        found[f"torch.is_autocast_enabled({device_type!r})"] = _autocast(device_type)
    return {name: pair for name, pair in found.items() if pair is not None}


def _autocast(device_type: str) -> tuple[Callable[[], Any], Callable[[Any], None]] | None:
    try:
        torch.is_autocast_enabled(device_type)  # the device_type form is torch >= 2.4's
    except (TypeError, RuntimeError):
        return None
    return (lambda: torch.is_autocast_enabled(device_type)), (
        lambda value: torch.set_autocast_enabled(device_type, value)
    )


SWITCHES = _switches()


@dataclass(frozen=True)
class Snapshot:
    """The switches' values at one moment, and whether `device`'s current CUDA stream is its default one."""

    values: dict[str, Any]
    # Whether the device's current CUDA stream is its default one; None where CUDA was not started (a
    # session's snapshot is taken before any case starts it)
    default_stream: bool | None

    def changes(self, now: Snapshot) -> list[str]:
        """What differs in `now`, one 'name: before -> after' each."""
        out = [
            f"{name}: {_shown(before)} -> {_shown(now.values.get(name))}"
            for name, before in self.values.items()
            if now.values.get(name) != before
        ]
        if now.default_stream is False and self.default_stream is not False:
            out.append("the current CUDA stream: the default stream -> another stream")
        return out


def _shown(value: Any) -> str:
    return str(value).replace("torch.", "")


def _default_stream(device: torch.device | None) -> bool | None:
    if device is None or device.type != "cuda" or not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return None
    return bool(torch.cuda.current_stream(device) == torch.cuda.default_stream(device))


def _read(read: Callable[[], Any]) -> Any:
    """A switch's value; a getter that raises (torch refuses some reads of a state set another way) reads as
    what it said, so a change into that state is still a change."""
    try:
        return read()
    except Exception as exc:
        return f"unreadable ({str(exc)[:60]})"


def snapshot(device: torch.device | None = None) -> Snapshot:
    return Snapshot({name: _read(read) for name, (read, _) in SWITCHES.items()}, _default_stream(device))


def restore(to: Snapshot, device: torch.device | None = None) -> None:
    """Puts every switch back to `to`'s value (the ones that differ), and the default stream where a phase
    left another one current."""
    for name, value in to.values.items():
        read, write = SWITCHES[name]
        if _read(read) != value and not str(value).startswith("unreadable"):
            with contextlib.suppress(Exception):  # a value torch refuses to take back is seen at the next read
                write(value)
    if device is not None and to.default_stream is not False and _default_stream(device) is False:
        torch.cuda.set_stream(torch.cuda.default_stream(device))


class Guard:
    """The state a case must be timed in (the session's at its start) and what each phase of the variant
    left changed. `phase(name)` is a context manager: a change the phase leaves is kept in `changed` (the
    first phase that made it) and undone on the way out."""

    def __init__(self, session: Snapshot, device: torch.device | None) -> None:
        self.session = session
        self.device = device
        self.changed: list[str] = []

    def outside(self) -> list[str]:
        """What differs from the session's start before the case runs (an import or a fixture changed it):
        put back, and returned for the case's notes."""
        changes = self.session.changes(snapshot(self.device))
        if changes:
            restore(self.session, self.device)
        return changes

    @contextlib.contextmanager
    def phase(self, name: str) -> Any:
        try:
            yield
        finally:
            changes = self.session.changes(snapshot(self.device))
            if changes:
                self.changed += [f"{c} (in {name})" for c in changes]
                restore(self.session, self.device)

    def message(self) -> str | None:
        if not self.changed:
            return None
        return (
            "global state changed: the variant left torch's process-wide settings changed, which moves the "
            f"reference timed beside it: {'; '.join(self.changed)}. Put them back before returning (a `with` "
            "block such as torch.nn.attention.sdpa_kernel, or set them once in conftest.py for every case); "
            "they were restored before anything else was timed"
        )
