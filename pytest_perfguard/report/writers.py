"""Every file a run can be written as, in one table that the plugin and `perfguard report` both loop over.

A format is one `Writer` in `WRITERS`: what messages call it, the function that writes it, what it needs
installed, and which front end names its file. The plugin writes the formats that have a setting (its
`--perfguard-<setting>` option, environment variable and ini key come from that setting's entry in
settings.py); `perfguard report` writes the formats that have a flag. The Markdown summary that the plugin
appends to GitHub's job summary is not in the table: its place is the job's, not a file the user names.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..settings import Settings
from . import html
from .markdown import markdown_summary, write_markdown
from .results import write_results

Document = Mapping[str, Any]


@dataclass(frozen=True)
class Writer:
    """One format. Its words are the ones the messages print: "perfguard: HTML report written to r.html"."""

    name: str  # the key in WRITERS, and the `perfguard report` option's dest
    title: str  # what the messages call the file
    write: Callable[[Path, Document], None]
    failed: str  # the plugin's error before ": why", with {path}
    setting: str = ""  # the plugin's setting that names the file (settings.py); "": the plugin writes none
    flag: str = ""  # the `perfguard report` option that names the file; "": the command writes none
    flag_help: str = ""
    stdout: Callable[[Document], str] | None = None  # what `<flag> -` prints; None: "-" is a file name
    then: str = ""  # what `perfguard report` tells the reader to do with the file
    needs: str | None = None  # a module of an optional extra, imported only when the file is written
    install: str = ""  # how to get `needs`

    def missing(self) -> str | None:
        """What the format needs that is not installed, and how to install it; checked before a run, so that
        a long guard run does not end without the report it was asked for."""
        if self.needs is None or importlib.util.find_spec(self.needs) is not None:
            return None
        return f"needs {self.needs}: {self.install}"


# The order is the order of the `perfguard report` options and of the plugin's messages.
WRITERS: Mapping[str, Writer] = {
    w.name: w
    for w in (
        Writer(
            "results",
            "results",
            write_results,
            failed="could not write results to {path}",
            setting="json",
        ),
        Writer(
            "html",
            "HTML report",
            html.write_html,
            failed="could not write the HTML report {path}",
            setting="html",
            flag="--html",
            flag_help="HTML report, with plotly.js in a file beside it (needs pytest-perfguard[report])",
            then="open it in a browser",
            needs=html.NEEDS,
            install=html.INSTALL,
        ),
        Writer(
            "markdown",
            "Markdown summary",
            write_markdown,
            failed="could not write the Markdown summary {path}",
            flag="--markdown",
            flag_help="Markdown summary, as in the job summary (- for stdout)",
            stdout=markdown_summary,
        ),
    )
}

# The settings that name an output file: the plugin resolves them once and hands them to its xdist workers,
# and a fresh confirmation process gets them emptied (it writes its own results file, and nothing else).
PATH_SETTINGS: tuple[str, ...] = tuple(w.setting for w in WRITERS.values() if w.setting)


def asked(settings: Settings) -> list[tuple[Writer, Path]]:
    """The files these settings ask the plugin to write, each with its writer, in the table's order."""
    out = []
    for writer in WRITERS.values():
        path = getattr(settings, writer.setting) if writer.setting else None
        if path is not None:
            out.append((writer, Path(path)))
    return out


def flagged() -> list[Writer]:
    """The formats `perfguard report` writes, one option each, in the table's order."""
    return [w for w in WRITERS.values() if w.flag]
