"""PyTorch adapter (extra ``[torch]``): a map-style Dataset and a tensor-yielding loader.

``TorchDataset`` is for code that already uses ``torch.utils.data.DataLoader``: it pickles as a
path, so each worker process opens its own handles; it is the slow path (docs/loader.md,
"PyTorch"). ``torch_loader`` wraps :class:`dlpack.Loader` (threads over memory maps, no pickling
of image bytes between processes) and runs at the loader's speed: its default NCHW batch is a
zero-copy ``channels_last`` view of the loader's NHWC array, and every conversion it is asked for
(contiguous NCHW, float scaling and normalisation) runs on the loader's reader threads, or on the
GPU after the uint8 batch crossed to it, never as an extra pass on the training thread.

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
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from . import schema
from .errors import MissingExtraError, OptionError, SampleIndexError
from .ragged import RaggedBatch
from .read.dataset import Dataset
from .read.loader import BatchSource, Loader, LoaderOptions, _BufferPool, check_selection

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise MissingExtraError("torch", "torch", "dlpack.torch") from exc

__all__ = ["TorchDataset", "TorchLoader", "collate", "torch_loader", "to_tensor"]

#: Keys of arrays holding codes into a manifest list: int64 tensors, as torch losses take them.
CODE_KEYS = frozenset(role.key for role in schema.CODED.values() if role.key is not None)
#: NumPy dtypes torch does not compute with on every version, and the type they widen to.
_WIDEN = {np.dtype(np.uint16): np.int32, np.dtype(np.uint32): np.int64}
#: The keys every batch has, converted by name; the rest are keyed arrays (:func:`_keyed_tensors`).
_BASE_KEYS = frozenset(schema.BASE_KEYS)
#: Output dtypes with a NumPy twin, whose buffers are recycled like the loader's batch arrays.
_NUMPY_OF = {torch.float16: "<f2", torch.float32: "<f4", torch.float64: "<f8", torch.uint8: "|u1"}


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


def _widened(arr: np.ndarray) -> np.ndarray:
    """``arr``, or a copy in the wider type of :data:`_WIDEN` when torch lacks its unsigned type."""
    wide = _WIDEN.get(arr.dtype.newbyteorder("="))
    return arr if wide is None else arr.astype(wide)


def array_tensor(key: str, value: np.ndarray) -> torch.Tensor:
    """One keyed array's value as a tensor: codes (:data:`CODE_KEYS`) as int64, unsigned types
    torch lacks widened, everything else in its stored dtype (no copy where NumPy allows)."""
    arr = np.asarray(value)
    arr = arr.astype(np.int64, copy=False) if key in CODE_KEYS else _widened(arr)
    return torch.from_numpy(np.ascontiguousarray(arr))


def _keyed_tensors(sample: dict[str, Any], skip: Iterable[str]) -> dict[str, Any]:
    """Every value of ``sample`` but ``skip`` as tensors: arrays as one tensor, lists of arrays
    (ragged arrays of a batch) as lists of tensors; anything else (a split's name) as it is."""
    out: dict[str, Any] = {}
    skipped = skip if isinstance(skip, frozenset) else frozenset(skip)
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
        """The store, opened on first use in each process (a pickled copy reopens it)."""
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
        out.update(_keyed_tensors(s, _BASE_KEYS))
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


def scale_shift(
    image_dtype: np.dtype[Any] | str, channels: int, mean: Sequence[float] | None, std: Sequence[float] | None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel ``(a, b)`` with ``x * a + b == (x / max - mean) / std``: the normalisation as
    one fused pass (``a = 1 / (max * std)``, ``b = -mean / std``), in float64."""
    dt = np.dtype(image_dtype)
    scale = float(np.iinfo(dt).max) if dt.kind in "ui" else 1.0
    m = np.broadcast_to(np.asarray(mean if mean is not None else [0.0], dtype=np.float64), (channels,))
    s = np.broadcast_to(np.asarray(std if std is not None else [1.0], dtype=np.float64), (channels,))
    return 1.0 / (scale * s), -m / s


def _store_stats(source: BatchSource) -> tuple[dict[str, Any] | None, str, str]:
    """The pixel statistics the store behind ``source`` records (None if none), its name, and
    the stored pixel dtype."""
    ds = getattr(source, "ds", source)  # cached views keep their store as .ds
    manifest = getattr(ds, "manifest", None)
    where = str(getattr(ds, "path", type(source).__name__))
    layout = source.image_layout()
    dtype = manifest.image.dtype if manifest is not None else layout[1] if layout is not None else "|u1"
    return (getattr(manifest, "stats", None) if manifest is not None else None), where, dtype


def resolve_store_stats(
    source: BatchSource, mean: Sequence[float] | str | None, std: Sequence[float] | str | None
) -> tuple[Sequence[float] | None, Sequence[float] | None]:
    """``mean``/``std`` with ``"store"`` replaced by the store's recorded statistics, scaled to the
    [0, 1] units ``mean``/``std`` are given in (pixel units divided by the dtype's maximum)."""
    for name, value in (("mean", mean), ("std", std)):
        if isinstance(value, str) and value != "store":
            raise OptionError(f"{name} must be per-channel numbers or 'store', got {value!r}")
    if mean != "store" and std != "store":
        return mean, std  # type: ignore[return-value]
    stats, where, dtype = _store_stats(source)
    if stats is None:
        raise OptionError(
            f"mean/std='store' uses the pixel statistics a build records, and {where} has none (it was built "
            "before they were recorded): rebuild it with `dlpack build --overwrite`, or pass numbers; "
            "dlpack.pack.stats.pixel_stats computes them from any array of images"
        )
    top = float(np.iinfo(np.dtype(dtype)).max)
    got_mean = [v / top for v in stats["mean"]] if mean == "store" else mean
    got_std = [max(v, 1e-12) / top for v in stats["std"]] if std == "store" else std
    return got_mean, got_std  # type: ignore[return-value]


class _Finisher:
    """What the reader threads do to each batch for :class:`TorchLoader`: the batch as tensors,
    converted as asked (or left uint8 when the conversion waits for the device).

    The fused scale-and-shift (``torch.addcmul(b, x, a)``, one pass writing the output) beat a
    per-channel 256-entry lookup table (``np.take`` per channel) on this 2-core machine: one 32 x
    256x256x3 uint8 batch to float32 took 3.9 ms fused into channels_last and 5.6 ms into NCHW,
    14.6 ms by table, against 21.8 ms for the earlier scale, subtract and divide passes
    (``benchmarks/loader.py --torch-only``; docs/benchmarks.md, "PyTorch path").
    """

    def __init__(self, owner: TorchLoader, pool_limit: int, layout: tuple[tuple[int, ...], str] | None) -> None:
        self.owner = owner
        self.pools: dict[tuple[str, bool], _BufferPool] = {}
        self.pool_limit = pool_limit
        self.layout = layout
        self.ab: dict[tuple[str, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def image_nbytes(self) -> int:
        """Bytes per image of the batches this finisher hands out (0: images of several sizes),
        which the loader's statistics count without asking each tensor (see :class:`dlpack.Loader`)."""
        if self.layout is None:
            return 0
        shape, stored = self.layout
        o, pixels = self.owner, int(np.prod(shape))
        stored_dtype = np.dtype(stored)
        if o.on_device:  # the stored pixels cross as they are (widened where torch lacks the type)
            wide = _WIDEN.get(stored_dtype.newbyteorder("="))
            return pixels * (stored_dtype if wide is None else np.dtype(wide)).itemsize
        if not o.converts and stored_dtype == np.uint8:
            return pixels
        target = o.dtype if o.dtype.is_floating_point else torch.float32
        return pixels * torch.empty((), dtype=target).element_size()

    def coefficients(
        self, image_dtype: np.dtype[Any], channels: int, dtype: torch.dtype, device: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key = (f"{image_dtype.str}{channels}{device}", dtype)
        got = self.ab.get(key)
        if got is None:
            a, b = scale_shift(image_dtype, channels, self.owner.mean, self.owner.std)
            shape = (1, channels, 1, 1)
            got = (
                torch.tensor(a, dtype=dtype, device=device).view(shape),
                torch.tensor(b, dtype=dtype, device=device).view(shape),
            )
            self.ab[key] = got
        return got

    def output(self, like: tuple[int, ...], dtype: torch.dtype, contiguous: bool) -> torch.Tensor:
        """An N x C x H x W output tensor for a batch of N x H x W x C ``like``, from a pool when it can."""
        n, h, w, c = like
        np_dtype = _NUMPY_OF.get(dtype)
        if np_dtype is None or self.layout is None:
            fmt = torch.contiguous_format if contiguous else torch.channels_last
            return torch.empty((n, c, h, w), dtype=dtype, memory_format=fmt)
        pool = self.pools.get((np_dtype, contiguous))
        if pool is None:
            shape = (self.owner.loader.options.batch_size, *((c, h, w) if contiguous else (h, w, c)))
            pool = self.pools[(np_dtype, contiguous)] = _BufferPool(shape, np_dtype, self.pool_limit)
        arr = torch.from_numpy(pool.take(n))
        return arr if contiguous else arr.permute(0, 3, 1, 2)

    def transposed(self, images: np.ndarray) -> torch.Tensor:
        """A uint8 B x H x W x C batch as a contiguous B x C x H x W tensor, by NumPy's strided
        copy: several times faster here than torch's ``copy_`` of the permuted view."""
        out = self.output(images.shape, torch.uint8, True)
        np.copyto(out.numpy(), images.transpose(0, 3, 1, 2))
        return out

    def image(self, images: np.ndarray) -> torch.Tensor:
        """One B x H x W x C batch as the NCHW tensor asked for (on the CPU)."""
        o = self.owner
        if not o.converts and images.dtype == np.uint8:  # 16-bit pixels are scaled to float, as always
            # The zero-copy channels_last view in one torch call, not two (from_numpy, permute):
            # NumPy's transpose costs no torch dispatch, and right after the batch's copy flushed
            # the caches the first torch call costs about 20 us here, each further one 2-3 us.
            return self.transposed(images) if o.contiguous else torch.from_numpy(images.transpose(0, 3, 1, 2))
        t = torch.from_numpy(_widened(images))
        nchw = t.permute(0, 3, 1, 2)  # a zero-copy channels_last view
        target = o.dtype if o.dtype.is_floating_point else torch.float32
        work = target if target in (torch.float32, torch.float64) else torch.float32
        a, b = self.coefficients(images.dtype, images.shape[3], work)
        out = self.output(images.shape, work, o.contiguous)
        if o.contiguous:  # over planes of H x W values: transposed first (uint8, the cheap copy)
            torch.addcmul(b, self.transposed(images) if images.dtype == np.uint8 else nchw, a, out=out)
        else:
            # channels_last is NHWC in memory: as rows of W x C values with a and b tiled along
            # them, the pass runs over long contiguous rows, not over runs of C = 3.
            n, h, w, c = images.shape
            rows = out.permute(0, 2, 3, 1).view(n * h, w * c)
            torch.addcmul(b.view(c).repeat(w), t.reshape(n * h, w * c), a.view(c).repeat(w), out=rows)
        return (
            out
            if work == target
            else out.to(target, memory_format=torch.contiguous_format if o.contiguous else torch.channels_last)
        )

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        o = self.owner
        images = batch["image"]
        image: Any
        if isinstance(images, list):  # variable-size store: one CHW tensor per sample
            image = [to_tensor(im, o.dtype, o.mean, o.std) for im in images]
        elif o.on_device:  # converted there after the move: uint8 crosses, 4x fewer bytes than float
            image = torch.from_numpy(_widened(images))
        else:
            image = self.image(images)
        out: dict[str, Any] = {
            "image": image,
            "label": torch.from_numpy(np.asarray(batch["label"], dtype=np.int64)),
            "index": torch.from_numpy(np.asarray(batch["index"], dtype=np.int64)),
        }
        if not _BASE_KEYS.issuperset(batch):  # keyed arrays (boxes, mask, ...) ride along
            out.update(_keyed_tensors(batch, _BASE_KEYS))
        return out


class TorchLoader:
    """Iterable of ``{"image": NCHW tensor, "label": int64 tensor, "index": int64 tensor, KEY: ...}``.

    ``image`` is B x C x H x W. By default it is a ``channels_last`` tensor: for uint8, a zero-copy
    view of the loader's B x H x W x C batch (convolutions in ``channels_last`` read it as it is;
    ``model.to(memory_format=torch.channels_last)`` keeps the whole network in that layout).
    ``memory_format=torch.contiguous_format`` gives contiguous NCHW, copied on the reader threads.
    ``dtype`` float scales to [0, 1] by the dtype's maximum, then normalises with ``mean``/``std``
    (per channel; ``"store"``: the statistics the build recorded, :attr:`dlpack.Dataset.stats`).
    Without a device (or on ``"cpu"``) that is one fused pass on the reader threads; with a GPU
    device the uint8 batch crosses first and is converted there.

    Every keyed array of the batch comes along: a fixed one as one tensor (``mask`` B x H x W), a
    ragged one (``boxes``, ``box_labels``) as a list of B tensors (see the module's notes on dtypes).
    ``pin_memory`` and ``device`` apply to every tensor but ``index``. With ``pin_memory`` the
    loader reads straight into pinned buffers, recycled like its other batch arrays.

    Delegates order, epochs, prefetch, resume and :meth:`stats` to the wrapped
    :class:`dlpack.Loader` (it installs its conversion as that loader's ``finisher``), including
    its rule of one live pass at a time. A variable-size store is refused (its batches cannot be
    one tensor; code written for tensors would fail at the first batch) unless ``allow_lists``,
    which yields a list of CHW tensors per batch.
    """

    def __init__(
        self,
        loader: Loader,
        dtype: torch.dtype = torch.uint8,
        mean: Sequence[float] | str | None = None,
        std: Sequence[float] | str | None = None,
        pin_memory: bool | None = None,
        device: str | torch.device | None = None,
        allow_lists: bool = False,
        memory_format: torch.memory_format = torch.channels_last,
    ) -> None:
        layout = loader.source.image_layout()
        if not allow_lists and layout is None:
            raise OptionError(_variable_size_hint(loader.source) + "; or pass allow_lists=True for lists of tensors")
        if memory_format not in (torch.channels_last, torch.contiguous_format):
            raise OptionError(
                f"memory_format must be torch.channels_last (the default, a zero-copy view) or "
                f"torch.contiguous_format (contiguous NCHW), got {memory_format!r}"
            )
        if not isinstance(dtype, torch.dtype):
            raise OptionError(f"dtype must be a torch.dtype (torch.uint8, torch.float32 ...), got {dtype!r}")
        self.loader = loader
        self.dtype = dtype
        self.mean, self.std = resolve_store_stats(loader.source, mean, std)
        self.memory_format = memory_format
        self.contiguous = memory_format == torch.contiguous_format
        self.converts = dtype != torch.uint8 or self.mean is not None or self.std is not None
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
        if self.pin_memory and not torch.cuda.is_available():
            raise OptionError("pin_memory=True needs CUDA, which this torch does not see; pass pin_memory=False")
        self.device = torch.device(device) if device is not None else None
        self.on_device = self.device is not None and self.device.type != "cpu" and layout is not None
        #: Nothing to pin or move: the finished batches are handed over as the loader yields them.
        self._as_finished = not self.pin_memory and (self.device is None or self.device.type == "cpu")
        #: Batches whose copy to the device may still read their pinned buffer: held until it is done.
        self._inflight: deque[tuple[Any, Any]] = deque()
        pool = getattr(loader, "_pool", None)
        if self.pin_memory and pool is not None:
            pool.use_allocator(_pinned_block)
        self._finisher = _Finisher(self, pool.limit if pool is not None else 8, layout)
        # Converting or copying on the reader threads is work: "auto" then reads on every core.
        loader.set_finisher(self._finisher, works=self.converts or self.contiguous)

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """:meth:`dlpack.Loader.set_epoch`: start ``epoch`` from its first batch."""
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """:meth:`dlpack.Loader.state_dict`: resume after the last batch handed out."""
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """:meth:`dlpack.Loader.load_state_dict`: refuses a state of other data, selection or order."""
        self.loader.load_state_dict(state)

    def stats(self) -> list[Any]:
        """The wrapped loader's per-pass :class:`~dlpack.timing.EpochStats` (wait share, p50/p99
        batch wait, images/s, bytes/s); ``report=True`` prints one line per pass."""
        return self.loader.stats()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # Claim the loader now, so a second live iterator is refused at iter(), not at its first batch.
        batches = iter(self.loader)
        # On the CPU the reader threads finished every batch: the loader's own iterator, with no
        # generator and no dict rebuilt per batch on the training thread in between.
        return batches if self._as_finished else self._tensors(batches)

    def _tensors(self, batches: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Each finished batch of ``batches``, pinned, moved and converted on the device as asked."""
        try:
            for batch in batches:
                out = {key: self._moved(key, value) for key, value in batch.items()}
                if self.on_device and isinstance(out["image"], torch.Tensor):
                    out["image"] = self._device_image(out["image"])
                if self.device is not None and self.device.type == "cuda":
                    self._hold(batch)
                yield out
        finally:
            self._inflight.clear()

    def _device_image(self, image: torch.Tensor) -> torch.Tensor:
        """A B x H x W x C batch on the device as the NCHW tensor asked for, converted there."""
        nchw = image.permute(0, 3, 1, 2)
        if not self.converts and image.dtype == torch.uint8:
            return nchw.contiguous() if self.contiguous else nchw
        target = self.dtype if self.dtype.is_floating_point else torch.float32
        fmt = torch.contiguous_format if self.contiguous else torch.channels_last
        a, b = self._finisher.coefficients(
            np.dtype(np.uint8 if image.dtype == torch.uint8 else np.uint16), image.shape[3], target, image.device
        )
        out = torch.empty(nchw.shape, dtype=target, device=image.device, memory_format=fmt)
        return torch.addcmul(b, nchw, a, out=out)

    def _hold(self, batch: dict[str, Any]) -> None:
        """Keep ``batch`` (its pinned buffers) until the copies queued from it are done, so the
        loader does not read the next batch into memory a copy is still reading."""
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        self._inflight.append((event, batch))
        while self._inflight and self._inflight[0][0].query():
            self._inflight.popleft()

    def _moved(self, key: str, value: Any) -> Any:
        """``value`` (a tensor or a list of them) pinned and on the device as asked; ``index`` stays on the CPU."""
        if key == "index":
            return value
        if isinstance(value, list):
            return [self._moved(key, v) for v in value]
        if not isinstance(value, torch.Tensor):
            return value
        if self.pin_memory and not value.is_pinned():
            value = value.pin_memory()
        if self.device is not None:
            value = value.to(self.device, non_blocking=True)
        return value


def _pinned_block(nbytes: int) -> np.ndarray:
    """A block of page-locked memory as a NumPy array (it keeps its tensor alive)."""
    block: np.ndarray = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()
    return block


def torch_loader(
    store: str | os.PathLike[str] | Dataset,
    options: LoaderOptions | None = None,
    *,
    dtype: torch.dtype = torch.uint8,
    mean: Sequence[float] | str | None = None,
    std: Sequence[float] | str | None = None,
    pin_memory: bool | None = None,
    device: str | torch.device | None = None,
    split: str | None = None,
    indices: Sequence[int] | np.ndarray | None = None,
    allow_lists: bool = False,
    memory_format: torch.memory_format = torch.channels_last,
    **loader_kwargs: Any,
) -> TorchLoader:
    """A loader over ``store`` yielding NCHW tensors (uint8, or float scaled and normalised).

    ``loader_kwargs`` are :class:`~dlpack.LoaderOptions` fields (``batch_size``, ``shuffle``,
    ``seed``, ``prefetch``, ``workers``, ``rank``, ``world_size``, ``report``, and the augmentation
    options ``augment="cached"``, ``original_rate``, ``views_per_batch``, ``online``: batches of
    cached views carry ``variant``, an int64 tensor). ``split``/``indices`` select samples as in
    :meth:`dlpack.Dataset.loader`. ``memory_format``, ``mean``/``std`` (numbers or ``"store"``),
    ``pin_memory`` (default: whether CUDA is available) and ``device``: see :class:`TorchLoader`.
    A variable-size store is refused with :class:`~dlpack.OptionError` unless ``allow_lists=True``
    (then ``image`` is a list of CHW tensors).
    """
    ds = store if isinstance(store, Dataset) else Dataset(store)
    loader = ds.loader(options, split=split, indices=indices, **loader_kwargs)
    return TorchLoader(loader, dtype, mean, std, pin_memory, device, allow_lists, memory_format)
