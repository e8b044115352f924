"""The `perfguard_runner` fixture's value: the item's case run by its runner (runner.py), then the item
ended as the runner decided (ending.py). The pytest outcome is made here and in confirm.Batch, never in
the runner's steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..marker import PerfCase
from .ending import end_item
from .runner import Runner


class ItemRun:
    """Runs the item's case and ends the item as its runner decided."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def run(self, case: PerfCase, variant_name: str, factory: Callable[[], Any], params: dict[str, Any]) -> None:
        __tracebackhide__ = True
        ending = self.runner.run(case, variant_name, factory, params)
        if ending is not None:  # else its regression waits for the batch confirmation, which ends it
            end_item(ending)
