"""Lock files on a shared machine: a planted symlink is not followed and a lock folder that belongs to
someone else is refused (issue 27, finding 4)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pytest_perfguard import locks
from pytest_perfguard.jsonio import JSONFileError, lock_file, locked


@pytest.fixture
def lock_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "locks"
    root.mkdir()
    monkeypatch.setenv(locks.LOCK_DIR_ENV, str(root))
    return root


def test_a_planted_symlink_is_not_followed(tmp_path: Path, lock_root: Path) -> None:
    target = tmp_path / "dev.json"
    elsewhere = tmp_path / "elsewhere" / "victim"
    elsewhere.parent.mkdir()
    lock_file(target).symlink_to(elsewhere)
    with pytest.raises(JSONFileError, match="is a symlink; it is not followed"), locked(target):
        pass
    assert not elsewhere.exists()
    device = locks.lock_path("cuda:0")
    device.symlink_to(elsewhere)
    with pytest.raises(locks.LockError, match="symlink"), locks.device_lock("cuda:0", exclusive=True):
        pass
    assert not elsewhere.exists()


def test_the_lock_folder_is_owner_only(lock_root: Path) -> None:
    folder = locks.lock_dir()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.chmod(0o777)  # one of ours, made too open: tightened, not refused
    assert stat.S_IMODE(locks.lock_dir().stat().st_mode) == 0o700


def test_a_lock_folder_of_another_user_is_refused(
    tmp_path: Path, lock_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks.lock_dir()
    monkeypatch.setattr(locks, "uid", lambda: os.getuid() + 1)  # the folder now belongs to "someone else"
    with (
        pytest.raises(JSONFileError, match=r"belongs to another user.*set PERFGUARD_LOCK_DIR"),
        locked(tmp_path / "dev.json"),
    ):
        pass


def test_a_symlinked_lock_folder_is_refused(tmp_path: Path, lock_root: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (lock_root / f"pytest-perfguard-{os.getuid()}").symlink_to(theirs)
    with pytest.raises(locks.LockError, match="is a symlink or not a folder"):
        locks.lock_dir()


def test_a_held_lock_times_out(tmp_path: Path, lock_root: Path) -> None:
    target = tmp_path / "dev.json"
    with (
        locks.file_lock(lock_file(target)),
        pytest.raises(JSONFileError, match="could not lock it within"),
        locked(target, timeout=0.1),
    ):
        pass
