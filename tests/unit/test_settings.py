"""One source per setting: the options, env variables, ini keys, fresh-process hand-off and README agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_perfguard.settings import AB_SMALL_NS, BY_NAME, SPECS, Settings, convert, options_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_options_table_is_the_settings_table() -> None:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"<!-- options:start -->\n(.*?)\n<!-- options:end -->", text, re.S)
    assert match, "README.md needs the options table between <!-- options:start --> and <!-- options:end -->"
    assert match.group(1).strip() == options_table().strip(), (
        "README's options table differs from pytest_perfguard/settings.py; regenerate it with "
        "python -m pytest_perfguard.settings"
    )


def test_every_setting_has_a_field_and_the_defaults_agree() -> None:
    defaults = Settings()
    for spec in SPECS:
        if spec.name == "device":
            continue  # Settings holds the resolved device ("auto" becomes cpu or cuda:N)
        value = getattr(defaults, spec.name)
        expected = Path(spec.default) if spec.kind == "path" and spec.default is not None else spec.default
        assert value == expected, spec.name


def test_child_env_round_trips_every_project_setting(tmp_path: Path) -> None:
    s = Settings(margin=0.03, ci_target=0.02, baseline_dir=tmp_path / "b", confirm=False, against="HEAD~1")
    env = s.child_env()
    for spec in SPECS:
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
