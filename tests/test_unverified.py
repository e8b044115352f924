"""An undecided verdict is not a pass, end to end: a case the guard could not decide (here: its stored entry
was recorded under another torch, so it is not comparable) is "unverified"; the run's summary counts pass,
fail and unverified apart and names each unverified case with its reason; under CI they fail the run unless
--perfguard-allow-unverified allows them; outside CI they are a warning. In the three xdist modes: the
controller decides, from every worker's records.
"""

from __future__ import annotations

import json

import pytest
from test_plugin import CONFTEST, MODES, _case, baseline_json, mode, record_baseline, run

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # every test runs the plugin end to end


__all__ = ["mode"]  # the three xdist modes, test_plugin's fixture


@pytest.fixture
def recorded(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project whose baseline was recorded under another torch: every case is not comparable."""
    pytester.makeconftest(CONFTEST)
    (pytester.path / ".ci" / "baselines").mkdir(parents=True)
    pytester.makepyfile(test_k=_case())
    record_baseline(pytester).assert_outcomes(passed=4)
    path = next((pytester.path / ".ci" / "baselines").glob("*.json"))
    doc = baseline_json(pytester)
    for entry in doc["cases"].values():
        entry["env"]["torch"] = "1.0.0"
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return pytester


def test_unverified_cases_fail_a_ci_run_and_are_named(recorded: pytest.Pytester, mode: list[str]) -> None:
    result = run(recorded, mode, "--perfguard", env={"CI": "true"})
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*perfguard: 4 timed case(s): 0 pass, 0 fail, 4 unverified*",
            "*perfguard: 4 case(s) unverified: the guard could not rule out a regression:",
            "*test_k.py::test_attn[[]fast-8[]]: not comparable: torch 1.0.0*",
            "*Under CI an unverified case is not a pass: this fails the run (0 allowed by "
            "--perfguard-allow-unverified=0)*",
        ]
    )


def test_the_allowance_takes_a_count_or_a_share(recorded: pytest.Pytester) -> None:
    mode = MODES["no-xdist"]
    allowed = run(recorded, mode, "--perfguard", "--perfguard-allow-unverified", "4", env={"CI": "true"})
    assert allowed.ret == pytest.ExitCode.OK
    allowed.stdout.fnmatch_lines(["*(within the 4 allowed.)*"])
    share = run(recorded, mode, "--perfguard", "--perfguard-allow-unverified", "50%", env={"CI": "true"})
    assert share.ret == pytest.ExitCode.TESTS_FAILED
    share.stdout.fnmatch_lines(["*(2 allowed by --perfguard-allow-unverified=50%)*"])
    bad = run(recorded, mode, "--perfguard", "--perfguard-allow-unverified", "some")
    bad.stderr.fnmatch_lines(["*--perfguard-allow-unverified*expected a whole number of cases (3) or a share*"])


def test_outside_ci_unverified_is_a_warning_never_a_silent_pass(recorded: pytest.Pytester) -> None:
    result = run(recorded, MODES["no-xdist"], "--perfguard")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "*4 unverified*",
            "*(a warning here; under CI they fail the run.) To decide them:*--perfguard-against origin/main*",
        ]
    )
    result.stdout.fnmatch_lines(["*unverified: not comparable*"])  # the table says it per row


def test_a_decided_run_passes_under_ci(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    (pytester.path / ".ci" / "baselines").mkdir(parents=True)
    pytester.makepyfile(test_k=_case())
    # Three processes: a one-process (thin) baseline knows nothing of the spread between processes, and its
    # passes could hide a slowdown of several margins (their MDE): unverified, as the next lines show.
    run(pytester, [], "--perfguard-update-baseline", env={"PERFGUARD_UPDATE_PROCESSES": "3"})
    result = run(pytester, MODES["no-xdist"], "--perfguard", env={"CI": "true"})
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*perfguard: 4 timed case(s): 4 pass, 0 fail, 0 unverified*"])
