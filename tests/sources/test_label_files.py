"""Label files and augmentation configs that are odd but well-formed, or not files at all.

Every one ends in a clear error naming the file (exit 2), or in a per-entry error that
``--on-error skip`` skips (exit 1, the rest packed); never exit 3. A named pipe nobody writes to,
a device or an oversized file is refused at once; a pipe with a writer (``<(command)``) is read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dlpack
from dlpack._files import FileTooLargeError, NotRegularFileError, read_regular
from dlpack._json import MAX_FILE_BYTES
from dlpack.cli import main

MakeTree = Callable[..., Path]
Capsys = pytest.CaptureFixture[str]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(dlpack.__file__).parents[1]), *sys.path])}
SIZE = 8
TREE = {f"{c}/{k}.png": ("rgb", SIZE, SIZE) for k, c in enumerate("aab")}
FILES = sorted(TREE)
DEEP = "[" * 5000 + "]" * 5000


def _coco(edit: Callable[[dict[str, Any]], Any] | None = None) -> str:
    doc: dict[str, Any] = {
        "images": [{"id": k + 1, "file_name": f, "width": SIZE, "height": SIZE} for k, f in enumerate(FILES)],
        "annotations": [
            {"id": k + 1, "image_id": k + 1, "category_id": 1 + k % 2, "bbox": [1, 1, 4, 4]} for k in range(len(FILES))
        ],
        "categories": [{"id": 1, "name": "x"}, {"id": 2, "name": "y"}],
    }
    if edit is not None:
        edit(doc)
    return json.dumps(doc)


def _negative_category(doc: dict[str, Any]) -> None:
    doc["categories"].append({"id": -3, "name": "neg"})
    doc["annotations"][0].update(category_id=-3, segmentation=[[1, 1, 6, 1, 6, 6]])


def _dldataset(edit: Callable[[dict[str, Any]], Any] | None = None) -> str:
    doc: dict[str, Any] = {
        "image_dir": "../src",
        "class_names": ["x", "y"],
        "class_ids": [0, 1],
        "samples": [
            {"image_id": k, "image_file_name": f, "bbox_label_id": [0], "bbox_row1": [1.0], "bbox_col1": [1.0],
             "bbox_row2": [5.0], "bbox_col2": [5.0]}
            for k, f in enumerate(FILES)
        ],
    }  # fmt: skip
    if edit is not None:
        edit(doc)
    return json.dumps(doc)


CSV = "path,label\n" + "".join(f"{f},{f[0]}\n" for f in FILES)

#: (kind, text of the label file, expected exit code with --on-error skip, what the message says).
HOSTILE: dict[str, tuple[str, str, int, str]] = {
    "coco-nul-in-name": ("coco", _coco(lambda d: d["images"][0].update(file_name="a/0\0.png")), 1, r"a/0\x00.png"),
    "coco-lone-surrogate": ("coco", _coco(lambda d: d["images"][1].update(file_name="a/\udcfe.png")), 1, "surrogate"),
    "coco-negative-category-painted": ("coco", _coco(_negative_category), 2, "category 'neg' has id -3"),
    "coco-309-digit-box": ("coco", _coco(lambda d: d["annotations"][0].update(bbox=[1, 1, 10**309, 4])), 2, "64 bits"),
    "coco-5000-digit-id": ("coco", _coco().replace('"id": 2,', '"id": ' + "7" * 5000 + ",", 1), 2, "64 bits"),
    "coco-float-beyond-range": ("coco", _coco().replace("[1, 1, 4, 4]", "[1, 1, 4e999, 4]", 1), 2, "range of a float"),
    "coco-nan": ("coco", _coco().replace("[1, 1, 4, 4]", "[1, 1, NaN, 4]", 1), 2, "NaN"),
    "coco-deep": ("coco", _coco()[:-1] + ', "info": ' + DEEP + "}", 2, "nested more than"),
    "coco-key-twice": ("coco", _coco()[:-1] + ', "images": []}', 2, "the key 'images' appears twice"),
    "csv-nul-in-name": ("csv", CSV.replace("a/0.png", "a/0\0.png"), 1, r"line 2 of"),
    "csv-column-twice": ("csv", CSV.replace("path,label", "path,label,label"), 2, "a column named twice"),
    "dldataset-nul-in-name": ("dldataset", _dldataset(lambda d: d["samples"][0].update(image_file_name="a/\0")), 1,
                              "image_id 0"),
    "dldataset-309-digit-box": ("dldataset", _dldataset(lambda d: d["samples"][1].update(bbox_row2=[10**309])), 2,
                                "64 bits"),
    "dldataset-deep": ("dldataset", _dldataset(lambda d: d.update(samples=[])).replace("[]", DEEP), 2,
                       "nested more than"),
    "dldataset-key-twice": ("dldataset", _dldataset()[:-1] + ', "class_ids": [0, 1]}', 2,
                            "the key 'class_ids' appears twice"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_label_file_is_refused_or_skipped_never_an_internal_error(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys, case: str
) -> None:
    kind, text, want, says = HOSTILE[case]
    src = make_tree(TREE)
    label = tmp_path / "labels" / {"coco": "ann.json", "csv": "list.csv", "dldataset": "dataset.json"}[kind]
    label.parent.mkdir()
    label.write_text(text, encoding="utf-8", errors="surrogatepass")
    out = tmp_path / "o.zarr"
    if kind == "dldataset":
        argv = ["build", str(label), str(out)]
    else:
        argv = ["build", str(src), str(out), "--labels", f"{kind}:{label}"]
    code = main([*argv, "--size", f"{SIZE}x{SIZE}", "--on-error", "skip", "--jobs", "1", "--quiet"])
    err = capsys.readouterr().err
    assert code == want, err
    assert "Traceback" not in err and "internal error" not in err
    assert says in err
    if want == 2:
        assert label.name in err  # the file is named
        assert not out.exists()
    else:
        assert len(dlpack.open(out)) == len(FILES) - 1  # the one entry skipped, the rest packed


def _albumentations(*transforms: dict[str, Any]) -> str:
    return json.dumps(
        {
            "__version__": "2.0.8",
            "transform": {"__class_fullname__": "Compose", "p": 1.0, "transforms": list(transforms)},
        }
    )


def _rrc(height: int, width: int) -> dict[str, Any]:
    return {"__class_fullname__": "RandomResizedCrop", "p": 1.0, "size": [height, width]}


#: Configs that must be refused (exit 2) before any variant is made, and what the message says.
HOSTILE_CONFIGS: dict[str, tuple[str, str]] = {
    "halcon-5000-digit-int": ('{"rotate": ' + "9" * 5000 + "}", "64 bits"),
    "halcon-deep": ('{"mirror": ' + DEEP + "}", "nested more than"),
    "halcon-key-twice": ('{"mirror": "r", "rotate": 90, "mirror": "c"}', "the key 'mirror' appears twice"),
    "halcon-infinity": ('{"brightness_variation": Infinity}', "Infinity"),
    "rotate-range-overflows-the-generator": (
        _albumentations({"__class_fullname__": "Rotate", "p": 1.0, "limit": [-1e308, 1e308]}),
        "(Rotate).limit: the range is too wide",
    ),
    "crop-to-a-huge-size": (_albumentations(_rrc(100000, 100000)), "more than 268,435,456 pixels"),
    "crop-to-another-size": (_albumentations(_rrc(SIZE // 2, SIZE)), "keeps the stored size"),
    "crop-then-another-size": (
        _albumentations(_rrc(SIZE, SIZE), {"__class_fullname__": "RandomCrop", "p": 1.0, "height": 4, "width": 4}),
        "RandomCrop makes 4x4 images",
    ),
}


@pytest.fixture
def small_store(make_tree: MakeTree, tmp_path: Path) -> Path:
    out = tmp_path / "s.zarr"
    dlpack.build(make_tree(TREE), out, size=(SIZE, SIZE), quiet=True, jobs=1)
    return out


@pytest.mark.parametrize("case", sorted(HOSTILE_CONFIGS))
def test_a_hostile_augmentation_config_is_refused_before_any_variant(
    small_store: Path, tmp_path: Path, capsys: Capsys, case: str
) -> None:
    text, says = HOSTILE_CONFIGS[case]
    config = tmp_path / f"{case}.json"
    config.write_text(text, encoding="utf-8")
    code = main(["augment", str(small_store), "--augment", "1", "--augment-config", str(config), "--jobs", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and config.name in err and says in err
    assert dlpack.Dataset(small_store).variants == 0


@pytest.mark.parametrize(
    "transforms",
    [
        [_rrc(SIZE, SIZE)],
        [{"__class_fullname__": "RandomCrop", "p": 1.0, "height": 4, "width": 4}, _rrc(SIZE, SIZE)],
    ],
    ids=["crop-to-the-stored-size", "crop-then-back-to-the-stored-size"],
)
def test_a_config_that_ends_at_the_stored_size_is_not_refused(
    small_store: Path, tmp_path: Path, transforms: list[dict[str, Any]]
) -> None:
    config = tmp_path / "ok.json"
    config.write_text(_albumentations(*transforms), encoding="utf-8")
    result = dlpack.augment(small_store, k=1, config=config, jobs=1, quiet=True)
    assert result.written == len(FILES)
    assert dlpack.Dataset(small_store).variants == 1


# ---------------------------------------------------------------- not a regular file: never a hang


def _build(src: Path, out: Path, labels: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a child process, with a timeout: a regression fails the test instead of hanging it."""
    argv = [sys.executable, "-m", "dlpack", "build", str(src), str(out), "--labels", labels, "--size", "8x8"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=ENV)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
@pytest.mark.parametrize("kind", ["coco", "csv", "dldataset", "masks"])
def test_a_named_pipe_nobody_writes_to_is_refused_at_once(make_tree: MakeTree, tmp_path: Path, kind: str) -> None:
    src = make_tree(TREE)
    if kind == "masks":
        masks = make_tree({f: ("gray", SIZE, SIZE) for f in FILES}, "masks")
        os.mkfifo(masks / "classes.txt")
        labels, named = f"masks:{masks}", "classes.txt"
    else:
        os.mkfifo(tmp_path / "labels.fifo")
        labels, named = f"{kind}:{tmp_path / 'labels.fifo'}", "labels.fifo"
    done = _build(src, tmp_path / "o.zarr", labels)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr and "a named pipe that nothing writes to" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
@pytest.mark.parametrize("kind", ["coco", "csv", "dldataset"])
def test_a_device_is_refused_never_read(make_tree: MakeTree, tmp_path: Path, kind: str) -> None:
    done = _build(make_tree(TREE), tmp_path / "o.zarr", f"{kind}:/dev/zero")
    assert done.returncode == 2, done.stderr
    assert "/dev/zero" in done.stderr and "character device" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["coco", "csv"])
def test_a_label_file_over_the_size_limit_is_refused_before_it_is_read(
    make_tree: MakeTree, tmp_path: Path, kind: str
) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk, and a read would take minutes
    done = _build(make_tree(TREE), tmp_path / "o.zarr", f"{kind}:{big}")
    assert done.returncode == 2, done.stderr
    assert "big.json" in done.stderr and "too large to read" in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for <(command)")
def test_a_label_file_from_process_substitution_is_read(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree(TREE)
    (tmp_path / "list.csv").write_text(CSV, encoding="utf-8")
    done = subprocess.run(
        ["bash", "-c", '"$0" -m dlpack build "$1" "$2" --labels csv:<(sleep 1; cat "$3") --size 8x8 --quiet',
         sys.executable, str(src), str(tmp_path / "o.zarr"), str(tmp_path / "list.csv")],
        capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert dlpack.open(tmp_path / "o.zarr").classes == ("a", "b")


def test_a_pipe_is_read_up_to_the_limit_and_refused_past_it() -> None:
    for size, limit in ((100, 100), (101, 100)):
        r, w = os.pipe()
        os.write(w, b"x" * size)
        os.close(w)
        try:
            if size > limit:
                with pytest.raises(FileTooLargeError, match="the limit is 100 bytes"):
                    read_regular(f"/dev/fd/{r}", limit=limit, pipes=True)
            else:
                assert read_regular(f"/dev/fd/{r}", limit=limit, pipes=True) == b"x" * size
        finally:
            os.close(r)
    r, w = os.pipe()
    os.close(w)
    try:
        with pytest.raises(NotRegularFileError, match="nothing writes to"):
            read_regular(f"/dev/fd/{r}", pipes=True)
        with pytest.raises(NotRegularFileError, match="a named pipe"):
            read_regular(f"/dev/fd/{r}")  # a pipe only where the caller accepts one
    finally:
        os.close(r)


def test_the_strict_reader_accepts_what_valid_label_files_hold() -> None:
    """No false refusal: brackets and quotes inside strings, long fractions, 64-bit ints, 100 levels."""
    from dlpack._json import MAX_DEPTH, parse_json

    text = json.dumps(
        {
            "file_name": 'a/[[[{{{"]]]' + "[" * 200 + ".png",
            "bbox": [0.00012345678901234567891, 2**63 - 1, -(2**63), 1e308, 1.5e-300],
            "deep": json.loads("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)),
        }
    )
    doc = parse_json(text, "ok.json", ValueError)
    assert doc["bbox"][1:3] == [2**63 - 1, -(2**63)] and doc["file_name"].endswith("[.png")
    with pytest.raises(ValueError, match="nested more than"):
        parse_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "deep.json", ValueError)
    with pytest.raises(ValueError, match="64 bits"):
        parse_json(f"[{2**63}]", "big.json", ValueError)
