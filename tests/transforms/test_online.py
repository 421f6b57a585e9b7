"""The loader's online layer: seeded per (seed, index, epoch), in place on a batch, labels following."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from dlpack.errors import OptionError
from dlpack.ragged import RaggedBatch
from dlpack.transforms.online import OnlineAugment, online_uniforms

ALL = OnlineAugment(hflip=True, vflip=True, rot90=True, brightness=0.2, contrast=0.3)


def _batch(indices: list[int], w: int = 16, h: int = 16, dtype: Any = np.uint8, channels: int = 3) -> dict[str, Any]:
    """A batch whose sample ``i`` is a seeded image with one box per ``i % 3 + 1`` drawn into it
    (bright pixels) and into its mask (value 1 + box number)."""
    top = np.iinfo(dtype).max
    images, masks, boxes = [], [], []
    for i in indices:
        rng = np.random.default_rng(i)
        img = rng.integers(0, top // 4, (h, w, channels), dtype=dtype, endpoint=True)
        mask = np.zeros((h, w), np.uint8)
        own = []
        for k in range(i % 3 + 1):
            x0, y0 = int(rng.integers(0, w - 5)), int(rng.integers(0, h - 5))
            x1, y1 = x0 + int(rng.integers(2, 5)), y0 + int(rng.integers(2, 5))
            own.append([x0, y0, x1, y1])
            mask[y0:y1, x0:x1] = 1 + k
        img[mask > 0] = top
        images.append(img)
        masks.append(mask)
        boxes.append(np.array(own, np.float32))
    counts = [len(b) for b in boxes]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    labels = np.concatenate([np.arange(c, dtype=np.int32) for c in counts])
    return {
        "image": np.stack(images),
        "mask": np.stack(masks),
        "index": np.array(indices, np.int64),
        "boxes": RaggedBatch(np.concatenate(boxes), offsets),
        "box_labels": RaggedBatch(labels, offsets),
    }


def _by_index(batch: dict[str, Any]) -> dict[int, tuple[bytes, bytes, bytes]]:
    return {
        int(i): (batch["image"][j].tobytes(), batch["mask"][j].tobytes(), batch["boxes"][j].tobytes())
        for j, i in enumerate(batch["index"])
    }


def test_the_result_of_a_sample_does_not_depend_on_its_batch() -> None:
    indices = [9, 2, 31, 4, 17, 8, 5, 40]
    whole = ALL.apply_batch(_batch(indices), seed=3, epoch=2)
    parts: dict[int, tuple[bytes, bytes, bytes]] = {}
    for split in ([40, 5], [17, 9, 2], [8, 31, 4]):
        parts |= _by_index(ALL.apply_batch(_batch(split), seed=3, epoch=2))
    assert parts == _by_index(whole)


def test_the_result_depends_on_the_seed_and_the_epoch() -> None:
    indices = list(range(16))
    base = _by_index(ALL.apply_batch(_batch(indices), seed=3, epoch=2))
    assert _by_index(ALL.apply_batch(_batch(indices), seed=3, epoch=2)) == base
    assert _by_index(ALL.apply_batch(_batch(indices), seed=3, epoch=3)) != base
    assert _by_index(ALL.apply_batch(_batch(indices), seed=4, epoch=2)) != base


def test_the_draws_of_a_row_are_the_same_in_any_batch() -> None:
    alone = online_uniforms(7, 1, np.array([5]))
    among = online_uniforms(7, 1, np.array([1, 5, 9]))
    assert np.array_equal(alone[0], among[1])
    assert among.shape == (3, 5) and (among >= 0).all() and (among < 1).all()
    assert not np.array_equal(among[0], among[2])


def test_apply_batch_works_in_place() -> None:
    batch = _batch([1, 2, 3, 4])
    images = batch["image"]
    out = ALL.apply_batch(batch, seed=0, epoch=0)
    assert out is batch and out["image"] is images


def _bbox(on: np.ndarray) -> list[float]:
    ys, xs = np.nonzero(on)
    return [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]


def _orientation(before: np.ndarray, after: np.ndarray) -> Any:
    """The flip or turn that takes ``before`` to ``after`` (the images are noise: only one does)."""
    found = [f for f in _ORIENTATIONS if np.array_equal(f(before), after)]
    assert len(found) == 1
    return found[0]


_ORIENTATIONS = [
    (lambda a, k=k, flip=flip: np.rot90(a, k)[:, ::-1] if flip else np.rot90(a, k)) for k in range(4) for flip in (0, 1)
]


@pytest.mark.parametrize(
    "layer", [OnlineAugment(), OnlineAugment(vflip=True), OnlineAugment(hflip=True, vflip=True, rot90=True)]
)
def test_boxes_and_masks_follow_the_flips_and_turns(layer: OnlineAugment) -> None:
    indices = list(range(24))
    before = _batch(indices)
    after = layer.apply_batch(_batch(indices), seed=1, epoch=0)
    for j in range(len(indices)):
        move = _orientation(before["image"][j], after["image"][j])
        assert np.array_equal(after["mask"][j], move(before["mask"][j]))
        assert len(after["boxes"][j]) == len(before["boxes"][j])
        for old, new in zip(before["boxes"][j], after["boxes"][j], strict=True):
            x0, y0, x1, y1 = old.astype(int)
            own = np.zeros((16, 16), bool)
            own[y0:y1, x0:x1] = True
            assert _bbox(move(own)) == new.tolist()
    assert after["box_labels"] == before["box_labels"]  # labels are unchanged


def test_pixel_jitter_leaves_the_geometry_draws_as_they_were() -> None:
    indices = list(range(24))
    geometric = OnlineAugment(hflip=True, vflip=True, rot90=True).apply_batch(_batch(indices), seed=1, epoch=0)
    everything = ALL.apply_batch(_batch(indices), seed=1, epoch=0)
    assert np.array_equal(everything["mask"], geometric["mask"])
    assert everything["boxes"] == geometric["boxes"]
    assert not np.array_equal(everything["image"], geometric["image"])


def test_every_flip_and_turn_is_drawn() -> None:
    layer = OnlineAugment(hflip=True, vflip=True, rot90=True)
    indices = list(range(400))
    before = _batch(indices)
    after = layer.apply_batch(_batch(indices), seed=0, epoch=0)
    seen = set()
    for j in range(len(indices)):
        seen.add(_ORIENTATIONS.index(_orientation(before["image"][j], after["image"][j])))
    assert len(seen) == 8  # the eight symmetries of a square


def test_hflip_alone_flips_about_half_of_the_samples() -> None:
    indices = list(range(2000))
    before = _batch(indices, w=8, h=8)
    after = OnlineAugment().apply_batch(_batch(indices, w=8, h=8), seed=5, epoch=1)
    flipped = [np.array_equal(after["image"][j], before["image"][j][:, ::-1]) for j in range(len(indices))]
    same = [np.array_equal(after["image"][j], before["image"][j]) for j in range(len(indices))]
    assert all(f or s for f, s in zip(flipped, same, strict=True))
    assert abs(np.mean(flipped) - 0.5) < 0.05


def test_rot90_is_skipped_for_non_square_images() -> None:
    layer = OnlineAugment(hflip=False, rot90=True)
    batch = _batch(list(range(40)), w=20, h=12)
    before = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in batch.items()}
    layer.apply_batch(batch, seed=0, epoch=0)
    assert np.array_equal(batch["image"], before["image"]) and np.array_equal(batch["mask"], before["mask"])
    assert batch["boxes"] == before["boxes"]


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("channels", [1, 3])
def test_brightness_jitter_is_a_share_of_the_dtype_range(dtype: Any, channels: int) -> None:
    top = int(np.iinfo(dtype).max)
    flat = {"image": np.full((300, 4, 4, channels), top // 2, dtype), "index": np.arange(300)}
    OnlineAugment(hflip=False, brightness=0.1).apply_batch(flat, seed=0, epoch=0)
    values = flat["image"].reshape(300, -1).astype(np.int64)
    assert (values == values[:, :1]).all()  # one offset per image
    shift = values[:, 0] - top // 2
    assert np.abs(shift).max() <= round(0.1 * top) and shift.min() < -0.08 * top and shift.max() > 0.08 * top


def test_contrast_jitter_scales_about_the_mean() -> None:
    img = np.zeros((200, 2, 2, 1), np.uint8)
    img[:, 0, :, 0], img[:, 1, :, 0] = 80, 120  # mean 100
    batch = {"image": img, "index": np.arange(200)}
    OnlineAugment(hflip=False, contrast=0.5).apply_batch(batch, seed=2, epoch=0)
    lo, hi = batch["image"][:, 0, 0, 0].astype(int), batch["image"][:, 1, 0, 0].astype(int)
    assert (np.abs(lo + hi - 200) <= 1).all()
    spread = hi - lo
    assert spread.min() >= 19 and spread.max() <= 61 and spread.min() < 26 and spread.max() > 54


def test_a_list_of_images_is_refused() -> None:
    batch = {"image": [np.zeros((4, 4, 3), np.uint8), np.zeros((5, 4, 3), np.uint8)], "index": np.arange(2)}
    with pytest.raises(OptionError, match="one image size.*--size"):
        OnlineAugment().apply_batch(batch, seed=0, epoch=0)


def test_boxes_as_a_list_of_arrays_follow_too() -> None:
    batch = _batch(list(range(12)))
    ragged = batch["boxes"]
    batch["boxes"] = list(ragged)
    twin = _batch(list(range(12)))
    OnlineAugment(vflip=True).apply_batch(batch, seed=0, epoch=0)
    OnlineAugment(vflip=True).apply_batch(twin, seed=0, epoch=0)
    assert twin["boxes"] == batch["boxes"]


def test_from_value_and_to_dict() -> None:
    assert OnlineAugment.from_value(True) == OnlineAugment()
    assert OnlineAugment.from_value(None) is None and OnlineAugment.from_value(False) is None
    assert OnlineAugment.from_value(ALL) is ALL
    assert OnlineAugment.from_value({"vflip": True, "brightness": 0.1}) == OnlineAugment(vflip=True, brightness=0.1)
    d = json.loads(json.dumps(ALL.to_dict()))
    assert d == {"hflip": True, "vflip": True, "rot90": True, "brightness": 0.2, "contrast": 0.3}
    assert OnlineAugment.from_value(d) == ALL


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ({"hfilp": True}, "no option 'hfilp'; its options: hflip, vflip, rot90, brightness, contrast"),
        ({"hflip": 1}, "online.hflip must be true or false"),
        ({"brightness": 2}, r"online.brightness must be a number in 0\.\.1"),
        ({"contrast": "x"}, r"online.contrast must be a number in 0\.\.1"),
        ("yes", "online must be true, a dict"),
    ],
)
def test_bad_online_options_are_option_errors(value: Any, match: str) -> None:
    with pytest.raises(OptionError, match=match):
        OnlineAugment.from_value(value)
