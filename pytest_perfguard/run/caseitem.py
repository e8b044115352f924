"""The pytest item a perf case runs as, as the case's steps see it: a value the adapter makes once from the
item (plugin.py's fixture), so that no step reads pytest's node (its callspec, its class, its original name).
The session's config travels with it: a confirmation starts its fresh processes from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from ..marker import VARIANT_ARG
from ..record import Param


@dataclass(frozen=True)
class CaseItem:
    nodeid: str
    name: str  # with its parameters: "test_attn[fast-8]"
    test: str  # the test function's own name: "test_attn"
    path: Path  # the test's file
    class_name: str | None  # the class it is defined in, for a test method
    location: tuple[str, int | None, str]
    params: dict[str, Param]  # its parameters as the record shows them (display_params)
    config: pytest.Config

    @classmethod
    def of(cls, item: pytest.Item) -> CaseItem:
        owner = getattr(item, "cls", None)
        return cls(
            nodeid=item.nodeid,
            name=item.name,
            test=getattr(item, "originalname", item.name),
            path=Path(str(item.path)),
            class_name=owner.__name__ if owner is not None else None,
            location=item.location,
            params=display_params(item),
            config=item.config,
        )


def display_params(item: pytest.Item) -> dict[str, Param]:
    """The item's parameters as the record shows them: plain values, anything else by its repr."""
    callspec = getattr(item, "callspec", None)
    raw = dict(callspec.params) if callspec is not None else {}
    raw.pop(VARIANT_ARG, None)
    return {k: v if isinstance(v, int | float | str | bool) or v is None else repr(v) for k, v in raw.items()}
