"""Every setting of the plugin, in one table: its name, type, default, help and check.

From the table come the command-line options, the `PERFGUARD_*` environment variables, the
`perfguard_*` ini keys, the hand-off to a fresh confirmation process and the README's options table (a
test fails when the README disagrees). One precedence rule: command line > environment > ini > default,
and a bad value names where it came from. An empty value is no value: an environment variable or ini key
set to "" counts as unset.

Two settings are environment-only (`env_only`): where this machine keeps the plugin's lock files and the A/B
cache. Code that has no pytest config reads them (every JSON write takes a lock, the `perfguard` command
extracts base trees), through `from_env`, by the same rule. Two more variables are not settings but the
hand-off to a fresh confirmation process, set by the plugin itself: PERFGUARD_CONFIRMING (run/cleanup.py)
and PERFGUARD_SESSION_PIDS (measure/device.py).

Relative paths: a path given on the command line or in the environment is relative to the directory pytest
was started in (as pytest's own `--junitxml` and file arguments are); one set in the ini file is relative
to the ini file's folder, and a default is relative to the rootdir (as pytest resolves `testpaths`). So the
same baseline is found from any working directory, from xdist workers and from a fresh process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}

DEFAULT_MARGIN = 0.05  # the A/A rates behind it: benchmarks/results/README.md
# Head vs base in one process (benchmarks/results/ab_2026-11-23/README.md): cases under AB_SMALL_NS spread
# wider between two loaded copies of the same code than their in-process interval shows, so they get the
# wider margin.
DEFAULT_AB_MARGIN = 0.010
DEFAULT_AB_SMALL_MARGIN = 0.015
AB_SMALL_NS = 20_000.0
# An A/B case measures until a slowdown of this many times its margin would fail it 95% of the time (its
# MDE), or its budget ends: +2% from 20 us up, +3% below, at the default margins. Stopping on the 1% CI
# target alone left 24 of 98 cases above that, MDEs up to 4.3% (benchmarks/results/ab_2026-11-25).
AB_DETECT_FACTOR = 2.0
# The offset each process adds to a head/base ratio, beyond what its interval samples (sd of the log ratio,
# fitted on H100 A/A runs so that the estimates' scatter matches their intervals, cuda_scalar left out;
# ab_2026-11-25): the MDE counts it, the decision leaves it to the margin. Without it, +2% shifted onto real
# A/A noise was caught in 92% of single measurements where the MDE promised 95%. Another GPU may differ: an
# update fits them on the user's device from A/A readings stored in the baseline file, which an A/B run then
# uses in their place (ab.use_stored_offset); the settings below override both.
AB_PROCESS_SD = 0.0010
AB_SMALL_PROCESS_SD = 0.0032


def _fraction(value: float) -> None:
    if not 0 < value < 1:
        raise ValueError("expected a fraction between 0 and 1 (0.02 means 2%)")


def _spread(value: float) -> None:
    if not 0 <= value < 0.1:
        raise ValueError("expected a standard deviation of the log ratio from 0 to 0.1 (0.001 means 0.1%)")


def _positive(value: float) -> None:
    if value <= 0:
        raise ValueError("expected a positive number of seconds")


def _at_least_one(value: int) -> None:
    if value < 1:
        raise ValueError("expected a whole number of at least 1")


def _not_negative(value: int) -> None:
    if value < 0:
        raise ValueError("expected a whole number of at least 0")


def _allowance(value: str) -> None:
    text = value.strip()
    number = text[:-1] if text.endswith("%") else text
    try:
        ok = float(number) >= 0 and (text.endswith("%") or float(number).is_integer())
    except ValueError:
        ok = False
    if not ok:
        raise ValueError("expected a whole number of cases (3) or a share of the timed cases (5%)")


def _device(value: str) -> None:
    if not (value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit())):
        raise ValueError("expected auto, cpu, cuda or cuda:N")


@dataclass(frozen=True)
class Spec:
    """One setting. `kind` is bool, int, float, path or str; `cli_only` settings have no env variable or ini key
    (they say what to do in this run, not how the project is configured); `env_only` settings have no option
    or ini key (they say where this machine keeps files, for every process that needs them: `from_env`)."""

    name: str
    kind: str
    default: Any
    help: str
    check: Callable[[Any], None] | None = None
    cli_only: bool = False
    env_only: bool = False
    flag: str = ""  # the command-line option, when it is not --perfguard-<name>

    @property
    def option(self) -> str:
        if self.flag:
            return self.flag
        if self.kind == "bool" and self.default is True:
            return "--perfguard-no-" + self.name.replace("_", "-")
        return "--perfguard-" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "PERFGUARD_" + self.name.upper()

    @property
    def ini(self) -> str:
        return "perfguard_" + self.name

    @property
    def dest(self) -> str:
        return "perfguard_" + self.name


SPECS: tuple[Spec, ...] = (
    Spec(
        "enabled",
        "bool",
        False,
        "time every perf case against its reference and apply the gates",
        cli_only=True,
        flag="--perfguard",
    ),
    Spec(
        "update",
        "bool",
        False,
        "measure and record baselines (implies --perfguard)",
        cli_only=True,
        flag="--perfguard-update-baseline",
    ),
    Spec(
        "update_processes",
        "int",
        3,
        "with --perfguard-update-baseline: measure every case in this many processes (this one and fresh "
        "ones, in alternating order) and store their medians as the case's sample",
        _at_least_one,
    ),
    Spec(
        "prune",
        "bool",
        False,
        "with --perfguard-update-baseline: remove stored cases that were not collected",
        cli_only=True,
    ),
    Spec(
        "join",
        "bool",
        False,
        "with --perfguard-update-baseline: add this update's processes to each stored entry of the same "
        "workload and environment even where its time moved past the case's threshold (a scheduled update of "
        "unchanged code, so a kernel with several speeds gets them all into its sample); without it such an "
        "entry restarts from this update",
        cli_only=True,
    ),
    Spec(
        "seed",
        "int",
        None,
        "use seeds N, N+1, ... instead of fresh random ones (to reproduce a failure)",
        cli_only=True,
    ),
    Spec(
        "against",
        "str",
        None,
        "git revision to compare with, in the same process: each variant is timed against its twin at REV "
        "(the A/B gate)",
    ),
    Spec("ab_margin", "float", DEFAULT_AB_MARGIN, "margin of the A/B gate (head vs base revision)", _fraction),
    Spec(
        "ab_small_margin",
        "float",
        DEFAULT_AB_SMALL_MARGIN,
        "margin of the A/B gate for cases under 20 us, whose A/A spread is wider (never below ab_margin)",
        _fraction,
    ),
    Spec(
        "ab_process_sd",
        "float",
        AB_PROCESS_SD,
        "sd of the offset each process adds to a head/base ratio, which the A/B gate's MDE and stop rule count "
        "(cases from 20 us). Unset, the A/B gate uses the value fitted on this device model from the A/A readings "
        "that --perfguard-update-baseline stores in the baseline file, else this fit from H100s",
        _spread,
    ),
    Spec(
        "ab_small_process_sd",
        "float",
        AB_SMALL_PROCESS_SD,
        "the same for cases under 20 us",
        _spread,
    ),
    Spec(
        "ab_offset_fit",
        "bool",
        True,
        "time each variant against its own twin at HEAD (A/A) in an update's fresh processes and store the "
        "readings, from which the A/B gate's per-process offset is fitted on this device (needs a clean git "
        "checkout; costs about 1.4x the time of those processes)",
    ),
    Spec(
        "ab_case_offset",
        "bool",
        True,
        "count a case's own A/A readings in the baseline file in its A/B gate: where they scatter more than the "
        "device's per-process offset, a head/base difference that the case's offset can explain is not called "
        "regressed or faster, and the MDE says how much it can hide",
    ),
    Spec(
        "cache_days",
        "float",
        30.0,
        "days a base revision's tree stays in the A/B cache ($PERFGUARD_CACHE_DIR) unused before it is "
        "removed; 0 = never",
    ),
    Spec(
        "cache_dir",
        "path",
        None,
        "folder of the A/B cache of base revisions' trees (default: pytest-perfguard in $XDG_CACHE_HOME, "
        "else in ~/.cache)",
        env_only=True,
    ),
    Spec(
        "lock_dir",
        "path",
        None,
        "folder that holds this user's folder of lock files (default: the temp folder)",
        env_only=True,
    ),
    Spec("baseline_dir", "path", ".ci/baselines", "folder of the per-device baseline JSON files"),
    Spec(
        "margin",
        "float",
        DEFAULT_MARGIN,
        "regression margin of the baseline and ratio gates; a case's threshold is never below the prediction "
        "bound of its stored processes' spread",
        _fraction,
    ),
    Spec(
        "ci_target",
        "float",
        0.01,
        "stop measuring a case once the 95% CI half-width is under this fraction (against a base revision, "
        "its head/base interval narrows on until the A/B gate's MDE is at most twice its margin)",
        _fraction,
    ),
    Spec("case_budget", "float", 5.0, "seconds of measurement per case (per re-measurement)", _positive),
    Spec("total_budget", "float", 0.0, "seconds of measurement for the whole run; 0 = unlimited"),
    Spec(
        "case_timeout",
        "float",
        900.0,
        "seconds one case may run before the session ends with TIMEOUT (hung kernel), saying what the case "
        "was doing (its step; in timing, whether blocks were still ending); 0 = none",
    ),
    Spec(
        "confirm",
        "bool",
        True,
        "re-run a regressed case (against a base revision, a faster one too) once in a fresh process; "
        "the verdict stands only if it holds there",
    ),
    Spec(
        "confirm_max",
        "int",
        10,
        "fresh processes a session (each xdist worker) starts to confirm one case each; regressions past them "
        "are confirmed together in one more fresh process after the last case",
        _not_negative,
    ),
    Spec(
        "cpu_watch",
        "bool",
        True,
        "watch the host while timing on CPU: a measurement during which this process waited for a CPU (other "
        "processes' load) or the hypervisor stole time is re-measured once, and inconclusive, never stored, if "
        "it stays disturbed",
    ),
    Spec("json", "path", None, "write every result to this JSON file"),
    Spec("html", "path", None, "write an HTML report to this file (plotly.js in a file beside it)"),
    Spec(
        "strict", "bool", False, "fail on a missing baseline or base, an incomparable one, or an inconclusive verdict"
    ),
    Spec(
        "allow_missing",
        "bool",
        False,
        "under CI, do not fail a run in which no case was compared with a baseline or base revision",
    ),
    Spec(
        "allow_unverified",
        "str",
        "0",
        "under CI, how many timed cases may end unverified (undecided, disturbed, not comparable, no base, or a "
        "pass that could hide twice the margin) before the run fails: a count (3) or a share of the timed cases "
        "(5%); outside CI they are a warning",
        _allowance,
    ),
    Spec("require_gpu", "bool", False, "fail, not skip, when a variant needs a GPU that is not there"),
    Spec("device", "str", "auto", "where to run: auto (CUDA if available), cpu, cuda, cuda:N", _device),
)
BY_NAME: Mapping[str, Spec] = {s.name: s for s in SPECS}


def _default(name: str) -> Any:
    """A setting's default, as the table gives it: written once."""
    return BY_NAME[name].default


@dataclass
class Settings:
    """The resolved settings of one run (`device` is the concrete device, never "auto")."""

    enabled: bool = _default("enabled")
    update: bool = _default("update")
    update_processes: int = _default("update_processes")
    prune: bool = _default("prune")
    join: bool = _default("join")
    seed: int | None = _default("seed")
    against: str | None = _default("against")
    ab_margin: float = _default("ab_margin")
    ab_small_margin: float = _default("ab_small_margin")
    ab_process_sd: float = _default("ab_process_sd")
    ab_small_process_sd: float = _default("ab_small_process_sd")
    ab_offset_fit: bool = _default("ab_offset_fit")
    ab_case_offset: bool = _default("ab_case_offset")
    cache_days: float = _default("cache_days")
    baseline_dir: Path = Path(_default("baseline_dir"))
    margin: float = _default("margin")
    ci_target: float = _default("ci_target")
    case_budget: float = _default("case_budget")
    total_budget: float = _default("total_budget")
    case_timeout: float = _default("case_timeout")
    confirm: bool = _default("confirm")
    confirm_max: int = _default("confirm_max")
    cpu_watch: bool = _default("cpu_watch")
    json: Path | None = _default("json")  # noqa: RUF009 (None: nothing shared to mutate)
    html: Path | None = _default("html")  # noqa: RUF009
    strict: bool = _default("strict")
    allow_missing: bool = _default("allow_missing")
    allow_unverified: str = _default("allow_unverified")
    require_gpu: bool = _default("require_gpu")
    device: str = "cpu"  # resolved: the table's "auto" becomes cpu or cuda:N
    alpha: float = 0.05
    explicit: frozenset[str] = frozenset()  # the settings given on the command line, env or ini

    def ab_margin_for(self, time_ns: float) -> float:
        """The A/B gate's margin for a case of this time: the small-case one under AB_SMALL_NS."""
        return self.ab_margin if time_ns >= AB_SMALL_NS else max(self.ab_margin, self.ab_small_margin)

    def ab_detect_for(self, time_ns: float) -> float:
        """The slowdown an A/B pass must rule out for a case of this time (AB_DETECT_FACTOR margins)."""
        return AB_DETECT_FACTOR * self.ab_margin_for(time_ns)

    def ab_process_sd_for(self, time_ns: float) -> float:
        """The per-process offset of a head/base ratio for a case of this time (the small-case one under
        AB_SMALL_NS)."""
        return self.ab_process_sd if time_ns >= AB_SMALL_NS else self.ab_small_process_sd

    def child_env(self) -> dict[str, str]:
        """The environment that gives a fresh process these settings (paths absolute)."""
        out: dict[str, str] = {}
        for spec in SPECS:
            if spec.cli_only:
                continue
            value = from_env(spec.name) if spec.env_only else getattr(self, spec.name)
            if value is None:
                continue
            if spec.kind == "bool":
                out[spec.env] = "1" if value else "0"
            elif spec.kind == "path":
                out[spec.env] = str(Path(value).resolve())
            else:
                out[spec.env] = repr(value) if spec.kind == "float" else str(value)
        return out


def shown(path: Path) -> str:
    """A path as people want to read it: relative to the working directory when it is under it."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def convert(raw: Any, spec: Spec) -> Any:
    """A raw value (string from the environment or ini, or a parsed option) as the setting's type."""
    if spec.kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError("expected one of 1/0, true/false, yes/no, on/off")
    value: Any
    if spec.kind == "int":
        try:
            value = int(raw)
        except ValueError:
            raise ValueError("expected a whole number") from None
    elif spec.kind == "float":
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"expected a number such as {spec.default!r}") from None
        if not value >= 0 or value == float("inf"):
            raise ValueError("expected a finite number >= 0")
    elif spec.kind == "path":
        value = Path(str(raw))
    else:
        value = str(raw)
    if spec.check is not None:
        spec.check(value)
    return value


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("perfguard", "correctness and performance guard for kernels")
    for spec in SPECS:
        if spec.env_only:
            continue
        where = "" if spec.cli_only else f" (env {spec.env}, ini {spec.ini})"
        # argparse %-formats every help string: a bare "95% CI" broke `pytest --help`, so escape them all here.
        help_text = spec.help.replace("%", "%%")
        if spec.kind == "int":
            group.addoption(spec.option, dest=spec.dest, default=None, type=int, metavar="N", help=help_text)
        elif spec.kind == "bool" and spec.default is True:
            group.addoption(
                spec.option, action="store_false", dest=spec.dest, default=None, help=f"do not {help_text}{where}"
            )
        elif spec.kind == "bool":
            group.addoption(spec.option, action="store_true", dest=spec.dest, default=None, help=help_text + where)
        else:
            shown = "none" if spec.default is None else str(spec.default).replace("%", "%%")
            group.addoption(
                spec.option,
                dest=spec.dest,
                default=None,
                metavar=spec.name.upper(),
                help=f"{help_text}{where}; default {shown}",
            )
        if not spec.cli_only:
            if spec.kind == "bool":
                parser.addini(spec.ini, spec.help, type="bool", default=spec.default)
            else:
                parser.addini(spec.ini, spec.help, type="string", default=spec.default)


def _source(config: pytest.Config, spec: Spec) -> tuple[Any, str, Path | None]:
    """The raw value, where it came from, and the folder a relative path in it is relative to."""
    cli = config.getoption(spec.dest)
    invoked = config.invocation_params.dir
    if cli is not None:
        return cli, spec.option, invoked
    if spec.cli_only:
        return None, "default", config.rootpath
    if os.environ.get(spec.env, "") != "":  # an empty value is no value, as in the ini file
        return os.environ[spec.env], f"environment variable {spec.env}", invoked
    raw = config.getini(spec.ini)
    if raw not in (None, "") and raw != spec.default:
        folder = config.inipath.parent if config.inipath is not None else config.rootpath
        return raw, f"ini option {spec.ini} in {config.inipath}", folder
    return None, "default", config.rootpath


def resolve(config: pytest.Config, spec: Spec) -> Any:
    """CLI > env > ini > default; a relative path is made absolute (see the module docstring)."""
    raw, source, folder = _source(config, spec)
    if raw is None or raw == "":
        value = spec.default
        if spec.kind == "path" and value is not None:
            value = Path(value)
    else:
        try:
            value = convert(raw, spec)
        except ValueError as exc:
            raise pytest.UsageError(
                f"Invalid value {raw!r} from {source}, the perfguard setting {spec.name} ({spec.help}): {exc}"
            ) from None
    if isinstance(value, Path) and not value.is_absolute() and folder is not None:
        value = folder / value
    return value


def from_env(name: str) -> Any:
    """A setting from the environment alone, for code that runs without a pytest config: unset or empty
    means the default; a relative path is relative to the working directory, made absolute."""
    spec = BY_NAME[name]
    raw = os.environ.get(spec.env, "")
    if raw == "":
        return Path(spec.default) if spec.kind == "path" and spec.default is not None else spec.default
    try:
        value = convert(raw, spec)
    except ValueError as exc:
        raise ValueError(f"Invalid value {raw!r} from environment variable {spec.env} ({spec.help}): {exc}") from None
    return Path.cwd() / value if isinstance(value, Path) and not value.is_absolute() else value


def from_config(config: pytest.Config) -> Settings:
    """All settings of this run, except the concrete device (the plugin picks it)."""
    specs = [spec for spec in SPECS if not spec.env_only]
    values = {spec.name: resolve(config, spec) for spec in specs}
    explicit = frozenset(spec.name for spec in specs if _source(config, spec)[1] != "default")
    values["enabled"] = bool(values["enabled"]) or bool(values["update"]) or bool(values["against"])
    if values["prune"] and not values["update"]:
        raise pytest.UsageError(
            "--perfguard-prune only works with --perfguard-update-baseline; add it or drop --perfguard-prune."
        )
    if values["join"] and not values["update"]:
        raise pytest.UsageError(
            "--perfguard-join only works with --perfguard-update-baseline; add it or drop --perfguard-join."
        )
    if values["update"] and values["against"]:
        raise pytest.UsageError(
            "--perfguard-update-baseline records this revision's times; --perfguard-against compares with "
            "another revision. Run them separately."
        )
    wanted = values.pop("device")
    settings = Settings(**{k: v for k, v in values.items() if k in {f.name for f in fields(Settings)}})
    settings.device = wanted  # "auto" until the plugin resolves it
    settings.explicit = explicit
    return settings
