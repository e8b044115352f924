"""End-to-end behaviour of the plugin, through pytester, in the three ways it runs: without xdist,
with xdist but no workers (-n 0), and with two workers (-n 2).

Timing here is driven by a fake nanosecond clock that the kernels advance themselves, with noise drawn
from a seeded generator, so every verdict below is deterministic and the tests cannot flake on a busy
machine. The statistics on real GPU noise are tested in tests/unit/test_stats.py.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_perfguard.judge.baseline import SCHEMA_VERSION
from pytest_perfguard.measure.visible import cpu_model

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # every test runs the plugin end to end

MODES = {"no-xdist": ["-p", "no:xdist"], "n0": ["-n", "0"], "n2": ["-n", "2"]}

CONFTEST = '''
import random
import torch

class FakeClock:
    """Nanoseconds that only move when a fake kernel runs."""
    def __init__(self):
        self.t = 0
    def __call__(self):
        return self.t

CLOCK = FakeClock()
RNG = random.Random(12345)

def reference(q, k, v, causal):
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v

_MEMO = {}

def remembered(q, k, v, causal, fn=reference):
    """fn's answer, computed once per input set: timing calls a kernel thousands of times on the same few
    input copies. The memo holds the inputs, so their ids stay unique. It is keyed by the inputs' version
    counters too: the guard refills an input in place to check the timed calls, and a memo blind to that
    would be the cache it is built to catch."""
    key = (id(fn), id(q), id(k), id(v), q._version, k._version, v._version, causal)
    if key not in _MEMO:
        _MEMO[key] = (q, k, v, fn(q, k, v, causal))
    return _MEMO[key][3].clone()

def timed(ns, noise=0.01, fn=reference):
    """A kernel taking `ns` fake nanoseconds with 1% multiplicative noise (lognormal)."""
    def kernel(q, k, v, causal):
        CLOCK.t += int(ns * RNG.lognormvariate(0.0, noise))
        return remembered(q, k, v, causal, fn)
    kernel.__name__ = f"kernel_{ns}"
    return kernel
'''


def _case(variant_ns: str = "1000", against_ns: str = "1000", extra: str = "") -> str:
    return f"""
import os
import pytest
import torch
from pytest_perfguard import perf_case, Variant
from conftest import CLOCK, reference, timed

SLOW = float(os.environ.get("PLANT_SLOWDOWN", "1.0"))
AGAINST = float(os.environ.get("PLANT_AGAINST", "1.0"))

@perf_case(
    variants={{"fast": timed(int({variant_ns} * SLOW)), "other": timed(2 * {variant_ns}){extra}}},
    reference=reference,
    against=timed(int({against_ns} * AGAINST)),
    flops=lambda S: 4 * S * S * 16,
    clock=CLOCK,
)
@pytest.mark.parametrize("S", [8, 16])
def test_attn(S, perfguard_device):
    q, k, v = (torch.randn(1, 2, S, 16, dtype=torch.float64) for _ in range(3))
    return (q, k, v), {{"causal": True}}
"""


# The modes a run is tested in: without xdist and with two workers. Under -n 0 the session is the no-xdist one
# (xdist loaded, no worker; the records never travel): what -n 0 changes is that the controller plugin is
# registered (inert without workers) and that a fresh process is started with "-n 0" when xdist is loaded,
# which every -n 2 run does too. The update-then-A/A test keeps all three modes (ALL_MODES), the one place
# -n 0 runs end to end; elsewhere it cost a third of each test's runs and tested nothing the others do not.
TESTED_MODES = ("no-xdist", "n2")


@pytest.fixture(params=TESTED_MODES)
def mode(request: pytest.FixtureRequest) -> list[str]:
    return MODES[request.param]


ALL_MODES = pytest.mark.parametrize("mode", list(MODES), indirect=True)
NO_N0 = pytest.mark.parametrize("mode", list(TESTED_MODES), indirect=True)
# A gate's arithmetic is the same in every mode: a test of one gate alone runs once, without xdist. Its
# failure reaches the controller, and is confirmed from a worker, as the time gate's does under -n 2 in the
# update-then-A/A test.
NO_XDIST_ONLY = pytest.mark.parametrize("mode", ["no-xdist"], indirect=True)


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    (pytester.path / ".ci" / "baselines").mkdir(parents=True)
    return pytester


def _runner(p: pytest.Pytester, fresh: bool = False) -> Callable[..., pytest.RunResult]:
    """In-process unless the run may end its process (see `run`)."""
    return p.runpytest_subprocess if fresh else p.runpytest_inprocess


def run(
    p: pytest.Pytester, mode: list[str], *args: str, env: dict[str, str] | None = None, fresh: bool = False
) -> pytest.RunResult:
    """Run the project with the plugin, in this process: a new interpreter spends seconds of CPU importing
    torch and the plugin, which this one has done already, and pytester gives the run fresh copies of the
    project's modules. Under -n 2 this process is the xdist controller and the two workers are new processes,
    as in xdist's own tests. A run that may end its process (``fresh=True``: a timeout ends it with
    os._exit) goes to a subprocess."""
    # One process per update, unless a test asks for more: the multi-process update has tests of its own
    # (tests/test_stored_baseline.py), and each further process imports torch for seconds.
    env = {"PERFGUARD_UPDATE_PROCESSES": "1", **(env or {})}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _runner(p, fresh)(*mode, "-p", "no:cacheprovider", "--perfguard-case-budget", "30", *args)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def record_baseline(p: pytest.Pytester, *args: str) -> pytest.RunResult:
    """The baseline a test starts from, recorded in this process without xdist workers: the cheapest run (under
    -n 2 it would start two worker processes that each import torch). The runs under test, in the test's mode,
    come after it. Update runs in each mode are under test themselves in the update-then-A/A, the merge-and-stale
    and the held-back update tests."""
    return run(p, [], "--perfguard-update-baseline", *args)


def baseline_json(p: pytest.Pytester) -> dict:
    files = list((p.path / ".ci" / "baselines").glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


# ------------------------------------------------------------------------------------------ collection


def test_one_item_per_variant_and_parametrization_with_variant_first(project: pytest.Pytester) -> None:
    project.makepyfile(test_k=_case())
    result = project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        ["*test_attn[[]fast-8[]]", "*test_attn[[]fast-16[]]", "*test_attn[[]other-8[]]", "*test_attn[[]other-16[]]"]
    )


def test_unknown_marker_argument_lists_the_allowed_ones(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from pytest_perfguard import perf_case
        @perf_case(variants={"a": abs}, reference=abs, tolerence=1)
        def test_x():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*unknown argument(s) [[]'tolerence'[]]; allowed: variants, reference, against*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_bad_option_value_names_its_source(project: pytest.Pytester) -> None:
    project.makepyfile(test_k=_case())
    result = run(project, [], "--perfguard", env={"PERFGUARD_MARGIN": "lots"})
    result.stderr.fnmatch_lines(["*Invalid value 'lots' from environment variable PERFGUARD_MARGIN*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


# ----------------------------------------------------------------------------------------- correctness


def test_plain_run_checks_correctness_only(project: pytest.Pytester, mode: list[str]) -> None:
    project.makepyfile(test_k=_case())
    result = run(project, mode)
    result.assert_outcomes(passed=4)
    assert "perfguard:" not in result.stdout.str()


BUGS = {
    "error": ("lambda q, k, v, causal: reference(q, k, v, causal) + 1e-3", "*atol/rtol bound failed (seed *"),
    "nan": (
        "lambda q, k, v, causal: reference(q, k, v, causal).index_fill(-2, torch.tensor([3]), float('nan'))",
        "*output elements are NaN/Inf where the reference is finite, first at index (0, 0, 3, 0)*",
    ),
    "inplace": (
        "lambda q, k, v, causal: (q.add_(0.5), reference(q, k, v, causal))[1]",
        "*input arg0 was modified in place*",
    ),
    "dtype": (
        "lambda q, k, v, causal: reference(q, k, v, causal).float()",
        "*output dtype torch.float32 != expected torch.float64*",
    ),
    "shape": ("lambda q, k, v, causal: reference(q, k, v, causal)[..., :-1]", "*output shape*!= reference shape*"),
    "type": (
        "lambda q, k, v, causal: reference(q, k, v, causal).tolist()",
        "*returned list, expected a plain torch.Tensor*",
    ),
}


def failure_sections(result: pytest.RunResult) -> dict[str, list[str]]:
    """The lines of each failure's section in the report, by its title (``test_attn[buggy_nan-8]``)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in result.outlines:
        if title := re.fullmatch(r"_{3,} (\S.*?) _{3,}", line):
            current = sections.setdefault(title.group(1), [])
        elif re.match(r"={3,} ", line):
            current = None
        elif current is not None:
            current.append(line)
    return sections


def test_planted_correctness_bugs_fail_with_the_reason_and_seed(project: pytest.Pytester, mode: list[str]) -> None:
    """Every kind of wrong answer in one run: each buggy variant's two cases fail, with its own reason."""
    project.makepyfile(test_k=_case(extra="".join(f', "buggy_{name}": {bug}' for name, (bug, _) in BUGS.items())))
    result = run(project, mode, "-k", "buggy")
    result.assert_outcomes(failed=2 * len(BUGS))
    sections = failure_sections(result)
    for name, (_, message) in BUGS.items():
        titles = [title for title in sections if f"[buggy_{name}-" in title]
        assert len(titles) == 2, (name, list(sections))
        mine = pytest.LineMatcher([line for title in titles for line in sections[title]])
        mine.fnmatch_lines([message])
        mine.fnmatch_lines(["*reproduce with --perfguard-seed=*"])


def test_seed_option_reproduces_the_same_seeds(project: pytest.Pytester) -> None:
    project.makepyfile(test_k=_case(extra=', "buggy": lambda q, k, v, causal: reference(q, k, v, causal) + 1'))
    result = run(project, [], "-k", "buggy and 8", "--perfguard-seed", "41")
    result.stdout.fnmatch_lines(["*Seeds drawn for this run: [[]41, 42, 43[]]*"])


def test_unmet_requirement_skips_and_require_gpu_fails(project: pytest.Pytester, mode: list[str]) -> None:
    project.makepyfile(test_k=_case(extra=', "gpu": Variant(reference, requires="cuda")'))
    result = run(project, mode, "-k", "gpu", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*needs a CUDA GPU*"])
    result = run(project, mode, "-k", "gpu", env={"PERFGUARD_REQUIRE_GPU": "1"})
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*--perfguard-require-gpu: needs a CUDA GPU*Diagnostics: torch*"])


# ------------------------------------------------------------------------------------ timing and gates


_FIRST_GUARDS: dict[tuple[str, ...], tuple[pytest.RunResult, Path]] = {}


@pytest.fixture
def first_guard(request: pytest.FixtureRequest, mode: list[str]) -> tuple[pytest.RunResult, Path]:
    """The first --perfguard run of the two-variant project, no baseline stored, in the test's mode: its results
    in out/results.json and its Markdown summary in summary.md, under the project folder it returns. Run once
    per mode (and xdist worker) and read by each test that needs it, each asserting on its own part."""
    key = tuple(mode)
    if key not in _FIRST_GUARDS:
        project: pytest.Pytester = request.getfixturevalue("project")
        project.makepyfile(test_k=_case())
        summary = project.path / "summary.md"
        result = run(
            project,
            mode,
            "--perfguard",
            "--perfguard-json",
            "out/results.json",
            env={"GITHUB_STEP_SUMMARY": str(summary)},
        )
        _FIRST_GUARDS[key] = (result, project.path)
    return _FIRST_GUARDS[key]


def test_perfguard_without_baseline_reports_and_writes_json_and_summary(
    first_guard: tuple[pytest.RunResult, Path],
) -> None:
    result, path = first_guard
    summary = path / "summary.md"
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*perfguard:*", "test_attn:", "fast*S8*ns ±*no baseline*"])
    doc = json.loads((path / "out" / "results.json").read_text())
    assert doc["kind"] == "perfguard-results" and len(doc["results"]) == 4
    fast = next(r for r in doc["results"] if r["id"].endswith("[fast-8]"))
    assert 0.9 < fast["ratio"] < 1.1 and fast["ratio_ci"][0] <= fast["ratio"] <= fast["ratio_ci"][1]
    assert fast["median_ns"] == pytest.approx(1000, rel=0.05)
    assert fast["stop_reason"] == "target" and fast["blocks"] >= 12
    assert fast["tflops"] == pytest.approx(4 * 64 * 16 / 1000e-9 / 1e12, rel=0.05)
    # The whole case (correctness, measurement, checks) in wall time; elapsed_s runs on the injected clock.
    assert fast["case_s"] > fast["checks_s"] > 0
    assert all(r["device"] == cpu_model() for r in doc["results"])  # what each was timed on (a GPU: its UUID)
    other = next(r for r in doc["results"] if r["id"].endswith("[other-8]"))
    assert other["ratio"] == pytest.approx(2.0, rel=0.05)
    md = summary.read_text()
    assert "| case" in md and "fast" in md


def test_a_variant_timed_against_itself_reports_the_time_gates_mde(project: pytest.Pytester) -> None:
    """The A/A control (the reference as one of its own variants): a slowdown of it moves both sides of its
    ratio, so its MDE is the time gate's, while another variant's is the better of its two gates (here the
    ratio gate for "twin", which shares the reference's ramp, and the time gate for "fast")."""
    project.makepyfile(
        test_self="""
import math
import pytest
import torch
from pytest_perfguard import perf_case
from conftest import CLOCK, reference, remembered, timed

CALLS = [0]

def drifting(q, k, v, causal):
    # A slow ramp that both sides of each interleaved pair share: the ratio cancels it, the time does not,
    # so the ratio gate resolves finer than the time gate.
    CALLS[0] += 1
    CLOCK.t += int(1000 * (1.0 + CALLS[0] / 2000.0))
    return remembered(q, k, v, causal)

REF = drifting


def twin(q, k, v, causal):
    return drifting(q, k, v, causal)  # the same ramp, another kernel: its ratio gate resolves finer

@perf_case(variants={"self": REF, "twin": twin, "fast": timed(1000)}, reference=reference, against=REF,
           clock=CLOCK)
@pytest.mark.parametrize("S", [8])
def test_attn(S, perfguard_device):
    q, k, v = (torch.randn(1, 2, S, 16, dtype=torch.float64) for _ in range(3))
    return (q, k, v), {"causal": True}
"""
    )
    budget = ("--perfguard-case-budget", "1")
    for _ in range(2):  # runs that agree: the stored between-run noise falls to its floor
        run(project, MODES["no-xdist"], "--perfguard-update-baseline", *budget).assert_outcomes(passed=3)
    run(project, MODES["no-xdist"], "--perfguard", "--perfguard-json", "r.json", *budget).assert_outcomes(passed=3)
    records = {r["variant"]: r for r in json.loads((project.path / "r.json").read_text())["results"]}
    gate_mde = {v: {g["gate"]: g["mde"] for g in r["gates"]} for v, r in records.items()}
    assert all(m["baseline"] is not None and m["ratio"] is not None for m in gate_mde.values()), gate_mde
    assert gate_mde["self"]["ratio"] < gate_mde["self"]["baseline"], gate_mde  # else the test could not fail
    assert records["self"]["mde"] == gate_mde["self"]["baseline"]
    assert gate_mde["twin"]["ratio"] < gate_mde["twin"]["baseline"], gate_mde
    assert records["twin"]["mde"] == gate_mde["twin"]["ratio"]
    assert records["fast"]["mde"] == min(gate_mde["fast"]["baseline"], gate_mde["fast"]["ratio"])


@ALL_MODES
def test_update_then_aa_rerun_passes_and_planted_slowdown_fails(project: pytest.Pytester, mode: list[str]) -> None:
    project.makepyfile(test_k=_case())
    result = run(project, mode, "--perfguard-update-baseline")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*baseline .ci*baselines*.json: 4 added*"])
    stored = baseline_json(project)
    assert stored["schema_version"] == SCHEMA_VERSION and len(stored["cases"]) == 4
    assert not list((project.path / ".ci" / "baselines").glob("*.tmp*"))

    result = run(project, mode, "--perfguard", "--perfguard-json", "aa.json")  # A/A: same kernels, fresh process
    result.assert_outcomes(passed=4)
    assert "regressed" not in result.stdout.str()
    # Each case reports the smallest slowdown it would catch: its better gate's, never below that gate's margin.
    doc = json.loads((project.path / "aa.json").read_text())
    for r in doc["results"]:
        sized = [g for g in r["gates"] if g["mde"] is not None]
        assert {g["gate"] for g in sized} == {"baseline", "ratio"}, r["gates"]
        best = min(sized, key=lambda g: g["mde"])
        assert isinstance(r["mde"], float) and r["mde"] == best["mde"] > best["threshold"] - 1 >= 0.05, (r["id"], best)
    fast = next(r for r in doc["results"] if r["id"].endswith("[fast-8]"))
    result.stdout.fnmatch_lines(["*Δ baseline*MDE*verdict*", "test_attn:", f"fast*S8*{fast['mde'] * 100:+.1f}% *pass*"])

    result = run(project, mode, "--perfguard", env={"PLANT_SLOWDOWN": "1.5"})
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*fast: performance regression: time vs baseline +5*% (95% CI*"])
    result.stdout.fnmatch_lines(["*confirmed in a fresh process: time vs baseline +5*%*"])


@NO_N0
def test_a_regression_seen_in_one_process_only_is_inconclusive_not_a_failure(
    project: pytest.Pytester, mode: list[str]
) -> None:
    """The slowdown belongs to the process (popped from the environment, so the fresh process that
    confirms the case does not see it), as a placement-dependent small kernel's does on a GPU."""
    once = _case().replace(
        'SLOW = float(os.environ.get("PLANT_SLOWDOWN", "1.0"))', 'SLOW = float(os.environ.pop("PLANT_ONCE", "1.0"))'
    )
    project.makepyfile(test_k=once)
    record_baseline(project).assert_outcomes(passed=4)
    result = run(project, mode, "--perfguard", "--perfguard-json", "r.json", env={"PLANT_ONCE": "1.3"})
    result.assert_outcomes(passed=4)
    # The reason sits below the case's row in the table, wrapped to 120 columns: read it as one text.
    text = " ".join(result.stdout.str().split())
    assert fnmatch.fnmatch(text, "*not confirmed: time vs baseline +3*% * in this process, but pass in a fresh one*")
    doc = json.loads((project.path / "r.json").read_text())
    fast = [r for r in doc["results"] if r["variant"] == "fast"]
    assert [r["verdict"] for r in fast] == ["inconclusive", "inconclusive"]
    assert all(r["confirmation"]["verdict"] == "pass" for r in fast)
    # The fresh process's time is its own, not the case's: case_s is this process's share alone.
    assert all(r["case_s"] < r["confirmation"]["elapsed_s"] for r in fast)
    # With confirmation off, the same process-bound slowdown fails the build.
    result = run(project, mode, "--perfguard", "--perfguard-no-confirm", env={"PLANT_ONCE": "1.3"})
    result.assert_outcomes(passed=2, failed=2)


@NO_N0
def test_an_update_run_that_moved_in_its_own_process_only_is_held_back(
    project: pytest.Pytester, mode: list[str]
) -> None:
    """A slow process during an update would restart a case's entry as a "changed kernel" and throw away the
    runs its centre was made of. The move is checked in a fresh process first: a process-bound one (popped
    from the environment, so the fresh process does not see it) is held back; a real one restarts the entry."""
    once = _case().replace(
        'SLOW = float(os.environ.get("PLANT_SLOWDOWN", "1.0"))',
        'SLOW = float(os.environ.pop("PLANT_ONCE", os.environ.get("PLANT_SLOWDOWN", "1.0")))',
    )
    project.makepyfile(test_k=once)
    record_baseline(project).assert_outcomes(passed=4)
    first = baseline_json(project)["cases"]

    result = run(project, mode, "--perfguard-update-baseline", "--perfguard-json", "u.json", env={"PLANT_ONCE": "2.0"})
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*2 case(s) not folded in: they moved past the margin in this process only*"])
    held = baseline_json(project)["cases"]
    for case_id, e in held.items():
        if "[fast-" in case_id:
            assert (e["runs"], e["median_ns"]) == (1, first[case_id]["median_ns"]), case_id
        else:
            assert e["runs"] == 2, case_id
    doc = json.loads((project.path / "u.json").read_text())
    fast = [r for r in doc["results"] if r["variant"] == "fast"]
    assert all("not folded into the baseline" in r["baseline_hold"] for r in fast)
    assert all(r["confirmation"]["verdict"] == "pass" for r in fast)
    # The fresh process's time is its own, not the case's: case_s is this process's share alone.
    assert all(r["case_s"] < r["confirmation"]["elapsed_s"] for r in fast)

    result = run(project, mode, "--perfguard-update-baseline", env={"PLANT_SLOWDOWN": "2.0"})
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*2 reset*"])
    assert "not folded in" not in result.stdout.str()
    changed = baseline_json(project)["cases"]
    for case_id, e in changed.items():
        if "[fast-" in case_id:
            assert e["runs"] == 1 and e["median_ns"] == pytest.approx(2 * first[case_id]["median_ns"], rel=0.1)


def test_faster_than_baseline_is_reported(project: pytest.Pytester) -> None:
    project.makepyfile(test_k=_case())
    record_baseline(project).assert_outcomes(passed=4)
    result = run(project, [], "--perfguard", "-k", "fast", "--perfguard-json", "r.json", env={"PLANT_SLOWDOWN": "0.5"})
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*faster*"])
    doc_gate = "faster than the baseline by more than the margin; update it"
    assert doc_gate in (project.path / "r.json").read_text() and result.ret == 0


@NO_XDIST_ONLY
def test_ratio_gate_fires_when_the_reference_got_faster(project: pytest.Pytester, mode: list[str]) -> None:
    project.makepyfile(test_k=_case())
    record_baseline(project, "-k", "fast").assert_outcomes(passed=2)
    # The variant's own time is unchanged, but SDPA got 40% faster: the variant lost ground.
    result = run(project, mode, "--perfguard", "-k", "fast", "--perfguard-margin", "0.3", env={"PLANT_AGAINST": "0.6"})
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*performance regression: ratio vs baseline ratio +6*%*"])


@NO_XDIST_ONLY
def test_max_ratio_gate(project: pytest.Pytester, mode: list[str]) -> None:
    project.makepyfile(test_k=_case(extra=', "capped": Variant(timed(3000), max_ratio=1.5)'))
    result = run(project, mode, "--perfguard", "-k", "capped")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*ratio 3.0* exceeds max_ratio 1.5*"])


def test_update_merges_keeps_other_cases_and_reports_stale(project: pytest.Pytester, mode: list[str]) -> None:
    project.makepyfile(test_k=_case())
    record_baseline(project).assert_outcomes(passed=4)
    before = baseline_json(project)
    run(project, mode, "--perfguard-update-baseline", "-k", "fast").assert_outcomes(passed=2)
    after = baseline_json(project)
    assert set(after["cases"]) == set(before["cases"])
    fast_id = next(k for k in after["cases"] if k.endswith("[fast-8]"))
    other_id = next(k for k in after["cases"] if k.endswith("[other-8]"))
    assert after["cases"][fast_id]["runs"] == 2 and after["cases"][other_id] == before["cases"][other_id]
    # Remove a variant from the test: its stored entries become stale.
    project.makepyfile(test_k=_case().replace(', "other": timed(2 * 1000)', ""))
    result = run(project, mode, "--perfguard-update-baseline")
    result.stdout.fnmatch_lines(["*2 stale case(s) stored but not collected*--perfguard-prune*"])
    result = run(project, mode, "--perfguard-update-baseline", "--perfguard-prune")
    result.stdout.fnmatch_lines(["*pruned 2 stale case(s)*"])
    assert len(baseline_json(project)["cases"]) == 2


def test_workload_change_is_not_comparable(project: pytest.Pytester) -> None:
    project.makepyfile(test_k=_case())
    record_baseline(project, "-k", "fast").assert_outcomes(passed=2)
    project.makepyfile(test_k=_case().replace("(1, 2, S, 16", "(4, 2, S, 16"))
    result = run(project, [], "--perfguard", "-k", "fast", env={"PLANT_SLOWDOWN": "3"})
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*not comparable*"])
    strict = run(project, [], "--perfguard", "-k", "fast", "--perfguard-strict")
    strict.assert_outcomes(failed=2)
    strict.stdout.fnmatch_lines(["*--perfguard-strict (not comparable): not comparable: workload changed*"])


def test_strict_fails_on_missing_baseline(project: pytest.Pytester) -> None:
    project.makepyfile(test_k=_case())
    result = run(project, [], "--perfguard", "--perfguard-strict", "-k", "fast")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*--perfguard-strict (no baseline): no stored baseline*--perfguard-update-baseline*"])


def test_zero_perf_cases_under_perfguard_fails(pytester: pytest.Pytester, mode: list[str]) -> None:
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = _runner(pytester)(*mode, "--perfguard", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*no perf case was timed (no @perf_case test was collected)*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_a_run_whose_every_case_failed_says_so_not_that_none_was_collected(project: pytest.Pytester) -> None:
    """Every item failed its correctness gate: the message said "no @perf_case test was collected"."""
    wrong = _case().replace("timed(int(1000 * SLOW))", "timed(1000, fn=lambda q, k, v, causal: q)")
    project.makepyfile(test_k=wrong)
    result = run(project, [], "--perfguard-update-baseline", "-k", "fast")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*no perf case was timed (2 failed before a measurement finished (2 incorrect))*"])


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"schema_version": 1, "device": ', "*truncated*"),
        ("<<<<<<< HEAD\n{}\n=======\n{}\n>>>>>>> branch\n", "*merge conflict*"),
        ('{"schema_version": 99, "device": {"slug": "x", "name": "x"}, "cases": {}}', "*upgrade pytest-perfguard*"),
        (
            '{"schema_version": 1, "schema_version": 1, "device": {"slug": "x", "name": "x"}, "cases": {}}',
            "*duplicate key*",
        ),
    ],
    ids=["truncated", "conflict", "newer", "duplicate"],
)
def test_bad_baseline_file_errors_naming_the_file_and_is_left_alone(
    project: pytest.Pytester, mode: list[str], content: str, problem: str
) -> None:
    project.makepyfile(test_k=_case())
    record_baseline(project, "-k", "fast").assert_outcomes(passed=2)
    path = next((project.path / ".ci" / "baselines").glob("*.json"))
    path.write_text(content)
    for flag in ("--perfguard", "--perfguard-update-baseline"):
        result = run(project, mode, flag)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"*perfguard: *{path.name}*"])
        assert problem.strip("*").lower() in result.stderr.str().lower()
        assert path.read_text() == content


def test_first_update_creates_the_default_baseline_folder(pytester: pytest.Pytester) -> None:
    # An explicitly configured folder without a parent stays an error: tests/test_baseline_paths.py.
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_k=_case())
    result = run(pytester, [], "--perfguard-update-baseline", "-k", "fast")
    result.stdout.fnmatch_lines(["*created the baseline folder .ci*baselines*", "*2 added*"])
    assert result.ret == 0
    assert len(list((pytester.path / ".ci" / "baselines").glob("*.json"))) == 1


# ---------------------------------------------------------------------------------------------- faults

_STICKY = (
    "lambda q, k, v, causal: (_ for _ in ()).throw("
    'RuntimeError("CUDA error: an illegal memory access was encountered"))'
)
_OOM = (
    "lambda q, k, v, causal: (_ for _ in ()).throw("
    'torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))'
)


def test_sticky_cuda_error_fails_its_case_and_no_later_case_is_judged(project: pytest.Pytester) -> None:
    project.makepyfile(test_k=_case(extra=f', "aaa_poison": {_STICKY}'))
    result = run(project, ["-p", "no:xdist"], "--perfguard-update-baseline", "-rs")
    result.stdout.fnmatch_lines(
        ["*aaa_poison: correctness check raised RuntimeError: CUDA error: an illegal memory access*"]
    )
    result.stdout.fnmatch_lines(["*not run: CUDA context poisoned by test_k.py::test_attn[[]aaa_poison-8[]]*"])
    result.stdout.fnmatch_lines(["*no baseline written: the CUDA context was poisoned*"])
    assert "regressed" not in result.stdout.str()
    assert not list((project.path / ".ci" / "baselines").glob("*.json"))


def test_out_of_memory_fails_that_case_and_the_run_goes_on(project: pytest.Pytester) -> None:
    project.makepyfile(test_k=_case(extra=f', "oom": {_OOM}'))
    result = run(project, ["-p", "no:xdist"], "--perfguard")
    result.assert_outcomes(passed=4, failed=2)
    result.stdout.fnmatch_lines(
        ["*oom: CUDA out of memory in correctness check (inputs float64[[]1,2,8,16[]]*Tried to allocate 2.00 GiB*"]
    )


def test_hung_kernel_times_out_with_the_case_name_and_results_are_flushed(project: pytest.Pytester) -> None:
    hang = "lambda q, k, v, causal: __import__('time').sleep(3600)"
    project.makepyfile(test_k=_case(extra=f', "hang": {hang}'))
    result = run(
        project,
        ["-p", "no:xdist"],
        "--perfguard",
        "--perfguard-case-timeout",
        "3",
        "--perfguard-json",
        "r.json",
        "-k",
        "hang and 8",
        fresh=True,
    )
    assert result.ret != 0
    result.stderr.fnmatch_lines(
        [
            "*perfguard: TIMEOUT: test_k.py::test_attn[[]hang-8[]] ran longer than 3s (--perfguard-case-timeout) in "
            "its correctness check; ending the session*"
        ]
    )
    doc = json.loads((project.path / "r.json").read_text())
    assert any(r["verdict"] == "timeout" for r in doc["results"])


# A kernel on the fake clock whose noise keeps the measurement's interval wide: it measures until its budget.
# Its calls stop returning (a hang) after HANG_AFTER_S seconds of them, or raise after RAISE_AFTER_S, where set.
LATE_HANG = """

import os
import time

_STARTED = []


def late(q, k, v, causal, kernel=timed(1000, noise=3.0)):
    time.sleep(0.0002)  # its blocks take real time: 400 of them outlast the timeout
    for stop in ("HANG_AFTER_S", "RAISE_AFTER_S"):
        if os.environ.get(stop):
            _STARTED.append(time.monotonic())
            if time.monotonic() - _STARTED[0] > float(os.environ[stop]):
                if stop == "RAISE_AFTER_S":
                    raise RuntimeError("the kernel gave up")
                time.sleep(3600)
    return kernel(q, k, v, causal)
"""


def test_a_case_that_raises_while_timed_keeps_where_it_ran(project: pytest.Pytester) -> None:
    project.path.joinpath("conftest.py").write_text(CONFTEST + LATE_HANG)
    project.makepyfile(test_k=_case(extra=', "late": __import__("conftest").late'))
    args = ("--perfguard", "--perfguard-json", "r.json", "-k", "late and 8")
    result = run(project, ["-p", "no:xdist"], *args, env={"RAISE_AFTER_S": "0.5"})
    result.assert_outcomes(failed=1)
    (r,) = json.loads((project.path / "r.json").read_text())["results"]
    assert (r["verdict"], r["reasons"]) == ("error", ["timing raised RuntimeError: the kernel gave up"])
    import torch

    assert r["env"]["torch"] == torch.__version__, r


@pytest.mark.parametrize(
    ("hang", "doing"),
    [
        (
            "1",
            "in timing for * s: no block had ended for * s (* had before that), as a call that never returns leaves it",
        ),
        (
            "",
            "in timing for * s, still measuring: * blocks of its measurement, the last * s ago; a longer "
            "--perfguard-case-timeout or a "
            "shorter --perfguard-case-budget lets it finish",
        ),
    ],
    ids=["hung", "measuring"],
)
def test_a_timeout_in_timing_says_whether_blocks_were_still_ending(
    project: pytest.Pytester, hang: str, doing: str
) -> None:
    """A case past its timeout while timed: a call that stopped returning and a measurement that was still
    taking blocks are told apart, and the record keeps where the case ran (its environment)."""
    project.path.joinpath("conftest.py").write_text(CONFTEST + LATE_HANG)
    project.makepyfile(test_k=_case(extra=', "late": __import__("conftest").late'))
    args = ("--perfguard", "--perfguard-case-timeout", "3", "--perfguard-json", "r.json", "-k", "late and 8")
    result = run(project, ["-p", "no:xdist"], *args, env={"HANG_AFTER_S": hang}, fresh=True)
    assert result.ret != 0
    message = f"TIMEOUT: test_k.py::test_attn[[]late-8[]] ran longer than 3s (--perfguard-case-timeout) {doing}; "
    result.stderr.fnmatch_lines([f"*perfguard: {message}ending the session*"])
    (r,) = json.loads((project.path / "r.json").read_text())["results"]
    assert r["verdict"] == "timeout" and "in timing" in r["reasons"][0]
    import torch

    assert r["env"]["torch"] == torch.__version__, r


def test_under_xdist_a_poisoned_worker_exits_and_a_fresh_one_runs_the_rest(project: pytest.Pytester) -> None:
    project.makepyfile(test_k=_case(extra=f', "aaa_poison": {_STICKY}'))
    result = run(project, ["-n", "2"], "--perfguard-update-baseline", "--perfguard-json", "r.json", "-rs")
    # Each poisoning case fails once, with its own reason; every other case is run by a worker that is
    # not poisoned and gets a real verdict, none "not run".
    result.assert_outcomes(passed=4, failed=2)
    result.stdout.fnmatch_lines(
        ["*aaa_poison: correctness check raised RuntimeError: CUDA error: an illegal memory access*"]
    )
    result.stdout.fnmatch_lines(["*replacing crashed worker*"])
    result.stdout.fnmatch_lines(
        ["*perfguard: worker gw* ended after test_k.py::test_attn[[]aaa_poison-*[]] poisoned its CUDA context*"]
    )
    result.stdout.fnmatch_lines(
        ["*no baseline written: the CUDA context was poisoned during this session (by *aaa_poison*"]
    )
    assert "not run" not in result.stdout.str()
    assert "crashed while running" not in result.stdout.str()
    assert not list((project.path / ".ci" / "baselines").glob("*.json"))
    doc = json.loads((project.path / "r.json").read_text())
    by_variant: dict[str, list[str]] = {}
    for r in doc["results"]:
        by_variant.setdefault(r["variant"], []).append(r["outcome"])
    assert by_variant == {
        "aaa_poison": ["failed", "failed"],
        "fast": ["passed", "passed"],
        "other": ["passed", "passed"],
    }


def test_under_xdist_a_hung_case_times_out_and_the_rest_still_run(project: pytest.Pytester) -> None:
    hang = "lambda q, k, v, causal: __import__('time').sleep(3600)"
    project.makepyfile(test_k=_case(extra=f', "hang": {hang}'))
    # The run waits out the timeout; it need only be far above a case's own time here (under 1 s of CPU).
    result = run(
        project,
        ["-n", "2"],
        "--perfguard",
        "--perfguard-case-timeout",
        "10",
        "--perfguard-json",
        "r.json",
        "-k",
        "not (hang and 16)",
    )
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*TIMEOUT: test_k.py::test_attn[[]hang-8[]] ran longer than 10s*"])
    assert "crashed while running" not in result.stdout.str()
    doc = json.loads((project.path / "r.json").read_text())
    verdicts = sorted(str(r.get("verdict")) for r in doc["results"])
    assert verdicts.count("timeout") == 1 and len(verdicts) == 5, verdicts


def test_under_xdist_a_crashed_worker_is_recorded_and_the_rest_still_run(project: pytest.Pytester) -> None:
    crash = "lambda q, k, v, causal: __import__('os')._exit(9)"
    project.makepyfile(test_k=_case(extra=f', "crash": {crash}'))
    result = run(project, ["-n", "2"], "--perfguard", "--perfguard-json", "r.json", "-k", "not (crash and 16)")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*worker 'gw*' crashed while running 'test_k.py::test_attn[[]crash-8[]]'*"])
    doc = json.loads((project.path / "r.json").read_text())
    crashed = [r for r in doc["results"] if r.get("crashed")]
    assert [r["id"] for r in crashed] == ["test_k.py::test_attn[crash-8]"]
    assert len(doc["results"]) == 5


# ------------------------------------------------------------------------------------------ live progress

DONE_LINE = r"perfguard: test_attn\[(fast|other)\] S(8|16): .* blocks in [\d.]+ s \((target|budget)\): \w"
TTY_CONFTEST = """

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    reporter = config.pluginmanager.getplugin("terminalreporter")
    reporter.isatty = type(reporter.isatty)(True)  # as on a terminal (a bool pytest also calls)
"""


def test_progress_off_a_tty_is_one_line_per_measured_case(first_guard: tuple[pytest.RunResult, Path]) -> None:
    import re

    result, _ = first_guard
    result.assert_outcomes(passed=4)
    out = result.stdout.str()
    done = [line for line in out.splitlines() if re.match(DONE_LINE, line)]
    assert len(done) == 4, out  # one per case, from the xdist controller under -n 2
    assert "\r" not in out and "block 1 " not in out
    lines = out.splitlines()
    assert all(lines[i + 1].strip() for i, line in enumerate(lines[:-1]) if re.match(DONE_LINE, line)), out


def test_progress_is_silent_under_q(project: pytest.Pytester) -> None:
    project.makepyfile(test_k=_case())
    result = run(project, ["-p", "no:xdist"], "--perfguard", "-q")
    result.assert_outcomes(passed=4)
    assert "blocks in" not in result.stdout.str() and "\r" not in result.stdout.str()


def test_progress_on_a_tty_rewrites_one_line_and_clears_it(project: pytest.Pytester) -> None:
    import re

    project.makeconftest(CONFTEST.replace("import random", "import random\nimport pytest", 1) + TTY_CONFTEST)
    project.makepyfile(test_k=_case())
    # fresh: a subprocess, whose raw output pytester keeps in the file "stdout"
    result = run(project, ["-p", "no:xdist"], "--perfguard", env={"COLUMNS": "120"}, fresh=True)
    result.assert_outcomes(passed=4)
    out = (project.path / "stdout").read_bytes().decode()  # as written: result.stdout splits lines at \r
    drawn = re.findall(
        r"\rperfguard: (\d+) blocks?  CI (-|±[\d.]+%) \(target 1\.00%\)  [\d.]+ s, [\d.]+ s left  "
        r"(test_attn\[\w+-\d+\])",
        out,
    )
    assert {name for _, _, name in drawn} == {f"test_attn[{v}-{s}]" for v in ("fast", "other") for s in (8, 16)}, out
    assert out.count("\r\x1b[A") == 4  # cleared after each case, the cursor back at the end of pytest's line
    assert not any(re.match(DONE_LINE, line) for line in out.splitlines())  # no log lines on a terminal
    screen = _screen(out)  # what a person sees at the end: pytest's own lines, as without the live line
    assert any(re.fullmatch(r"test_k\.py \.{4} +\[100%\]", line) for line in screen), screen
    assert not any("blocks  CI" in line for line in screen), screen


def _screen(raw: str) -> list[str]:
    """The lines a terminal shows after `raw`: enough of one for \\r, \\n, cursor up and right."""
    import re

    lines, row, col = [""], 0, 0
    for m in re.finditer(r"\x1b\[(\d*)([A-Za-z])|\r|\n|[^\x1b\r\n]+", raw):
        token = m.group(0)
        if token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            lines.extend([""] * (row + 1 - len(lines)))
        elif m.group(2) == "A":
            row -= int(m.group(1) or 1)
        elif m.group(2) == "C":
            col += int(m.group(1) or 1)
        elif m.group(2) is None:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + token + line[col + len(token) :]
            col += len(token)
    return [line.rstrip() for line in lines]


def test_the_table_counts_the_skips_pytest_counts(project: pytest.Pytester, mode: list[str]) -> None:
    """A shape skipped by a mark never reaches the plugin's runner: the table said "skipped 25" where pytest
    said "88 skipped" (issue 46). Each such item is kept as a skipped record with its reason."""
    case = _case().replace(
        '@pytest.mark.parametrize("S", [8, 16])',
        '@pytest.mark.parametrize("S", [8, pytest.param(16, marks=pytest.mark.skipif(True, reason="too big here"))])',
    )
    project.makepyfile(test_k=case)
    result = run(project, mode, "--perfguard", "--perfguard-json", "perfguard-results.json")
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines(["*skipped 2: 2 too big here*"])
    doc = json.loads((project.path / "perfguard-results.json").read_text())
    skipped = sorted(r["id"] for r in doc["results"] if r["outcome"] == "skipped")
    assert skipped == ["test_k.py::test_attn[fast-16]", "test_k.py::test_attn[other-16]"], skipped
