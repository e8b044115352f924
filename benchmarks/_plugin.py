"""How the benchmark scripts load the plugin into the pytest runs they start."""

from __future__ import annotations

from importlib.metadata import entry_points


def plugin_args() -> list[str]:
    """Load the plugin by module name where it is not installed (a checkout on PYTHONPATH, as on a GPU host
    without the package): pytest finds an installed one through its entry point, and loading it twice fails."""
    installed = any(ep.name == "perfguard" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "pytest_perfguard.plugin"]


if __name__ == "__main__":  # for benchmarks/_suite.sh: the arguments on one line (empty when installed)
    print(" ".join(plugin_args()))
