"""``dlpack verify``: any damage is exit 4 with a message naming the store and what is damaged,
never exit 3 (2 only where the path is no dlpack store at all); with ``--json`` one document always
names every damaged array."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import dlpack
from dlpack.cli import main

Capsys = pytest.CaptureFixture[str]
TREE = {f"{'ab'[k % 2]}/{k}.png": ("rgb", 6, 5) for k in range(6)}


@pytest.fixture
def out(make_tree: Callable[..., Path], tmp_path: Path, backend: str) -> Path:
    path = tmp_path / backend
    dlpack.build(make_tree(TREE), path, quiet=True, jobs=1)
    return path


def poke(store: Path, name: str, element: int, value: Any, dtype: str) -> None:
    """Overwrite one element of uncompressed array ``name`` in place, bypassing dlpack."""
    if store.is_dir():
        path, offset = next(p for p in sorted((store / name / "c").rglob("*")) if p.is_file()), 0
    else:
        with h5py.File(store, "r") as f:
            path, offset = store, int(f[name].id.get_offset())
    raw = np.asarray(value, dtype=dtype).tobytes()
    with open(path, "r+b") as f:
        f.seek(offset + element * len(raw))
        f.write(raw)


def verify_json(store: Path, capsys: Capsys) -> tuple[int, dict[str, Any], str]:
    capsys.readouterr()
    code = main(["verify", str(store), "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def test_verify_json_of_an_intact_store(out: Path, capsys: Capsys) -> None:
    code, doc, _ = verify_json(out, capsys)
    assert (code, doc) == (0, {"store": str(out), "count": 6, "ok": True, "mismatched": [], "damaged": []})


def test_verify_json_names_an_array_damaged_outside_the_images(out: Path, capsys: Capsys) -> None:
    poke(out, "transform", 1, 0.375, "<f8")
    code, doc, err = verify_json(out, capsys)
    assert code == 4 and doc["ok"] is False and doc["count"] == 6 and doc["mismatched"] == []
    assert [d["array"] for d in doc["damaged"]] == ["transform"]
    assert "checksum" in doc["damaged"][0]["reason"]
    assert "transform" in err and str(out) in err


def test_verify_json_names_both_a_damaged_array_and_a_damaged_image(out: Path, capsys: Capsys) -> None:
    with dlpack.open(out) as ds:
        before = int(ds[1]["image"][0, 0, 2])
    poke(out, "images", 6 * 5 * 3 + 2, (before + 1) % 256, "|u1")  # that byte of image 1
    poke(out, "transform", 0, 0.5, "<f8")
    code, doc, _ = verify_json(out, capsys)
    assert code == 4 and [d["array"] for d in doc["damaged"]] == ["transform"]
    assert [m["index"] for m in doc["mismatched"]] == [1]


def test_verify_json_names_the_labels_when_their_damage_keeps_the_store_from_opening(out: Path, capsys: Capsys) -> None:
    poke(out, "labels", 0, 1, "<i4")  # in range, but not what was recorded
    code, doc, err = verify_json(out, capsys)
    assert code == 4 and doc["ok"] is False and doc["count"] == 6
    assert [d["array"] for d in doc["damaged"]] == ["labels"] and "labels" in err


def test_verify_json_of_a_store_that_does_not_open(tmp_path: Path, capsys: Capsys) -> None:
    missing = tmp_path / "none.zarr"
    code, doc, err = verify_json(missing, capsys)
    assert code == 2 and doc["ok"] is False and doc["count"] is None
    assert doc["damaged"][0]["array"] is None and str(missing) in doc["damaged"][0]["reason"]


def test_verify_exits_4_for_a_dlpack_store_too_damaged_to_open(
    tmp_path: Path, make_tree: Callable[..., Path], capsys: Capsys
) -> None:
    store = tmp_path / "s.zarr"
    dlpack.build(make_tree(TREE), store, quiet=True, jobs=1)
    (store / "manifest.json").write_text("{ not json", encoding="utf-8")
    code, doc, err = verify_json(store, capsys)
    assert code == 4 and doc["ok"] is False and doc["count"] is None
    assert err.startswith("dlpack: error: ") and str(store) in err


def test_verify_exits_2_for_a_path_that_is_no_store_or_a_newer_format(
    tmp_path: Path, make_tree: Callable[..., Path], capsys: Capsys
) -> None:
    """Not damage: a mistyped path, a folder that is no store, a store only a newer dlpack reads."""
    plain = tmp_path / "plain"
    plain.mkdir()
    newer = tmp_path / "newer.zarr"
    dlpack.build(make_tree(TREE), newer, quiet=True, jobs=1)
    manifest = json.loads((newer / "manifest.json").read_text(encoding="utf-8"))
    (newer / "manifest.json").write_text(json.dumps({**manifest, "format_version": 999}), encoding="utf-8")
    for path in (tmp_path / "missing.zarr", plain, newer):
        code, doc, err = verify_json(path, capsys)
        assert (code, doc["ok"]) == (2, False), err
        assert str(path) in err and "Traceback" not in err
    assert "999" in err


def test_an_hdf5_object_header_that_h5py_cannot_open_is_exit_4(
    out: Path, backend: str, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """h5py raises KeyError (and RuntimeError, ValueError ...) for corrupt object headers."""
    if backend != "out.h5":
        pytest.skip("HDF5 only")
    real = h5py.Group.__getitem__

    def corrupt(self: Any, name: Any) -> Any:
        if name == "transform":
            raise KeyError("Unable to synchronously open object (exponent range out of bounds)")
        return real(self, name)

    monkeypatch.setattr(h5py.Group, "__getitem__", corrupt)
    code, doc, err = verify_json(out, capsys)
    assert code == 4 and [d["array"] for d in doc["damaged"]] == ["transform"]
    assert "internal error" not in err and "exponent range" in err and str(out) in err


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["s.h5", "s.zarr"])
def test_verify_of_a_store_with_flipped_bits_exits_0_2_or_4_never_3(
    make_tree: Callable[..., Path], tmp_path: Path, capsys: Capsys, fmt: str
) -> None:
    import shutil

    built = tmp_path / fmt
    dlpack.build(make_tree(TREE), built, quiet=True, jobs=1)
    files = [built] if built.is_file() else sorted(p for p in built.rglob("*") if p.is_file())
    rng = np.random.default_rng(11)
    codes = []
    for trial in range(40):
        copy = tmp_path / f"t{trial}" / fmt
        copy.parent.mkdir()
        (shutil.copy2 if built.is_file() else shutil.copytree)(built, copy)
        target = copy / files[rng.integers(len(files))].relative_to(built) if copy.is_dir() else copy
        raw = bytearray(target.read_bytes())
        for pos in rng.integers(0, len(raw), rng.integers(1, 7)):
            raw[pos] ^= 1 << int(rng.integers(8))
        target.write_bytes(bytes(raw))
        code, doc, err = verify_json(copy, capsys)
        assert code in (0, 2, 4), err  # 2: the flips left no dlpack marker to recognise the store by
        assert doc["ok"] is (code == 0) and "internal error" not in err
        codes.append(code)
    assert 4 in codes  # the flips did damage something


@pytest.mark.parametrize("cut", ["one byte", "to 30%", "the last 16 bytes"])
def test_a_dlpack_hdf5_store_cut_short_is_damage_exit_4(
    cut: str, tmp_path: Path, make_tree: Callable[..., Path], capsys: Capsys
) -> None:
    """A copy cut short (a full disk, an interrupted transfer) is damage, not "not a store"."""
    store = tmp_path / "cut.h5"
    dlpack.build(make_tree(TREE), store, quiet=True, jobs=1)
    size = store.stat().st_size
    os.truncate(store, {"one byte": size - 1, "to 30%": size * 3 // 10, "the last 16 bytes": size - 16}[cut])
    code, doc, err = verify_json(store, capsys)
    assert (code, doc["ok"], doc["count"]) == (4, False, None), err
    assert str(store) in err and "cut short" in err and str(size) in err
    with pytest.raises(dlpack.StoreDamagedError, match="cut short"):
        dlpack.open(store)


def test_a_cut_hdf5_file_that_is_not_dlpacks_is_exit_2(tmp_path: Path, capsys: Capsys) -> None:
    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:
        f.attrs["format"] = "someone else's"
        f["x"] = np.arange(4096, dtype=np.float64)
    os.truncate(plain, plain.stat().st_size - 1)
    code, doc, err = verify_json(plain, capsys)
    assert (code, doc["ok"]) == (2, False), err
    assert str(plain) in err and "not a readable HDF5 file" in err
