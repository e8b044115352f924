"""The options as a user meets them: the README's table of every option (made from settings.SPECS), and the
mistakes on a command line that pytest would report badly or not at all (a misspelled `--perfguard...`
option, a path option written with a space that moved pytest's rootdir)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path

import pytest

from .settings import SPECS


def _git_top(folder: Path) -> Path | None:
    """The top of the git work tree that holds `folder` (a `.git` folder or file), or None."""
    for candidate in (folder, *folder.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def rootdir_mistake(config: pytest.Config) -> str | None:
    """A path option written with a space (`--perfguard-json /tmp/r.json`) whose file exists: pytest picks
    its rootdir before it knows the plugin's options, so it took the path for a test path and may have
    moved the rootdir out of the project, and with it the default baseline folder and every case id."""
    args = [str(a) for a in config.invocation_params.args]
    if any(a == "--rootdir" or a.startswith("--rootdir=") for a in args):
        return None  # the user chose it
    invoked, root = Path(config.invocation_params.dir).resolve(), Path(config.rootpath).resolve()
    top = _git_top(invoked)
    inside = (root == top or top in root.parents) if top is not None else (root == invoked or root in invoked.parents)
    if inside:
        return None
    for spec in SPECS:
        if spec.kind != "path" or spec.env_only or spec.option not in args[:-1]:
            continue
        value = args[args.index(spec.option) + 1]
        path = (invoked / value).resolve()
        if path.exists() and (root == path or root in path.parents):
            project = f"this git repository ({top})" if top is not None else f"the folder pytest ran in ({invoked})"
            return (
                f"perfguard: pytest chose the rootdir {root}, outside {project}, because it read "
                f"`{spec.option} {value}` (with a space) as a test path when it picked the rootdir; the baseline "
                f"folder and the case ids would follow it. Write {spec.option}={value} (with '=') instead."
            )
    return None


def options_table() -> str:
    """The README's options table, made from SPECS."""
    rows = ["| option | env / ini | default | meaning |", "|---|---|---|---|"]
    for spec in SPECS:
        if spec.name in ("enabled", "update"):
            continue
        where = "-" if spec.cli_only else f"`{spec.env}`" if spec.env_only else f"`{spec.env}` / `{spec.ini}`"
        if spec.kind == "bool":
            default = "on" if spec.default else "off"
        elif spec.default is None:
            default = "-" if spec.env_only else "none"  # an env-only folder's help says where it is by default
        else:
            default = f"`{spec.default}`"
        help_text = ("do not " + spec.help) if spec.kind == "bool" and spec.default is True else spec.help
        option = "- (environment only)" if spec.env_only else f"`{spec.option}`"
        rows.append(f"| {option} | {where} | {default} | {help_text} |")
    return "\n".join(rows)


def misspelled(args: Sequence[str], known: Sequence[str]) -> str | None:
    """The message for the first `--perfguard...` argument that is no option, naming the nearest one (pytest
    itself says only "unrecognized arguments"), or None. Arguments after `--` are not options."""
    for arg in args:
        if arg == "--":
            return None
        name = arg.split("=", 1)[0]
        if not name.startswith("--perf") or name in known:
            continue
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        if not name.startswith("--perfguard") and not difflib.get_close_matches(name, known, n=1, cutoff=0.8):
            continue  # another plugin's --perf... option, perhaps: pytest judges it
        hint = f"did you mean {near[0]}?" if near else "pytest --help lists them under 'perfguard'"
        return f"{name}: no such option; {hint}"
    return None


if __name__ == "__main__":
    print(options_table())
