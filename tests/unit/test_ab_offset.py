"""The A/B gate's per-process offset fitted on the user's device: the fit (policy.fit_process_offset), the A/A
readings in the baseline file (schema 3) and their migration, the choice an A/B run makes (ab.use_stored_offset)
and the revision an update's A/A processes compare with (ab.aa_base)."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_perfguard.commands.cli import main
from pytest_perfguard.judge.baseline import (
    SCHEMA_VERSION,
    BaselineEntry,
    BaselineError,
    BaselineFile,
    ProcessSample,
    ab_offset_of,
)
from pytest_perfguard.judge.policy import AB_OFFSET_MIN_READINGS, fit_process_offset
from pytest_perfguard.judge.stats import chi2_quantile
from pytest_perfguard.judge.storage import migrate_file, read_baseline, update_baseline, write_baseline
from pytest_perfguard.record import CaseRecord, Gate, Status
from pytest_perfguard.run.ab import aa_base, use_stored_offset
from pytest_perfguard.run.samples import aa_reading
from pytest_perfguard.settings import AB_PROCESS_SD, AB_SMALL_NS, AB_SMALL_PROCESS_SD, BY_NAME, Settings, convert
from tests.test_ab import _git
from tests.unit.recorded_aa import records

DEVICE: dict[str, Any] = {"slug": "nvidia-h100-80gb-hbm3", "name": "NVIDIA H100 80GB HBM3"}
Z975 = 1.959963984540054


def readings(
    rng: random.Random, n: int, b: float, s: tuple[float, float] = (0.0005, 0.002)
) -> list[tuple[float, float]]:
    """A/A readings (e, s): in-process sd s, and a per-process offset of sd b on top."""
    out = []
    for _ in range(n):
        sd = rng.uniform(*s)
        out.append((rng.gauss(0.0, math.hypot(sd, b)), sd))
    return out


def sample(
    ns: float, aa: float | None = None, half: float = 0.002, device: str = "GPU-1", day: str = "2026-11-25"
) -> ProcessSample:
    """A process sample, with an A/A reading of head/base `aa` and a 95% interval of +-`half` (log scale)."""
    aa_ci = (aa * math.exp(-half), aa * math.exp(half)) if aa is not None else None
    return ProcessSample(ns, (ns * 0.99, ns * 1.01), 1.1, ns / 1.1, device, day, 20, aa, aa_ci)


def entry(case_id: str, samples: list[ProcessSample]) -> BaselineEntry:
    return BaselineEntry.from_samples(
        case_id, samples, workload="a" * 64, workload_desc="x", env={"torch": "2"}, updated="2026-11-25"
    )


# ------------------------------------------------------------------------------------------------ the fit


def test_chi2_quantile_is_close_to_the_exact_one_where_the_fit_uses_it() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df in (10, 11.4, 60, 227.3):  # the fit's: at least AB_OFFSET_MIN_READINGS readings, 1.14 dof each
        for p in (0.05, 0.1, 0.5, 0.9, 0.99):
            assert chi2_quantile(p, df) == pytest.approx(stats.chi2.ppf(p, df), rel=0.003), (p, df)
    assert chi2_quantile(0.01, 3) == pytest.approx(0.66 * stats.chi2.ppf(0.01, 3), rel=0.01)  # as documented
    with pytest.raises(ValueError):
        chi2_quantile(1.0, 3)
    with pytest.raises(ValueError):
        chi2_quantile(0.5, 0)


def test_the_fit_recovers_a_known_offset_and_its_bound_sits_above_it() -> None:
    fit = fit_process_offset(readings(random.Random(1), 3000, 0.003))
    assert fit is not None and fit.readings == 3000
    assert fit.fit == pytest.approx(0.003, rel=0.06)
    assert fit.fit < fit.bound < 1.08 * fit.fit  # many readings: a tight bound
    assert fit.dof == pytest.approx(1.137 * 3000, rel=0.01)  # the clipped statistic's effective dof


def test_the_bound_covers_the_true_offset_nine_times_in_ten() -> None:
    rng = random.Random(2)
    fits = [fit_process_offset(readings(rng, 20, 0.003)) for _ in range(400)]
    covered = sum(f is not None and f.bound >= 0.003 for f in fits) / len(fits)
    assert 0.85 < covered < 0.95
    few = [fit_process_offset(readings(rng, 4, 0.003)) for _ in range(200)]
    assert sum(f is not None and f.bound >= 0.003 for f in few) / len(few) > 0.85  # the bound says how little 4 know


def test_intervals_that_cover_the_scatter_leave_no_offset() -> None:
    fit = fit_process_offset(readings(random.Random(3), 500, 0.0))
    assert fit is not None and fit.fit < 0.0003 and fit.bound < 0.0006
    assert fit_process_offset([(0.0, 0.001)] * 12) == fit_process_offset([(0.0, 0.0)] * 12)
    zero = fit_process_offset([(0.0, 0.0)] * 12)
    assert zero is not None and zero.fit == zero.bound == 0.0
    flat = fit_process_offset([(0.01, 0.0), (-0.01, 0.0)] * 6)  # intervals of no width: the scatter is the offset
    assert flat is not None and flat.fit == pytest.approx(0.01, rel=0.2)
    assert fit_process_offset([]) is None
    with pytest.raises(ValueError):
        fit_process_offset([(0.0, 0.001)], level=1.0)


def test_the_fit_does_not_depend_on_the_order_of_its_readings() -> None:
    rows = readings(random.Random(4), 200, 0.002)
    shuffled = list(rows)
    random.Random(5).shuffle(shuffled)
    assert fit_process_offset(rows) == fit_process_offset(shuffled)


def test_one_kernel_with_a_large_offset_of_its_own_does_not_set_its_class() -> None:
    """cuda_scalar on H100s: two loaded copies up to 4% apart per process, where the rest read 0.1%."""
    rng = random.Random(7)
    rows = readings(rng, 110, 0.001) + [(rng.choice((-1, 1)) * rng.uniform(0.02, 0.045), 0.0005) for _ in range(10)]
    clipped, plain = fit_process_offset(rows), fit_process_offset(rows, clip=50.0)
    assert clipped is not None and plain is not None
    assert plain.fit > 0.008  # the root-mean-square fit follows the one kernel
    assert clipped.fit < 0.0025  # clipped, a reading counts as at most a 2.5-sigma one


def test_recorded_h100_a_a_readings_fit_near_the_built_in_values() -> None:
    """Hosts 7 and 9 of benchmarks/results/ab_2026-11-25 (not used for the built-in fit), stored as an update
    stores them: two processes per case, cuda_scalar included."""
    by_case: dict[str, list[ProcessSample]] = {}
    for r in records():
        ab = next(g for g in r["gates"] if g["gate"] == "ab")
        ns = float(r["median_ns"])
        s = ProcessSample(ns, (ns, ns), None, None, "GPU-h100", "2026-11-25", 0, ab["estimate"], tuple(ab["ci"]))
        by_case.setdefault(r["id"], []).append(s)
    fitted = ab_offset_of({k: entry(k, v) for k, v in by_case.items()})
    assert fitted is not None and fitted.small is not None and fitted.large is not None
    assert (fitted.small.readings, fitted.small_cases, fitted.large.readings, fitted.large_cases) == (67, 34, 129, 65)
    assert 0.5 * AB_SMALL_PROCESS_SD < fitted.small.fit <= fitted.small.bound < 2 * AB_SMALL_PROCESS_SD
    assert 0.5 * AB_PROCESS_SD < fitted.large.fit <= fitted.large.bound < 2 * AB_PROCESS_SD
    large = [x.aa_reading for v in by_case.values() for x in v if x.median_ns >= AB_SMALL_NS]
    plain = fit_process_offset([x for x in large if x is not None], clip=50.0)
    assert plain is not None and plain.fit > 4 * AB_PROCESS_SD  # what cuda_scalar does to an unclipped fit


# ------------------------------------------------------------------------------------------------ storage


def test_a_sample_keeps_its_a_a_reading_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "nvidia-h100-80gb-hbm3.json"
    one = entry("t.py::one", [sample(9_000.0, 1.004)])  # a one-process entry keeps its sample's reading
    assert one.runs == 1 and one.samples[0].aa_ratio == 1.004
    assert replace(one, noise=0.01).samples[0].aa_ci == one.samples[0].aa_ci
    three = entry("t.py::three", [sample(50_000.0), sample(50_100.0, 0.998), sample(49_900.0, 1.001)])
    write_baseline(BaselineFile(path, False, DEVICE, {"t.py::one": one, "t.py::three": three}))
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == SCHEMA_VERSION == 3
    stored = doc["cases"]["t.py::three"]["samples"]
    assert [s["aa_ratio"] for s in stored] == [None, 0.998, 1.001]
    assert stored[0]["aa_ci"] is None and stored[1]["aa_ci"][0] < 0.998 < stored[1]["aa_ci"][1]
    back = read_baseline(path)
    assert back.cases["t.py::three"].samples == three.samples
    reading = back.cases["t.py::one"].samples[0].aa_reading
    assert reading is not None and reading == pytest.approx((math.log(1.004), 0.002 / Z975))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"aa_ci": None}, "aa_ci' must be an interval when 'aa_ratio' is set"),
        ({"aa_ratio": None}, "aa_ci' must be null when 'aa_ratio' is null"),
        ({"aa_ratio": 1.2}, "must satisfy low <= samples[0].aa_ratio"),
        ({"aa_ratio": -1.0}, "aa_ratio' must be positive"),
        ({"aa_ci": [0.99]}, "aa_ci' must be a list [low, high]"),
    ],
)
def test_a_bad_a_a_reading_is_refused_with_its_field(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    path = tmp_path / "nvidia-h100-80gb-hbm3.json"
    write_baseline(BaselineFile(path, False, DEVICE, {"t.py::a": entry("t.py::a", [sample(9_000.0, 1.0)])}))
    doc = json.loads(path.read_text())
    doc["cases"]["t.py::a"]["samples"][0].update(change)
    path.write_text(json.dumps(doc))
    with pytest.raises(BaselineError, match=r"case 't\.py::a'") as info:
        read_baseline(path)
    assert message in str(info.value)


def test_the_fit_pools_every_sample_of_the_file_by_size_class() -> None:
    small = [sample(8_000.0, 1.0 + 0.003 * (-1) ** i, device=f"GPU-{i % 2}", day=f"2026-11-2{i % 3}") for i in range(4)]
    large = [sample(60_000.0, 1.001, day="2026-11-21"), sample(60_000.0)]
    cases = {"a": entry("a", small[:2]), "b": entry("b", small[2:]), "c": entry("c", large)}
    fitted = ab_offset_of(cases)
    assert fitted is not None and fitted.small is not None and fitted.large is not None
    assert (fitted.small.readings, fitted.small_cases, fitted.large.readings, fitted.large_cases) == (4, 2, 1, 1)
    assert fitted.devices == ("GPU-0", "GPU-1") and fitted.dates == ("2026-11-20", "2026-11-22")
    assert fitted.small.fit == pytest.approx(0.003, rel=0.3)
    assert fitted.to_json()["small"]["readings"] == 4
    assert ab_offset_of({"c": entry("c", [sample(60_000.0), sample(60_100.0)])}) is None


def test_updates_add_readings_and_a_reset_entry_drops_its_old_ones(tmp_path: Path) -> None:
    path = tmp_path / "nvidia-h100-80gb-hbm3.json"
    first = entry("t.py::a", [sample(9_000.0), sample(9_010.0, 1.002), sample(8_990.0, 0.999)])
    update_baseline(path, DEVICE, {"t.py::a": first}, noise_floor=0.005, change_threshold=0.05)
    again = entry("t.py::a", [sample(9_005.0), sample(9_000.0, 1.001), sample(9_020.0, 1.003)])
    update_baseline(path, DEVICE, {"t.py::a": again}, noise_floor=0.005, change_threshold=0.05)
    fitted = read_baseline(path).ab_offset()
    assert fitted is not None and fitted.small is not None and fitted.small.readings == 4
    changed = entry("t.py::a", [sample(20_000.0), sample(20_100.0, 1.0)])  # a new kernel: the entry restarts
    update_baseline(path, DEVICE, {"t.py::a": changed}, noise_floor=0.005, change_threshold=0.05)
    fitted = read_baseline(path).ab_offset()
    assert fitted is not None and fitted.large is not None and fitted.small is None and fitted.large.readings == 1


def _schema_2(path: Path) -> dict[str, Any]:
    """A schema-2 file (no A/A readings) made from a current one."""
    two = entry("t.py::a", [sample(9_000.0), sample(9_100.0)])
    write_baseline(BaselineFile(path, False, DEVICE, {"t.py::a": two}))
    doc: dict[str, Any] = json.loads(path.read_text())
    doc["schema_version"] = 2
    for e in doc["cases"].values():
        for s in e["samples"]:
            del s["aa_ratio"], s["aa_ci"]
    path.write_text(json.dumps(doc))
    return doc


def test_a_schema_2_file_reads_migrated_in_memory_and_perfguard_migrate_rewrites_it(tmp_path: Path) -> None:
    path = tmp_path / "nvidia-h100-80gb-hbm3.json"
    _schema_2(path)
    text = path.read_text()
    bf = read_baseline(path)
    assert bf.migrated_from == 2 and path.read_text() == text  # reading never rewrites
    assert all(s.aa_ratio is None and s.aa_ci is None for s in bf.cases["t.py::a"].samples)
    assert bf.ab_offset() is None
    assert migrate_file(path) == 2
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == 3
    assert [(s["aa_ratio"], s["aa_ci"]) for s in doc["cases"]["t.py::a"]["samples"]] == [(None, None)] * 2
    assert migrate_file(path) is None


def test_a_schema_2_sample_with_a_stray_field_is_refused_not_migrated(tmp_path: Path) -> None:
    path = tmp_path / "nvidia-h100-80gb-hbm3.json"
    doc = _schema_2(path)
    doc["cases"]["t.py::a"]["samples"][1]["aa_ratio"] = 1.0  # schema 2 had none: a hand edit
    path.write_text(json.dumps(doc))
    with pytest.raises(BaselineError, match=r"cannot migrate from schema 2: case 't\.py::a': samples\[1\]"):
        read_baseline(path)


# ------------------------------------------------------------------------------------ the A/B run's choice


def _file_with(small: int, large: int, tmp_path: Path) -> BaselineFile:
    """A written file with `small` A/A readings under 20 us and `large` from 20 us (sd about 0.5% and 0.2%)."""
    rng = random.Random(8)
    cases = {}
    for i in range(small):
        cases[f"s{i}"] = entry(f"s{i}", [sample(8_000.0, math.exp(rng.gauss(0, 0.005)), 0.0005, "GPU-a")])
    for i in range(large):
        cases[f"l{i}"] = entry(f"l{i}", [sample(80_000.0, math.exp(rng.gauss(0, 0.002)), 0.0005, "GPU-a")])
    path = tmp_path / "nvidia-h100-80gb-hbm3.json"
    write_baseline(BaselineFile(path, False, DEVICE, cases))
    return read_baseline(path)


def test_an_ab_run_counts_the_fit_of_a_class_with_enough_readings(tmp_path: Path) -> None:
    bf = _file_with(AB_OFFSET_MIN_READINGS, AB_OFFSET_MIN_READINGS - 1, tmp_path)
    fitted = bf.ab_offset()
    assert fitted is not None and fitted.small is not None
    settings = Settings()
    large, small = use_stored_offset(settings, bf, "GPU-a", "b.json")
    assert small.source == "fitted" and settings.ab_small_process_sd == small.sd == fitted.small.bound
    assert settings.ab_process_sd_for(AB_SMALL_NS - 1) == fitted.small.bound
    assert small.line().startswith(f"perfguard: A/B per-process offset under 20 us: {fitted.small.bound:.2%}, ")
    assert f"from {AB_OFFSET_MIN_READINGS} A/A readings of {AB_OFFSET_MIN_READINGS} case(s)" in small.detail
    assert "this one among them, 2026-11-25, in b.json" in small.detail
    assert large.source == "built-in" and settings.ab_process_sd == AB_PROCESS_SD
    assert f"only {AB_OFFSET_MIN_READINGS - 1} A/A reading(s) of this size in b.json, 10 needed" in large.detail
    _, small = use_stored_offset(Settings(), bf, "GPU-other", "b.json")
    assert "on 1 device(s), not this one" in small.detail  # another GPU of the model: its fit still counts


def test_a_fit_past_what_the_setting_takes_is_clamped_and_said(tmp_path: Path) -> None:
    rng = random.Random(9)
    cases = {f"s{i}": entry(f"s{i}", [sample(8_000.0, math.exp(rng.gauss(0, 0.3)), 0.0005)]) for i in range(12)}
    path = tmp_path / "nvidia-h100-80gb-hbm3.json"
    write_baseline(BaselineFile(path, False, DEVICE, cases))
    settings = Settings()
    _, small = use_stored_offset(settings, read_baseline(path), "GPU-1", "b.json")
    assert small.source == "fitted" and settings.ab_small_process_sd == small.sd == 0.099
    assert "(clamped to 9.90%: no A/B margin covers such an offset)" in small.detail
    passed_on = Settings(ab_small_process_sd=small.sd).child_env()["PERFGUARD_AB_SMALL_PROCESS_SD"]
    assert convert(passed_on, BY_NAME["ab_small_process_sd"]) == 0.099  # a fresh process accepts it


def test_a_value_set_by_the_user_wins_and_no_readings_keep_the_built_in_one(tmp_path: Path) -> None:
    bf = _file_with(12, 12, tmp_path)
    settings = Settings(ab_small_process_sd=0.002, explicit=frozenset({"ab_small_process_sd"}))
    large, small = use_stored_offset(settings, bf, "GPU-a", "b.json")
    assert small.source == "setting" and settings.ab_small_process_sd == small.sd == 0.002
    assert "as set (--perfguard-ab-small-process-sd, PERFGUARD_AB_SMALL_PROCESS_SD or" in small.detail
    assert large.source == "fitted" and settings.ab_process_sd == large.sd
    assert small.to_json() == {"sd": 0.002, "source": "setting", "detail": small.detail}
    missing = BaselineFile(tmp_path / "none.json", False, {}, {})
    for baseline, why in ((None, "no baseline file b.json"), (missing, "no baseline file b.json")):
        settings = Settings()
        large, small = use_stored_offset(settings, baseline, "GPU-a", "b.json")
        assert (
            (large.sd, small.sd)
            == (AB_PROCESS_SD, AB_SMALL_PROCESS_SD)
            == (settings.ab_process_sd, settings.ab_small_process_sd)
        )
        assert why in large.detail and "--perfguard-update-baseline on a clean git checkout" in large.detail
    _, small = use_stored_offset(Settings(), _file_with(0, 12, tmp_path), "GPU-a", "b.json")
    assert small.source == "built-in" and "no A/A readings of this size in b.json" in small.detail


def test_perfguard_show_prints_what_the_readings_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bf = _file_with(12, 3, tmp_path)
    fitted = bf.ab_offset()
    assert fitted is not None and fitted.small is not None
    assert main(["show", str(bf.path)]) == 0
    out = capsys.readouterr().out
    assert (
        "A/B per-process offset from its A/A readings: from 20 us: 3 reading(s), 10 needed (the built-in value "
        f"stays); under 20 us: {fitted.small.bound:.2%} (the 90% upper bound of {fitted.small.fit:.2%}, 12 readings "
        "of 12 case(s))"
    ) in out


# ------------------------------------------------------------------------------------- the A/A revision


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PERFGUARD_CACHE_DIR", str(tmp_path / "cache"))
    repo = tmp_path / "repo"
    (repo / ".ci" / "baselines").mkdir(parents=True)
    (repo / "kernels.py").write_text("X = 1\n")
    (repo / ".ci" / "baselines" / "dev.json").write_text("{}\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "one")
    return repo


def test_a_clean_checkout_compares_with_head_whose_tree_is_materialised(checkout: Path, tmp_path: Path) -> None:
    (checkout / "notes.txt").write_text("untracked: not in HEAD's tree, not a change to it\n")
    (checkout / ".ci" / "baselines" / "dev.json").write_text('{"an earlier update": 1}\n')  # data, never imported
    sha, why = aa_base(checkout, checkout / ".ci" / "baselines")
    assert why == "" and sha == _git(checkout, "rev-parse", "HEAD")
    assert (tmp_path / "cache" / "base" / sha / "kernels.py").read_text() == "X = 1\n"


def test_a_changed_tracked_file_means_no_a_a(checkout: Path) -> None:
    (checkout / "kernels.py").write_text("X = 2\n")
    sha, why = aa_base(checkout, checkout / ".ci" / "baselines")
    assert sha is None
    assert why == "the working tree has uncommitted changes (kernels.py), so HEAD is not the code this update measured"
    _git(checkout, "add", "kernels.py")  # staged is uncommitted too
    assert aa_base(checkout, checkout / ".ci" / "baselines")[0] is None


def test_no_git_repository_or_no_commit_means_no_a_a(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    sha, why = aa_base(plain, plain / ".ci" / "baselines")
    assert sha is None and why.startswith(f"{plain} is not in a git repository")
    _git(plain, "init", "-q")
    assert aa_base(plain, plain / ".ci" / "baselines") == (None, f"the git repository {plain} has no commit yet")


def test_a_record_gives_its_a_a_reading_only_from_a_usable_twin() -> None:
    def rec(*gates: Gate) -> CaseRecord:
        return CaseRecord(id="t.py::a", gates=list(gates))

    assert aa_reading(rec(Gate("ab", Status.PASS, 1.01, 1.0, 1.02))) == (1.01, (1.0, 1.02))
    assert aa_reading(rec(Gate("ab", Status.NEW))) is None
    assert aa_reading(rec(Gate("ab", Status.PASS, 1.01, 0.0, math.inf))) is None
    assert aa_reading(rec(Gate("baseline", Status.PASS, 1.01, 1.0, 1.02))) is None
