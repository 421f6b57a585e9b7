"""albumentations documents: files albumentations saved itself, hand-written 1.4- and 2.0-style documents,
bad documents (each a ConfigError naming the field), and the engine that runs albumentations itself."""

from __future__ import annotations

import copy
import json
import math
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlpack.errors import ConfigError, MissingExtraError
from dlpack.transforms.albumentations import AlbumentationsEngine, is_albumentations, pipeline_from_albumentations
from dlpack.transforms.base import DEFAULT_MIN_AREA, OneOf, Pipeline, Targets, Transform, variant_rng
from dlpack.transforms.ops import (
    Affine,
    CoarseDropout,
    GaussianBlur,
    GaussNoise,
    HorizontalFlip,
    HueSaturationValue,
    Perspective,
    RandomBrightnessContrast,
    RandomCrop,
    RandomResizedCrop,
    RandomRotate90,
    Rotate,
    ShiftScaleRotate,
    VerticalFlip,
)


def _close(a: Any, b: Any) -> bool:
    """Equal JSON-like values, floats within 1e-9 (albumentations stores 1 + 0.1 - 1)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return bool(a == b)


def _same_ops(got: Pipeline, want: list[Transform]) -> None:
    assert len(got.ops) == len(want)
    for g, w in zip(got.ops, want, strict=True):
        assert _close(g.to_dict(), w.to_dict()), (g, w)


def _doc(*transforms: dict[str, Any], version: str = "2.0.8", **compose: Any) -> dict[str, Any]:
    return {
        "__version__": version,
        "transform": {"__class_fullname__": "Compose", "p": 1.0, "transforms": list(transforms), **compose},
    }


def _targets(channels: int = 3) -> Targets:
    rng = np.random.default_rng(0)
    mask = np.zeros((40, 48), np.uint8)
    mask[10:25, 14:31] = 1
    return Targets(
        rng.integers(0, 256, (40, 48, channels)).astype(np.uint8),
        boxes=np.array([[14, 10, 31, 25], [40, 0, 48, 8], [2, 30, 12, 38]], np.float32),
        box_labels=np.array([3, 1, 4], np.int32),
        box_crowd=np.array([0, 1, 0], np.uint8),
        mask=mask,
    )


# ---------------------------------------------------------------- what albumentations itself saves


@pytest.fixture(scope="module")
def A() -> Any:  # noqa: N802 - albumentations' own alias
    # albumentations is a test-only dependency that is not installed for the lowest-versions run
    # (`make test-min`: 2.0.8 needs a newer OpenCV than the minimum pin), so these tests skip there.
    import os

    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")  # no network check at import
    albumentations = pytest.importorskip("albumentations")
    if int(albumentations.__version__.split(".")[0]) < 2:
        pytest.skip("these tests use the parameters albumentations 2 reports (save_applied_params)")
    return albumentations


def _whole_subset(A: Any) -> tuple[Any, list[Transform]]:
    """Every operation of the subset, away from its defaults, and what dlpack must read from it."""
    theirs = [
        A.HorizontalFlip(p=0.3),
        A.VerticalFlip(p=0.4),
        A.RandomRotate90(p=0.6),
        A.Affine(
            scale=(0.9, 1.1),
            translate_percent=(-0.1, 0.1),
            rotate=(-15, 15),
            shear=(-5, 5),
            border_mode=1,
            fill=3,
            fill_mask=255,
            p=0.7,
        ),
        A.ShiftScaleRotate(shift_limit=0.1, scale_limit=0.2, rotate_limit=20, border_mode=0, p=0.45),
        A.Rotate(limit=25, interpolation=0, p=0.35),
        A.RandomCrop(height=24, width=32, p=0.9),
        A.RandomResizedCrop(size=(32, 40), scale=(0.5, 1.0), ratio=(0.8, 1.25), p=0.8),
        A.OneOf(
            [
                A.RandomBrightnessContrast(brightness_limit=0.1, contrast_limit=(-0.3, 0.1), p=1.0),
                A.HueSaturationValue(hue_shift_limit=10, sat_shift_limit=15, val_shift_limit=5, p=0.5),
            ],
            p=0.25,
        ),
        A.GaussNoise(std_range=(0.05, 0.1), mean_range=(0.0, 0.05), per_channel=False, p=0.2),
        A.GaussianBlur(blur_limit=(3, 5), sigma_limit=(0.1, 1.0), p=0.15),
        A.Perspective(scale=(0.02, 0.05), keep_size=False, p=0.1),
        A.CoarseDropout(num_holes_range=(1, 3), hole_height_range=(4, 8), hole_width_range=(0.1, 0.2), fill_mask=0),
    ]
    ours: list[Transform] = [
        HorizontalFlip(p=0.3),
        VerticalFlip(p=0.4),
        RandomRotate90(p=0.6),
        Affine(
            p=0.7,
            scale=((0.9, 1.1), (0.9, 1.1)),
            translate_percent=((-0.1, 0.1), (-0.1, 0.1)),
            rotate=(-15, 15),
            shear=((-5, 5), (-5, 5)),
            border_mode=1,
            fill=3.0,
            fill_mask=255,
        ),
        ShiftScaleRotate(
            p=0.45,
            shift_limit_x=(-0.1, 0.1),
            shift_limit_y=(-0.1, 0.1),
            scale_limit=(-0.2, 0.2),
            rotate_limit=(-20, 20),
        ),
        Rotate(p=0.35, limit=(-25, 25), interpolation=0, fill_mask=0),
        RandomCrop(24, 32, p=0.9, fill_mask=0),
        RandomResizedCrop((32, 40), p=0.8, scale=(0.5, 1.0), ratio=(0.8, 1.25)),
        OneOf(
            (
                RandomBrightnessContrast(p=1.0, brightness_limit=(-0.1, 0.1), contrast_limit=(-0.3, 0.1)),
                HueSaturationValue(
                    p=0.5, hue_shift_limit=(-10, 10), sat_shift_limit=(-15, 15), val_shift_limit=(-5, 5)
                ),
            ),
            p=0.25,
        ),
        GaussNoise(p=0.2, std_range=(0.05, 0.1), mean_range=(0.0, 0.05), per_channel=False),
        GaussianBlur(p=0.15, blur_limit=(3, 5), sigma_limit=(0.1, 1.0)),
        Perspective(p=0.1, scale=(0.02, 0.05), keep_size=False, fill_mask=0),
        CoarseDropout(
            p=0.5, num_holes_range=(1, 3), hole_height_range=(4, 8), hole_width_range=(0.1, 0.2), fill_mask=0
        ),
    ]
    # albumentations 2.x writes fill_mask 0 for its geometric operations: the file names it, so it is kept.
    ours[4] = ShiftScaleRotate(**{**ours[4].__dict__, "fill_mask": 0})
    compose = A.Compose(theirs, bbox_params=A.BboxParams(format="coco", label_fields=["category_ids"], min_area=4.0))
    return compose, ours


@pytest.mark.filterwarnings("ignore:ShiftScaleRotate is a special case")  # albumentations 2 prefers Affine
@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_a_file_albumentations_saved_of_the_whole_subset_is_read(A: Any, tmp_path: Path, fmt: str) -> None:
    compose, ours = _whole_subset(A)
    path = tmp_path / f"aug.{fmt}"
    A.save(compose, str(path), data_format=fmt)
    if fmt == "json":
        doc = json.loads(path.read_text())
    else:
        yaml = pytest.importorskip("yaml")
        doc = yaml.safe_load(path.read_text())
    assert is_albumentations(doc)
    pipe = pipeline_from_albumentations(doc, path.name)
    assert pipe.kind == "albumentations" and pipe.min_area == 4.0 and pipe.min_visibility == 0.0
    _same_ops(pipe, ours)
    # ... and it runs, its record JSON, on a gray image with labels.
    out, record = pipe(_targets(1), variant_rng(0, 1, 1))
    assert out.image.dtype == np.uint8 and out.image.shape[2] == 1
    json.dumps(record)


def test_pipeline_reads_its_normalised_form_back() -> None:
    doc = _doc(
        {"__class_fullname__": "Affine", "rotate": [-10, 10], "translate_px": {"x": [-3, 3], "y": 0}},
        {"__class_fullname__": "OneOf", "transforms": [{"__class_fullname__": "GaussNoise", "var_limit": 30}]},
    )
    pipe = pipeline_from_albumentations(doc, "aug.json")
    again = Pipeline.from_dict(json.loads(json.dumps(pipe.to_dict())))
    assert again == pipe


# ---------------------------------------------------------------- hand-written documents

V14 = {
    "__version__": "1.4.0",
    "transform": {
        "__class_fullname__": "Compose",
        "p": 1.0,
        "transforms": [
            {"__class_fullname__": "HorizontalFlip", "always_apply": False, "p": 0.5},
            {"__class_fullname__": "RandomRotate90", "always_apply": False, "p": 0.5},
            {
                "__class_fullname__": "Affine",
                "always_apply": False,
                "p": 0.5,
                "interpolation": 1,
                "mask_interpolation": 0,
                "cval": 5,
                "mode": 0,
                "scale": {"x": [0.9, 1.1], "y": [0.9, 1.1]},
                "translate_percent": {"x": [-0.1, 0.1], "y": [-0.2, 0.2]},
                "translate_px": None,
                "rotate": [-10, 10],
                "fit_output": False,
                "shear": {"x": [0, 0], "y": [0, 0]},
                "cval_mask": 255,
                "keep_ratio": True,
                "rotate_method": "largest_box",
            },
            {
                "__class_fullname__": "ShiftScaleRotate",
                "always_apply": True,
                "p": 0.5,
                "shift_limit_x": [-0.05, 0.05],
                "shift_limit_y": [-0.1, 0.1],
                "scale_limit": [-0.1, 0.1],
                "rotate_limit": [-20, 20],
                "interpolation": 1,
                "border_mode": 4,
                "value": None,
                "mask_value": None,
                "rotate_method": "largest_box",
            },
            {
                "__class_fullname__": "Rotate",
                "always_apply": False,
                "p": 0.5,
                "limit": [-30, 30],
                "interpolation": 1,
                "border_mode": 0,
                "value": 0,
                "mask_value": 0,
                "rotate_method": "largest_box",
                "crop_border": False,
            },
            {"__class_fullname__": "RandomCrop", "always_apply": False, "p": 1.0, "height": 24, "width": 32},
            {
                "__class_fullname__": "RandomResizedCrop",
                "always_apply": False,
                "p": 1.0,
                "height": 32,
                "width": 40,
                "scale": [0.5, 1.0],
                "ratio": [0.75, 1.3333333333333333],
                "interpolation": 1,
            },
            {
                "__class_fullname__": "GaussNoise",
                "always_apply": False,
                "p": 0.5,
                "var_limit": [10.0, 50.0],
                "per_channel": True,
                "mean": 0,
            },
            {
                "__class_fullname__": "GaussianBlur",
                "always_apply": False,
                "p": 0.5,
                "blur_limit": [3, 7],
                "sigma_limit": [0, 0],
            },
            {
                "__class_fullname__": "Perspective",
                "always_apply": False,
                "p": 0.5,
                "scale": [0.05, 0.1],
                "keep_size": True,
                "pad_mode": 0,
                "pad_val": 0,
                "mask_pad_val": 0,
                "fit_output": False,
                "interpolation": 1,
            },
            {
                "__class_fullname__": "CoarseDropout",
                "always_apply": False,
                "p": 0.5,
                "max_holes": 8,
                "max_height": 8,
                "max_width": 0.25,
                "min_holes": 2,
                "min_height": None,
                "min_width": 0.1,
                "fill_value": 0,
                "mask_fill_value": None,
            },
            {
                "__class_fullname__": "OneOf",
                "p": 0.5,
                "transforms": [
                    {
                        "__class_fullname__": "RandomBrightnessContrast",
                        "always_apply": False,
                        "p": 0.5,
                        "brightness_limit": [-0.2, 0.2],
                        "contrast_limit": [-0.2, 0.2],
                        "brightness_by_max": True,
                    },
                    {
                        "__class_fullname__": "HueSaturationValue",
                        "always_apply": False,
                        "p": 0.5,
                        "hue_shift_limit": [-20, 20],
                        "sat_shift_limit": [-30, 30],
                        "val_shift_limit": [-20, 20],
                    },
                ],
            },
        ],
        "bbox_params": {
            "format": "coco",
            "label_fields": ["category_ids"],
            "min_area": 16.0,
            "min_visibility": 0.3,
            "min_width": 0.0,
            "min_height": 0.0,
            "check_each_transform": True,
        },
        "keypoint_params": None,
        "additional_targets": {},
        "is_check_shapes": True,
    },
}


def test_a_1_4_style_document_is_read_with_its_key_names() -> None:
    pipe = pipeline_from_albumentations(V14, "old.json")
    assert (pipe.min_area, pipe.min_visibility) == (16.0, 0.3)
    _same_ops(
        pipe,
        [
            HorizontalFlip(p=0.5),
            RandomRotate90(p=0.5),
            Affine(
                p=0.5,
                scale=((0.9, 1.1), (0.9, 1.1)),
                translate_percent=((-0.1, 0.1), (-0.2, 0.2)),
                rotate=(-10, 10),
                fill=5.0,
                fill_mask=255,
                keep_ratio=True,
            ),
            # always_apply: true means every time; value/mask_value null mean 0 and the store's fill
            ShiftScaleRotate(
                p=1.0,
                shift_limit_x=(-0.05, 0.05),
                shift_limit_y=(-0.1, 0.1),
                scale_limit=(-0.1, 0.1),
                rotate_limit=(-20, 20),
                border_mode=4,
            ),
            Rotate(p=0.5, limit=(-30, 30), fill_mask=0),
            RandomCrop(24, 32, p=1.0),
            RandomResizedCrop((32, 40), p=1.0, scale=(0.5, 1.0)),
            GaussNoise(p=0.5, var_limit=(10.0, 50.0), mean=0.0),
            GaussianBlur(p=0.5, blur_limit=(3, 7), sigma_limit=(0.0, 0.0)),
            Perspective(p=0.5, fill_mask=0),
            CoarseDropout(p=0.5, num_holes_range=(2, 8), hole_height_range=(8, 8), hole_width_range=(0.1, 0.25)),
            OneOf((RandomBrightnessContrast(p=0.5), HueSaturationValue(p=0.5)), p=0.5),
        ],
    )


def test_a_1_4_document_runs_and_its_noise_is_in_8_bit_units() -> None:
    pipe = pipeline_from_albumentations(V14, "old.json")
    out, record = pipe(_targets(), variant_rng(3, 0, 1))
    assert out.image.shape[2] == 3
    noise = GaussNoise(p=1.0, var_limit=(100.0, 100.0), mean=0.0)
    for dtype, top in ((np.uint8, 255), (np.uint16, 65535)):
        t = Targets(np.full((32, 32, 1), top // 2, dtype))
        params = noise.draw(np.random.default_rng(0), t)
        assert math.isclose(params["std"], 10.0 * top / 255)  # sqrt(100) steps of 8 bits


SAVED = Path(__file__).parent / "saved"


def test_files_albumentations_1_4_saved_of_the_whole_subset_are_read() -> None:
    """Written by ``A.save`` of albumentations 1.4.0 and 1.4.24 (every operation at its defaults, 32 px crops)."""
    old = pipeline_from_albumentations(json.loads((SAVED / "albumentations-1.4.0.json").read_text()), "1.4.0.json")
    late = pipeline_from_albumentations(json.loads((SAVED / "albumentations-1.4.24.json").read_text()), "1.4.24.json")
    for pipe in (old, late):
        names = [op.name for op in pipe.ops]
        assert names == [
            "HorizontalFlip",
            "VerticalFlip",
            "RandomRotate90",
            "Affine",
            "ShiftScaleRotate",
            "Rotate",
            "RandomCrop",
            "RandomResizedCrop",
            "RandomBrightnessContrast",
            "HueSaturationValue",
            "GaussNoise",
            "GaussianBlur",
            "Perspective",
            "CoarseDropout",
        ]
        by = {op.name: op for op in pipe.ops}
        assert by["RandomRotate90"].p == 0.5
        assert by["ShiftScaleRotate"].border_mode == 4 and by["Rotate"].border_mode == 4  # type: ignore[attr-defined]
        assert by["RandomCrop"] == RandomCrop(32, 32, p=1.0, fill_mask=by["RandomCrop"].fill_mask)  # type: ignore[attr-defined]
        assert by["RandomResizedCrop"] == RandomResizedCrop((32, 32), p=1.0)
        assert by["GaussianBlur"] == GaussianBlur(p=0.5, blur_limit=(3, 7), sigma_limit=(0.0, 0.0))
        out, record = pipe(_targets(), variant_rng(0, 0, 1))
        assert out.image.shape == (32, 32, 3)
        json.dumps(record)
    # 1.4.0's own names: 1.4.24 already writes 2.0's
    assert old.ops[10] == GaussNoise(p=0.5, var_limit=(10.0, 50.0), mean=0.0)
    assert late.ops[10] == GaussNoise(p=0.5, std_range=(0.2, 0.44))
    assert old.ops[13] == CoarseDropout(
        p=0.5, num_holes_range=(8, 8), hole_height_range=(8, 8), hole_width_range=(8, 8)
    )
    assert late.ops[13] == CoarseDropout(
        p=0.5, num_holes_range=(1, 1), hole_height_range=(8, 8), hole_width_range=(8, 8)
    )


def test_a_1_4_10_style_coarse_dropout_and_gauss_noise_are_read() -> None:
    doc = _doc(
        {
            "__class_fullname__": "CoarseDropout",
            "p": 0.5,
            "num_holes_range": [1, 3],
            "hole_height_range": [8, 8],
            "hole_width_range": [4, 8],
            "fill_value": "random",
            "mask_fill_value": 7,
        },
        {"__class_fullname__": "GaussNoise", "var_limit": 25, "per_channel": False, "mean": 4, "noise_scale_factor": 1},
        version="1.4.10",
    )
    _same_ops(
        pipeline_from_albumentations(doc, "a.json"),
        [
            CoarseDropout(
                p=0.5,
                num_holes_range=(1, 3),
                hole_height_range=(8, 8),
                hole_width_range=(4, 8),
                fill="random",
                fill_mask=7,
            ),
            GaussNoise(p=0.5, var_limit=(0.0, 25.0), mean=4.0, per_channel=False),
        ],
    )


def test_a_2_0_style_document_may_leave_keys_at_their_defaults() -> None:
    doc = _doc(
        {"__class_fullname__": "Rotate"},
        {"__class_fullname__": "GaussianBlur"},
        {"__class_fullname__": "RandomRotate90"},
        {"__class_fullname__": "CoarseDropout"},
        {"__class_fullname__": "Affine", "scale": 1.2, "rotate": 5, "shear": {"y": [-3, 3]}, "translate_percent": 0.1},
        {"__class_fullname__": "ShiftScaleRotate", "shift_limit": 0.2, "scale_limit": 0.1, "rotate_limit": 10},
        {"__class_fullname__": "RandomBrightnessContrast", "brightness_limit": 0.3},
        {"__class_fullname__": "RandomResizedCrop", "size": [20, 30]},
    )
    pipe = pipeline_from_albumentations(doc, "new.json")
    assert pipe.min_area == DEFAULT_MIN_AREA  # no bbox_params: dlpack's documented defaults
    _same_ops(
        pipe,
        [
            Rotate(p=0.5, limit=(-90, 90), border_mode=0),
            GaussianBlur(p=0.5, blur_limit=(0, 0), sigma_limit=(0.5, 3.0)),
            RandomRotate90(p=1.0),
            CoarseDropout(p=0.5),
            # a single number is a constant for Affine, a symmetric range for the *_limit keys
            Affine(
                p=0.5,
                scale=((1.2, 1.2), (1.2, 1.2)),
                rotate=(5, 5),
                shear=((0, 0), (-3, 3)),
                translate_percent=((0.1, 0.1), (0.1, 0.1)),
            ),
            ShiftScaleRotate(
                p=0.5,
                shift_limit_x=(-0.2, 0.2),
                shift_limit_y=(-0.2, 0.2),
                scale_limit=(-0.1, 0.1),
                rotate_limit=(-10, 10),
            ),
            RandomBrightnessContrast(p=0.5, brightness_limit=(-0.3, 0.3)),
            RandomResizedCrop((20, 30), p=1.0),
        ],
    )


def test_keys_a_1_x_document_leaves_out_take_the_1_4_defaults() -> None:
    names = ("Rotate", "ShiftScaleRotate", "GaussianBlur", "RandomRotate90", "CoarseDropout")
    doc = _doc(*({"__class_fullname__": n} for n in names), version="1.4.18")
    ops = pipeline_from_albumentations(doc, "old.yaml").ops
    assert isinstance(ops[0], Rotate) and ops[0].border_mode == 4
    assert isinstance(ops[1], ShiftScaleRotate) and ops[1].border_mode == 4
    assert isinstance(ops[2], GaussianBlur) and (ops[2].blur_limit, ops[2].sigma_limit) == ((3, 7), (0.0, 0.0))
    assert ops[3].p == 0.5
    assert isinstance(ops[4], CoarseDropout)
    assert (ops[4].num_holes_range, ops[4].hole_height_range, ops[4].hole_width_range) == ((1, 1), (8, 8), (8, 8))


@pytest.mark.parametrize("fmt", ["pascal_voc", "coco", "yolo", "albumentations"])
def test_every_box_format_is_accepted_and_its_rules_kept(fmt: str) -> None:
    doc = _doc({"__class_fullname__": "HorizontalFlip"}, bbox_params={"format": fmt, "min_visibility": 0.25})
    pipe = pipeline_from_albumentations(doc, "aug.json")
    assert (pipe.min_area, pipe.min_visibility) == (0.0, 0.25)


def test_is_albumentations_needs_both_keys() -> None:
    assert is_albumentations({"__version__": "2.0.8", "transform": {}})
    assert not is_albumentations({"transform": {}})
    assert not is_albumentations({"augmentation_percentage": 50, "mirror": "rc"})
    assert not is_albumentations([1, 2])


# ---------------------------------------------------------------- bad documents

AFFINE = {"__class_fullname__": "Affine", "p": 0.5}
BAD: list[tuple[str, dict[str, Any], str]] = [
    (
        "unknown op",
        _doc({"__class_fullname__": "Blur"}),
        r"aug\.json: transform\.transforms\[0\]: unknown transform 'Blur'",
    ),
    ("module path", _doc({"__class_fullname__": "albumentations.Sharpen"}), r"unknown transform 'Sharpen'"),
    ("nested compose", _doc({"__class_fullname__": "Compose", "transforms": []}), r"unknown transform 'Compose'"),
    (
        "top not a compose",
        {"__version__": "2.0.8", "transform": {"__class_fullname__": "OneOf", "transforms": []}},
        r"aug\.json: transform: transform must be a Compose",
    ),
    (
        "p out of range",
        _doc({"__class_fullname__": "HorizontalFlip", "p": 1.5}),
        r"transforms\[0\] \(HorizontalFlip\)\.p: must be in 0\.0\.\.1\.0, got 1\.5",
    ),
    (
        "p wrong type",
        _doc({"__class_fullname__": "VerticalFlip", "p": "half"}),
        r"\(VerticalFlip\)\.p: must be a number, got \"half\"",
    ),
    (
        "range wrong type",
        _doc({"__class_fullname__": "Rotate", "limit": "ten"}),
        r"\(Rotate\)\.limit: must be a number or a \[low, high\] pair",
    ),
    (
        "range reversed",
        _doc({"__class_fullname__": "Rotate", "limit": [10, -10]}),
        r"\(Rotate\)\.limit: low must not exceed high",
    ),
    (
        "bool for a number",
        _doc({"__class_fullname__": "HueSaturationValue", "hue_shift_limit": True}),
        r"\(HueSaturationValue\)\.hue_shift_limit: must be a number",
    ),
    (
        "unsupported key",
        _doc(
            {"__class_fullname__": "HorizontalFlip"},
            {"__class_fullname__": "VerticalFlip"},
            {**AFFINE, "fit_output": True},
        ),
        r"^aug\.json: transform\.transforms\[2\] \(Affine\)\.fit_output: dlpack supports only false, got true$",
    ),
    (
        "ellipse boxes",
        _doc({**AFFINE, "rotate_method": "ellipse"}),
        r"\(Affine\)\.rotate_method: dlpack supports only \"largest_box\", got \"ellipse\"",
    ),
    (
        "mask interpolation",
        _doc({**AFFINE, "mask_interpolation": 1}),
        r"\(Affine\)\.mask_interpolation: dlpack supports only 0, got 1",
    ),
    (
        "crop border",
        _doc({"__class_fullname__": "Rotate", "crop_border": True}),
        r"\(Rotate\)\.crop_border: dlpack supports only false",
    ),
    (
        "safe range",
        _doc({"__class_fullname__": "RandomBrightnessContrast", "ensure_safe_range": True}),
        r"ensure_safe_range: dlpack supports only false",
    ),
    (
        "noise scale",
        _doc({"__class_fullname__": "GaussNoise", "noise_scale_factor": 0.5}),
        r"\(GaussNoise\)\.noise_scale_factor: dlpack supports only 1\.0, got 0\.5",
    ),
    (
        "unknown key",
        _doc({**AFFINE, "foo": 1}),
        r"\(Affine\)\.foo: not a key dlpack reads for Affine \(it reads: .*rotate",
    ),
    (
        "border mode",
        _doc({"__class_fullname__": "Rotate", "border_mode": 7}),
        r"\(Rotate\)\.border_mode: dlpack supports 0, 1, 2, 3, 4, got 7",
    ),
    (
        "interpolation name",
        _doc({**AFFINE, "interpolation": "linear"}),
        r"\(Affine\)\.interpolation: dlpack supports 0, 1, 2, 3, 4, got \"linear\"",
    ),
    (
        "crop without height",
        _doc({"__class_fullname__": "RandomCrop", "width": 8}),
        r"\(RandomCrop\)\.height: is required",
    ),
    (
        "crop of zero",
        _doc({"__class_fullname__": "RandomCrop", "width": 0, "height": 8}),
        r"\(RandomCrop\)\.width: must be in 1\.\.inf, got 0",
    ),
    (
        "crop of a fraction",
        _doc({"__class_fullname__": "RandomCrop", "width": 8.5, "height": 8}),
        r"\(RandomCrop\)\.width: must be a whole number",
    ),
    (
        "pad position",
        _doc({"__class_fullname__": "RandomCrop", "width": 8, "height": 8, "pad_position": "middle"}),
        r"\(RandomCrop\)\.pad_position: dlpack supports \"center\"",
    ),
    (
        "size of one",
        _doc({"__class_fullname__": "RandomResizedCrop", "size": [32]}),
        r"\(RandomResizedCrop\)\.size: must be \[height, width\]",
    ),
    (
        "size and height",
        _doc({"__class_fullname__": "RandomResizedCrop", "size": [8, 8], "height": 8}),
        r"\(RandomResizedCrop\)\.size: give size or height and width",
    ),
    (
        "area for downscale",
        _doc({"__class_fullname__": "RandomResizedCrop", "size": [8, 8], "area_for_downscale": "image_mask"}),
        r"area_for_downscale: dlpack supports \"image\"",
    ),
    (
        "both noise forms",
        _doc({"__class_fullname__": "GaussNoise", "var_limit": 10, "std_range": [0.1, 0.2]}),
        r"\(GaussNoise\)\.var_limit: is the 1\.4 form",
    ),
    (
        "std over 1",
        _doc({"__class_fullname__": "GaussNoise", "std_range": [0.1, 2]}),
        r"\(GaussNoise\)\.std_range: must be in 0\.0\.\.1\.0, got 2",
    ),
    (
        "inpainting",
        _doc({"__class_fullname__": "CoarseDropout", "fill": "inpaint_telea"}),
        r"\(CoarseDropout\)\.fill: dlpack supports a number",
    ),
    (
        "old and new holes",
        _doc({"__class_fullname__": "CoarseDropout", "max_holes": 4, "num_holes_range": [1, 2]}),
        r"\(CoarseDropout\)\.num_holes_range: give num_holes_range or the 1\.4",
    ),
    (
        "min over max",
        _doc({"__class_fullname__": "CoarseDropout", "max_holes": 4, "min_holes": 6}),
        r"\(CoarseDropout\)\.min_holes: must not exceed max_holes",
    ),
    (
        "no holes",
        _doc({"__class_fullname__": "CoarseDropout", "num_holes_range": [0, 2]}),
        r"\(CoarseDropout\)\.num_holes_range: must be whole numbers >= 1",
    ),
    (
        "fractional pixels",
        _doc({"__class_fullname__": "CoarseDropout", "hole_height_range": [2.5, 8]}),
        r"\(CoarseDropout\)\.hole_height_range: pixel sizes",
    ),
    (
        "no blur",
        _doc({"__class_fullname__": "GaussianBlur", "blur_limit": 0, "sigma_limit": 0}),
        r"\(GaussianBlur\)\.sigma_limit: a blur needs",
    ),
    (
        "fractional shift",
        _doc({**AFFINE, "translate_px": [-2.5, 2]}),
        r"\(Affine\)\.translate_px: must be whole pixels",
    ),
    (
        "two shifts",
        _doc({**AFFINE, "translate_px": 2, "translate_percent": 0.1}),
        r"\(Affine\)\.translate_px: give translate_percent or translate_px",
    ),
    (
        "keep ratio",
        _doc({**AFFINE, "keep_ratio": True, "scale": {"x": [1, 2], "y": [1, 1]}}),
        r"\(Affine\)\.scale: keep_ratio needs",
    ),
    ("bad axis", _doc({**AFFINE, "shear": {"z": [1, 2]}}), r"\(Affine\)\.shear: is an object with \"x\" and/or \"y\""),
    (
        "scale of zero",
        _doc({"__class_fullname__": "ShiftScaleRotate", "scale_limit": [-1, 0]}),
        r"\(ShiftScaleRotate\)\.scale_limit: 1 \+ low must be > 0",
    ),
    ("two names", _doc({**AFFINE, "fill": 1, "cval": 2}), r"\(Affine\)\.fill: fill and cval name the same setting"),
    (
        "always apply",
        _doc({"__class_fullname__": "HorizontalFlip", "always_apply": "yes"}),
        r"\(HorizontalFlip\)\.always_apply: must be true or false",
    ),
    (
        "fill per channel",
        _doc({**AFFINE, "fill": [1, "x"]}),
        r"\(Affine\)\.fill: must be a number or a list of numbers",
    ),
    ("negative fill mask", _doc({**AFFINE, "fill_mask": -1}), r"\(Affine\)\.fill_mask: must be a whole number >= 0"),
    ("compose p", _doc(p=0.5), r"aug\.json: transform \(Compose\)\.p: dlpack supports only 1\.0"),
    (
        "keypoints",
        _doc(keypoint_params={"format": "xy"}),
        r"transform \(Compose\)\.keypoint_params: dlpack has no keypoints",
    ),
    (
        "extra targets",
        _doc(additional_targets={"image2": "image"}),
        r"transform \(Compose\)\.additional_targets: dlpack augments one image",
    ),
    ("compose key", _doc(foo=1), r"transform \(Compose\)\.foo: not a Compose key"),
    (
        "min width",
        _doc(bbox_params={"format": "coco", "min_width": 4}),
        r"\.bbox_params\.min_width: dlpack supports only 0",
    ),
    (
        "box format",
        _doc(bbox_params={"format": "xywh"}),
        r"\.bbox_params\.format must be one of pascal_voc, coco, yolo, albumentations",
    ),
    (
        "visibility",
        _doc(bbox_params={"format": "coco", "min_visibility": 2}),
        r"\.bbox_params\.min_visibility must be in 0\.0\.\.1\.0",
    ),
    ("box key", _doc(bbox_params={"format": "coco", "foo": 1}), r"\.bbox_params\.foo: not a bbox_params key"),
    (
        "version",
        {"__version__": "latest", "transform": {"__class_fullname__": "Compose", "transforms": []}},
        r"aug\.json: __version__ must be",
    ),
    ("transforms not a list", _doc(transforms={"a": 1}), r"\(Compose\)\.transforms must be a list"),
    ("entry not an object", _doc(5), r"transforms\[0\]: each transform is an object"),
    (
        "empty one of",
        _doc({"__class_fullname__": "OneOf", "transforms": []}),
        r"transforms\[0\] \(OneOf\)\.transforms must be a non-empty list",
    ),
    ("one of key", _doc({"__class_fullname__": "OneOf", "n": 2, "transforms": []}), r"\(OneOf\)\.n: not a OneOf key"),
    (
        "inside one of",
        _doc(
            {
                "__class_fullname__": "OneOf",
                "transforms": [
                    {"__class_fullname__": "HorizontalFlip"},
                    {"__class_fullname__": "Rotate", "limit": "x"},
                ],
            }
        ),
        r"aug\.json: transform\.transforms\[0\]\.transforms\[1\] \(Rotate\)\.limit",
    ),
]


@pytest.mark.parametrize(("case", "doc", "message"), BAD, ids=[c for c, _, _ in BAD])
def test_a_bad_document_is_a_config_error_naming_the_field(case: str, doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        pipeline_from_albumentations(doc, "aug.json")


def test_not_an_albumentations_document_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"aug\.json: not an albumentations document"):
        pipeline_from_albumentations({"mirror": "rc"}, "aug.json")


# ---------------------------------------------------------------- the albumentations engine


def test_the_engine_without_albumentations_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "albumentations", None)  # import albumentations now fails
    with pytest.raises(
        MissingExtraError, match=r"--augment-engine albumentations needs .*dlpack-datasets\[albumentations\]"
    ):
        AlbumentationsEngine(_doc({"__class_fullname__": "HorizontalFlip"}))


def test_the_engine_refuses_a_document_that_is_not_albumentations() -> None:
    with pytest.raises(
        ConfigError, match=r"aug\.yaml: --augment-engine albumentations needs an albumentations document"
    ):
        AlbumentationsEngine({"mirror": "rc"}, "aug.yaml")


def _engine_doc(A: Any) -> dict[str, Any]:
    compose = A.Compose(
        [
            A.HorizontalFlip(p=0.5),
            A.Affine(rotate=(-20, 20), translate_percent=(-0.1, 0.1), p=0.8),
            A.RandomBrightnessContrast(p=0.5),
            A.CoarseDropout(num_holes_range=(1, 2), hole_height_range=(4, 6), hole_width_range=(4, 6), p=0.5),
        ],
        bbox_params=A.BboxParams(format="coco", label_fields=["category_ids"], min_visibility=0.2),
    )
    doc: dict[str, Any] = A.to_dict(compose)
    return doc


def test_the_engine_is_seeded_per_variant(A: Any) -> None:
    engine = AlbumentationsEngine(_engine_doc(A), "aug.json")
    assert AlbumentationsEngine.engine == "albumentations" and engine.to_dict()["engine"] == "albumentations"
    t = _targets()
    out, record = engine(t, variant_rng(1, 2, 3))
    again, record2 = engine(t, variant_rng(1, 2, 3))
    assert record == record2 and np.array_equal(out.image, again.image)
    assert np.array_equal(out.boxes, again.boxes) and np.array_equal(out.mask, again.mask)
    others = [engine(t, variant_rng(1, 2, v))[0].image for v in range(4, 9)]
    assert any(not np.array_equal(out.image, o) for o in others)
    assert record[0]["op"] == "albumentations" and isinstance(record[0]["seed"], int)
    assert {r["op"] for r in record[1:]} <= {"HorizontalFlip", "Affine", "RandomBrightnessContrast", "CoarseDropout"}
    json.dumps(record)
    # Boxes keep their labels and crowd flags; the shapes stay those of the input.
    assert out.boxes is not None and out.box_labels is not None and out.box_crowd is not None
    assert len(out.boxes) == len(out.box_labels) == len(out.box_crowd)
    assert set(out.box_labels.tolist()) <= {1, 3, 4} and out.box_labels.dtype == np.int32
    assert out.image.shape == t.image.shape and out.mask is not None and out.mask.shape == (40, 48)


def test_the_engine_is_the_same_after_pickling(A: Any) -> None:
    engine = AlbumentationsEngine(_engine_doc(A))
    t = _targets(1)
    before = engine(t, variant_rng(0, 5, 1))
    copied = pickle.loads(pickle.dumps(engine))  # what a worker process receives
    after = copied(t, variant_rng(0, 5, 1))
    assert before[1] == after[1] and np.array_equal(before[0].image, after[0].image)
    assert before[0].image.shape == (40, 48, 1)


def test_the_engine_does_not_change_the_users_document(A: Any) -> None:
    doc = _engine_doc(A)
    kept = copy.deepcopy(doc)
    engine = AlbumentationsEngine(doc)
    engine(_targets(), variant_rng(0, 0, 1))
    assert doc == kept and engine.to_dict()["document"] == json.loads(json.dumps(kept))
