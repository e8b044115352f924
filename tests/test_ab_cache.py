"""The A/B gate's cache of base trees on a hostile or messy machine (issue 27, findings 1 and 2): a tree
changed on disk is extracted again, the folder is owner-only, the archive is streamed, a symlink may not
point out of the tree, killed extractions are swept and unused trees evicted."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from pytest_perfguard import locks
from pytest_perfguard.run import basetree


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "t@example.com")
    _git(root, "config", "user.name", "t")
    (root / "kern.py").write_text("def kern(x):\n    return x\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "base")
    return root


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(basetree.CACHE_DIR_ENV, str(folder))
    return folder


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def test_a_tampered_tree_is_extracted_again_and_said(repo: Path, cache: Path) -> None:
    sha = _git(repo, "rev-parse", "HEAD")
    tree = basetree.materialise(repo, sha)
    assert (tree / "kern.py").read_text() == "def kern(x):\n    return x\n"
    assert basetree.materialise(repo, sha) == tree  # unchanged: reused
    with (tree / "kern.py").open("a") as handle:
        handle.write("import time; time.sleep(4)\n")  # one job slows down every later job's base
    said: list[str] = []
    assert basetree.materialise(repo, sha, say=said.append) == tree
    assert (tree / "kern.py").read_text() == "def kern(x):\n    return x\n"
    assert len(said) == 1 and "kern.py, which differs from git's" in said[0] and "extracted again" in said[0]
    (tree / "extra.py").write_text("")  # an added file is a change too
    basetree.materialise(repo, sha, say=said.append)
    assert not (tree / "extra.py").exists() and "extra.py, which is not in git's tree" in said[1]
    (tree / "pkg" / "__init__.py").unlink()
    basetree.materialise(repo, sha, say=said.append)
    assert (tree / "pkg" / "__init__.py").exists() and "lacks pkg/__init__.py" in said[2]


def test_a_rewritten_manifest_does_not_hide_a_change(repo: Path, cache: Path) -> None:
    """Whoever can edit the tree can edit the manifest beside it: the reference is git's tree itself."""
    sha = _git(repo, "rev-parse", "HEAD")
    tree = basetree.materialise(repo, sha)
    (tree / "kern.py").write_text("def kern(x):\n    return x * 0\n")
    manifest = cache / "base" / f"{sha}.manifest.json"
    doc = json.loads(manifest.read_text())
    doc["digest"] = basetree.tree_digest(tree)[0]
    manifest.write_text(json.dumps(doc))
    said: list[str] = []
    basetree.materialise(repo, sha, say=said.append)
    assert (tree / "kern.py").read_text() == "def kern(x):\n    return x\n" and said


def test_a_tree_that_git_archive_rewrites_is_checked_by_its_manifest(repo: Path) -> None:
    """export-subst makes the archive differ from git's blobs: such a tree is reused as long as it matches
    the hash taken at extraction, and extracted again when it does not."""
    (repo / ".gitattributes").write_text("version.py export-subst\n")
    (repo / "version.py").write_text('COMMIT = "$Format:%H$"\n')
    sha = _commit(repo, "export-subst")
    tree = basetree.materialise(repo, sha)
    assert sha in (tree / "version.py").read_text()
    said: list[str] = []
    basetree.materialise(repo, sha, say=said.append)
    assert said == []  # reused, not extracted on every run
    (tree / "version.py").write_text('COMMIT = "forged"\n')
    basetree.materialise(repo, sha, say=said.append)
    assert sha in (tree / "version.py").read_text() and "does not match its manifest" in said[0]


def test_a_manifest_of_another_tree_is_not_trusted(repo: Path, cache: Path) -> None:
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "kern.py").write_text("def kern(x):\n    return x + 1\n")
    second = _commit(repo, "second")
    basetree.materialise(repo, first)
    basetree.materialise(repo, second)
    base = cache / "base"
    # swap the trees with their manifests: each manifest matches its tree, but not the commit's git tree
    os.rename(base / first, base / "x")
    os.rename(base / second, base / first)
    os.rename(base / "x", base / second)
    os.rename(base / f"{first}.manifest.json", base / "x")
    os.rename(base / f"{second}.manifest.json", base / f"{first}.manifest.json")
    os.rename(base / "x", base / f"{second}.manifest.json")
    said: list[str] = []
    tree = basetree.materialise(repo, first, say=said.append)
    assert (tree / "kern.py").read_text() == "def kern(x):\n    return x\n"
    assert "manifest of another tree" in said[0]


def test_the_cache_folder_is_owner_only(
    repo: Path, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sha = _git(repo, "rev-parse", "HEAD")
    basetree.materialise(repo, sha)
    assert stat.S_IMODE((cache / "base").stat().st_mode) == 0o700
    (cache / "base").chmod(0o777)  # ours, too open: tightened
    basetree.materialise(repo, sha)
    assert stat.S_IMODE((cache / "base").stat().st_mode) == 0o700
    monkeypatch.delenv(basetree.CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    basetree.materialise(repo, sha)
    assert stat.S_IMODE((tmp_path / "xdg" / "pytest-perfguard").stat().st_mode) == 0o700
    monkeypatch.setattr(locks, "uid", lambda: os.getuid() + 1)  # now it belongs to "someone else"
    with pytest.raises(pytest.UsageError, match=r"cache folder .* belongs to another user.*PERFGUARD_CACHE_DIR"):
        basetree.materialise(repo, sha)


def test_a_planted_base_folder_is_refused(repo: Path, cache: Path, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    cache.mkdir()
    (cache / "base").symlink_to(theirs)
    with pytest.raises(pytest.UsageError, match="is a symlink or not a folder"):
        basetree.materialise(repo, _git(repo, "rev-parse", "HEAD"))
    assert not any(theirs.iterdir())


def test_a_symlink_inside_the_tree_is_recreated(repo: Path) -> None:
    (repo / "alias.py").symlink_to("kern.py")
    (repo / "pkg" / "up").symlink_to("../kern.py")
    sha = _commit(repo, "links")
    tree = basetree.materialise(repo, sha)
    assert os.readlink(tree / "alias.py") == "kern.py"
    assert (tree / "pkg" / "up").read_text().startswith("def kern")
    assert basetree.materialise(repo, sha) == tree  # the links are part of the manifest, and still match


@pytest.mark.parametrize("target", ["/etc/passwd", "../../outside", "pkg/../../x"])
def test_a_symlink_out_of_the_tree_names_the_cause(repo: Path, target: str) -> None:
    (repo / "data").symlink_to(target)
    sha = _commit(repo, "bad link")
    with pytest.raises(pytest.UsageError) as info:
        basetree.materialise(repo, sha)
    message = str(info.value)
    assert f"symlink data -> {target} points outside the tree" in message
    assert "writable" not in message


def test_git_archive_streams_to_disk(repo: Path) -> None:
    big = 48 << 20
    with (repo / "weights.bin").open("wb") as handle:
        handle.truncate(big)
    sha = _commit(repo, "a big file")
    tracemalloc.start()
    try:
        tree = basetree.materialise(repo, sha)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (tree / "weights.bin").stat().st_size == big
    assert peak < big // 4, f"peak {peak / 2**20:.1f} MiB of Python memory for a {big >> 20} MiB file"


def test_stale_temp_trees_are_swept(repo: Path, cache: Path) -> None:
    sha = _git(repo, "rev-parse", "HEAD")
    base = cache / "base"
    base.mkdir(parents=True, mode=0o700)
    stale = base / f".{sha}.abc123.tmp"
    (stale / "deep").mkdir(parents=True)
    (stale / "deep" / "half.bin").write_bytes(b"x" * 1000)
    other = base / f".{'e' * 40}.zz.tmp"  # a killed extraction of another revision
    other.mkdir()
    basetree.materialise(repo, sha)
    assert not stale.exists() and not other.exists()


def test_an_extraction_under_way_is_not_swept_by_a_process_with_another_temp_dir(
    repo: Path, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs share the cache folder but not their temp dir (where the per-user lock folder lives): the
    tree's lock is in the cache folder, so the second job sees the first one's extraction as running."""
    sha = _git(repo, "rev-parse", "HEAD")
    base = cache / "base"
    base.mkdir(parents=True, mode=0o700)
    running = base / f".{sha}.abc123.tmp"
    running.mkdir()
    monkeypatch.setenv(locks.LOCK_DIR_ENV, str(tmp_path / "job1"))
    with basetree._tree_lock(base, sha, timeout=0):  # job 1 extracts (a second open file: flock sees another holder)
        monkeypatch.setenv(locks.LOCK_DIR_ENV, str(tmp_path / "job2"))
        assert basetree.sweep_temp_trees(base) == []
        assert running.exists()
    assert basetree.sweep_temp_trees(base) == [running]  # once no one holds it, it is a killed extraction's


def test_unused_trees_are_evicted(repo: Path, cache: Path) -> None:
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "kern.py").write_text("def kern(x):\n    return 2 * x\n")
    second = _commit(repo, "second")
    basetree.materialise(repo, first)
    old = time.time() - 40 * 86400
    os.utime(cache / "base" / f"{first}.manifest.json", (old, old))
    basetree.materialise(repo, second, keep_days=0)  # 0: never evict
    assert (cache / "base" / first).is_dir()
    basetree.materialise(repo, second, keep_days=30)
    assert not (cache / "base" / first).exists()
    assert not (cache / "base" / f"{first}.manifest.json").exists()
    assert (cache / "base" / second).is_dir()


def test_what_git_writes_after_the_archive_end_is_read_not_cut(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tar reader stops at the archive's end marker; git may still be writing its record padding then. The
    pipe was closed at once, git died of SIGPIPE with nothing on stderr, and a whole base tree read as "git
    archive failed" (the README's quick start under CI's load, 2026-11-28). Here the padding comes late."""
    sha = _git(repo, "rev-parse", "HEAD")
    archive = tmp_path / "a.tar"
    archive.write_bytes(subprocess.run(["git", "archive", "--format=tar", sha], cwd=repo, capture_output=True).stdout)
    real = subprocess.Popen

    def late_padding(args: Any, *rest: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        if list(args[:2]) == ["git", "archive"]:
            args = ["sh", "-c", f"cat '{archive}'; sleep 0.3; head -c 65536 /dev/zero"]
        return real(args, *rest, **kwargs)

    monkeypatch.setattr(basetree.subprocess, "Popen", late_padding)
    tree = basetree.materialise(repo, sha)
    assert (tree / "kern.py").read_text() == "def kern(x):\n    return x\n"
