"""The online layer: cheap seeded flips, quarter turns and brightness/contrast jitter on a batch.

A cached variant is reused once per cycle of K + 1 epochs; re-applying a cheap random layer on
every reuse multiplies the distinct views a model sees (docs/augment.md, "Online layer"). The
loader applies it on its reader threads, so it works in place on a whole batch: the draws of all
rows are one vectorised hash, each image that moves is one OpenCV flip or turn, and the boxes of
all rows that drew the same move are moved together.

What sample ``i`` gets in epoch ``e`` is a pure function of ``(seed, i, e)``, drawn by a hash of
those numbers (with this layer's own tag), never of the batch it is in, its position there, the
thread or the worker: a batch split any other way gives every sample the same result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import cv2
import numpy as np

from ..errors import OptionError
from ..ragged import RaggedBatch
from .geometric import flip_matrix, rot90_matrix, warp_boxes

__all__ = ["OnlineAugment", "online_uniforms"]

#: Keeps this layer's draws apart from the loader's and the variants' (which use other tags).
_ONLINE_TAG = 0x6F6E6C
_MASK64 = (1 << 64) - 1
#: The draws each sample gets: hflip, vflip, quarter turns, brightness, contrast (always all five,
#: so turning one option on or off leaves the others' draws as they were).
_DRAWS = 5


def _mix(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a bijection of uint64 that scatters every input bit."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


def online_uniforms(seed: int, epoch: int, indices: np.ndarray, n: int = _DRAWS) -> np.ndarray:
    """``len(indices) x n`` uniform numbers in [0, 1): row ``r`` a pure function of
    ``(seed, epoch, indices[r])``, computed for the whole batch at once."""
    golden = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        key = _mix(np.array([(int(seed) ^ _ONLINE_TAG) & _MASK64], np.uint64) + golden)
        key = _mix(key ^ np.uint64(int(epoch) & _MASK64) + golden)
        rows = np.asarray(indices).astype(np.int64).astype(np.uint64).reshape(-1, 1)
        key = _mix(key ^ rows + golden)
        z = _mix(key + golden * np.arange(1, n + 1, dtype=np.uint64))
    out: np.ndarray = (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return out


@dataclass(frozen=True)
class OnlineAugment:
    """Seeded per-epoch jitter for a loader batch (``ds.loader(..., online=...)``).

    Each enabled flip applies with probability 1/2; ``rot90`` turns by 0 to 3 quarter turns
    (uniformly), on square images only: a turn would change the canvas of a non-square image, so
    there it is skipped. ``brightness`` adds a uniform offset in ``[-b, b]`` times the dtype's
    largest value; ``contrast`` scales the distance from the image's mean by a uniform factor in
    ``[1 - c, 1 + c]``. Boxes and masks follow the flips and turns; labels are unchanged.
    """

    hflip: bool = True
    vflip: bool = False
    rot90: bool = False
    brightness: float = 0.0
    contrast: float = 0.0

    def __post_init__(self) -> None:
        for name in ("hflip", "vflip", "rot90"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(f"online.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("brightness", "contrast"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise OptionError(f"online.{name} must be a number in 0..1 (a share of the range), got {value!r}")

    @classmethod
    def from_value(cls, value: bool | Mapping[str, Any] | OnlineAugment | None) -> OnlineAugment | None:
        """``True``: the defaults; a mapping: those fields; an OnlineAugment: itself; ``None`` or
        ``False``: no online layer (None)."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, OnlineAugment):
            return value
        if isinstance(value, Mapping):
            names = [f.name for f in fields(cls)]
            unknown = sorted(str(k) for k in value if k not in names)
            if unknown:
                raise OptionError(f"online has no option {unknown[0]!r}; its options: {', '.join(names)}")
            return cls(**dict(value))
        raise OptionError(
            f"online must be true, a dict of {', '.join(f.name for f in fields(cls))}, or an OnlineAugment; got {value!r}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (what a loader state records); :meth:`from_value` reads it back."""
        return asdict(self)

    def apply_batch(self, batch: dict[str, Any], seed: int, epoch: int) -> dict[str, Any]:
        """Apply to a loader batch in place and return it.

        ``batch["image"]`` is B x H x W x C (a list, from a variable-size store, is an
        OptionError), ``batch["index"]`` the sample indices; ``"mask"`` (B x H x W) and ``"boxes"``
        (a :class:`~dlpack.ragged.RaggedBatch` or a list of k x 4 arrays) follow the geometry.
        """
        images = batch.get("image")
        if not isinstance(images, np.ndarray) or images.ndim != 4:
            raise OptionError(
                "the online layer works on batches of one image size (B x H x W x C); this store's images "
                "differ in size: rebuild it with --size"
            )
        index = np.asarray(batch["index"]).reshape(-1)
        if len(index) != len(images):
            raise OptionError(f"the batch has {len(images)} images and {len(index)} indices")
        u = online_uniforms(seed, epoch, index)
        h, w = images.shape[1:3]
        n = len(images)
        hflip = (u[:, 0] < 0.5) & self.hflip
        vflip = (u[:, 1] < 0.5) & self.vflip
        turns = np.minimum((u[:, 2] * 4).astype(np.int64), 3) if self.rot90 and w == h else np.zeros(n, np.int64)
        mask = batch.get("mask")
        moved = np.flatnonzero(hflip | vflip | (turns > 0))
        if len(moved):
            _move_pixels(images, moved, hflip, vflip, turns)
            if isinstance(mask, np.ndarray):
                _move_pixels(mask, moved, hflip, vflip, turns)
            if batch.get("boxes") is not None:
                steps = [(hflip, flip_matrix(w, h, True, False)), (vflip, flip_matrix(w, h, False, True))]
                steps += [(turns == k, rot90_matrix(w, h, k)) for k in (1, 2, 3)]
                for rows, m in steps:
                    if rows.any():
                        batch["boxes"] = _move_boxes(batch["boxes"], rows, m, w, h)
        if self.brightness or self.contrast:
            offsets = (2.0 * u[:, 3] - 1.0) * self.brightness
            factors = 1.0 + (2.0 * u[:, 4] - 1.0) * self.contrast
            _jitter(images, offsets, factors)
        return batch


#: OpenCV's flip codes by (left-right, top-bottom), and its turns by counter-clockwise quarter turns.
_FLIP_CODES = {(True, False): 1, (False, True): 0, (True, True): -1}
_TURN_CODES = {1: cv2.ROTATE_90_COUNTERCLOCKWISE, 2: cv2.ROTATE_180, 3: cv2.ROTATE_90_CLOCKWISE}


def _move_pixels(a: np.ndarray, rows: np.ndarray, hflip: np.ndarray, vflip: np.ndarray, turns: np.ndarray) -> None:
    """Mirror (left-right, then top-bottom) and turn (as :func:`numpy.rot90`) the given rows of a
    B x H x W (x C) array in place: one OpenCV call per operation and row (SIMD copies), NumPy for
    what OpenCV does not take (more than 4 channels)."""
    scratch = np.empty_like(a[0])
    with_cv = a.ndim == 3 or a.shape[3] <= 4
    for j in rows.tolist():
        src = a[j]
        plane = src[:, :, 0] if src.ndim == 3 and src.shape[2] == 1 else src  # OpenCV drops a channel axis of 1
        out = scratch[:, :, 0] if plane is not src else scratch
        flip = _FLIP_CODES.get((bool(hflip[j]), bool(vflip[j])))
        k = int(turns[j])
        if not with_cv:
            moved = src[:, ::-1] if hflip[j] else src
            moved = moved[::-1] if vflip[j] else moved
            a[j] = np.rot90(moved, k)
            continue
        if flip is not None:
            cv2.flip(plane, flip, dst=out)
            plane[...] = out
        if k:
            cv2.rotate(plane, _TURN_CODES[k], dst=out)
            plane[...] = out


def _move_boxes(boxes: Any, rows: np.ndarray, m: np.ndarray, w: int, h: int) -> Any:
    """The boxes of the selected rows moved by ``m`` (a flip or turn, which keeps every box whole)."""
    if isinstance(boxes, RaggedBatch):
        owner = np.repeat(rows, boxes.counts())
        data = np.array(boxes.data, dtype=np.float32, copy=True)
        if owner.any():
            data[owner] = warp_boxes(data[owner], m, w, h)[0]
        return RaggedBatch(data, boxes.offsets)
    if isinstance(boxes, Sequence):
        return [warp_boxes(b, m, w, h)[0] if rows[j] else b for j, b in enumerate(boxes)]
    raise OptionError(f"batch['boxes'] must be a RaggedBatch or a list of arrays, got {type(boxes).__name__}")


def _jitter(images: np.ndarray, offsets: np.ndarray, factors: np.ndarray) -> None:
    """``(x - mean) * factor + mean + offset * top`` per image, rounded and saturated, in place:
    one OpenCV pass per image (``addWeighted``), NumPy for more than 4 channels."""
    if images.dtype not in (np.uint8, np.uint16):
        raise OptionError(
            f"the online layer's brightness and contrast work on uint8 and uint16 images, got {images.dtype}"
        )
    top = float(np.iinfo(images.dtype).max)
    channels = images.shape[3]
    scratch = np.empty_like(images[0])
    for j in range(len(images)):
        f, b = float(factors[j]), float(offsets[j]) * top
        if f == 1.0 and b == 0.0:
            continue
        src = images[j]
        plane = src[:, :, 0] if channels == 1 else src  # OpenCV drops a channel axis of 1
        out = scratch[:, :, 0] if channels == 1 else scratch
        if channels > 4:
            mean = float(src.mean()) if f != 1.0 else 0.0
            src[...] = np.clip(np.rint((src.astype(np.float32) - mean) * f + mean + b), 0.0, top)
            continue
        mean = float(np.mean(cv2.mean(plane)[:channels])) if f != 1.0 else 0.0
        cv2.addWeighted(plane, f, plane, 0.0, mean * (1.0 - f) + b, dst=out)
        plane[...] = out
