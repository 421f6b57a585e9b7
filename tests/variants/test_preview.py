"""dlpack preview: the contact sheet of originals and variants, read back pixel by pixel."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from _augment import HEIGHT, WIDTH, classification_store, detection_store

import dlpack
import dlpack.cli
from dlpack.variants import preview as P

TILE = 96  # twice the 48 x 32 fixture images: nearest neighbour repeats every pixel 2 x 2
SCALE = TILE // max(WIDTH, HEIGHT)
FLIP = {"augmentation_percentage": 100, "mirror": "c"}


def _config(tmp_path: Path, doc: dict[str, Any], name: str = "flip.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.fixture
def flipped(make_tree: Callable[..., Path], tmp_path: Path) -> Path:
    """A detection store (boxes, masks) whose 2 variants per image are all left-right mirrors."""
    store = detection_store(make_tree, tmp_path, "det.zarr", size=(WIDTH, HEIGHT))
    dlpack.augment(store, 2, _config(tmp_path, FLIP), jobs=1, quiet=True)
    return store


def _sheet(path: Path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert img is not None and img.dtype == np.uint8 and img.ndim == 3
    return img


def _cell(sheet: np.ndarray, row: int, col: int, tile: int = TILE) -> tuple[np.ndarray, np.ndarray]:
    """(the tile, its caption band) of one view, at the places the module's layout constants say."""
    y = P.HEADER + row * (tile + P.CAPTION + 2 * P.MARGIN) + P.MARGIN
    x = col * (tile + 2 * P.MARGIN) + P.MARGIN
    return sheet[y : y + tile, x : x + tile], sheet[y + tile : y + tile + P.CAPTION, x : x + tile]


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = dlpack.cli.main(["preview", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def _bgr(image: np.ndarray) -> np.ndarray:
    return image[:, :, ::-1] if image.shape[2] == 3 else np.repeat(image, 3, axis=2)


def _boxed(sample: dict[str, Any], shape: tuple[int, int]) -> np.ndarray:
    """Tile pixels on or inside a box (grown by one stored pixel) or on a mask pixel."""
    hit = np.zeros(shape, bool)
    for x0, y0, x1, y1 in np.asarray(sample["boxes"]).reshape(-1, 4):
        hit[max(0, int(y0 * SCALE) - SCALE) : int(np.ceil(y1 * SCALE)) + SCALE,
            max(0, int(x0 * SCALE) - SCALE) : int(np.ceil(x1 * SCALE)) + SCALE] = True  # fmt: skip
    mask = np.repeat(np.repeat(np.asarray(sample["mask"]) != 0, SCALE, axis=0), SCALE, axis=1)
    hit[: mask.shape[0], : mask.shape[1]] |= mask
    return hit


def test_the_sheet_has_a_row_per_sample_and_a_column_per_view(
    flipped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, flipped, tmp_path / "sheet.png", "--count", 5, "--tile", TILE)
    assert code == 0, err
    assert "5 sample(s)" in out and "2 variant(s)" in out
    sheet = _sheet(tmp_path / "sheet.png")
    assert sheet.shape == (P.HEADER + 5 * (TILE + P.CAPTION + 2 * P.MARGIN), 3 * (TILE + 2 * P.MARGIN), 3)
    code, _, err = _run(capsys, flipped, tmp_path / "one.png", "--count", 2, "--tile", TILE, "--max-variants", 1)
    assert code == 0, err
    assert _sheet(tmp_path / "one.png").shape[1] == 2 * (TILE + 2 * P.MARGIN)


def test_the_original_tile_is_the_stored_image_where_nothing_is_drawn(flipped: Path, tmp_path: Path) -> None:
    result = P.preview(flipped, tmp_path / "sheet.png", count=4, tile=TILE)
    sheet = _sheet(tmp_path / "sheet.png")
    with dlpack.open(flipped) as ds:
        for row, i in enumerate(result.samples):
            for v in (0, 1):
                sample = ds.variant(i, v)
                tile, _ = _cell(sheet, row, v)
                # The documented resize: nearest neighbour when enlarging, to fit the tile.
                want = cv2.resize(
                    _bgr(sample["image"]), (WIDTH * SCALE, HEIGHT * SCALE), interpolation=cv2.INTER_NEAREST
                )
                view = tile[: want.shape[0], : want.shape[1]]
                free = ~_boxed(sample, want.shape[:2])
                assert free.mean() > 0.5
                np.testing.assert_array_equal(view[free], want[free])
                assert (tile[want.shape[0] :] == 255).all()  # the rest of the square cell is white


def test_boxes_are_outlined_in_their_class_colour_where_the_view_has_them(flipped: Path, tmp_path: Path) -> None:
    with dlpack.open(flipped) as ds:
        result = P.preview(flipped, tmp_path / "sheet.png", count=len(ds), tile=TILE)  # every sample, in order
        assert result.samples == tuple(range(len(ds)))
        sheet = _sheet(tmp_path / "sheet.png")
        colours = P._palette(max(len(ds.classes), 12))
        i = row = next(i for i in range(len(ds)) if len(ds[i]["boxes"]))
        for v in (0, 1, 2):
            sample = ds.variant(i, v)
            tile, _ = _cell(sheet, row, v)
            for (x0, y0, x1, y1), label in zip(sample["boxes"], sample["box_labels"], strict=True):
                colour = colours[int(label)]
                top = tile[round(y0 * SCALE), round(x0 * SCALE) : round(x1 * SCALE)]
                left = tile[round(y0 * SCALE) : round(y1 * SCALE), round(x0 * SCALE)]
                assert (top == colour).all() and (left == colour).all(), (i, v)
        # The mirror moved the box: the variant's outline is not where the original's is, and vice versa.
        b0, b1 = ds.variant(i, 0)["boxes"][0], ds.variant(i, 1)["boxes"][0]
        assert b1[0] == WIDTH - b0[2]
        tile0, _ = _cell(sheet, row, 0)
        tile1, _ = _cell(sheet, row, 1)
        colour = colours[int(ds[i]["box_labels"][0])]
        assert not (tile1[round(b0[1] * SCALE), round(b0[0] * SCALE) : round(b0[2] * SCALE)] == colour).all()
        assert not (tile0[round(b1[1] * SCALE), round(b1[0] * SCALE) : round(b1[2] * SCALE)] == colour).all()


def test_masks_are_blended_in_their_class_colour(flipped: Path, tmp_path: Path) -> None:
    result = P.preview(flipped, tmp_path / "sheet.png", count=6, tile=TILE)
    sheet = _sheet(tmp_path / "sheet.png")
    colours = P._palette(12)
    checked = 0
    with dlpack.open(flipped) as ds:
        ids = list(ds.class_ids)
        for row, i in enumerate(result.samples):
            sample = ds.variant(i, 1)
            tile, _ = _cell(sheet, row, 1)
            mask = np.asarray(sample["mask"])
            image = _bgr(sample["image"])
            # A mask pixel away from every box outline: the image blended with its class colour.
            for y, x in zip(*np.nonzero(mask), strict=True):
                edges = [b for b in sample["boxes"] if abs(x - b[0]) < 1.5 or abs(x + 1 - b[2]) < 1.5
                         or abs(y - b[1]) < 1.5 or abs(y + 1 - b[3]) < 1.5]  # fmt: skip
                if edges:
                    continue
                colour = colours[ids.index(int(mask[y, x]))]
                want = np.rint(image[y, x] * (1 - P._MASK_ALPHA) + colour * P._MASK_ALPHA)
                np.testing.assert_array_equal(tile[y * SCALE, x * SCALE], want)
                checked += 1
    assert checked > 0


def test_each_caption_names_the_view_and_what_was_applied(flipped: Path, tmp_path: Path) -> None:
    result = P.preview(flipped, tmp_path / "sheet.png", count=3, tile=TILE)
    sheet = _sheet(tmp_path / "sheet.png")
    with dlpack.open(flipped) as ds:
        i = result.samples[0]
        assert ds.augmentation(i, 0) == [] and ds.augmentation(i, 1) == [{"op": "mirror", "axes": "c"}]
        lines = [P.describe_record(ds.augmentation(i, v), v) for v in (0, 1)]
    assert lines == [["original"], ["mirror axes=c"]]
    _, original = _cell(sheet, 0, 0)
    _, variant = _cell(sheet, 0, 1)
    np.testing.assert_array_equal(original, P._caption([f"#{i} v0", "original"], TILE))
    np.testing.assert_array_equal(variant, P._caption([f"#{i} v1", "mirror axes=c"], TILE))
    assert not np.array_equal(original[P.LINE + 2 :], variant[P.LINE + 2 :])  # below the head line too


def test_a_variant_with_nothing_applied_says_so_and_long_records_name_every_operation() -> None:
    assert P.describe_record([], 0) == ["original"]
    assert P.describe_record([], 2) == ["no operation drawn (= original)"]
    record = [{"op": f"Op{k}", "angle": 1.23456, "scale": [1, 2, 3, 4, 5]} for k in range(3)]
    assert P.describe_record(record)[0] == "Op0 angle=1.23 scale=[1,2,3,4,...]"
    fitted = P._fit_lines(["#1 v1", *P.describe_record(record)], 96)
    assert len(fitted) <= P.CAPTION_LINES
    assert [line.split(" ")[0] for line in fitted[1:]] == ["Op0", "Op1", "Op2"]
    many = P._fit_lines(["#1 v1", *[f"Op{k}" for k in range(9)]], 96)
    assert len(many) == P.CAPTION_LINES and many[-1] == "+6 more"
    assert all(P._width(line) <= 96 for line in fitted + many)


def test_a_store_without_variants_gives_one_column_of_originals(
    make_tree: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = classification_store(make_tree, tmp_path, "cls.zarr")
    code, out, err = _run(capsys, store, tmp_path / "sheet.png", "--count", 3, "--tile", TILE, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["variants"] == 0 and len(doc["samples"]) == 3 and doc["out"] == str(tmp_path / "sheet.png")
    sheet = _sheet(tmp_path / "sheet.png")
    assert sheet.shape[:2] == (P.HEADER + 3 * (TILE + P.CAPTION + 2 * P.MARGIN), TILE + 2 * P.MARGIN)
    with dlpack.open(store) as ds:
        i = doc["samples"][0]
        name = ds.classes[ds[i]["label"]]
        tile, caption = _cell(sheet, 0, 0)
        want = cv2.resize(_bgr(ds[i]["image"]), (WIDTH * SCALE, HEIGHT * SCALE), interpolation=cv2.INTER_NEAREST)
    np.testing.assert_array_equal(tile[: want.shape[0]], want)  # no boxes, no mask: every pixel
    np.testing.assert_array_equal(caption, P._caption([f"#{i} v0 {name}", "original"], TILE))


def test_16_bit_gray_images_are_shown_scaled_to_8_bits(make_tree: Callable[..., Path], tmp_path: Path) -> None:
    src = make_tree({f"a/{k}.png": ("gray16", WIDTH, HEIGHT) for k in range(4)}, "gray16")
    store = tmp_path / "gray16.zarr"
    dlpack.build(src, store, jobs=1, quiet=True)
    result = P.preview(store, tmp_path / "sheet.png", count=1, tile=TILE)
    tile, _ = _cell(_sheet(tmp_path / "sheet.png"), 0, 0)
    with dlpack.open(store) as ds:
        image = ds[result.samples[0]]["image"]
    assert image.dtype == np.uint16 and image.shape[2] == 1
    eight = ((image.astype(np.uint32) + 128) // 257).astype(np.uint8)
    want = np.repeat(np.repeat(np.repeat(eight, 3, axis=2), SCALE, axis=0), SCALE, axis=1)
    np.testing.assert_array_equal(tile[: want.shape[0]], want)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--count", "0"], "--count"),
        (["--tile", "8"], "--tile"),
        (["--seed", "-1"], "--seed"),
        (["--max-variants", "-1"], "--max-variants"),
        (["--count", "many"], "--count"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(
    flipped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], named: str
) -> None:
    code, _, err = _run(capsys, flipped, tmp_path / "sheet.png", *args)
    assert code == 2 and named in err and "Traceback" not in err
    assert not (tmp_path / "sheet.png").exists()


def test_bad_outputs_and_a_missing_store_exit_2_naming_the_problem(
    flipped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, flipped, tmp_path / "sheet.jpg")
    assert code == 2 and ".png" in err and "sheet.jpg" in err
    code, _, err = _run(capsys, tmp_path / "missing.zarr", tmp_path / "sheet.png")
    assert code == 2 and "missing.zarr" in err
    before = sorted(p.relative_to(flipped) for p in flipped.rglob("*"))
    code, _, err = _run(capsys, flipped, flipped / "sheet.png")
    assert code == 2 and "inside the store" in err
    assert sorted(p.relative_to(flipped) for p in flipped.rglob("*")) == before
    code, out, err = _run(capsys, tmp_path / "missing.zarr", tmp_path / "sheet.png", "--json")
    assert code == 2 and json.loads(out)["error"]["type"] == "StoreNotFoundError"
    assert "Traceback" not in err and not (tmp_path / "sheet.png").exists()


def test_the_same_seed_writes_the_same_bytes(flipped: Path, tmp_path: Path) -> None:
    a = P.preview(flipped, tmp_path / "a.png", count=4, seed=3, tile=64)
    b = P.preview(flipped, tmp_path / "b.png", count=4, seed=3, tile=64)
    c = P.preview(flipped, tmp_path / "c.png", count=4, seed=4, tile=64)
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    assert a.samples == b.samples and a.samples != c.samples
    assert list(a.samples) == sorted(set(a.samples)) and len(a.samples) == 4
    assert (tmp_path / "a.png").read_bytes() != (tmp_path / "c.png").read_bytes()
    everything = P.preview(flipped, tmp_path / "all.png", count=1000, tile=32)
    assert everything.samples == tuple(range(40))


def test_the_class_band_wraps_so_a_narrow_sheet_names_every_class() -> None:
    classes = ["scratch", "spot", "crack", "good", "a_very_long_class_name_indeed"]
    lines = P._legend(classes, 104)
    assert len(lines) > 1
    assert [k for line in lines for k, _, _ in line] == list(range(len(classes)))
    assert all(x + P.LINE + P._width(text) <= 104 - P.MARGIN for line in lines for _, text, x in line)
    assert P._header(classes, P._palette(12), 104).shape == (P.HEADER * len(lines), 104, 3)
    assert len(P._legend(classes, 2000)) == 1


def test_drawn_samples_are_those_with_labels_and_the_band_names_only_classes_drawn(
    flipped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A third of the fixture's images have no box: a drawn sheet shows only labelled ones while
    there are enough; --index shows the samples named, and the band lists only their classes."""
    with dlpack.open(flipped) as ds:
        boxed = {i for i in range(len(ds)) if len(ds[i]["boxes"])}
        classes = {i: {ds.classes[c] for c in ds[i]["box_labels"].tolist()} for i in range(len(ds))}
    assert 0 < len(boxed) < 40
    for seed in range(4):
        result = P.preview(flipped, tmp_path / "drawn.png", count=8, seed=seed, tile=32)
        assert len(result.samples) == 8 and set(result.samples) <= boxed, seed
    # More than the labelled ones: every labelled sample, then the others.
    result = P.preview(flipped, tmp_path / "many.png", count=len(boxed) + 3, tile=32)
    assert boxed <= set(result.samples) and len(result.samples) == len(boxed) + 3
    one = next(i for i in sorted(boxed) if len(classes[i]) == 1)
    empty = next(i for i in range(40) if i not in boxed)
    code, out, err = _run(capsys, flipped, tmp_path / "chosen.png", "--index", one, empty, "--json", "--tile", 48)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["samples"] == [one, empty] and doc["classes"] == sorted(classes[one])
    assert _sheet(tmp_path / "chosen.png").shape[0] == P.HEADER + 2 * (48 + P.CAPTION + 2 * P.MARGIN)
    code, _, err = _run(capsys, flipped, tmp_path / "bad.png", "--index", 40)
    assert code == 2 and "--index" in err and "40" in err and "0..39" in err and "Traceback" not in err
