"""The typed record reads and writes the recorded results files unchanged, and refuses a malformed part
with a message that names it."""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

import pytest

from pytest_perfguard.record import CaseRecord, Correctness, RecordError

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize("name", ["cpu_results.json.xz", "h200_planted_results.json.xz"])
def test_recorded_results_read_and_write_back_unchanged(name: str) -> None:
    """Every part of every recorded case (gates, confirmation, A/B, correctness) survives the typed trip."""
    records: list[dict[str, Any]] = json.loads(lzma.decompress((DATA / name).read_bytes()).decode())["results"]
    assert records
    for raw in records:
        record = CaseRecord.from_json(raw)
        assert record.correctness is None or isinstance(record.correctness, Correctness)
        assert record.to_json() == raw


def test_correctness_is_read_typed() -> None:
    raw = {
        "id": "t::a",
        "correctness": {
            "passed": True,
            "seeds": [3, 4],
            "dtype": "float16",
            "max_abs": 0.001,
            "rel_fro": 2e-4,
            "worst_index": [0, 1],
            "native_max_abs": 0.002,
            "message": "",
        },
    }
    record = CaseRecord.from_json(raw)
    assert record.correctness == Correctness(True, [3, 4], "float16", 0.001, 2e-4, [0, 1], 0.002, "")
    assert record.to_json()["correctness"] == raw["correctness"]


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ({"passed": "yes"}, "'passed' must be true or false"),
        ({"passed": True, "seeds": ["1"]}, "'seeds' must be a list of integers"),
        ({"passed": True, "max_abs": "big"}, "'max_abs' must be a number or null"),
        ({"passed": True, "worst_index": [0.5]}, "'worst_index' must be a list of integers or null"),
        ({"passed": True, "tolerance": 1}, "unknown correctness field(s) ['tolerance']"),
    ],
)
def test_a_malformed_correctness_is_refused_by_name(part: dict[str, Any], message: str) -> None:
    with pytest.raises(RecordError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        CaseRecord.from_json({"id": "t::a", "correctness": part})


def test_params_hold_plain_values_only() -> None:
    assert (
        CaseRecord.from_json({"id": "t::a", "params": {"S": 128, "dtype": "fp16", "causal": True}}).params["S"] == 128
    )
    with pytest.raises(RecordError, match="field 'params' must be an object of plain values"):
        CaseRecord.from_json({"id": "t::a", "params": {"shape": [1, 2]}})
