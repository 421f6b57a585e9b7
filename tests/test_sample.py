"""Tests for the built-in demo dataset generator."""

from __future__ import annotations

import pathlib

import cv2
import numpy as np
import numpy.typing as npt
import pytest

from dlpack.sample import CLASSES, main, make_sample

COUNT = 24
SIZE = 64


def _tree(root: pathlib.Path) -> dict[str, bytes]:
    """Map every file's relative POSIX path under `root` to its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _decode(path: pathlib.Path) -> npt.NDArray[np.generic]:
    """Decode an image whose path may be non-ASCII, as dlpack's readers do."""
    image = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_UNCHANGED)
    assert image is not None, f"cv2 could not decode {path}"
    return np.asarray(image)


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return make_sample(tmp_path_factory.mktemp("raw"), count=COUNT, size=SIZE, seed=0)


def test_returns_out_as_path(tmp_path: pathlib.Path) -> None:
    assert make_sample(str(tmp_path / "raw"), count=4, size=SIZE) == tmp_path / "raw"


def test_every_class_folder_exists_and_is_not_empty(sample: pathlib.Path) -> None:
    assert sorted(p.name for p in sample.iterdir()) == sorted(CLASSES)
    for cls in CLASSES:
        assert any(p.is_file() for p in (sample / cls).rglob("*")), cls


def test_writes_exactly_count_files(sample: pathlib.Path) -> None:
    assert len(_tree(sample)) == COUNT


def test_same_arguments_give_byte_identical_trees(tmp_path: pathlib.Path, sample: pathlib.Path) -> None:
    again = make_sample(tmp_path / "again", count=COUNT, size=SIZE, seed=0)
    assert _tree(again) == _tree(sample)


def test_different_seed_gives_different_files(tmp_path: pathlib.Path, sample: pathlib.Path) -> None:
    other = _tree(make_sample(tmp_path / "other", count=COUNT, size=SIZE, seed=1))
    assert len(other) == COUNT
    assert other != _tree(sample)


def test_does_not_touch_global_rng(tmp_path: pathlib.Path) -> None:
    np.random.seed(1234)
    expected = np.random.random(4)
    np.random.seed(1234)
    make_sample(tmp_path / "raw", count=8, size=SIZE)
    np.testing.assert_array_equal(np.random.random(4), expected)


def test_every_file_decodes(sample: pathlib.Path) -> None:
    for path in sorted(p for p in sample.rglob("*") if p.is_file()):
        image = _decode(path)
        assert image.dtype in (np.uint8, np.uint16), path
        assert image.ndim == 2 or image.shape[2] in (3, 4), path
        assert min(image.shape[:2]) >= SIZE // 2, path


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 7])
@pytest.mark.parametrize("count", [24, 25, 100])
def test_variants_are_guaranteed_from_24_images(tmp_path: pathlib.Path, count: int, seed: int) -> None:
    root = make_sample(tmp_path, count=count, size=32, seed=seed)
    files = [p for p in root.rglob("*") if p.is_file()]
    images = [_decode(p) for p in files]
    assert any(im.ndim == 2 and im.dtype == np.uint8 for im in images), "no 8-bit gray image"
    assert any(im.dtype == np.uint16 for im in images), "no 16-bit image"
    assert any(im.ndim == 3 and im.shape[2] == 3 for im in images), "no RGB image"
    assert any(not p.name.isascii() for p in files), "no non-ASCII name"
    assert any(" " in p.name for p in files), "no name with a space"
    assert any(len(p.relative_to(root).parts) > 2 for p in files), "no nested sub-folder"
    assert any(im.shape[:2] != (32, 32) for im in images), "no image of another size"
    assert {p.suffix for p in files} == {".png", ".jpg", ".bmp", ".tif"}


def test_sixteen_bit_images_use_the_range(sample: pathlib.Path) -> None:
    images = [_decode(p) for p in sample.rglob("*") if p.is_file()]
    deep = [im for im in images if im.dtype == np.uint16]
    assert deep
    assert all(int(im.max()) > 255 for im in deep)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"count": 0}, "count must be >= 1, got 0"),
        ({"count": -3}, "count must be >= 1, got -3"),
        ({"size": 15}, "size must be >= 16, got 15"),
        ({"seed": -1}, "seed must be >= 0, got -1"),
    ],
)
def test_bad_arguments_raise_value_error(tmp_path: pathlib.Path, kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_sample(tmp_path / "raw", **kwargs)
    assert not (tmp_path / "raw").exists()


def test_main_writes_and_reports(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "raw"
    assert main([str(out), "--count", "8", "--size", "32", "--seed", "3"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("wrote 8 images in 4 classes (")
    assert "MB" in line
    assert _tree(out) == _tree(make_sample(tmp_path / "lib", count=8, size=32, seed=3))


def test_main_rejects_bad_arguments(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "raw"), "--size", "8"]) == 2
    assert "size must be >= 16, got 8" in capsys.readouterr().err
