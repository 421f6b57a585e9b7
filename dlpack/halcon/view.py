"""A HALCON DLDataset opened read-only: its files decoded on the fly, as a :class:`~dlpack.read.loader.BatchSource`.

``dlpack.open`` returns a :class:`DLDatasetView` for a folder holding ``dataset.json`` or for a
``.json`` file that is a DLDataset, so a HALCON user can look at an existing set, feed it to a
loader and measure it (``dlpack bench``) before packing it. Nothing is written; every access
reads and decodes the image file, which is exactly the cost a packed store removes.

Samples are what a store's samples are: ``image``, ``label`` (index into :attr:`classes`, -1
none), ``index``, ``source`` (the path relative to the image folder), ``split`` (the name or
None) and, by task, ``boxes`` (``[k, 4]`` float32, corner-based ``x_min, y_min, x_max, y_max``)
and ``box_labels`` (``[k]`` int32, indices into :attr:`classes`), or ``mask`` (the label image:
pixel = class id). Without a ``target`` images keep their file's size and channels (batches hold
lists); with one they are resized as a build would, and boxes and masks follow the resize (masks
nearest-neighbour, padding ``255`` or ``65535``). Labels are in the file's pixel frame, as HALCON
reads it: for a file with an EXIF orientation other than 1 (rare outside phone photos) the view
does not rotate them with the upright image; a build does.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._json import parse_json, read_text_file
from ..errors import BadInputsError, DlpackError, OptionError, SampleIndexError
from ..read.loader import Loader, LoaderOptions, source_loader
from ..sources.base import SourceItem
from ..sources.decode import DecodeError, TargetSpec, decode_image, prepare_image, read_source_file
from .source import DLDatasetSource, dldataset_json

__all__ = ["DLDatasetView", "is_dldataset"]


def is_dldataset(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder holding ``dataset.json`` or a ``.json`` file holding a DLDataset's keys."""
    p = Path(path)
    if p.is_dir():
        return (p / "dataset.json").is_file()
    if p.suffix.lower() != ".json" or not p.is_file():
        return False
    try:
        text = read_text_file(p, repr(os.fspath(p)), ValueError)
    except ValueError:
        return False
    try:
        top = parse_json(text, repr(os.fspath(p)), ValueError)
    except ValueError:  # the DLDataset reader says what is wrong, if its keys are there
        return all(f'"{key}"' in text for key in ("samples", "class_names"))
    return isinstance(top, dict) and {"samples", "class_names"} <= set(top)


def _label_image(path: Path) -> np.ndarray:
    """A label image's pixel values (8 or 16 bit, one channel), never converted."""
    import cv2

    data = read_source_file(path)
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if img is None:
        raise DecodeError("not an image or corrupt (OpenCV could not decode it)")
    if img.ndim == 3:
        if not all(np.array_equal(img[:, :, 0], img[:, :, c]) for c in range(1, img.shape[2])):
            raise DecodeError("a label image must have one channel (or equal channels)")
        img = img[:, :, 0]
    if img.dtype not in (np.uint8, np.uint16):
        raise DecodeError(f"unsupported label pixel type {img.dtype}; label images are 8 or 16 bit")
    return np.ascontiguousarray(img)


class DLDatasetView:
    """A DLDataset read in place; implements :class:`~dlpack.read.loader.BatchSource`.

    Parameters
    ----------
    path
        The DLDataset's JSON file, or a folder holding ``dataset.json``.
    target
        What every image is turned into (a build's :class:`~dlpack.sources.TargetSpec`); None keeps
        each file's size and channels.
    on_error
        ``"raise"`` refuses a dataset with unusable samples (:class:`~dlpack.BadInputsError` lists
        them); ``"skip"`` leaves them out and lists them in :attr:`skipped`.
    """

    def __init__(self, path: str | os.PathLike[str], target: TargetSpec | None = None, on_error: str = "raise") -> None:
        if on_error not in ("raise", "skip"):
            raise OptionError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.path = dldataset_json(path)
        source = DLDatasetSource(self.path)
        scan = source.scan()
        info = source.info()
        if scan.errors and on_error == "raise":
            raise BadInputsError(
                scan.errors,
                repr(os.fspath(self.path)),
                nothing_left=not scan.items,
                hint="fix the samples, or open it with dlpack.halcon.view.DLDatasetView(path, on_error='skip')",
            )
        if not scan.items:
            raise BadInputsError(scan.errors, repr(os.fspath(self.path)), nothing_left=True)
        self.root = info.image_dir
        self.label_root = info.label_root
        self.task = scan.task
        self.classes: tuple[str, ...] = scan.classes
        self.class_ids: tuple[int, ...] = scan.class_ids
        self.skipped = scan.errors
        self.items: tuple[SourceItem, ...] = tuple(scan.items)
        self.splits: tuple[str, ...] = tuple(sorted({it.split for it in self.items if it.split is not None}))
        self.target = target
        self._labels = np.array(
            [-1 if it.label is None else self.classes.index(it.label) for it in self.items], np.int32
        )
        self._split = np.array([-1 if it.split is None else self.splits.index(it.split) for it in self.items], np.int8)
        self._fingerprint: str | None = None

    # ------------------------------------------------------------------ samples

    def __len__(self) -> int:
        return len(self.items)

    def _index(self, i: int) -> int:
        n = len(self)
        try:
            j = operator.index(i)
        except TypeError:
            raise SampleIndexError(f"sample index must be an integer, got {i!r}") from None
        j = j + n if j < 0 else j
        if not 0 <= j < n:
            raise SampleIndexError(f"sample index {i} is out of range for {self.path} with {n} samples")
        return j

    def _sample(self, j: int) -> dict[str, Any]:
        """Sample ``j`` decoded: the image, its labels, and the labels moved with the resize."""
        from ..transforms.functional import plan_geometry

        item = self.items[j]
        path = self.root / item.rel
        try:
            data = read_source_file(path)
            if self.target is None:
                image = decode_image(data)
                geometry = plan_geometry(image.shape[0], image.shape[1], "none")
            else:
                prepared = prepare_image(data, self.target)
                image, geometry = prepared.pixels, prepared.geometry
        except DecodeError as exc:
            raise DlpackError(f"DLDataset {os.fspath(self.path)!r}: cannot decode {os.fspath(path)!r}: {exc}") from exc
        sample: dict[str, Any] = {
            "image": image,
            "label": int(self._labels[j]),
            "index": j,
            "source": item.rel,
            "split": item.split,
        }
        ann = item.annotations or {}
        if self.task == "detection":
            boxes = np.asarray(ann.get("boxes", []), np.float32).reshape(-1, 4)
            scale = np.array([geometry.scale_x, geometry.scale_y] * 2, np.float32)
            offset = np.array([geometry.off_x, geometry.off_y] * 2, np.float32)
            sample["boxes"] = boxes * scale + offset
            sample["box_labels"] = np.asarray(ann.get("box_labels", []), np.int32)
        elif self.task == "segmentation" and self.label_root is not None:
            sample["mask"] = self._mask(self.label_root / ann["mask"], geometry)
        return sample

    def _mask(self, path: Path, geometry: Any) -> np.ndarray:
        import cv2

        try:
            mask = _label_image(path)
        except DecodeError as exc:
            raise DlpackError(f"DLDataset {os.fspath(self.path)!r}: label image {os.fspath(path)!r}: {exc}") from exc
        if mask.shape != (geometry.src_h, geometry.src_w):
            raise DlpackError(
                f"DLDataset {os.fspath(self.path)!r}: label image {os.fspath(path)!r} is {mask.shape[1]}x{mask.shape[0]}, "
                f"its image {geometry.src_w}x{geometry.src_h}"
            )
        if (geometry.new_h, geometry.new_w) != mask.shape:
            mask = cv2.resize(mask, (geometry.new_w, geometry.new_h), interpolation=cv2.INTER_NEAREST)
        if (geometry.out_h, geometry.out_w) != mask.shape:
            canvas = np.full((geometry.out_h, geometry.out_w), np.iinfo(mask.dtype).max, mask.dtype)
            canvas[
                geometry.off_y : geometry.off_y + geometry.new_h, geometry.off_x : geometry.off_x + geometry.new_w
            ] = mask
            mask = canvas
        return mask

    def __getitem__(self, i: int) -> dict[str, Any]:
        """``{"image", "label", "index", "source", "split"}`` plus the task's ``boxes``/``box_labels`` or ``mask``."""
        return self._sample(self._index(i))

    def __iter__(self) -> Any:
        for i in range(len(self)):
            yield self[i]

    def indices(self, split: str) -> np.ndarray:
        """The sorted sample indices (int64) of one split (``train``, ``validation``, ``test``)."""
        if not self.splits:
            raise OptionError(f"DLDataset {os.fspath(self.path)!r} has no splits; select samples with indices= instead")
        if not isinstance(split, str) or split not in self.splits:
            raise OptionError(
                f"DLDataset {os.fspath(self.path)!r} has no split {split!r}; its splits are: {', '.join(self.splits)}"
            )
        return np.flatnonzero(self._split == self.splits.index(split)).astype(np.int64)

    # ------------------------------------------------------------------ BatchSource

    def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
        """Samples ``indices``: images stacked (into ``out`` when given) for a fixed-size target, else a
        list; ``split`` as codes into :attr:`splits` (-1 none); boxes and labels as lists. ``epoch`` is unused."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        samples = [self._sample(int(j)) for j in idx.tolist()]
        layout = self.image_layout()
        images: Any = [s["image"] for s in samples]
        if layout is not None:
            if out is None:
                out = np.empty((len(idx), *layout[0]), dtype=layout[1])
            for k, s in enumerate(samples):
                out[k] = s["image"]
            images = out
        batch: dict[str, Any] = {
            "image": images,
            "label": self._labels[idx],
            "index": idx,
            "source": [s["source"] for s in samples],
            "split": self._split[idx],
        }
        if self.task == "detection":
            batch["boxes"] = [s["boxes"] for s in samples]
            batch["box_labels"] = [s["box_labels"] for s in samples]
        elif self.task == "segmentation":
            masks = [s["mask"] for s in samples]
            batch["mask"] = np.stack(masks) if layout is not None and masks else masks
        return batch

    def warm(self) -> None:
        """Nothing to open ahead: every image is its own file, opened when read."""

    def fingerprint(self) -> str:
        """A hash of the dataset file, each image's path, size and modification time, and the target."""
        if self._fingerprint is None:
            h = hashlib.sha256(self.path.read_bytes())
            h.update(json.dumps(None if self.target is None else self.target.to_dict()).encode())
            for it in self.items:
                try:
                    st = (self.root / it.rel).stat()
                except OSError as exc:
                    raise DlpackError(
                        f"DLDataset {os.fspath(self.path)!r}: cannot read {os.fspath(self.root / it.rel)!r}: "
                        f"{exc.strerror or exc}; was it removed?"
                    ) from exc
                h.update(json.dumps([it.rel, st.st_size, st.st_mtime_ns]).encode())
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    def image_layout(self) -> tuple[tuple[int, ...], str] | None:
        """``((H, W, C), dtype)`` for a target of one size (stretch, or fit into a size), else None."""
        t = self.target
        if t is None or t.size is None or t.mode not in ("stretch", "fit"):
            return None
        w, h = t.size
        return (h, w, t.channels), np.dtype(t.dtype).str

    def loader(
        self,
        options: LoaderOptions | None = None,
        *,
        transform: Callable[..., dict[str, Any]] | None = None,
        split: str | None = None,
        indices: Sequence[int] | np.ndarray | None = None,
        **kwargs: Any,
    ) -> Loader:
        """A batch loader, as :meth:`dlpack.Dataset.loader`: keyword arguments are LoaderOptions fields."""
        return source_loader(self, options, transform, split, indices, kwargs)

    def close(self) -> None:
        """Nothing is held open."""

    def __enter__(self) -> DLDatasetView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<dlpack.DLDatasetView {os.fspath(self.path)!r}: {len(self)} images, {self.task}, read in place>"
