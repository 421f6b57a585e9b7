"""PyTorch adapter (extra ``[torch]``): a map-style Dataset and a tensor-yielding loader.

``TorchDataset`` is for code that already uses ``torch.utils.data.DataLoader``: it pickles as a
path, so each worker process opens its own handles. ``torch_loader`` is faster: it wraps
:class:`dlpack.Loader` (threads over memory maps, no pickling of image bytes between processes)
and converts each batch to NCHW tensors.

Both pass every keyed array of the store through (``boxes``, ``box_labels``, ``mask``, ``defect``,
arrays added with ``add_array``): a fixed array as one tensor (``mask`` is B x H x W), a ragged
array as a list of one tensor per sample. Values keep their stored dtype, so a mask crosses to the
GPU at its stored size (``uint8``; ``uint16`` becomes ``int32``, which every torch version
computes with); codes into a manifest list (``label``, ``split``, ``defect``, ``box_labels``) are
``int64``, as torch losses and torchvision take them. Call ``.long()`` on a mask for
``cross_entropy``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from . import schema
from .dataset import Dataset
from .errors import MissingExtraError, OptionError, SampleIndexError
from .loader import BatchSource, Loader, LoaderOptions, check_selection
from .ragged import RaggedBatch

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise MissingExtraError("torch", "torch", "dlpack.torch") from exc

__all__ = ["TorchDataset", "TorchLoader", "collate", "torch_loader", "to_tensor"]

#: Keys of arrays holding codes into a manifest list: int64 tensors, as torch losses take them.
CODE_KEYS = frozenset(role.key for role in schema.CODED.values() if role.key is not None)
#: NumPy dtypes torch does not compute with on every version, and the type they widen to.
_WIDEN = {np.dtype(np.uint16): np.int32, np.dtype(np.uint32): np.int64}


def to_tensor(
    images: np.ndarray,
    dtype: torch.dtype = torch.uint8,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> torch.Tensor:
    """B x H x W x C (or H x W x C) array to a contiguous NCHW (CHW) tensor.

    Float output is scaled to [0, 1] by the dtype's maximum, then normalised with ``mean``/``std``
    (per channel) when given.
    """
    t = torch.from_numpy(np.ascontiguousarray(images))
    t = t.permute(0, 3, 1, 2) if t.ndim == 4 else t.permute(2, 0, 1)
    if dtype == torch.uint8 and images.dtype == np.uint8 and mean is None:
        return t.contiguous()
    scale = float(np.iinfo(images.dtype).max) if images.dtype.kind in "ui" else 1.0
    if images.dtype == np.uint16:
        t = t.to(torch.int32)  # torch has no uint16 arithmetic on every version
    t = t.to(dtype if dtype.is_floating_point else torch.float32).div_(scale)
    if mean is not None or std is not None:
        shape = (1, -1, 1, 1) if t.ndim == 4 else (-1, 1, 1)
        m = torch.tensor(mean if mean is not None else [0.0], dtype=t.dtype).view(shape)
        s = torch.tensor(std if std is not None else [1.0], dtype=t.dtype).view(shape)
        t = t.sub_(m).div_(s)
    return t.contiguous()


def array_tensor(key: str, value: np.ndarray) -> torch.Tensor:
    """One keyed array's value as a tensor: codes (:data:`CODE_KEYS`) as int64, unsigned types
    torch lacks widened, everything else in its stored dtype (no copy where NumPy allows)."""
    arr = np.asarray(value)
    if key in CODE_KEYS:
        arr = arr.astype(np.int64, copy=False)
    elif arr.dtype.newbyteorder("=") in _WIDEN:
        arr = arr.astype(_WIDEN[arr.dtype.newbyteorder("=")])
    return torch.from_numpy(np.ascontiguousarray(arr))


def _keyed_tensors(sample: dict[str, Any], skip: Iterable[str]) -> dict[str, Any]:
    """Every value of ``sample`` but ``skip`` as tensors: arrays as one tensor, lists of arrays
    (ragged arrays of a batch) as lists of tensors; anything else (a split's name) as it is."""
    out: dict[str, Any] = {}
    skipped = set(skip)
    for key, value in sample.items():
        if key in skipped:
            continue
        if isinstance(value, np.ndarray):
            out[key] = array_tensor(key, value)
        elif isinstance(value, RaggedBatch):
            # One tensor of the batch's rows, split into per-sample views: no copy per sample.
            out[key] = list(torch.split(array_tensor(key, value.data), value.counts().tolist()))
        elif isinstance(value, list) and all(isinstance(v, np.ndarray) for v in value):
            out[key] = [array_tensor(key, v) for v in value]
        else:
            out[key] = value
    return out


def collate(samples: Sequence[dict[str, Any]], ragged: Iterable[str] = ()) -> dict[str, Any]:
    """Samples of a :class:`TorchDataset` as one batch, for ``DataLoader(collate_fn=...)``.

    Keys in ``ragged`` (ragged arrays such as ``boxes``, and ``image`` of a variable-size store)
    become a list of one tensor per sample, as in :class:`TorchLoader` batches; other tensors are
    stacked, ints become an int64 tensor, floats a float tensor, anything else (a split's name, or
    None) a list. ``TorchDataset.collate_fn`` knows its store's ragged keys.
    """
    if not samples:
        raise OptionError("collate needs at least one sample")
    lists = set(ragged)
    out: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        if key in lists:
            out[key] = values
        elif all(isinstance(v, torch.Tensor) for v in values):
            out[key] = torch.stack(values)
        elif all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
            out[key] = torch.tensor([int(v) for v in values], dtype=torch.int64)
        elif all(isinstance(v, float) for v in values):
            out[key] = torch.tensor(values)
        else:
            out[key] = values
    return out


def _variable_size_hint(source: BatchSource) -> str:
    """Why a variable-size store gives no batch tensors, and what to build instead."""
    sizes = ""
    if isinstance(source, Dataset) and "image_shapes" in source.manifest.arrays:
        shapes = np.asarray(source.reader.read_all("image_shapes")).reshape(-1, 3)
        sizes = f" ({len(np.unique(shapes[:, :2], axis=0))} distinct sizes)"
    where = getattr(source, "path", type(source).__name__)
    return (
        f"{where} is a variable-size store{sizes}: batches are lists; pass --size WxH or --max-side N "
        "for tensors (dlpack build, or size=/max_side= in dlpack.build)"
    )


class TorchDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Map-style dataset over a store: ``ds[i] -> {"image": CxHxW tensor, "label": int, "index": j, KEY: ...}``.

    Every keyed array of the store comes along as a tensor (``mask`` H x W, ``boxes`` k x 4,
    ``box_labels`` k, see the module's notes on dtypes); ``split`` is the split's name (or None),
    ``defect`` an int. Batch it with ``DataLoader(tds, collate_fn=tds.collate_fn)``, which keeps
    ragged arrays as lists (torch's default collate cannot stack them).

    ``split`` or ``indices`` restrict it to those samples: item ``i`` is the ``i``-th selected sample,
    and ``index`` is its index in the store. Safe with ``DataLoader(num_workers > 0)``: only the
    path and the selection are pickled to workers.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        transform: Any = None,
        *,
        split: str | None = None,
        indices: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        if split is not None and indices is not None:
            raise OptionError("pass split or indices, not both (ds.indices(split) gives a split's indices)")
        self.path = os.fspath(path)
        self.transform = transform
        self.split = split
        self._ds: Dataset | None = None
        self._selection: np.ndarray | None = None
        if split is not None:
            self._selection = self.ds.indices(split)
        elif indices is not None:
            self._selection = check_selection(indices, len(self.ds), self.path)

    @property
    def ds(self) -> Dataset:
        if self._ds is None:
            self._ds = Dataset(self.path)
        return self._ds

    def __len__(self) -> int:
        return len(self.ds) if self._selection is None else len(self._selection)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self._selection is not None:
            n = len(self._selection)
            if not isinstance(i, (int, np.integer)) or not -n <= i < n:
                raise SampleIndexError(f"item {i!r} is out of range for a selection of {n} samples of {self.path}")
            i = int(self._selection[i])
        s = self.ds[i]
        out = {"image": to_tensor(s["image"]), "label": s["label"], "index": s["index"]}
        out.update(_keyed_tensors(s, schema.BASE_KEYS))
        return self.transform(out) if self.transform is not None else out

    @property
    def ragged_keys(self) -> frozenset[str]:
        """Keys whose values differ in shape between samples: ragged arrays, and ``image`` of a variable-size store."""
        m = self.ds.manifest
        keys = {spec.key for spec in m.arrays.values() if spec.key and spec.ragged}
        if m.image.layout == "variable":
            keys.add("image")
        return frozenset(k for k in keys if k is not None)

    @property
    def collate_fn(self) -> Any:
        """:func:`collate` for this store's samples (picklable, for worker processes)."""
        return functools.partial(collate, ragged=self.ragged_keys)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "transform": self.transform,
            "split": self.split,
            "_selection": self._selection,
            "_ds": None,
        }


class TorchLoader:
    """Iterable of ``{"image": NCHW tensor, "label": int64 tensor, "index": int64 tensor, KEY: ...}``.

    Every keyed array of the batch comes along: a fixed one as one tensor (``mask`` B x H x W), a
    ragged one (``boxes``, ``box_labels``) as a list of B tensors (see the module's notes on dtypes).
    ``pin_memory`` and ``device`` apply to every tensor.

    Delegates order, epochs, prefetch and resume to the wrapped :class:`dlpack.Loader`, including
    its rule of one live pass at a time. A variable-size store is refused (its batches cannot be
    one tensor; code written for tensors would fail at the first batch) unless ``allow_lists``,
    which yields a list of CHW tensors per batch.
    """

    def __init__(
        self,
        loader: Loader,
        dtype: torch.dtype = torch.uint8,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        pin_memory: bool | None = None,
        device: str | torch.device | None = None,
        allow_lists: bool = False,
    ) -> None:
        if not allow_lists and loader.source.image_layout() is None:
            raise OptionError(_variable_size_hint(loader.source) + "; or pass allow_lists=True for lists of tensors")
        self.loader = loader
        self.dtype, self.mean, self.std = dtype, mean, std
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.device = torch.device(device) if device is not None else None

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # Claim the loader now, so a second live iterator is refused at iter(), not at its first batch.
        return self._tensors(iter(self.loader))

    def _tensors(self, batches: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Each batch of ``batches`` as tensors."""
        for batch in batches:
            images = batch["image"]
            image: Any
            if isinstance(images, list):  # variable-size store: one CHW tensor per sample
                image = [to_tensor(im, self.dtype, self.mean, self.std) for im in images]
            else:
                image = to_tensor(images, self.dtype, self.mean, self.std)
            out: dict[str, Any] = {
                "image": image,
                "label": torch.from_numpy(np.asarray(batch["label"], dtype=np.int64)),
                "index": torch.from_numpy(np.asarray(batch["index"], dtype=np.int64)),
            }
            out.update(_keyed_tensors(batch, schema.BASE_KEYS))
            yield {key: self._moved(key, value) for key, value in out.items()}

    def _moved(self, key: str, value: Any) -> Any:
        """``value`` (a tensor or a list of them) pinned and on the device as asked; ``index`` stays on the CPU."""
        if key == "index":
            return value
        if isinstance(value, list):
            return [self._moved(key, v) for v in value]
        if not isinstance(value, torch.Tensor):
            return value
        if self.pin_memory:
            value = value.pin_memory()
        if self.device is not None:
            value = value.to(self.device, non_blocking=True)
        return value


def torch_loader(
    store: str | os.PathLike[str] | Dataset,
    options: LoaderOptions | None = None,
    *,
    dtype: torch.dtype = torch.uint8,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    pin_memory: bool | None = None,
    device: str | torch.device | None = None,
    split: str | None = None,
    indices: Sequence[int] | np.ndarray | None = None,
    allow_lists: bool = False,
    **loader_kwargs: Any,
) -> TorchLoader:
    """A loader over ``store`` yielding NCHW tensors (uint8, or float scaled and normalised).

    ``loader_kwargs`` are :class:`~dlpack.LoaderOptions` fields (``batch_size``, ``shuffle``,
    ``seed``, ``prefetch``, ``workers``, ``rank``, ``world_size``, and the augmentation options
    ``augment="cached"``, ``original_rate``, ``views_per_batch``, ``online``: batches of cached views
    carry ``variant``, an int64 tensor). ``split``/``indices``
    select samples as in :meth:`dlpack.Dataset.loader`. ``pin_memory`` defaults to whether CUDA
    is available. A variable-size store is refused with :class:`~dlpack.OptionError` unless
    ``allow_lists=True`` (then ``image`` is a list of CHW tensors).
    """
    ds = store if isinstance(store, Dataset) else Dataset(store)
    loader = ds.loader(options, split=split, indices=indices, **loader_kwargs)
    return TorchLoader(loader, dtype, mean, std, pin_memory, device, allow_lists)
