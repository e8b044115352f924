"""How a perf item ends: the runner (runner.py) decides it as an `Ending`; `end_item` alone turns that into
pytest's outcome of the item, in its call phase (item.py) or, for a regression the batch confirmation
settled, in place of it (confirm.Batch)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Ending:
    """The variant's own exception (the item fails with its traceback), a failure's message, a skip's
    reason, or none of them (the item passes)."""

    raised: BaseException | None = None
    failure: str | None = None
    skipped: str | None = None


def end_item(ending: Ending) -> None:
    """The runner's decision as the item's outcome: raise the variant's exception, fail, skip, or pass."""
    __tracebackhide__ = True
    if ending.raised is not None:
        raise ending.raised
    if ending.failure is not None:
        pytest.fail(ending.failure, pytrace=False)
    if ending.skipped is not None:
        pytest.skip(ending.skipped)
