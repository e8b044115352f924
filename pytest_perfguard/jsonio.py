"""Strict JSON files: one loader, one serialisation, one atomic writer, for baselines and results alike.

Strict means what a reviewer sees in a diff is exactly what is used: UTF-8, no merge-conflict markers, no
duplicate keys, no NaN or Infinity, no numbers that overflow. Writes go to a temp file in the same folder and
replace the target atomically. The validators raise `Invalid`; the caller adds the file and the record.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import math
import os
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

from .locks import LOCK_DIR_ENV, LockError, LockTimeout, file_lock, lock_dir

LOCK_TIMEOUT_S = 60.0
_CONFLICT_PREFIXES = ("<<<<<<<", "=======", ">>>>>>>", "|||||||")


class JSONFileError(Exception):
    """A perfguard JSON file (baseline or results) that cannot be used; the message says which and why."""


def restore_hint(path: Path) -> str:
    return f"restore it from git (git checkout -- {path}) or delete it and record a new baseline"


# --------------------------------------------------------------------------------------------- strict JSON


class _BadJSON(Exception):
    """Raised from inside the json hooks; turned into a file error with the path by the caller."""

    def __init__(self, problem: str, needle: str) -> None:
        super().__init__(problem)
        self.needle = needle  # text to look for, to tell the user the line


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _BadJSON(f"duplicate key {json.dumps(key)}", json.dumps(key))
        out[key] = value
    return out


def _reject_constant(name: str) -> NoReturn:
    raise _BadJSON(f"non-finite number literal {name} (JSON has no NaN or Infinity)", name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadJSON(f"number {text} overflows to infinity", text)
    return value


def _line_of(text: str, needle: str) -> int | None:
    """Line (1-based) of the last occurrence, where a duplicate or bad literal most likely sits."""
    at = text.rfind(needle)
    return None if at < 0 else text.count("\n", 0, at) + 1


def load_json_text(path: Path, error: type[JSONFileError], what: str) -> tuple[Any, bool]:
    """Read ``path`` as strict JSON; return (object, True), or (None, False) when the file does not exist.

    Strict means: UTF-8, no git conflict markers, no duplicate keys, no NaN/Infinity, no numbers that
    overflow, so that what is stored is exactly what a reviewer sees in the diff.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, False
    except IsADirectoryError:
        raise error(f"{path}: is a folder, not a {what} file") from None
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} file ({exc.strerror or exc}); check its permissions") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not UTF-8 text (bad byte at offset {exc.start}); the file is damaged: {restore_hint(path)}"
        ) from None
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise error(f"{path}: the {what} file is empty: {restore_hint(path)}")
    for line_number, line in enumerate(text.splitlines(), start=1):
        if line.startswith(_CONFLICT_PREFIXES):
            raise error(
                f"{path}: unresolved merge conflict at line {line_number}: resolve the merge conflict "
                f"(keep one side of each conflicting case, or take either side and re-record it), "
                f"then check it with `perfguard validate {path}`"
            )
    try:
        obj = json.loads(
            text, object_pairs_hook=_pairs_hook, parse_constant=_reject_constant, parse_float=_finite_float
        )
    except _BadJSON as exc:
        line_no = _line_of(text, exc.needle)
        where = f" (near line {line_no})" if line_no else ""
        raise error(
            f"{path}: {exc}{where}; a hand edit or a bad merge left this: fix that line or {restore_hint(path)}"
        ) from None
    except json.JSONDecodeError as exc:
        # a string can hold no raw newline, so an unterminated one runs to the end of the file
        truncated = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")
        why = "the file ends early (truncated write?)" if truncated else "invalid JSON"
        raise error(f"{path}: {why} at line {exc.lineno} column {exc.colno}: {exc.msg}: {restore_hint(path)}") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply to be a {what} file: {restore_hint(path)}") from None
    except ValueError as exc:  # e.g. an integer literal longer than Python's digit limit
        raise error(f"{path}: unreadable number ({exc}): {restore_hint(path)}") from None
    return obj, True


# --------------------------------------------------------------------------------------------- validation


class Invalid(Exception):
    """A value that fails validation; the caller adds the file and case."""


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number(value: Any, name: str, *, positive: bool = False, nonneg: bool = False) -> float:
    if not is_number(value):
        raise Invalid(f"field {name!r} must be a number, got {json.dumps(value)[:60]}")
    try:
        out = float(value)
    except OverflowError:
        raise Invalid(f"field {name!r} is too large: {str(value)[:30]}...") from None
    if not math.isfinite(out):
        raise Invalid(f"field {name!r} must be finite, got {out}")
    if positive and out <= 0:
        raise Invalid(f"field {name!r} must be positive, got {out}")
    if nonneg and out < 0:
        raise Invalid(f"field {name!r} must not be negative, got {out}")
    return out


def interval(value: Any, name: str, centre: float, centre_name: str) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise Invalid(f"field {name!r} must be a list [low, high], got {json.dumps(value)[:60]}")
    lo = number(value[0], f"{name}[0]", positive=True)
    hi = number(value[1], f"{name}[1]", positive=True)
    if not lo <= centre <= hi:
        raise Invalid(f"field {name!r} = [{lo}, {hi}] must satisfy low <= {centre_name} ({centre}) <= high")
    return lo, hi


def integer(value: Any, name: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise Invalid(f"field {name!r} must be an integer, got {json.dumps(value)[:60]}")
    if value < minimum:
        raise Invalid(f"field {name!r} must be >= {minimum}, got {value}")
    return value


def string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise Invalid(f"field {name!r} must be a string, got {json.dumps(value)[:60]}")
    return value


def iso_date(value: Any, name: str) -> str:
    text = string(value, name)
    if text == "":
        return text
    try:
        ok = len(text) == 10 and datetime.date.fromisoformat(text).isoformat() == text
    except ValueError:
        ok = False
    if not ok:
        raise Invalid(f"field {name!r} must be a date YYYY-MM-DD, got {text!r}")
    return text


def check_keys(obj: dict[str, Any], allowed: tuple[str, ...], required: tuple[str, ...]) -> None:
    missing = [k for k in required if k not in obj]
    if missing:
        raise Invalid(f"missing field {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    unknown = sorted(k for k in obj if k not in allowed)
    if unknown:
        raise Invalid(f"unknown field {unknown[0]!r} (allowed: {', '.join(allowed)})")


def dumps(obj: Mapping[str, Any]) -> str:
    """The one serialisation of a perfguard JSON file: byte-identical for equal content."""
    return json.dumps(obj, sort_keys=True, indent=2, allow_nan=False) + "\n"


def fsync_dir(folder: Path) -> None:
    """Make the rename durable; not possible (nor needed) on every platform."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str, error: type[JSONFileError] = JSONFileError) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new file, never a part.

    Temp file in the same folder (same file system, so ``os.replace`` is atomic), flush, fsync, replace,
    fsync the folder. On any failure the old file is intact and the temp file is gone.
    """
    folder = path.parent
    if not folder.is_dir():
        raise error(f"{path}: folder {folder} does not exist; create it (mkdir -p {folder}) and run again")
    data = text.encode("utf-8")
    tmp = folder / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise error(
            f"{path}: cannot write in folder {folder} ({exc.strerror or exc}); make it writable "
            f"(chmod u+w {folder}), or give {path.name} a path in a folder you can write"
        ) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(OSError):
            os.chmod(tmp, path.stat().st_mode & 0o7777)  # keep the mode of the file it replaces
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise error(f"{path}: writing failed ({exc.strerror or exc}); the previous file is unchanged") from None
        raise
    fsync_dir(folder)


def lock_file(path: Path) -> Path:
    """Where the lock of a file lives: in a per-user folder outside the repository, keyed by the file's
    absolute path, so that no run (finished or crashed) ever leaves a lock file beside a tracked file."""
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    return lock_dir() / f"{path.name}.{key}.lock"


@contextlib.contextmanager
def locked(
    path: Path,
    timeout: float = LOCK_TIMEOUT_S,
    error: type[JSONFileError] = JSONFileError,
    *,
    lock_at: Path | None = None,
) -> Iterator[None]:
    """Inter-process lock on a file, so concurrent update runs (xdist, CI shards) lose nothing. The lock file
    is `lock_at` where given (beside what it guards, in a folder that processes with different temp dirs
    share), else in the per-user lock folder (lock_file)."""
    if not path.parent.is_dir():
        raise error(f"{path}: folder {path.parent} does not exist; create it (mkdir -p {path.parent}) and run again")
    try:
        where = lock_at if lock_at is not None else lock_file(path)
    except LockError as exc:
        raise error(f"{path}: {exc.strerror}") from None
    except OSError as exc:
        raise error(f"{path}: cannot create the lock folder ({exc.strerror or exc}); set {LOCK_DIR_ENV}") from None
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(file_lock(where, timeout=timeout))
        except LockTimeout:
            raise error(
                f"{path}: could not lock it within {timeout:g} s ({where}); another perfguard run is writing "
                "this file. Wait for it and run again"
            ) from None
        except LockError as exc:
            raise error(f"{path}: {exc.strerror}") from None
        except OSError as exc:
            raise error(f"{path}: cannot create the lock file {where} ({exc.strerror or exc})") from None
        yield
