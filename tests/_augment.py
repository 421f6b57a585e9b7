"""Test helper: a tiny augmentation pipeline of test-local operations, and stores to augment.

The operations are exact (a left-right flip and a brightness offset), so a test can say where
every pixel, box and mask value of a variant must be. ``install_loader`` puts a stand-in
``dlpack.transforms.config`` in ``sys.modules`` whose ``load_config`` reads this helper's own JSON
(``{"flip": P, "brightness": B}``), so the CLI and ``build --augment`` can be run with a config
file whatever config readers this checkout has.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

import dlpack
from dlpack.transforms import geometric
from dlpack.transforms.base import REGISTRY, Pipeline, Targets, Transform, register


@dataclass(frozen=True)
class StoreFlip(Transform):
    """Mirror left-right with probability ``p``: image, mask and boxes (x -> W - x)."""

    name: ClassVar[str] = "TestStoreFlip"
    geometric: ClassVar[bool] = True
    p: float = 0.5

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        w = t.shape[1]
        img = geometric.hflip(t.image)
        mask = None if t.mask is None else geometric.hflip(t.mask)
        if t.boxes is None:
            return t.replace(image=img, mask=mask)
        b = t.boxes.copy()
        b[:, 0], b[:, 2] = w - t.boxes[:, 2], w - t.boxes[:, 0]
        return t.moved(b, np.ones(len(b)), image=img, mask=mask)


@dataclass(frozen=True)
class StoreBrightness(Transform):
    """Add an integer offset drawn from ``-limit .. limit`` (saturating); labels unchanged."""

    name: ClassVar[str] = "TestStoreBrightness"
    p: float = 0.5
    limit: int = 40

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        return {"offset": int(rng.integers(-self.limit, self.limit + 1))}

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        top = np.iinfo(t.image.dtype).max
        img = np.clip(t.image.astype(np.int64) + int(params["offset"]), 0, top).astype(t.image.dtype)
        return t.replace(image=img)


for _op in (StoreFlip, StoreBrightness):
    if _op.name not in REGISTRY:
        register(_op)


@dataclass(frozen=True)
class Config:
    """What ``dlpack.augment`` takes for a loaded config: an augmenter, the manifest's record, the operations."""

    augmenter: Any
    text: str = "{}"
    name: str = "test.json"

    def manifest_record(self) -> dict[str, Any]:
        return {"kind": "albumentations", "format": "json", "text": self.text, "name": self.name}

    def operations(self) -> Any:
        return self.augmenter.to_dict()


def pipeline(flip: float = 0.5, brightness: float = 0.5) -> Pipeline:
    return Pipeline((StoreFlip(p=flip), StoreBrightness(p=brightness)))


def config(flip: float = 0.5, brightness: float = 0.5) -> Config:
    return Config(pipeline(flip, brightness), json.dumps({"flip": flip, "brightness": brightness}))


def load_config(path: str | Path, *, engine: str = "dlpack", task: str | None = None) -> Config:
    """The stand-in config reader: ``{"flip": P, "brightness": B}``."""
    text = Path(path).read_text(encoding="utf-8")
    doc = json.loads(text)
    return Config(pipeline(float(doc["flip"]), float(doc["brightness"])), text, Path(path).name)


def install_loader(setitem: Callable[[Any, str, Any], None] | None = None) -> None:
    """Make ``dlpack.transforms.config.load_config`` this helper's (``setitem``: a monkeypatch's)."""
    module = types.ModuleType("dlpack.transforms.config")
    module.load_config = load_config  # type: ignore[attr-defined]
    if setitem is None:
        sys.modules[module.__name__] = module
    else:
        setitem(sys.modules, module.__name__, module)


def write_config(path: Path, flip: float = 0.5, brightness: float = 0.5) -> Path:
    path.write_text(json.dumps({"flip": flip, "brightness": brightness}), encoding="utf-8")
    return path


#: 40 noise PNGs of 48x32: at 48x32x3 (4.5 KiB) in 64 KiB shards, 14 images a block, 3 blocks.
N_IMAGES, WIDTH, HEIGHT = 40, 48, 32


def detection_store(make_tree: Callable[..., Path], tmp_path: Path, name: str, **options: Any) -> Path:
    """A detection store (boxes, box labels, crowd flags, a polygon mask) of :data:`N_IMAGES` images."""
    src = make_tree({f"img/{k:03d}.png": ("rgb", WIDTH, HEIGHT) for k in range(N_IMAGES)}, f"src-{name}")
    images = [{"id": k + 1, "file_name": f"img/{k:03d}.png", "width": WIDTH, "height": HEIGHT} for k in range(N_IMAGES)]
    annotations = [
        {
            "id": len(images) * j + k + 1,
            "image_id": k + 1,
            "category_id": 1 + (k + j) % 2,
            "bbox": [2.0 + k % 7 + 20 * j, 4.0, 12.0, 10.0 + j],
            "area": 120.0,
            "iscrowd": int((k + j) % 3 == 0),
            "segmentation": [[2.0 + k % 7 + 20 * j, 4.0, 14.0 + k % 7 + 20 * j, 4.0, 14.0 + k % 7 + 20 * j, 14.0 + j,
                              2.0 + k % 7 + 20 * j, 14.0 + j]],
        }
        for k in range(N_IMAGES)
        for j in range(k % 3)  # 0, 1 or 2 boxes
    ]  # fmt: skip
    categories = [{"id": 1, "name": "scratch"}, {"id": 2, "name": "spot"}]
    coco = src.parent / f"coco-{name}.json"
    coco.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    out = tmp_path / name
    dlpack.build(src, out, labels=f"coco:{coco}", quiet=True, jobs=1, shard_bytes=2**16, **options)
    return out


def classification_store(make_tree: Callable[..., Path], tmp_path: Path, name: str, **options: Any) -> Path:
    src = make_tree({f"c{k % 2}/{k:03d}.png": ("rgb", WIDTH, HEIGHT) for k in range(N_IMAGES)}, f"src-{name}")
    out = tmp_path / name
    dlpack.build(src, out, quiet=True, jobs=1, shard_bytes=2**16, **options)
    return out


def content(store: Path) -> dict[str, Any]:
    """What a reader sees of a store: its manifest and every array's bytes (ragged ones per sample)."""
    with dlpack.open(store) as ds:
        r = ds.reader
        arrays = {
            name: [r.read(name, i).tobytes() for i in range(len(ds))]
            if spec.ragged
            else np.ascontiguousarray(r.read_all(name) if r._small(spec) else _whole(r, name, len(ds))).tobytes()
            for name, spec in r.arrays.items()
        }
        return {"manifest": json.loads(r.manifest.to_json()), "arrays": arrays}


def _whole(reader: Any, name: str, n: int) -> np.ndarray:
    spec = reader.spec(name)
    out = np.empty((n, *spec.shape), dtype=spec.dtype)
    return np.asarray(reader.read_into(name, list(range(n)), out))
