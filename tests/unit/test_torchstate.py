"""torch's process-wide switches guarded (measure/torchstate.py): a change a variant's phase leaves is named
and undone; a change made outside any case is put back before the next case."""

from __future__ import annotations

import torch

from pytest_perfguard.measure import torchstate


def test_a_phase_that_flips_a_switch_is_named_and_undone() -> None:
    start = torchstate.snapshot()
    guard = torchstate.Guard(start, None)
    assert torch.backends.cuda.flash_sdp_enabled()
    with guard.phase("the timed calls"):
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.matmul.allow_tf32 = True  # the legacy setter: what a library may still use
    assert torch.backends.cuda.flash_sdp_enabled()  # put back on the way out
    assert torchstate.snapshot().values == start.values
    message = guard.message()
    assert message is not None and message.startswith("global state changed: the variant left torch's")
    assert "torch.backends.cuda.flash_sdp_enabled(): True -> False (in the timed calls)" in message
    assert ("matmul" in message and "-> tf32 (in the timed calls)" in message) or "allow_tf32: False -> True" in message


def test_a_phase_that_restores_what_it_changed_passes() -> None:
    guard = torchstate.Guard(torchstate.snapshot(), None)
    with guard.phase("the correctness calls"):
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
            pass
        torch.set_grad_enabled(False)
        torch.set_grad_enabled(True)
    assert guard.message() is None


def test_every_switch_the_issue_names_is_read() -> None:
    names = set(torchstate.SWITCHES)
    for wanted in (
        "torch.backends.cuda.flash_sdp_enabled()",
        "torch.backends.cuda.mem_efficient_sdp_enabled()",
        "torch.backends.cuda.math_sdp_enabled()",
        "torch.backends.cudnn.benchmark",
        "torch.backends.cudnn.deterministic",
        "torch.are_deterministic_algorithms_enabled()",
        "torch.get_default_dtype()",
        "torch.is_grad_enabled()",
        "torch.get_num_threads()",
    ):
        assert wanted in names, wanted


def test_the_tf32_switches_are_read_whichever_api_set_them() -> None:
    names = set(torchstate.SWITCHES)
    assert "torch.backends.cuda.matmul.fp32_precision" in names or "torch.backends.cuda.matmul.allow_tf32" in names


def test_a_change_outside_any_case_is_put_back_and_said() -> None:
    start = torchstate.snapshot()
    torch.set_default_dtype(torch.float64)
    try:
        changes = torchstate.Guard(start, None).outside()
        assert changes == ["torch.get_default_dtype(): float32 -> float64"]
        assert torch.get_default_dtype() == torch.float32
    finally:
        torch.set_default_dtype(torch.float32)
