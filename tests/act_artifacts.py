"""Stand-ins for actions/upload-artifact and actions/download-artifact in the act runs of test_workflows.py.

Why: act cannot fetch the real actions offline, and the sharded workflow needs its artifacts to travel, from
each shard to the merge job. Here an artifact is a folder of a store on this machine, named after the
artifact. The inputs the workflows use behave as the real actions (v4 and later) document them:

- upload: ``name``, ``path`` (files, folders and globs, one a line; the artifact's root is the folder
  they share, a folder's own contents for a single folder), ``if-no-files-found`` (warn, error, ignore);
  a second artifact of the same name is an error, as in one run on GitHub.
- download: ``name`` (into ``path``; an error if missing), or ``pattern`` (each matching artifact into
  ``path/NAME``, or all into ``path`` with ``merge-multiple``).

``python tests/act_artifacts.py standins FOLDER STORE`` writes the two composite actions into
FOLDER/upload-artifact and FOLDER/download-artifact, for act's ``--local-repository``; they run this file
as ``upload|download STORE`` with the inputs in ``INPUT_*`` variables.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

# The inputs each stand-in declares, with the real action's defaults, and the command it runs.
ACTIONS = {
    "actions/upload-artifact": (
        "upload",
        {"name": "artifact", "path": "", "if-no-files-found": "warn", "retention-days": "0"},
    ),
    "actions/download-artifact": ("download", {"name": "", "pattern": "", "path": ".", "merge-multiple": "false"}),
}


def write_standins(folder: Path, store: Path) -> dict[str, Path]:
    """The stand-in composite actions, one folder each, that keep artifacts in `store`: {action: folder}."""
    written = {}
    for action, (command, inputs) in ACTIONS.items():
        target = folder / action.split("/")[1]
        target.mkdir(parents=True, exist_ok=True)
        declared = "".join(
            f"  {key}:\n    description: as in {action}\n    default: {json.dumps(value)}\n"
            for key, value in inputs.items()
        )
        env = "".join(f"        INPUT_{key.upper().replace('-', '_')}: ${{{{ inputs.{key} }}}}\n" for key in inputs)
        script = shlex.quote(str(Path(__file__).resolve()))
        (target / "action.yml").write_text(
            f"name: {action} stand-in\n"
            "description: Keeps the artifact in a folder of this machine (tests/act_artifacts.py).\n"
            f"inputs:\n{declared}"
            "runs:\n  using: composite\n  steps:\n    - shell: bash\n      env:\n"
            f"{env}"
            f"      run: python {script} {command} {shlex.quote(str(store.resolve()))}\n"
        )
        written[action] = target
    return written


def _input(name: str, default: str = "") -> str:
    return os.environ.get("INPUT_" + name.upper().replace("-", "_"), "").strip() or default


def _search_root(pattern: str) -> Path:
    """The folder a path or glob searches from: its part before the first wildcard, or the file's folder."""
    if glob.has_magic(pattern):
        parts: list[str] = []
        for part in Path(pattern).parts:
            if glob.has_magic(part):
                break
            parts.append(part)
        return Path(*parts) if parts else Path(".")
    path = Path(pattern)
    return path if path.is_dir() else path.parent


def _matches(pattern: str) -> list[Path]:
    if glob.has_magic(pattern):
        return [Path(p) for p in sorted(glob.glob(pattern, recursive=True)) if Path(p).is_file()]
    path = Path(pattern)
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return [path] if path.is_file() else []


def upload(store: Path) -> int:
    name = _input("name", "artifact")
    patterns = [line.strip() for line in _input("path").splitlines() if line.strip()]
    if not patterns or any(p.startswith("!") for p in patterns):
        print(f"::error::stand-in upload-artifact: give 'path' as files, folders or globs (no exclusions): {patterns}")
        return 1
    files = [f.resolve() for p in patterns for f in _matches(p)]
    if not files:
        message = f"No files were found with the provided path: {' '.join(patterns)}. No artifacts will be uploaded."
        mode = _input("if-no-files-found", "warn")
        if mode == "error":
            print(f"::error::{message}")
            return 1
        if mode == "warn":
            print(f"::warning::{message}")
        return 0
    root = Path(os.path.commonpath([_search_root(p).resolve() for p in patterns]))
    dest = store / name
    if dest.exists():
        print(f"::error::an artifact named {name!r} was already uploaded in this run")
        return 1
    for f in files:
        target = dest / f.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    print(f"stand-in upload-artifact: {name!r} with {len(files)} file(s) from {root}")
    return 0


def download(store: Path) -> int:
    name, pattern = _input("name"), _input("pattern")
    dest = Path(_input("path", "."))
    if name:
        if not (store / name).is_dir():
            print(f"::error::Artifact not found for name: {name}")
            return 1
        shutil.copytree(store / name, dest, dirs_exist_ok=True)
        print(f"stand-in download-artifact: {name!r} into {dest}")
        return 0
    merge = _input("merge-multiple", "false") == "true"
    names = sorted(d.name for d in store.glob("*") if d.is_dir() and fnmatch.fnmatchcase(d.name, pattern or "*"))
    for found in names:
        shutil.copytree(store / found, dest if merge else dest / found, dirs_exist_ok=True)
    print(f"stand-in download-artifact: {len(names)} artifact(s) matching {pattern or '*'!r} into {dest}: {names}")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[1] == "standins":
        for action, target in write_standins(Path(argv[2]), Path(argv[3])).items():
            print(f"{action}: {target}")
        return 0
    if len(argv) != 3 or argv[1] not in ("upload", "download"):
        print("usage: act_artifacts.py standins FOLDER STORE | upload STORE | download STORE", file=sys.stderr)
        return 2
    store = Path(argv[2])
    store.mkdir(parents=True, exist_ok=True)
    return upload(store) if argv[1] == "upload" else download(store)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
