"""A copy of this plugin that a checkout cannot replace, for commands that run pytest in other revisions.

`perfguard bisect` checks out old revisions and `perfguard explain --against REV` runs in REV's tree. When
that tree is the plugin's own repository (or holds a ``pytest_perfguard`` folder), ``python -m pytest``
would import the plugin of that revision, which may lack the A/B gate, the bisect step or the profiling
probe, or decide differently. So the running plugin is copied once into a folder, and pytest is started
through a launcher beside the copy: the script's folder comes first on ``sys.path``, so every revision is
judged by the same plugin. The working directory follows it, as under ``python -m pytest``.

The launcher names the plugin with ``-p`` where pytest would not load it by itself: not installed (a
checkout on PYTHONPATH), or plugin autoloading off. It asks in the child, on the child's own path, because
naming it when its entry point loads it too would register it twice, which pytest refuses.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

PYTEST_LAUNCHER = "perfguard_pytest.py"

_LAUNCHER_TEXT = '''"""Runs pytest with the pinned copy of pytest_perfguard beside this file (written by perfguard)."""
import os
import sys
from importlib.metadata import entry_points

import pytest

# This file's folder, with the pinned pytest_perfguard, stays first; the working directory follows it, as
# under python -m pytest. Importing the plugin here would keep pytest from rewriting its asserts.
sys.path.insert(1, os.getcwd())

PLUGIN = "pytest_perfguard.plugin"
installed = any(ep.value.split(":")[0] == PLUGIN for ep in entry_points(group="pytest11"))
if not installed or os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
    sys.argv[1:1] = ["-p", PLUGIN]  # a checkout on PYTHONPATH: no entry point loads it

sys.exit(pytest.main())  # the arguments are sys.argv[1:]
'''


def pin(folder: Path) -> Path:
    """Copy the plugin package into `folder` (once) and return the folder; children get it on PYTHONPATH."""
    package = Path(__file__).resolve().parents[1]  # commands/ -> the package
    target = folder / package.name
    if not target.is_dir():
        shutil.copytree(package, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (folder / PYTEST_LAUNCHER).write_text(_LAUNCHER_TEXT, encoding="utf-8")
    return folder


def pytest_command(folder: Path) -> list[str]:
    """The argv prefix that starts pytest with the pinned plugin (after `pin(folder)`)."""
    return [sys.executable, str(folder / PYTEST_LAUNCHER)]


def child_env(folder: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a pinned run: the copy first on PYTHONPATH, for the processes pytest starts."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    return env
