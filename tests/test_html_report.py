"""The HTML report in a real browser: headless Chromium loads it from disk, with no network, draws the
plots, logs nothing to the console, and leaves a screenshot for a person to look at.

Why a browser: the report is JavaScript (plotly.js) fed JSON that Python wrote; only running it shows
that the figures draw. Chromium comes from the system's package manager (.ci/run installs it in CI). The
test skips where it is absent, except under CI=true, where a missing browser is a failure.
"""

from __future__ import annotations

import json
import lzma
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_perfguard.report.view import build

DATA = Path(__file__).resolve().parent / "data" / "h200_planted_results.json.xz"
BROWSER = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
TIMEOUT_S = 180


def _browser() -> str:
    if BROWSER is None:
        message = "chromium is not installed (apt-get install chromium); .ci/run installs it"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    return BROWSER


def _chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless, sandbox off (CI runs as root), no GPU, no network chatter, a fresh profile; console
    messages go to stderr as CONSOLE lines."""
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=20000",
        *args,
    ]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"chromium did not finish in {TIMEOUT_S}s: {' '.join(cmd)}")


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "CONSOLE(" in line]


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    browser = _browser()
    pytest.importorskip("plotly", reason="the HTML report needs pytest-perfguard[report]")
    from pytest_perfguard.report.html import OPEN_FIGURES, write_html

    doc = json.loads(lzma.decompress(DATA.read_bytes()).decode())
    page = tmp_path / "report.html"
    write_html(page, doc)
    report = build(doc)
    # drawn at load: the grid and gates figures of each test, and the first failing cases' figures
    expected = 2 * len(report.tests()) + min(OPEN_FIGURES, len(report.attention()))

    dom = _chromium(browser, tmp_path / "profile-dom", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-4000:]
    console = _console(dom.stderr)
    assert not console, "console messages while loading the report:\n" + "\n".join(console)
    drawn = re.search(r'data-plots-drawn="(\d+)"', dom.stdout)
    assert drawn is not None, "the page's script drew no plot (no data-plots-drawn on <body>)"
    assert int(drawn.group(1)) == expected
    assert dom.stdout.count('class="main-svg"') >= expected, "plotly did not render its SVG layers"

    shot = Path(os.environ.get("PERFGUARD_REPORT_SCREENSHOT") or tmp_path / "report.png")
    shot.parent.mkdir(parents=True, exist_ok=True)
    taken = _chromium(
        browser, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1400,2000", page.as_uri()
    )
    assert taken.returncode == 0, taken.stderr[-4000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"no PNG screenshot at {shot}"
    # A blank page compresses to a few kB; figures, text and colour chips do not.
    assert shot.stat().st_size > 50_000, f"{shot} looks blank ({shot.stat().st_size} bytes)"
    print(f"screenshot: {shot}")
