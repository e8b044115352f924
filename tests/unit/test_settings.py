"""One source per setting: the options, env variables, ini keys, fresh-process hand-off and README agree."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from pytest_perfguard import locks, settings
from pytest_perfguard.run import basetree
from pytest_perfguard.settings import AB_SMALL_NS, BY_NAME, SPECS, Settings, convert, from_env
from pytest_perfguard.usage import options_table

pytest_plugins = ["pytester"]

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_perfguard"
# Set by the plugin for its own fresh processes, never by a user: not settings.
HAND_OFF = {"PERFGUARD_CONFIRMING", "PERFGUARD_CONFIRM_ALONE", "PERFGUARD_SESSION_PIDS", "PERFGUARD_UPDATE_PROCESS"}

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_options_table_is_the_settings_table() -> None:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"<!-- options:start -->\n(.*?)\n<!-- options:end -->", text, re.S)
    assert match, "README.md needs the options table between <!-- options:start --> and <!-- options:end -->"
    assert match.group(1).strip() == options_table().strip(), (
        "README's options table differs from pytest_perfguard/usage.py; regenerate it with "
        "python -m pytest_perfguard.usage"
    )


def test_every_setting_has_a_field_and_the_defaults_agree() -> None:
    defaults = Settings()
    for spec in SPECS:
        if spec.name == "device" or spec.env_only:
            continue  # Settings holds the resolved device ("auto" becomes cpu or cuda:N); env-only: from_env
        value = getattr(defaults, spec.name)
        expected = Path(spec.default) if spec.kind == "path" and spec.default is not None else spec.default
        assert value == expected, spec.name


def test_child_env_round_trips_every_project_setting(tmp_path: Path) -> None:
    s = Settings(margin=0.03, ci_target=0.02, baseline_dir=tmp_path / "b", confirm=False, against="HEAD~1")
    env = s.child_env()
    for spec in SPECS:
        if spec.env_only:
            continue  # below
        if spec.cli_only or getattr(s, spec.name) is None:
            assert spec.env not in env
            continue
        back = convert(env[spec.env], spec)
        assert back == getattr(s, spec.name), spec.name
    assert Path(env["PERFGUARD_BASELINE_DIR"]).is_absolute()


@pytest.mark.parametrize(
    ("name", "raw", "problem"),
    [
        ("margin", "2", "fraction"),
        ("case_budget", "0", "positive"),
        ("device", "gpu", "cuda:N"),
        ("strict", "maybe", "true/false"),
        ("ab_process_sd", "-0.001", "finite number >= 0"),
        ("ab_small_process_sd", "0.5", "standard deviation"),
    ],
)
def test_bad_values_say_what_is_expected(name: str, raw: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        convert(raw, BY_NAME[name])


def test_the_ab_margin_widens_for_small_cases_and_never_narrows() -> None:
    s = Settings()
    assert s.ab_margin_for(AB_SMALL_NS) == s.ab_margin == 0.01
    assert s.ab_margin_for(AB_SMALL_NS - 1) == s.ab_small_margin == 0.015
    wide = Settings(ab_margin=0.03, ab_small_margin=0.015)
    assert wide.ab_margin_for(5_000.0) == 0.03  # a user's wider margin holds for small cases too


def test_the_per_process_offset_is_a_setting_with_a_small_case_value() -> None:
    s = Settings()
    assert s.ab_process_sd_for(AB_SMALL_NS) == s.ab_process_sd == 0.001
    assert s.ab_process_sd_for(AB_SMALL_NS - 1) == s.ab_small_process_sd == 0.0032
    off = Settings(ab_process_sd=0.0, ab_small_process_sd=0.0)
    assert off.ab_process_sd_for(5_000.0) == off.ab_process_sd_for(50_000.0) == 0.0


def test_every_perfguard_variable_the_package_reads_is_in_the_table() -> None:
    """The lock and cache folders were read beside the table, each by a rule of its own for an empty value."""
    named = {m for path in PACKAGE.rglob("*.py") for m in re.findall(r"PERFGUARD_[A-Z][A-Z_]*", path.read_text())}
    assert named - HAND_OFF <= {spec.env for spec in SPECS}, sorted(named - HAND_OFF - {s.env for s in SPECS})
    assert {BY_NAME["cache_dir"].env, BY_NAME["lock_dir"].env} == {basetree.CACHE_DIR_ENV, locks.LOCK_DIR_ENV}


@pytest.mark.parametrize("spec", [s for s in SPECS if s.env_only], ids=lambda s: s.name)
def test_an_env_only_setting_is_unset_when_empty_and_absolute_when_relative(
    spec: settings.Spec, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(spec.env, raising=False)
    assert from_env(spec.name) is None
    monkeypatch.setenv(spec.env, "")
    assert from_env(spec.name) is None and spec.env not in Settings().child_env()
    monkeypatch.setenv(spec.env, "here")
    assert from_env(spec.name) == tmp_path / "here"
    assert Settings().child_env()[spec.env] == str(tmp_path / "here")  # a fresh process runs elsewhere


def test_empty_lock_and_cache_folders_mean_the_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(locks.LOCK_DIR_ENV, "")
    monkeypatch.setenv(basetree.CACHE_DIR_ENV, "")
    assert locks.lock_dir() == tmp_path / "tmp" / f"pytest-perfguard-{locks.uid()}"
    assert basetree.cache_dir() == tmp_path / "xdg" / "pytest-perfguard"
    monkeypatch.setenv(locks.LOCK_DIR_ENV, str(tmp_path / "locks"))
    monkeypatch.setenv(basetree.CACHE_DIR_ENV, str(tmp_path / "cache"))
    assert locks.lock_dir() == tmp_path / "locks" / f"pytest-perfguard-{locks.uid()}"
    assert basetree.cache_dir() == tmp_path / "cache"


def test_an_empty_environment_variable_leaves_the_ini_value(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rule for an empty value, in the environment as in the ini file: it is no value."""
    pytester.makeini("[pytest]\nperfguard_margin = 0.03\n")
    monkeypatch.setenv("PERFGUARD_MARGIN", "")
    monkeypatch.setenv("PERFGUARD_STRICT", "")
    resolved = settings.from_config(pytester.parseconfig())
    assert resolved.margin == 0.03 and resolved.strict is False
    assert resolved.explicit == frozenset({"margin"})  # from the ini; the empty variables count as unset
    monkeypatch.setenv("PERFGUARD_MARGIN", "0.04")
    assert settings.from_config(pytester.parseconfig()).margin == 0.04
