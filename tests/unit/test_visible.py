"""The controller's view of the host's GPUs without torch (measure/visible.py): torch's build read from its
files, the driver asked where torch is not imported, torch asked where it is."""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
from pathlib import Path

import pytest

from pytest_perfguard.measure import visible


def _fake_torch(tmp_path: Path, version_py: str | None) -> importlib.machinery.ModuleSpec:
    package = tmp_path / "torch"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('this fake torch must not be imported')\n")
    if version_py is not None:
        (package / "version.py").write_text(version_py)
    spec = importlib.machinery.ModuleSpec("torch", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    return spec


@pytest.mark.parametrize(
    ("version_py", "built"),
    [
        ("__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n", True),
        ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n", False),
        ("cuda = '12.1'\n", True),  # older files carry no annotation
        ("__version__ = '9.0'\n", None),  # nothing said: ask torch itself
        (None, None),  # no such file
    ],
)
def test_torchs_cuda_build_is_read_from_its_version_file_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version_py: str | None, built: bool | None
) -> None:
    spec = _fake_torch(tmp_path, version_py)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "torch" else None)
    assert visible.torch_cuda_build() is built


def test_no_torch_installed_means_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert visible.torch_cuda_build() is False


def test_without_a_driver_library_the_driver_cannot_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """None, not "no GPU": where the library has another name (not Linux), torch must answer instead."""

    def missing(name: str) -> ctypes.CDLL:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert visible._driver_gpus() is None


@pytest.mark.parametrize(("status", "expected"), [(visible.CUDA_ERROR_NO_DEVICE, ()), (999, None)])
def test_a_driver_that_finds_no_device_lists_none_and_one_that_fails_cannot_answer(
    monkeypatch: pytest.MonkeyPatch, status: int, expected: tuple[visible.Gpu, ...] | None
) -> None:
    class Driver:
        def cuInit(self, flags: int) -> int:
            return status

    monkeypatch.setattr(ctypes, "CDLL", lambda name: Driver())
    assert visible._driver_gpus() == expected


def test_where_torch_is_imported_it_answers_and_the_driver_is_not_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    class Props:
        def __init__(self, index: int) -> None:
            self.name = "NVIDIA H100 80GB HBM3"
            self.uuid = f"GPU-58d5c8a0-1b2c-4d5e-8f90-a1b2c3d4e5f{index}"

    def asked() -> tuple[visible.Gpu, ...]:
        raise AssertionError("the driver was asked")

    monkeypatch.setattr(visible, "_driver_gpus", asked)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", Props)
    visible.cuda_gpus.cache_clear()
    try:
        assert visible.cuda_gpus() == (
            visible.Gpu("NVIDIA H100 80GB HBM3", "GPU-58d5c8a0-1b2c-4d5e-8f90-a1b2c3d4e5f0"),
            visible.Gpu("NVIDIA H100 80GB HBM3", "GPU-58d5c8a0-1b2c-4d5e-8f90-a1b2c3d4e5f1"),
        )
        assert visible.gpu_names() == ["NVIDIA H100 80GB HBM3"] * 2
    finally:
        visible.cuda_gpus.cache_clear()
