"""What a new user meets in the first hour (issue 26), end to end through pytester: `pytest --help`, a bad
setting, a variant that raises, a skipped variant, a path option written with a space, the margin the
gates used, and a baseline stored with a wide interval."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # every test runs the plugin end to end

MODES = {"no-xdist": ["-p", "no:xdist"], "n2": ["-n", "2"]}

CONFTEST = """
import random
import torch

class FakeClock:
    def __init__(self):
        self.t = 0
    def __call__(self):
        return self.t

CLOCK = FakeClock()
RNG = random.Random(7)

def reference(x):
    return x * 2

def timed(ns, noise=0.01):
    def kernel(x):
        CLOCK.t += int(ns * RNG.lognormvariate(0.0, noise))
        return x * 2
    return kernel
"""

CASES = """
import os
import pytest
import torch
from pytest_perfguard import Variant, perf_case
from conftest import CLOCK, reference, timed

NOISE = float(os.environ.get("KERNEL_NOISE", "0.01"))


def deep_inside_the_kernel(x):
    raise RuntimeError("boom")


def broken(x):
    return deep_inside_the_kernel(x)


@perf_case(
    variants={
        "fine": timed(1000, NOISE),
        "broken": broken,
        "gpu": Variant(reference, requires="cuda"),
    },
    reference=reference,
    against=timed(1000, NOISE),
    clock=CLOCK,
)
@pytest.mark.parametrize("n", [1024, 256])
def test_k(n, perfguard_device):
    return (torch.randn(n, dtype=torch.float64),), {}
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_k=CASES)
    return pytester


def run(p: pytest.Pytester, *args: str) -> pytest.RunResult:
    return p.runpytest_inprocess("-p", "no:cacheprovider", "--perfguard-case-budget", "30", *args)


def test_pytest_help_works_with_the_plugin_loaded(pytester: pytest.Pytester) -> None:
    """argparse %-formats help strings: a bare "95% CI" in one made `pytest --help` crash."""
    result = pytester.runpytest_subprocess("--help")
    assert result.ret == 0, result.stderr.str()
    result.stdout.fnmatch_lines(["*--perfguard-ci-target=CI_TARGET*", "*95% CI half-width*"])


def test_a_bad_value_says_which_setting_where_from_and_what_is_expected(project: pytest.Pytester) -> None:
    result = run(project, "--perfguard-margin", "abc")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*Invalid value 'abc' from --perfguard-margin, the perfguard setting margin (*): expected a number such as*"]
    )


def test_a_body_that_returns_nothing_is_named_as_the_inputs_step(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_rn="""
import torch
from pytest_perfguard import perf_case

def k(x):
    return x * 2

@perf_case(variants={"k": k}, reference=k)
def test_none(perfguard_device):
    x = torch.randn(8)
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*perfguard: k: making the inputs (the test's body) raised TypeError: test_none must return (args, kwargs)*"]
    )
    assert "requirements raised" not in result.stdout.str()


def test_a_mistyped_option_names_the_nearest_one(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    typo = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--perfguard-updat-baseline")
    assert typo.ret == pytest.ExitCode.USAGE_ERROR
    typo.stderr.fnmatch_lines(
        ["*--perfguard-updat-baseline: no such option; did you mean --perfguard-update-baseline?"]
    )
    swapped = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--perfgaurd=1")
    swapped.stderr.fnmatch_lines(["*--perfgaurd: no such option; did you mean --perfguard?"])
    # another plugin's --perf option, and a test argument after --, are pytest's to judge
    other = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--perf-foo")
    assert "no such option" not in other.stderr.str()
    assert pytester.runpytest_subprocess("-p", "no:cacheprovider", "--perfguard-margin", "0.05").ret == 0


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("tb", ["long", "short", "line"])
def test_a_raising_variant_fails_with_its_own_traceback(project: pytest.Pytester, mode: str, tb: str) -> None:
    result = run(project, *MODES[mode], f"--tb={tb}", "-k", "broken", "--perfguard")
    result.assert_outcomes(failed=2)
    if tb == "line":
        result.stdout.fnmatch_lines(["*test_k.py:*: RuntimeError: boom"])
    else:
        result.stdout.fnmatch_lines(
            ["*deep_inside_the_kernel(x)*", '*raise RuntimeError("boom")*', "E*RuntimeError: boom"]
        )
    text = result.stdout.str()
    assert "runner.py" not in text and "marker.py" not in text
    # the perfguard table keeps its one short reason line per case
    assert "test_k.py::test_k[broken-256]: correctness check raised RuntimeError: boom" in text


@pytest.mark.parametrize("mode", list(MODES))
def test_a_skip_points_at_the_test_not_the_plugin(project: pytest.Pytester, mode: str) -> None:
    result = run(project, *MODES[mode], "-rs", "-k", "gpu")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["SKIPPED [[]2[]] test_k.py:*: needs a CUDA GPU*"])
    assert "pytest_perfguard" not in result.stdout.str()


def test_the_table_sorts_shapes_by_their_numbers(project: pytest.Pytester) -> None:
    result = run(project, "-k", "fine", "--perfguard")
    result.assert_outcomes(passed=2)
    rows = [line.split()[1] for line in result.stdout.lines if line.startswith("fine ")]
    assert rows == ["n256", "n1024"], result.stdout.str()


def _git(path: Path, *args: str) -> None:
    env = {"GIT_CONFIG_GLOBAL": os.devnull, "HOME": str(path), "PATH": os.environ["PATH"]}
    subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, env=env)


def test_a_path_option_with_a_space_that_moves_the_rootdir_is_refused(
    project: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """pytest picks the rootdir before it knows the plugin's options: `--perfguard-json /elsewhere/r.json`
    (an existing file) reads as a test path there, and the rootdir, the baseline folder and the case ids
    moved with it."""
    _git(project.path, "init", "-q")
    project.makeini("[pytest]\n")
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "r.json"
    elsewhere.write_text("{}")
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--perfguard-json", str(elsewhere), "-k", "fine")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*outside this git repository*Write --perfguard-json={elsewhere} (with '=') instead.*"]
    )
    result = project.runpytest_subprocess("-p", "no:cacheprovider", f"--perfguard-json={elsewhere}", "-k", "fine")
    result.assert_outcomes(passed=2)
    assert json.loads(elsewhere.read_text())["results"]


def test_the_margin_used_is_said(project: pytest.Pytester) -> None:
    """The gates widen the margin from the stored between-run noise (on a CPU its floor makes 20% of 5%);
    the README and the Markdown said 5%. The guard says the margin it used. (A baseline whose processes
    spread too wide to judge the margin is not stored at all: tests/test_stored_baseline.py and
    tests/test_update_robust.py plant such processes deterministically.)"""
    run(project, "-k", "fine", "--perfguard-update-baseline").assert_outcomes(passed=2)
    result = run(project, "-k", "fine", "--perfguard")
    result.stdout.fnmatch_lines(["margin used by the baseline and ratio gates: *; 5% set, widened *"])


def _own_project_section() -> str:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Use it in your own project") :]
    return section[: section.index("\n## ", 1)]


def test_the_readme_example_runs_as_written(pytester: pytest.Pytester) -> None:
    """Copied from the README, so the README cannot drift from what runs (.ci/clean_install.sh runs it too,
    in a fresh venv with the wheel alone)."""
    section = _own_project_section()
    install = re.search(r"```bash\n(.*?)```", section, re.S)
    example = re.search(r"```python\n(.*?)```", section, re.S)
    assert install is not None and example is not None
    # the CPU build first: a bare torch requirement pulled the CUDA build and its nvidia packages (5.4 GB)
    assert re.match(r"pip install torch==[\d.]+ && pip install \S+", install.group(1).strip())
    pytester.makepyfile(test_readme_example=example.group(1))  # not test_attention: tests/perf has one
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 2 and outcomes.get("failed", 0) == 0
