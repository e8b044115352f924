"""The float64 judge of one output, on both of its paths: a finite reference (the common, fast path) and a
reference with non-finite elements (a fully masked row gives NaN), where the output must match them exactly."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_perfguard.measure.correctness import (
    CorrectnessFailure,
    judge_output,
    modified_input,
    oracle_of,
    screened,
)


def rowsum(x: torch.Tensor) -> torch.Tensor:
    """x / x.sum(-1): a row of zeros gives NaN in every path, like attention over a fully masked row."""
    return x / x.sum(-1, keepdim=True)


def judge(out: torch.Tensor, x: torch.Tensor) -> float:
    inputs = ((x,), {})
    oracle = oracle_of(inputs, rowsum, seed=1)
    return judge_output(out, inputs, rowsum, (), seed=1, oracle=oracle).max_abs


def test_a_finite_reference_judges_errors_and_unwritten_elements() -> None:
    x = torch.rand(4, 8) + 0.5
    good = rowsum(x)
    assert judge(good, x) == pytest.approx(0.0, abs=1e-6)
    wrong = good.clone()
    wrong[2, 3] += 0.1
    with pytest.raises(CorrectnessFailure, match=r"max abs error 0.1 at index \(2, 3\)"):
        judge(wrong, x)
    unwritten = good.clone()
    unwritten[1, 5] = math.nan
    with pytest.raises(CorrectnessFailure, match=r"1 of 32 output elements are NaN/Inf.*\(1, 5\)"):
        judge(unwritten, x)


@pytest.mark.parametrize("chunk", [1 << 22, 3])
def test_a_non_finite_reference_must_be_matched_exactly_and_the_rest_judged(
    monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr("pytest_perfguard.measure.correctness.JUDGE_CHUNK", chunk)
    x = torch.rand(4, 8) + 0.5
    x[0] = 0.0  # row 0 is NaN in the reference
    good = rowsum(x)
    assert judge(good, x) == pytest.approx(0.0, abs=1e-6)
    filled = good.clone()
    filled[0] = 0.0  # a kernel that writes zeros where the reference says NaN
    with pytest.raises(CorrectnessFailure, match=r"reference is non-finite at \(0, 0\)"):
        judge(filled, x)
    wrong = good.clone()
    wrong[3, 1] += 0.1
    with pytest.raises(CorrectnessFailure, match=r"atol/rtol bound failed.*1 of 32 elements"):
        judge(wrong, x)


@pytest.mark.parametrize("chunk", [1 << 22, 7, 1])
def test_slices_judge_as_the_whole(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """The output is judged slice by slice; where a slice ends changes no figure and no message."""
    monkeypatch.setattr("pytest_perfguard.measure.correctness.JUDGE_CHUNK", chunk)
    x = torch.rand(4, 8, dtype=torch.float64) + 0.5
    good = rowsum(x)
    out = good + 1e-12 * torch.arange(32, dtype=torch.float64).reshape(4, 8)
    inputs = ((x,), {})
    report = judge_output(out, inputs, rowsum, (), seed=1)
    assert report.max_abs == pytest.approx(31e-12, rel=1e-3) and report.worst_index == (3, 7)
    assert report.rel_fro == pytest.approx(float((out - good).norm() / good.norm()))
    wrong = out.clone()
    wrong[1, 2] += 0.5
    wrong[3, 6] += 0.6
    with pytest.raises(CorrectnessFailure, match=r"2 of 32 elements exceed.*max abs error 0.6 at index \(3, 6\)"):
        judge_output(wrong, inputs, rowsum, (), seed=1)
    unwritten = out.clone()
    unwritten[2, 1] = unwritten[3, 0] = math.nan
    with pytest.raises(CorrectnessFailure, match=r"2 of 32 output elements are NaN/Inf.*first at index \(2, 1\)"):
        judge_output(unwritten, inputs, rowsum, (), seed=1)


def test_an_input_is_modified_only_if_its_values_changed() -> None:
    x = torch.rand(3, 4)
    nan = x.clone()
    nan[1, 2] = math.nan  # a NaN input stays equal to its copy
    assert modified_input([("x", x.clone()), ("m", nan.clone())], [("x", x), ("m", nan)]) is None
    scaled = nan.clone()
    scaled[0, 0] *= 2  # in-place scaling of one element
    assert modified_input([("x", x.clone()), ("m", nan.clone())], [("x", x), ("m", scaled)]) == "m"
    assert modified_input([("x", x.clone())], [("x", x[:2])]) == "x"


def _sdpa_half(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _wrong_outputs(out: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
    """Outputs a cheat leaves behind, each wrong in one way judge_output knows."""
    ref = oracle_of((inputs, {}), _sdpa_half, seed=0).ref
    err = (out.double() - ref).abs().max().item()
    off_native = out.double().clone()
    off_native.view(-1)[7] = ref.view(-1)[7] + 4.0 * max(err, 1e-3)  # past the native bound, within atol/rtol?
    stale = torch.roll(out, 1, dims=-2)
    one_nan = out.clone()
    one_nan.view(-1)[3] = math.nan
    one_inf = out.clone()
    one_inf.view(-1)[5] = -math.inf
    half_done = out.clone()
    half_done[..., : out.shape[-2] // 2, :] = 0
    return {
        "off_native": off_native.to(out.dtype),
        "stale": stale,
        "one_nan": one_nan,
        "one_inf": one_inf,
        "half_done": half_done,
        "float64": out.double(),
        "shape": out[..., :-1, :],
    }


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_device_screen_never_passes_what_the_full_judgement_fails(dtype: torch.dtype) -> None:
    """correctness.screened is what lets the timed-copy check read all its copies at once: it may send a
    correct output to the full judgement, never pass a wrong one. Every way of being wrong here fails the
    full judgement and is not passed by the screen; an honest output passes both; an input changed in place
    is not passed."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 64, 32, generator=g).to(dtype) for _ in range(3))
    inputs = (q, k, v)
    before = [(n, t.clone()) for n, t in zip("qkv", inputs, strict=True)]
    honest = _sdpa_half(*inputs)
    ok = screened(honest, (inputs, {}), _sdpa_half, [], before)
    assert ok is not None and bool(ok)
    judge_output(honest, (inputs, {}), _sdpa_half, [], seed=0)
    for name, wrong in _wrong_outputs(honest, inputs).items():
        with pytest.raises(CorrectnessFailure):
            judge_output(wrong, (inputs, {}), _sdpa_half, [], seed=0)
        got = screened(wrong, (inputs, {}), _sdpa_half, [], before)
        assert got is None or not bool(got), name
    changed = [(n, t.clone()) for n, t in before]
    changed[1][1].view(-1)[0] += 1
    got = screened(honest, (inputs, {}), _sdpa_half, [], changed)
    assert got is not None and not bool(got)


def test_the_screen_leaves_a_float64_output_as_it_was() -> None:
    """The screen's difference is taken out of place: a float64 output is its own float64 copy, and an
    in-place difference would zero the output that the full judgement reads next."""
    g = torch.Generator().manual_seed(4)
    inputs = tuple(torch.randn(1, 2, 16, 8, generator=g, dtype=torch.float64) for _ in range(3))
    out = _sdpa_half(*inputs)
    kept = out.clone()
    ok = screened(out, (inputs, {}), _sdpa_half, [], [(n, t.clone()) for n, t in zip("qkv", inputs, strict=True)])
    assert ok is not None and bool(ok)
    assert torch.equal(out, kept)
