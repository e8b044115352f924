"""Runs over several devices, on CPU: what the summary counts, and how a run picks and names its GPUs.

The GPU side (every step of a case on its own GPU, `-n 2` against `-n 0`) is in tests/gpu/test_multi_gpu.py.
"""

from __future__ import annotations

import json
import os

import pytest

from pytest_perfguard.measure.visible import timing_gpus
from pytest_perfguard.run import xdist as xd
from pytest_perfguard.run.update import split_cases
from tests.test_plugin import CONFTEST, MODES, _case, baseline_json, run

pytest_plugins = ["pytester"]

# A kernel that answers its timed calls from the last untimed one: the timed-output check flags it.
STALE = """
import sys

def stale(ns):
    last = {}
    def kernel(q, k, v, causal):
        CLOCK.t += ns
        frame, timed = sys._getframe(1), False
        for _ in range(5):
            if frame is None:
                break
            timed = timed or frame.f_code.co_filename.endswith("timing.py")
            frame = frame.f_back
        if not (timed and q.shape in last):
            last[q.shape] = reference(q, k, v, causal)
        return last[q.shape]
    return kernel
"""


@pytest.fixture
def flagged(pytester: pytest.Pytester) -> pytest.Pytester:
    """Per shape: two honest variants and one the timed-output check flags."""
    pytester.makeconftest(CONFTEST + STALE)
    case = _case(extra=', "stale": stale(1000)').replace(
        "from conftest import CLOCK, reference, timed", "from conftest import CLOCK, reference, stale, timed"
    )
    pytester.makepyfile(test_k=case)
    return pytester


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_a_flagged_case_is_not_called_new(flagged: pytest.Pytester, mode: str) -> None:
    result = run(flagged, MODES[mode], "--perfguard")
    result.assert_outcomes(passed=4, failed=2)
    result.stdout.fnmatch_lines(["*stale: flagged: timed output wrong*"])
    result.stdout.fnmatch_lines(
        ["perfguard: 0 of 6 timed case(s) compared with the baseline; not compared: 2 flagged, 4 new (no baseline*"]
    )


@pytest.mark.slow
def test_a_run_of_flagged_cases_only_does_not_ask_for_a_baseline(flagged: pytest.Pytester) -> None:
    result = run(flagged, MODES["no-xdist"], "--perfguard", "-k", "stale", env={"CI": "true"})
    result.assert_outcomes(failed=2, deselected=4)
    result.stdout.fnmatch_lines(["perfguard: 0 of 2 timed case(s) compared with the baseline; not compared: 2 flagged"])
    out = result.stdout.str()
    assert "new (no baseline" not in out and "no timed case was compared with anything" not in out


@pytest.mark.slow
def test_the_summary_of_a_run_over_workers_names_their_gpus(
    flagged: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under -q pytest's header is gone, and the summary's title names the controller's device: a run over
    xdist workers lists the GPUs they used below it (gpu_header, faked here: this host has no GPU)."""
    said = "perfguard: GPUs used: cuda:0, cuda:1 (a fake GPU), one xdist worker each"
    monkeypatch.setattr(xd, "gpu_header", lambda config, settings: [said])
    result = run(flagged, MODES["n2"], "--perfguard", "-q", "-k", "not stale")
    result.assert_outcomes(passed=4)
    assert said in result.stdout.str().splitlines()
    alone = run(flagged, MODES["n0"], "--perfguard", "-q", "-k", "not stale")
    assert said not in alone.stdout.str()


# ---------------------------------------------------------------------------------------- one host, N GPUs

CONTROLLER_PROBE = """
import sys

def _log(when):
    with open("controller.log", "a") as f:
        f.write(("torch" if "torch" in sys.modules else "no torch") + when + "\\n")

def pytest_configure_node(node):
    _log("")

def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        _log(" at the end")
"""


@pytest.mark.slow
@pytest.mark.fresh_interpreter
def test_the_controller_starts_its_workers_without_importing_torch(pytester: pytest.Pytester) -> None:
    """An xdist controller runs no case: it names the GPUs and the baseline file from the driver
    (measure/visible.py), so its workers start without waiting for its torch import (7 s on a fresh
    two-H200 host). It takes the device's fingerprint from its first worker, and never imports torch: the
    summary still names torch's version."""
    pytester.makepyfile(fakes=CONFTEST, test_k=_case().replace("from conftest import", "from fakes import"))
    pytester.makeconftest(CONTROLLER_PROBE)
    result = pytester.runpytest_subprocess("-n", "2", "--perfguard", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    log = (pytester.path / "controller.log").read_text().splitlines()
    assert log == ["no torch", "no torch", "no torch at the end"], log
    result.stdout.fnmatch_lines(["*perfguard: * (cpu), torch 2.*"])


FAKE_DRIVER = """
from pytest_perfguard.measure import visible

visible.torch_cuda_build = lambda: True
GPUS = (visible.Gpu("Fake H100", "a-0"), visible.Gpu("Fake L4", "b-1"), visible.Gpu("Fake H100", "c-2"))
visible._driver_gpus = lambda: GPUS
"""


@pytest.mark.slow
@pytest.mark.fresh_interpreter
def test_the_controller_names_the_gpus_and_the_baseline_file_from_the_driver(pytester: pytest.Pytester) -> None:
    """Where the controller has not imported torch, the CUDA driver's list (faked here) names the GPUs it hands
    out and the baseline file it reads; its workers, on this host without a GPU, run on the CPU."""
    pytester.makepyfile(fakes=CONFTEST, test_k=_case().replace("from conftest import", "from fakes import"))
    pytester.makeconftest(CONTROLLER_PROBE + FAKE_DRIVER)
    result = pytester.runpytest_subprocess("-n", "2", "--perfguard", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "perfguard: baseline .ci/baselines/fake-h100.json (no such file yet)",
            "perfguard: GPUs used: cuda:0, cuda:2 (Fake H100), one xdist worker each",
            "perfguard: GPUs not used: cuda:1 (Fake L4): not the model of cuda:0*",
        ]
    )
    assert (pytester.path / "controller.log").read_text().splitlines()[:2] == ["no torch", "no torch"]


ORDER_LOG = """
import json, os

def pytest_collection_finish(session):
    if hasattr(session.config, "workerinput"):
        with open(os.environ["ORDER_LOG"], "a") as f:
            f.write(json.dumps([item.nodeid.split("::")[-1] for item in session.items]) + "\\n")
"""


@pytest.mark.slow
def test_workers_take_the_longest_stored_cases_first(pytester: pytest.Pytester) -> None:
    """xdist hands items out in collection order: each worker's collection puts the cases with the longest
    stored time (variant and `against` per call) first, and a case with no stored entry before them."""
    pytester.makeconftest(CONFTEST + ORDER_LOG)
    pytester.makepyfile(test_k=_case())  # fast: 1000 ns, other: 2000 ns, against: 1000 ns; S 8 and 16
    (pytester.path / ".ci" / "baselines").mkdir(parents=True)
    run(pytester, MODES["no-xdist"], "--perfguard-update-baseline").assert_outcomes(passed=4)
    files = list((pytester.path / ".ci" / "baselines").glob("*.json"))
    doc = baseline_json(pytester)
    del doc["cases"]["test_k.py::test_attn[fast-16]"]
    files[0].write_text(json.dumps(doc))
    log = pytester.path / "order.log"
    os.environ["ORDER_LOG"] = str(log)
    try:
        run(pytester, MODES["n2"], "--perfguard").assert_outcomes(passed=4)
    finally:
        del os.environ["ORDER_LOG"]
    orders = [json.loads(line) for line in log.read_text().splitlines()]
    cases = doc["cases"]
    per_call = {k.split("::")[-1]: e["median_ns"] * (1 + 1 / e["ratio"]) for k, e in cases.items()}
    stored = sorted(per_call, key=per_call.__getitem__, reverse=True)
    assert stored[-1] == "test_attn[fast-8]", per_call  # other (2000 ns) before fast (1000 ns)
    expected = ["test_attn[fast-16]", *stored]
    assert orders == [expected, expected], orders
    # without workers, the collection order stays
    alone = run(pytester, MODES["no-xdist"], "--perfguard", "-v")
    alone.stdout.fnmatch_lines(["*fast-8*", "*fast-16*", "*other-8*", "*other-16*"])


H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"


def test_timing_gpus_are_those_of_the_first_gpus_model() -> None:
    assert timing_gpus([H100, H100]) == [0, 1]
    assert timing_gpus([H100, L4, H100]) == [0, 2]
    assert timing_gpus([L4, H100, H100], first=1) == [1, 2]
    assert timing_gpus([]) == []


def test_the_header_lists_the_gpus_used_and_why_others_are_not() -> None:
    assert xd.gpu_lines([H100, H100], 2, enabled=True) == [
        f"perfguard: GPUs used: cuda:0, cuda:1 ({H100}), one xdist worker each"
    ]
    assert xd.gpu_lines([H100, H100], 0, enabled=True, pinned=1) == [f"perfguard: GPUs used: cuda:1 ({H100})"]
    mixed = xd.gpu_lines([H100, L4, H100], 2, enabled=True)
    assert mixed[0] == f"perfguard: GPUs used: cuda:0, cuda:2 ({H100}), one xdist worker each"
    assert mixed[1].startswith(f"perfguard: GPUs not used: cuda:1 ({L4}): not the model of cuda:0")
    assert "--perfguard-device cuda:1 (their own baseline file)" in mixed[1]
    # Correctness alone compares with no stored time: every GPU checks cases.
    assert xd.gpu_lines([H100, L4], 2, enabled=False) == [
        f"perfguard: GPUs used: cuda:0 ({H100}); cuda:1 ({L4}), one xdist worker each"
    ]
    busy = xd.gpu_lines([H100, H100], 4, enabled=True)
    assert busy == [
        f"perfguard: GPUs used: cuda:0, cuda:1 ({H100}), 4 xdist workers over them (they take turns timing on each GPU)"
    ]
    idle = xd.gpu_lines([H100, H100, H100], 2, enabled=True)
    assert idle[1] == f"perfguard: GPUs idle: cuda:2 ({H100}): -n 2 starts fewer workers; -n auto starts one each"
    assert xd.gpu_lines([], 2, enabled=True) == []


@pytest.mark.parametrize(
    ("args", "names", "expected"),
    [
        (["--perfguard"], [H100, H100], 2),
        (["--perfguard"], [H100, L4, H100, L4], 2),
        (["--perfguard-against", "HEAD"], [H100] * 4, 4),
        (["--perfguard", "--perfguard-device", "cuda:1"], [H100, H100], 1),
        (["--perfguard", "--perfguard-device", "cpu"], [H100, H100], None),
        (["--perfguard"], [], None),
        ([], [H100, H100], None),  # correctness alone: xdist's own count (one per CPU)
    ],
)
def test_n_auto_starts_one_worker_per_timing_gpu(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: list[str], names: list[str], expected: int | None
) -> None:
    monkeypatch.setattr(xd, "gpu_names", lambda: names)
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    config = pytester.parseconfig(*args)
    assert xd.auto_workers(config) == expected
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert xd.auto_workers(config) is None  # the user's count wins


@pytest.mark.parametrize(
    ("worker", "enabled", "expected"), [("gw0", True, 0), ("gw1", True, 2), ("gw2", True, 0), ("gw1", False, 1)]
)
def test_worker_n_takes_the_nth_gpu_of_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, worker: str, enabled: bool, expected: int
) -> None:
    monkeypatch.setattr(xd, "gpu_names", lambda: [H100, L4, H100])
    config = pytester.parseconfig()
    config.workerinput = {"workerid": worker}  # type: ignore[attr-defined]
    assert xd.worker_gpu(config, enabled=enabled) == f"cuda:{expected}"


def test_a_worker_takes_the_gpu_the_controller_gave_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(xd, "gpu_names", lambda: [H100, H100])
    config = pytester.parseconfig()
    config.workerinput = {"workerid": "gw2", xd.GPU_KEY: 1}  # type: ignore[attr-defined]
    assert xd.worker_gpu(config, enabled=True) == "cuda:1"


def test_the_replacement_of_a_crashed_worker_takes_its_gpu() -> None:
    shares = xd.GpuShares([0, 2])
    assert [shares.take(f"gw{i}") for i in range(4)] == [0, 2, 0, 2]
    shares.release("gw1")  # gw1 (on cuda:2) crashed; xdist starts gw4
    assert shares.take("gw4") == 2
    assert xd.GpuShares([]).take("gw0") is None


@pytest.mark.parametrize(
    ("dist", "workers", "gpus", "expected"),
    [
        ("load", 2, [0, 2], ["cuda:0", "cuda:2"]),  # two H100s beside an L4
        ("load", 4, [0, 1], ["cuda:0", "cuda:1"]),  # two workers take turns on each
        ("load", 1, [0, 1], []),  # one worker times on one GPU: the update keeps to it
        ("load", 2, [], []),  # no GPU to spread over (a CPU run, or a run pinned with --perfguard-device)
        ("no", 0, [0, 1], []),  # -n 0
    ],
)
def test_an_updates_further_processes_spread_over_the_gpus_its_workers_timed_on(
    pytester: pytest.Pytester, dist: str, workers: int, gpus: list[int], expected: list[str]
) -> None:
    config = pytester.parseconfig()
    config.option.dist, config.option.numprocesses = dist, workers

    class Controller:
        shares = xd.GpuShares(gpus)

    assert xd.update_devices(config) == []  # no controller: a worker, or no xdist
    config.pluginmanager.register(Controller(), xd.CONTROLLER)
    assert xd.update_devices(config) == expected


def test_an_updates_cases_are_split_over_its_gpus_by_their_time_in_the_given_order() -> None:
    order = ["a", "b", "c", "d", "e"]
    weights = {"a": 1.0, "b": 10.0, "c": 2.0, "d": 3.0, "e": 4.0}
    # b alone (10 s) against a, c, d, e (10 s), each part in the order given
    assert split_cases(order, weights, ["cuda:0", "cuda:1"]) == [("cuda:0", ["b"]), ("cuda:1", ["a", "c", "d", "e"])]
    assert split_cases(order[::-1], {}, ["cuda:0", "cuda:1"]) == [("cuda:0", ["e", "c", "a"]), ("cuda:1", ["d", "b"])]
    assert split_cases(order, weights, ["cuda:0"]) == [(None, order)]  # one GPU: one process, the run's device
    assert split_cases(["a"], weights, ["cuda:0", "cuda:1"]) == [("cuda:0", ["a"])]
    assert split_cases(["a", "b"], weights, ["cuda:0", "cuda:1", "cuda:2"]) == [("cuda:0", ["b"]), ("cuda:1", ["a"])]


def test_an_updates_cases_go_first_to_the_gpus_they_were_not_measured_on() -> None:
    """A case whose processes all ran on one GPU of a host is judged on the other one too, where GPUs of one
    model read apart by more than its stored spread (verdict._unseen_device): each goes first to a GPU it has
    not been on, the least loaded of those, then by load alone once it has been on every one."""
    order, weights, devices, names = ["a", "b", "c", "d"], {"a": 4.0}, ["cuda:0", "cuda:1"], ["G0", "G1"]
    seen = {"a": {"G0"}, "b": {"G0"}, "c": {"G0"}, "d": {"G1"}}
    assert split_cases(order, weights, devices, seen, names) == [("cuda:0", ["d"]), ("cuda:1", ["a", "b", "c"])]
    both = {c: {"G0", "G1"} for c in order}  # on both already: by load, as without `seen`
    assert split_cases(order, weights, devices, both, names) == split_cases(order, weights, devices)
    assert split_cases(["a"], weights, devices, {"a": {"G0"}}, names) == [("cuda:1", ["a"])]


def test_an_updates_processes_on_two_gpus_measure_every_case_on_both_and_store_where_each_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stored samples name the GPU each process timed the case on (its record's), not the controller's;
    and three processes on a two-GPU host put every case on both GPUs, wherever the first one ran it. Before,
    every sample named one GPU and a case's further processes went to the same GPU each round: a guard on the
    other GPU judged it on a GPU the baseline "never ran on" and left it unverified, failing CI."""
    from pytest_perfguard.record import CaseRecord, Outcome
    from pytest_perfguard.run import update as upd
    from pytest_perfguard.run.state import RunSummary, SessionState
    from pytest_perfguard.settings import Settings

    monkeypatch.setattr(upd, "gpu_id", lambda device: "GPU-" + device.partition(":")[2])

    made = iter(range(1000))

    def timed(case_id: str, device: str) -> CaseRecord:
        t = 1000.0 + next(made) % 3  # processes that agree, as quiet ones do
        return CaseRecord(
            id=case_id, outcome=Outcome.PASSED, median_ns=t, ci_ns=(t - 5, t + 5), ci_rel=0.005, device=device
        )

    runs: list[tuple[str, list[str]]] = []

    def fresh_cases(ids: list[str], settings: Settings) -> object:
        runs.append((settings.device, ids))
        return lambda: {c: timed(c, "GPU-" + settings.device.partition(":")[2]) for c in ids}

    state = SessionState(settings=Settings(update=True, update_processes=3, ab_offset_fit=False))
    state.fresh_cases, state.fresh_devices = fresh_cases, ["cuda:0", "cuda:1"]  # type: ignore[assignment]
    first = [timed(f"t::c{i}", "GPU-0" if i < 3 else "GPU-1") for i in range(4)]  # the workers' first process
    got = upd.process_samples(state, first, RunSummary())
    assert got is not None and got[1] == {}
    samples = got[0]
    on = {c: [x.device for x in s] for c, s in samples.items()}
    # the second process on the GPU the first was not on; the third by load, each case on both GPUs by then
    assert {c: d[:2] for c, d in on.items()} == {
        "t::c0": ["GPU-0", "GPU-1"],
        "t::c1": ["GPU-0", "GPU-1"],
        "t::c2": ["GPU-0", "GPU-1"],
        "t::c3": ["GPU-1", "GPU-0"],
    }, runs
    assert all(len(d) == 3 for d in on.values()), on
    assert len(runs) == 4  # two rounds, two GPUs each


@pytest.mark.slow
def test_n_auto_under_perfguard_starts_as_many_workers_as_timing_gpus(flagged: pytest.Pytester) -> None:
    """xdist asks the plugin for `-n auto`'s count: two H100s beside an L4 give two workers (on this CPU host
    the cases then run on the CPU)."""
    conftest = flagged.path / "conftest.py"
    conftest.write_text(
        conftest.read_text()
        + "\nimport pytest_perfguard.run.xdist as xd\nxd.gpu_names = lambda: ['H100', 'L4', 'H100']\n"
    )
    result = run(flagged, ["-n", "auto"], "--perfguard", "-k", "fast")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["created: 2/2 workers"])


def test_the_device_lock_is_named_after_the_gpus_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes that number one GPU differently (CUDA_VISIBLE_DEVICES) take one lock for it."""
    import torch

    from pytest_perfguard.measure import device, visible

    class Props:
        name = "NVIDIA H100 80GB HBM3"
        uuid = "58d5c8a0-1b2c-4d5e-8f90-a1b2c3d4e5f6"

    device.lock_name.cache_clear()
    visible.cuda_gpus.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props())
    try:
        assert device.lock_name("cuda:1") == "gpu-58d5c8a0-1b2c-4d5e-8f90-a1b2c3d4e5f6"
        assert device.lock_name("cpu") == "cpu"
    finally:
        device.lock_name.cache_clear()
        visible.cuda_gpus.cache_clear()
