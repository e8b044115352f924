"""The baseline store: strict reading, deterministic atomic writing, merging, migration, concurrency."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_perfguard.jsonio import dumps, lock_file
from pytest_perfguard.judge import update_rules
from pytest_perfguard.judge.baseline import (
    SCHEMA_VERSION,
    BaselineEntry,
    BaselineError,
    BaselineFile,
    ProcessSample,
)
from pytest_perfguard.judge.migrations import MIGRATIONS
from pytest_perfguard.judge.policy import MAX_SAMPLES
from pytest_perfguard.judge.storage import (
    migrate_file,
    read_baseline,
    remove_cases,
    stale_entries,
    update_baseline,
    write_baseline,
)
from pytest_perfguard.slugs import device_slug

DEVICE: dict[str, Any] = {
    "slug": "nvidia-h100-80gb-hbm3",
    "name": "NVIDIA H100 80GB HBM3",
    "kind": "cuda",
    "capability": "9.0",
    "sm_count": 132,
    "driver": "580.159.04",
    "cuda": "13.0",
    "torch": "2.11.0+cu130",
    "triton": "3.6.0",
}
ENV = {"torch": "2.11.0+cu130", "triton": "3.6.0", "sdpa_backend": "flash", "capability": "9.0"}
CASE = "tests/perf/test_attention.py::test_attention[triton_flash-8-8-128-64]"


def workload(text: str = "q,k,v float16[8,8,128,64] causal=True") -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def entry(case_id: str = CASE, median: float = 9123.4, **changes: Any) -> BaselineEntry:
    base = BaselineEntry(
        case_id=case_id,
        workload=workload(),
        workload_desc="q,k,v float16[8,8,128,64] causal=True",
        env=dict(ENV),
        median_ns=median,
        ci_ns=(median * 0.997, median * 1.003),
        ratio=1.02,
        ratio_ci=(1.01, 1.03),
        noise=0.004,
        runs=1,
        blocks=24,
        updated="2026-11-21",
    )
    return dataclasses.replace(base, **changes)


def valid_obj() -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "device": dict(DEVICE),
        "cases": {
            CASE: entry().to_json(),
            "t.py::other": entry("t.py::other", 500.0, ratio=None, ratio_ci=None).to_json(),
        },
    }


def write_raw(path: Path, content: str | bytes) -> bytes:
    data = content.encode() if isinstance(content, str) else content
    path.write_bytes(data)
    return data


def expect_error(path: Path, *needles: str) -> str:
    before = path.read_bytes()
    mtime = path.stat().st_mtime_ns
    with pytest.raises(BaselineError) as info:
        read_baseline(path)
    message = str(info.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message, message
    assert path.read_bytes() == before
    assert path.stat().st_mtime_ns == mtime
    return message


# ------------------------------------------------------------------------------------------------ basics


def test_device_slug() -> None:
    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert device_slug("NVIDIA L4") == "nvidia-l4"
    assert device_slug("NVIDIA A100-SXM4-40GB") == "nvidia-a100-sxm4-40gb"
    assert device_slug("  ../../etc/passwd ") == "etc-passwd"
    assert device_slug("") == "unknown-device"
    assert device_slug("Ünïcode GPU™") == "n-code-gpu"


def test_missing_file_is_empty_baseline(tmp_path: Path) -> None:
    bf = read_baseline(tmp_path / "none.json")
    assert not bf.exists
    assert bf.cases == {}
    assert bf.migrated_from is None
    assert not (tmp_path / "none.json").exists()


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    e1, e2 = entry(), entry("t.py::b", 1.5e6, ratio=None, ratio_ci=None, workload="")
    write_baseline(BaselineFile(path=path, exists=False, device=dict(DEVICE), cases={CASE: e1, e2.case_id: e2}))
    bf = read_baseline(path)
    assert bf.exists
    assert bf.device == DEVICE
    assert bf.cases == {CASE: e1, e2.case_id: e2}
    assert bf.migrated_from is None


def test_file_format_is_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    e1, e2 = entry(), entry("t.py::z", 700.0)
    write_baseline(BaselineFile(path=a, exists=False, device=dict(DEVICE), cases={CASE: e1, e2.case_id: e2}))
    reordered_device = dict(reversed(list(DEVICE.items())))
    write_baseline(BaselineFile(path=b, exists=False, device=reordered_device, cases={e2.case_id: e2, CASE: e1}))
    text = a.read_text()
    assert a.read_bytes() == b.read_bytes()
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=2, allow_nan=False) + "\n"
    assert list(json.loads(text)) == ["cases", "device", "schema_version"]
    # reading and writing back leaves the bytes alone
    write_baseline(read_baseline(a))
    assert a.read_bytes() == b.read_bytes()


def test_dumps_refuses_nan() -> None:
    with pytest.raises(ValueError):
        dumps({"x": math.nan})


def test_entry_json_has_exactly_the_documented_fields() -> None:
    assert sorted(entry().to_json()) == sorted(
        [
            "workload",
            "workload_desc",
            "env",
            "samples",
            "unstable",
            "median_ns",
            "ci_ns",
            "ratio",
            "ratio_ci",
            "noise",
            "runs",
            "blocks",
            "updated",
        ]
    )


# ----------------------------------------------------------------------------------------- bad files


BAD_TEXT = [
    ("", "empty"),
    ("   \n\n", "empty"),
    ('{"schema_version": 1, "device": {', "ends early"),
    (dumps(valid_obj())[:-40], "ends early"),
    ("{'a': 1}", "invalid JSON"),
    (
        '{"schema_version": 1, "schema_version": 1, "device": {}, "cases": {}}',
        'duplicate key "schema_version"',
    ),
    ('{"schema_version": NaN}', "NaN"),
    ('{"schema_version": -Infinity}', "Infinity"),
    ('{"schema_version": 1e999}', "overflows"),
    ("[" * 50000 + "]" * 50000, "nested too deeply"),
    ('{"x": ' + "1" * 5000 + "}", "unreadable number"),
    ("[1, 2]", "top level must be a JSON object"),
    ('"text"', "top level must be a JSON object"),
    ('{"device": {}, "cases": {}}', "missing 'schema_version'"),
    ('{"schema_version": "1", "device": {}, "cases": {}}', "'schema_version' must be a non-negative integer"),
    (
        '{"schema_version": true, "device": {}, "cases": {}}',
        "'schema_version' must be a non-negative integer",
    ),
    ('{"schema_version": -1, "device": {}, "cases": {}}', "'schema_version' must be a non-negative integer"),
    (
        '{"schema_version": 4, "device": {}, "cases": {}}',
        "newer pytest-perfguard (schema 4 > 3): upgrade pytest-perfguard",
    ),
    ('{"schema_version": 1, "cases": {}}', "missing field 'device'"),
    ('{"schema_version": 1, "device": {"slug": "a"}, "cases": {}}', "'device' is missing field 'name'"),
    ('{"schema_version": 1, "device": {"slug": "A B", "name": "x"}, "cases": {}}', "is not a slug"),
    ('{"schema_version": 1, "device": [], "cases": {}}', "'device' must be a JSON object"),
    (
        '{"schema_version": 1, "device": {"slug": "a", "name": "a"}, "cases": []}',
        "'cases' must be a JSON object",
    ),
    ('{"schema_version": 1, "device": {"slug": "a", "name": "a"}, "cases": {}, "x": 1}', "unknown field 'x'"),
    ('{"schema_version": 1, "kind": "perfguard-results", "results": []}', "results file"),
]


@pytest.mark.parametrize(("content", "needle"), BAD_TEXT, ids=[f"bad{i}" for i in range(len(BAD_TEXT))])
def test_bad_file_is_refused_untouched(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "dev.json"
    write_raw(path, content)
    expect_error(path, needle)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    write_raw(path, b'{"schema_version": 1, "x": "\xff\xfe"}')
    expect_error(path, "not UTF-8", "git checkout -- ")


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    write_raw(path, "\ufeff" + dumps(valid_obj()))
    assert CASE in read_baseline(path).cases


def test_merge_conflict_names_the_line(tmp_path: Path) -> None:
    text = dumps(valid_obj()).splitlines()
    ours, theirs = text[:], text[:]
    conflicted = [
        *ours[:5],
        "<<<<<<< HEAD",
        ours[5],
        "=======",
        theirs[5].replace("1", "2"),
        ">>>>>>> feature",
        *ours[6:],
    ]
    path = tmp_path / "dev.json"
    write_raw(path, "\n".join(conflicted) + "\n")
    expect_error(path, "unresolved merge conflict at line 6", "resolve the merge conflict")


def test_duplicate_case_id_from_a_merge(tmp_path: Path) -> None:
    # git can merge two branches that each added the same case into one object holding the key twice
    one = json.dumps(entry().to_json())
    text = (
        f'{{"schema_version": {SCHEMA_VERSION},\n "device": {json.dumps(DEVICE)},\n "cases": {{\n'
        f'  "{CASE}": {one},\n  "{CASE}": {one}\n}}}}\n'
    )
    path = tmp_path / "dev.json"
    write_raw(path, text)
    message = expect_error(path, "duplicate key", CASE)
    assert "near line 5" in message


def test_directory_and_unreadable(tmp_path: Path) -> None:
    folder = tmp_path / "dev.json"
    folder.mkdir()
    with pytest.raises(BaselineError, match="is a folder"):
        read_baseline(folder)


def test_unreadable_file_simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "dev.json"
    write_raw(path, dumps(valid_obj()))

    def denied(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(
        BaselineError, match=r"cannot read the baseline file .Permission denied.; check its permissions"
    ):
        read_baseline(path)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads everything")
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    write_raw(path, dumps(valid_obj()))
    path.chmod(0)
    try:
        with pytest.raises(BaselineError, match="cannot read"):
            read_baseline(path)
    finally:
        path.chmod(0o644)


ENTRY_BAD = [
    ("median_ns", -1.0, "must be positive"),
    ("median_ns", 0, "must be positive"),
    ("median_ns", "9123", "must be a number"),
    ("median_ns", True, "must be a number"),
    ("median_ns", 10**400, "too large"),
    ("ci_ns", [9200.0, 9300.0], "low <= median_ns"),
    ("ci_ns", [9000.0], "must be a list [low, high]"),
    ("ci_ns", None, "must be a list [low, high]"),
    ("ci_ns", [-1.0, 9300.0], "must be positive"),
    ("ratio", 0.0, "must be positive"),
    ("ratio", "fast", "must be a number"),
    ("ratio_ci", [1.1, 1.2], "low <= ratio"),
    ("noise", -0.01, "must not be negative"),
    ("runs", 0, "must be >= 1"),
    ("runs", 1.0, "must be an integer"),
    ("blocks", -1, "must be >= 0"),
    ("updated", "2026-13-01", "must be a date"),
    ("updated", "21.11.2026", "must be a date"),
    ("updated", 20261121, "must be a string"),
    ("workload", "abc", "sha256"),
    ("workload", workload().upper(), "sha256"),
    ("env", {"torch": 2}, "env.torch"),
    ("env", ["torch"], "field 'env'"),
    ("workload_desc", None, "must be a string"),
]


@pytest.mark.parametrize(
    ("field", "value", "needle"), ENTRY_BAD, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(ENTRY_BAD)]
)
def test_bad_entry_names_file_case_and_field(tmp_path: Path, field: str, value: Any, needle: str) -> None:
    obj = valid_obj()
    obj["cases"][CASE][field] = value
    path = tmp_path / "dev.json"
    write_raw(path, json.dumps(obj))
    message = expect_error(path, needle, CASE, field)
    assert "git checkout --" in message


def test_entry_missing_and_unknown_fields(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    obj = valid_obj()
    del obj["cases"][CASE]["noise"]
    write_raw(path, json.dumps(obj))
    expect_error(path, "missing field 'noise'", CASE)
    obj = valid_obj()
    obj["cases"][CASE]["median_n"] = 1.0
    write_raw(path, json.dumps(obj))
    expect_error(path, "unknown field 'median_n'")
    obj = valid_obj()
    obj["cases"][CASE] = [1, 2]
    write_raw(path, json.dumps(obj))
    expect_error(path, "must be a JSON object")


def test_ratio_ci_without_ratio(tmp_path: Path) -> None:
    obj = valid_obj()
    obj["cases"][CASE]["ratio"] = None
    path = tmp_path / "dev.json"
    write_raw(path, json.dumps(obj))
    expect_error(path, "'ratio_ci' must be null")


def test_from_json_direct() -> None:
    good = entry()
    assert BaselineEntry.from_json(CASE, good.to_json(), Path("x.json")) == good
    with pytest.raises(BaselineError, match=r"x\.json: case 'c': the entry must be a JSON object"):
        BaselineEntry.from_json("c", None, Path("x.json"))


# --------------------------------------------------------------------------------------------- fuzzing


def _fuzz_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "dev.json"


def _load_or_baseline_error(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    try:
        read_baseline(path)
    except BaselineError as exc:
        assert str(path) in str(exc)
    assert path.read_bytes() == data


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.binary(max_size=400))
def test_fuzz_random_bytes(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    _load_or_baseline_error(_fuzz_path(tmp_path_factory), data)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for index, value in enumerate(obj):
            out += _paths(value, (*prefix, index))
    return out


@settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_fuzz_json_mutations(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    obj: Any = valid_obj()
    for _ in range(data.draw(st.integers(1, 3))):
        target = data.draw(st.sampled_from(_paths(obj)))
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if not target:
            obj = data.draw(JSON_VALUES)
            continue
        parent = obj
        for step in target[:-1]:
            parent = parent[step]
        last = target[-1]
        if action == "replace":
            parent[last] = data.draw(JSON_VALUES)
        elif action == "delete":
            del parent[last]
        elif isinstance(parent, dict):
            parent[data.draw(st.text(max_size=8))] = data.draw(JSON_VALUES)
        else:
            parent.append(data.draw(JSON_VALUES))
        if not isinstance(obj, dict):
            break
    _load_or_baseline_error(_fuzz_path(tmp_path_factory), json.dumps(obj).encode())


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_fuzz_text_mutations(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    text = dumps(valid_obj())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        kind = data.draw(st.sampled_from(["cut", "insert", "delete", "truncate"]))
        if kind == "truncate":
            text = text[:at]
        elif kind == "insert":
            text = text[:at] + data.draw(st.text(max_size=4)) + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + data.draw(st.integers(1, 8)) :]
        else:
            text = text[at:]
    _load_or_baseline_error(_fuzz_path(tmp_path_factory), text.encode("utf-8", "surrogatepass"))


# ------------------------------------------------------------------------------------------ atomic write


def test_crash_during_replace_keeps_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "dev.json"
    write_baseline(BaselineFile(path=path, exists=False, device=dict(DEVICE), cases={CASE: entry()}))
    before = path.read_bytes()

    def broken_replace(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    new = BaselineFile(path=path, exists=True, device=dict(DEVICE), cases={CASE: entry(median=1.0)})
    with pytest.raises(BaselineError, match=r"No space left on device.*previous file is unchanged"):
        write_baseline(new)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev.json"]


def test_interrupt_during_fsync_keeps_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "dev.json"
    write_baseline(BaselineFile(path=path, exists=False, device=dict(DEVICE), cases={CASE: entry()}))
    before = path.read_bytes()

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_baseline(BaselineFile(path=path, exists=True, device=dict(DEVICE), cases={}))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev.json"]


def test_write_keeps_file_mode(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    write_baseline(BaselineFile(path=path, exists=False, device=dict(DEVICE), cases={}))
    path.chmod(0o640)
    write_baseline(BaselineFile(path=path, exists=True, device=dict(DEVICE), cases={CASE: entry()}))
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_write_missing_folder(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dev.json"
    with pytest.raises(BaselineError, match=r"does not exist; create it \(mkdir -p .*no/such\)"):
        write_baseline(BaselineFile(path=path, exists=False, device=dict(DEVICE), cases={}))
    assert not (tmp_path / "no").exists()
    with pytest.raises(BaselineError, match="does not exist"):
        update_baseline(path, DEVICE, {CASE: entry()}, noise_floor=0.0)


def test_write_unwritable_folder_simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "dev.json"

    def denied(*args: Any, **kwargs: Any) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(BaselineError, match=r"cannot write in folder .*Permission denied.*make it writable"):
        write_baseline(BaselineFile(path=path, exists=False, device=dict(DEVICE), cases={}))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes everywhere")
def test_write_read_only_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "dev.json"
    write_baseline(BaselineFile(path=path, exists=False, device=dict(DEVICE), cases={}))
    before = path.read_bytes()
    folder.chmod(0o555)
    try:
        with pytest.raises(BaselineError, match=re.escape(str(folder))):
            update_baseline(path, DEVICE, {CASE: entry()}, noise_floor=0.0)
        assert path.read_bytes() == before
    finally:
        folder.chmod(0o755)


def test_write_refuses_invalid_entries(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    with pytest.raises(BaselineError, match="JSON cannot hold"):
        write_baseline(BaselineFile(path=path, exists=False, device=dict(DEVICE), cases={CASE: entry(noise=math.nan)}))
    with pytest.raises(BaselineError, match="must be positive"):
        write_baseline(BaselineFile(path=path, exists=False, device=dict(DEVICE), cases={CASE: entry(median=-5.0)}))
    assert not path.exists()


# ----------------------------------------------------------------------------------------------- update


def test_update_adds_and_keeps_other_cases(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    first = update_baseline(path, DEVICE, {"a": entry("a"), "b": entry("b")}, noise_floor=0.001)
    assert (first.added, first.updated, first.reset, first.kept) == (["a", "b"], [], [], 0)
    second = update_baseline(path, DEVICE, {"c": entry("c"), "a": entry("a", 9200.0)}, noise_floor=0.001)
    assert (second.added, second.updated, second.reset, second.kept) == (["c"], ["a"], [], 1)
    assert second.path == path
    bf = read_baseline(path)
    assert sorted(bf.cases) == ["a", "b", "c"]
    assert bf.cases["a"].median_ns == pytest.approx(math.sqrt(9123.4 * 9200.0))  # the runs' geometric mean
    assert bf.cases["b"] == entry("b")


def sampled(case_id: str, *times: float, ratio: float | None = 1.02) -> BaselineEntry:
    """An entry of one process sample per time, as an update of several processes makes it."""
    samples = [
        ProcessSample(t, (t * 0.997, t * 1.003), ratio, t / ratio if ratio else None, "GPU-1", "2026-11-25", 24)
        for t in times
    ]
    return BaselineEntry.from_samples(
        case_id, samples, workload=workload(), workload_desc="q", env=dict(ENV), updated="2026-11-25"
    )


def test_an_entry_is_the_sample_of_its_processes(tmp_path: Path) -> None:
    """Centre, interval and spread are derived from the process medians, and survive the file."""
    path = tmp_path / "dev.json"
    update_baseline(path, DEVICE, {"a": sampled("a", 1000.0, 1020.0, 990.0)}, noise_floor=0.001)
    stored = read_baseline(path).cases["a"]
    logs = [math.log(t) for t in (1000.0, 1020.0, 990.0)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    assert stored.runs == 3 and [x.median_ns for x in stored.samples] == [1000.0, 1020.0, 990.0]
    assert stored.median_ns == pytest.approx(math.exp(mean), rel=1e-12)
    assert stored.noise == pytest.approx(sd, rel=1e-12)
    assert stored.ratio == pytest.approx(1.02) and stored.ratio_noise == pytest.approx(0.0, abs=1e-12)
    lo, hi = stored.ci_ns
    assert lo < stored.median_ns < hi
    # another update's processes join the sample
    update_baseline(path, DEVICE, {"a": sampled("a", 1005.0, 1010.0, 995.0)}, noise_floor=0.001, change_threshold=0.05)
    assert read_baseline(path).cases["a"].runs == 6


def test_derived_fields_must_agree_with_the_samples(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    case = sampled("a", 1000.0, 1010.0).to_json()
    case["median_ns"] = 1000.0  # a hand-edited centre (inside its interval), the samples left alone
    write_raw(path, dumps({"schema_version": SCHEMA_VERSION, "device": dict(DEVICE), "cases": {"a": case}}))
    expect_error(path, "'a'", "median_ns", "its samples give")


def test_the_sample_keeps_the_last_processes_and_follows_a_drift(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    kw: dict[str, Any] = {"noise_floor": 0.001, "change_threshold": 0.05}
    update_baseline(path, DEVICE, {"a": sampled("a", 1000.0, 1003.0, 998.0)}, **kw)
    for i in range(8):
        t = 1000.0 + 5.0 * (i + 1)  # a slow drift, 0.5% a step: never a changed kernel
        update_baseline(path, DEVICE, {"a": sampled("a", t, t + 1.0, t - 1.0)}, **kw)
    stored = read_baseline(path).cases["a"]
    assert stored.runs == MAX_SAMPLES
    assert stored.samples[0].median_ns > 1003.0  # the oldest processes dropped out
    assert stored.median_ns > 1020.0


def test_noise_floor_applies(tmp_path: Path) -> None:
    """A one-process entry carries the floor as its noise; an entry of several derives its spread, and the
    floor applies in the threshold instead."""
    path = tmp_path / "dev.json"
    update_baseline(path, DEVICE, {"a": entry("a", noise=0.0001)}, noise_floor=0.01)
    assert read_baseline(path).cases["a"].noise == 0.01
    update_baseline(path, DEVICE, {"a": sampled("a", 9123.4, 9123.4)}, noise_floor=0.01)
    stored = read_baseline(path).cases["a"]
    assert stored.runs == 3 and stored.noise == pytest.approx(0.0, abs=1e-12)
    assert update_rules.entry_threshold(stored, 0.001, 0.01) > 0.01


@pytest.mark.parametrize(
    "change",
    [{"workload": workload("other shape")}, {"env": {**ENV, "sdpa_backend": "efficient"}}, {"env": {}}],
)
def test_workload_or_env_change_resets_noise(tmp_path: Path, change: dict[str, Any]) -> None:
    path = tmp_path / "dev.json"
    update_baseline(path, DEVICE, {"a": entry("a", 1000.0, noise=0.01)}, noise_floor=0.001)
    update_baseline(path, DEVICE, {"a": entry("a", 1100.0, noise=0.01)}, noise_floor=0.001)
    assert read_baseline(path).cases["a"].runs == 2
    summary = update_baseline(path, DEVICE, {"a": entry("a", 2000.0, noise=0.002, **change)}, noise_floor=0.003)
    assert summary.reset == ["a"]
    stored = read_baseline(path).cases["a"]
    assert (stored.runs, stored.noise, stored.median_ns) == (1, 0.003, 2000.0)


def test_update_refuses_other_device(tmp_path: Path) -> None:
    path = tmp_path / "nvidia-h100-80gb-hbm3.json"
    update_baseline(path, DEVICE, {"a": entry("a")}, noise_floor=0.0)
    before = path.read_bytes()
    other = {"slug": "nvidia-l4", "name": "NVIDIA L4"}
    with pytest.raises(BaselineError, match=r"holds device 'nvidia-h100-80gb-hbm3'.*nvidia-l4\.json"):
        update_baseline(path, other, {"b": entry("b")}, noise_floor=0.0)
    assert path.read_bytes() == before


def test_update_refuses_bad_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    before = write_raw(path, "<<<<<<< HEAD\n{}\n")
    with pytest.raises(BaselineError, match="merge conflict"):
        update_baseline(path, DEVICE, {"a": entry("a")}, noise_floor=0.0)
    assert path.read_bytes() == before


def test_update_lock_timeout(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    with FileLock(str(lock_file(path))), pytest.raises(BaselineError, match="could not lock"):
        update_baseline(path, DEVICE, {"a": entry("a")}, noise_floor=0.0, lock_timeout=0.2)
    assert not path.exists()


def test_update_updates_device_description(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    update_baseline(path, DEVICE, {"a": entry("a")}, noise_floor=0.0)
    update_baseline(path, {**DEVICE, "driver": "590.1"}, {"b": entry("b")}, noise_floor=0.0)
    assert read_baseline(path).device["driver"] == "590.1"


def _update_worker(args: tuple[str, int, int, bool]) -> None:
    path, worker, count, same_case = args
    for index in range(count):
        case_id = "shared" if same_case else f"w{worker}::case{index}"
        update_baseline(Path(path), DEVICE, {case_id: entry(case_id, 1000.0 + index)}, noise_floor=0.001)


@pytest.mark.parametrize("same_case", [False, True], ids=["distinct-cases", "same-case"])
def test_concurrent_updates_lose_nothing(tmp_path: Path, same_case: bool) -> None:
    path = tmp_path / "dev.json"
    # fork where there is one: spawned children would re-import the package (and torch) for seconds
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    with context.Pool(4) as pool:
        pool.map(_update_worker, [(str(path), worker, 10, same_case) for worker in range(4)])
    bf = read_baseline(path)
    if same_case:
        assert list(bf.cases) == ["shared"]
        assert bf.cases["shared"].runs == MAX_SAMPLES  # 40 processes joined; the last MAX_SAMPLES are kept
    else:
        assert len(bf.cases) == 40
        assert all(f"w{w}::case{i}" in bf.cases for w in range(4) for i in range(10))
    # the lock lives outside the folder: nothing but the baseline is left beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev.json"]


# ------------------------------------------------------------------------------------ migration, stale


LEGACY = {
    "schema_version": 0,
    "device": "NVIDIA L4",
    "cases": {
        "t.py::a": {"median_ms": 0.5257, "ci_ms": [0.52, 0.53], "ratio": 1.1, "notes": "hand-kept"},
        "t.py::b": {"median_us": 47.0, "updated": "2025-10-16", "blocks": 20, "desc": "B=8 H=8 S=128"},
    },
}


def test_legacy_file_migrates_in_memory_only(tmp_path: Path) -> None:
    path = tmp_path / "nvidia-l4.json"
    before = write_raw(path, json.dumps(LEGACY))
    bf = read_baseline(path)
    assert bf.migrated_from == 0
    assert path.read_bytes() == before
    assert bf.device == {"slug": "nvidia-l4", "name": "NVIDIA L4"}
    a, b = bf.cases["t.py::a"], bf.cases["t.py::b"]
    assert a.median_ns == pytest.approx(525_700.0)
    assert a.ci_ns == pytest.approx((520_000.0, 530_000.0))
    assert (a.ratio, a.ratio_ci, a.workload, a.env, a.runs, a.blocks, a.updated) == (
        1.1,
        None,
        "",
        {},
        1,
        0,
        "",
    )
    assert (b.median_ns, b.ci_ns, b.blocks, b.updated, b.workload_desc) == (
        47_000.0,
        (47_000.0, 47_000.0),
        20,
        "2025-10-16",
        "B=8 H=8 S=128",
    )


def test_migrate_file_rewrites_once(tmp_path: Path) -> None:
    path = tmp_path / "nvidia-l4.json"
    write_raw(path, json.dumps({"schema_version": 0, "cases": {"t.py::a": {"median_ns": 100}}}))
    assert migrate_file(path) == 0
    bf = read_baseline(path)
    assert bf.migrated_from is None
    assert bf.device == {"slug": "nvidia-l4", "name": "nvidia-l4"}
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION
    assert migrate_file(path) is None


def test_update_of_legacy_file_writes_current_schema(tmp_path: Path) -> None:
    path = tmp_path / "nvidia-l4.json"
    write_raw(path, json.dumps(LEGACY))
    device = {"slug": "nvidia-l4", "name": "NVIDIA L4"}
    summary = update_baseline(path, device, {"t.py::a": entry("t.py::a", 525_000.0)}, noise_floor=0.0)
    assert summary.migrated_from == 0
    assert summary.reset == ["t.py::a"]  # workload of a legacy entry is unknown: no folding
    assert read_baseline(path).migrated_from is None


@pytest.mark.parametrize(
    ("legacy", "needle"),
    [
        ({"schema_version": 0, "cases": {"a": {"median_ms": 1, "median_us": 1}}}, "exactly one of"),
        ({"schema_version": 0, "cases": {"a": {"median_ms": -1}}}, "must be positive"),
        ({"schema_version": 0, "cases": {"a": {"median_ms": 1, "ci_ms": [2, 3]}}}, "low <= median_ms"),
        ({"schema_version": 0, "cases": []}, "no 'cases' object"),
        ({"schema_version": 0, "device": 3, "cases": {}}, "legacy 'device'"),
        ({"schema_version": 0, "cases": {"a": {"median_ms": 1, "ratio": -2}}}, "field 'ratio'"),
    ],
)
def test_bad_legacy_file(tmp_path: Path, legacy: dict[str, Any], needle: str) -> None:
    path = tmp_path / "dev.json"
    write_raw(path, json.dumps(legacy))
    expect_error(path, needle)


def test_migration_registry_covers_every_old_version() -> None:
    assert set(MIGRATIONS) == set(range(SCHEMA_VERSION))
    migrated = MIGRATIONS[0](copy.deepcopy(LEGACY))
    assert migrated["schema_version"] == 1


def test_stale_entries_and_remove(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    update_baseline(path, DEVICE, {c: entry(c) for c in ["a", "b", "c", "d"]}, noise_floor=0.0)
    bf = read_baseline(path)
    assert stale_entries(bf, {"a", "c", "new"}) == ["b", "d"]
    assert stale_entries(bf, {"a", "b", "c", "d"}) == []
    assert remove_cases(path, {"b", "d", "zzz"}) == ["b", "d"]
    assert sorted(read_baseline(path).cases) == ["a", "c"]
    before = path.read_bytes()
    assert remove_cases(path, {"zzz"}) == []
    assert path.read_bytes() == before


def test_a_changed_kernel_resets_instead_of_inflating_the_noise(tmp_path: Path) -> None:
    """An intended 20% speed-up recorded as 'more processes' would widen the spread and blind the guard."""
    path = tmp_path / "dev.json"
    kw: dict[str, Any] = {"noise_floor": 0.005, "change_threshold": 0.05}
    update_baseline(path, DEVICE, {"a": sampled("a", 10_000.0, 10_020.0, 9_990.0)}, **kw)
    same = update_baseline(path, DEVICE, {"a": sampled("a", 10_100.0, 10_080.0, 10_050.0)}, **kw)
    assert same.updated == ["a"] and read_baseline(path).cases["a"].runs == 6
    faster = update_baseline(path, DEVICE, {"a": sampled("a", 8_000.0, 8_010.0, 7_990.0)}, **kw)
    assert faster.reset == ["a"]
    stored = read_baseline(path).cases["a"]
    assert stored.runs == 3 and stored.median_ns == pytest.approx(8_000.0, rel=1e-3)


def test_a_move_within_the_guards_own_threshold_is_noise_not_a_new_kernel(tmp_path: Path) -> None:
    """A case whose processes spread 3% has a prediction bound above the margin: a 6% move joins the
    sample, and only a move past the bound resets it."""
    path = tmp_path / "dev.json"
    kw: dict[str, Any] = {"noise_floor": 0.005, "change_threshold": 0.05}
    update_baseline(path, DEVICE, {"a": sampled("a", 10_000.0, 10_400.0, 9_800.0)}, **kw)
    stored = read_baseline(path).cases["a"]
    assert update_rules.entry_threshold(stored, 0.05, 0.005) > 0.06
    moved = update_baseline(path, DEVICE, {"a": sampled("a", 10_600.0, 10_650.0, 10_550.0)}, **kw)
    assert moved.updated == ["a"] and read_baseline(path).cases["a"].runs == 6
    far = update_baseline(path, DEVICE, {"a": sampled("a", 20_000.0, 20_100.0, 19_900.0)}, **kw)
    assert far.reset == ["a"] and read_baseline(path).cases["a"].runs == 3
