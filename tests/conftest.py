"""Shared test setup."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _not_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs these tests start are local runs unless a test says otherwise: under CI, a guard run that
    compared nothing fails (session.under_ci), and the CI machine running this suite sets CI=true."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
