"""HALCON batches of DLSample dicts from a store, read ahead by the loader (``dlpack.halcon``).

HALCON's own ``train_dl_model`` reads one sample file per image, one after another, on the
training thread. A Python loop that calls ``train_dl_model_batch(model, batch)`` itself can be fed
from dlpack's prefetching loader instead: :func:`sample_batches` turns each loader batch into a
list of DLSample dicts under HALCON's keys. The mapping (:func:`to_dlsample`) is a pure function
that needs no HALCON; only building the HALCON dicts needs the ``halcon`` module, which is the
``[halcon]`` extra and works only next to a native HALCON install with a licence.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from .. import schema
from ..errors import MissingExtraError, OptionError, StoreError
from ..timing import EpochStats

__all__ = [
    "DEFAULT_IMAGE_RANGE",
    "TASKS",
    "SampleBatches",
    "import_halcon",
    "sample_batches",
    "scale_image",
    "store_class_ids",
    "store_task",
    "to_dlsample",
    "to_halcon_dict",
    "unbatch",
]

#: HALCON's default ``image_range_min`` / ``image_range_max``: 8-bit 0..255 becomes -127..128.
DEFAULT_IMAGE_RANGE = (-127.0, 128.0)
TASKS = schema.TASKS
#: The stored array each task's labels come from (the loader's key for it).
_TASK_ARRAYS = {"detection": ("boxes", "box_labels"), "segmentation": ("mask",)}
#: Class names that mean "ok" in an anomaly store; any other class is "nok".
_OK_NAMES = ("ok", "good")
#: Largest value of each stored image dtype: the top of the range mapped to ``image_range``.
_DTYPE_MAX = {np.dtype(np.uint8): 255.0, np.dtype(np.uint16): 65535.0}


def store_task(manifest: Any) -> str:
    """The store's task (:func:`dlpack.schema.store_task`: the manifest's ``task``, or its arrays)."""
    task = getattr(manifest, "task", None)
    if task and task not in TASKS:
        raise StoreError(f"the store's manifest names task {task!r}; dlpack knows {', '.join(TASKS)}")
    classes = tuple(getattr(manifest, "classes", ()))
    return schema.store_task(getattr(manifest, "arrays", {}), classes, getattr(manifest, "labels", "") != "none", task)


def store_class_ids(manifest: Any) -> tuple[int, ...]:
    """HALCON's id of each class: the manifest's ``class_ids`` when present, else 0..C-1."""
    classes = tuple(getattr(manifest, "classes", ()))
    ids = tuple(int(i) for i in (getattr(manifest, "class_ids", None) or ()))
    if not ids:
        return tuple(range(len(classes)))
    if len(ids) != len(classes):
        raise StoreError(f"the store's manifest lists {len(ids)} class_ids for {len(classes)} classes")
    return ids


def _check_range(image_range: Sequence[float]) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in image_range)
    except (TypeError, ValueError):
        raise OptionError(f"image_range must be two numbers (min, max), got {image_range!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise OptionError(f"image_range must be two finite numbers with min < max, got {image_range!r}")
    return lo, hi


def scale_image(image: np.ndarray, image_range: Sequence[float] = DEFAULT_IMAGE_RANGE) -> np.ndarray:
    """``image`` as float32, its dtype's range (0..255, 0..65535) mapped linearly onto ``image_range``.

    HALCON's networks take real images in ``image_range_min..image_range_max`` (-127..128 by
    default); it has no float64 images, so the result is float32.
    """
    lo, hi = _check_range(image_range)
    top = _DTYPE_MAX.get(np.asarray(image).dtype)
    if top is None:
        raise OptionError(
            f"images of dtype {np.asarray(image).dtype} have no known range; dlpack stores uint8 or uint16"
        )
    out: np.ndarray = np.asarray(image, dtype=np.float32) * np.float32((hi - lo) / top)
    out += np.float32(lo)
    return out


def _class_id(index: int, class_ids: Sequence[int], what: str) -> int:
    if not 0 <= index < len(class_ids):
        raise StoreError(f"{what} is class index {index}, outside the store's {len(class_ids)} classes")
    return int(class_ids[index])


def to_dlsample(
    sample: dict[str, Any],
    task: str,
    class_ids: Sequence[int],
    image_range: Sequence[float] = DEFAULT_IMAGE_RANGE,
    *,
    classes: Sequence[str] = (),
) -> dict[str, Any]:
    """One store sample (``ds[i]``, or one row of a batch) as a DLSample under HALCON's keys.

    Values are builtin ``int``/``float``/``str`` or lists of them (what the HALCON binding
    accepts), except the iconic entries (``image``, ``segmentation_image``,
    ``anomaly_ground_truth``), which are NumPy arrays to become HALCON images. Boxes become
    HALCON's pixel-centred, rows-first coordinates: ``row1 = y_min - 0.5``, ``col1 = x_min - 0.5``,
    ``row2 = y_max - 0.5``, ``col2 = x_max - 0.5``. ``classes`` (the store's class names) tells
    an anomaly sample's ``ok`` from ``nok``; without it class id 0 means ok, as in HALCON.
    """
    if task not in TASKS:
        raise OptionError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    index = int(sample["index"])
    out: dict[str, Any] = {"image_id": index, "image": scale_image(sample["image"], image_range)}
    label = int(sample.get("label", -1))
    where = f"sample {index}"
    if task == "classification":
        if label >= 0:
            out["image_label_id"] = _class_id(label, class_ids, f"{where}'s label")
    elif task == "detection":
        boxes = np.asarray(sample["boxes"], dtype=np.float64).reshape(-1, 4)
        box_labels = np.asarray(sample["box_labels"]).reshape(-1)
        if len(box_labels) != len(boxes):
            raise StoreError(f"{where} has {len(boxes)} boxes but {len(box_labels)} box labels")
        out["bbox_label_id"] = [_class_id(int(k), class_ids, f"a box label of {where}") for k in box_labels]
        for key, column in (("bbox_row1", 1), ("bbox_col1", 0), ("bbox_row2", 3), ("bbox_col2", 2)):
            out[key] = [float(v) - 0.5 for v in boxes[:, column]]
    elif task == "segmentation":
        out["segmentation_image"] = np.ascontiguousarray(sample["mask"])
    elif task == "anomaly":
        if label >= 0 and classes:
            ok = classes[label] in _OK_NAMES
        else:
            ok = label < 0 or _class_id(label, class_ids, f"{where}'s label") == 0
        out["anomaly_label"] = "ok" if ok else "nok"
        if sample.get("mask") is not None:
            out["anomaly_ground_truth"] = np.ascontiguousarray(sample["mask"])
    return out


def unbatch(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """A loader batch as one dict per sample (row ``i`` of every array or list)."""
    n = len(batch["index"])
    return [{key: value[i] for key, value in batch.items()} for i in range(n)]


def import_halcon() -> Any:
    """The ``halcon`` module, or :class:`~dlpack.MissingExtraError` saying what it needs."""
    try:
        import halcon
    except Exception as exc:  # the binding raises more than ImportError when libhalcon is missing
        raise MissingExtraError(
            "halcon",
            "halcon",
            "dlpack.halcon",
            "the binding (mvtec-halcon) also needs a native HALCON installation with a licence on this machine: "
            f"without one `import halcon` fails ({type(exc).__name__}: {exc})",
        ) from exc
    return halcon


def to_halcon_dict(ha: Any, dlsample: dict[str, Any]) -> Any:
    """A :func:`to_dlsample` result as a HALCON dict: arrays as images, the rest as tuples."""
    d = ha.create_dict()
    for key, value in dlsample.items():
        if isinstance(value, np.ndarray):
            ha.set_dict_object(ha.himage_from_numpy_array(value), d, key)
        else:
            ha.set_dict_tuple(d, key, value)
    return d


def sample_batches(
    ds: Any,
    batch_size: int,
    *,
    split: str | None = None,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    prefetch: int = 4,
    workers: int = 2,
    drop_last: bool = False,
    image_range: Sequence[float] = DEFAULT_IMAGE_RANGE,
    as_halcon: bool = True,
    halcon: Any = None,
    augment: str | None = None,
    original_rate: float | None = None,
    views_per_batch: int = 1,
    online: Any = None,
    report: bool = False,
) -> SampleBatches:
    """One epoch of a store as lists of DLSample dicts, for ``train_dl_model_batch(model, batch)``.

    ``ds`` is a :class:`~dlpack.Dataset` or a store path. The batches come from ``ds.loader``
    (``prefetch`` batches read ahead on ``workers`` threads, the order drawn from ``seed`` and
    ``epoch``), so reading overlaps the training step. With ``as_halcon`` each sample is a
    HALCON dict (``halcon`` is the module to use; None imports it); otherwise the plain dicts
    of :func:`to_dlsample`. Images are float32, scaled to ``image_range``; the store's image size
    must be the model's input size (HALCON's preprocessing is not applied).

    ``augment``, ``original_rate``, ``views_per_batch`` and ``online`` are the loader's
    (docs/loader.md, "Cached augmentation views"): with ``augment="cached"`` each DLSample is the
    view its schedule picks for ``epoch``, its boxes and label image that view's, and its
    ``variant`` entry says which (0 the original); ``image_id`` stays the sample's index.
    ``original_rate`` is HALCON's ``augmentation_percentage`` turned around: ``1 - percentage / 100``.

    The result iterates like a generator (``close()`` ends it early) and keeps the loader's
    statistics: ``batches.stats()[-1].line()`` says how long the training loop waited for data
    (``report=True`` prints that line when the epoch ends).
    """
    from ..read.dataset import Dataset

    if not isinstance(ds, Dataset):
        if not isinstance(ds, (str, os.PathLike)):
            raise OptionError(f"sample_batches reads a dlpack.Dataset or a store path, got {type(ds).__name__}")
        ds = Dataset(ds)
    image_range = _check_range(image_range)
    ha = (halcon if halcon is not None else import_halcon()) if as_halcon else None
    manifest = ds.manifest
    task = store_task(manifest)
    class_ids = store_class_ids(manifest)
    keys = {spec.key for spec in manifest.arrays.values() if spec.key}
    missing = [name for name in _TASK_ARRAYS.get(task, ()) if name not in keys]
    if missing:
        raise StoreError(f"store {ds.path} is a {task} store but has no {', '.join(missing)} array; rebuild it")
    mapping = functools.partial(
        _map_batch, task=task, class_ids=class_ids, image_range=image_range, classes=tuple(ds.classes)
    )
    loader = ds.loader(
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        prefetch=prefetch,
        workers=workers,
        drop_last=drop_last,
        split=split,
        transform=mapping,  # scaling runs on the reader threads, ahead of the training step
        augment=augment,
        original_rate=original_rate,
        views_per_batch=views_per_batch,
        online=online,
        report=report,
    )
    loader.set_epoch(epoch)
    return SampleBatches(loader, ha)


def _map_batch(batch: dict[str, Any], **mapping: Any) -> dict[str, Any]:
    """A loader batch as its DLSamples (the loader's ``transform``); a cached view's DLSample
    carries its ``variant``."""
    samples = [to_dlsample(s, **mapping) for s in unbatch(batch)]
    if "variant" in batch:
        for d, v in zip(samples, batch["variant"].tolist(), strict=True):
            d["variant"] = int(v)
    return {"index": batch["index"], "dlsamples": samples}


class SampleBatches:
    """One epoch of DLSample lists (what :func:`sample_batches` returns): an iterator, as the
    generator it was, plus the loader's per-epoch statistics (:meth:`stats`)."""

    def __init__(self, loader: Any, ha: Any) -> None:
        #: The :class:`~dlpack.Loader` that reads the batches (its ``transform`` makes the DLSamples).
        self.loader = loader
        self._gen = self._batches(ha)

    def _batches(self, ha: Any) -> Generator[list[Any], None, None]:
        # HALCON dicts are made here, on the caller's thread: the binding's thread rules are not dlpack's to
        # assume. The loader's wait therefore leaves them out: they are part of the caller's step.
        try:
            for batch in self.loader:
                samples = batch["dlsamples"]
                yield samples if ha is None else [to_halcon_dict(ha, s) for s in samples]
        finally:
            self.loader.close()

    def __iter__(self) -> SampleBatches:
        return self

    def __next__(self) -> list[Any]:
        return next(self._gen)

    def close(self) -> None:
        """Stop the epoch early (its statistics are kept, marked partial)."""
        self._gen.close()

    def stats(self) -> list[EpochStats]:
        """The loader's :class:`~dlpack.EpochStats`, one per pass (``loader.stats()``): the share of
        the time the training loop waited for data, its p50/p99 per batch, images/s and bytes/s."""
        stats: list[EpochStats] = self.loader.stats()
        return stats
