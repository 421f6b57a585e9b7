"""PyTorch adapter (extra ``[torch]``): a map-style Dataset and a tensor-yielding loader.

``TorchDataset`` is for code that already uses ``torch.utils.data.DataLoader``: it pickles as a
path, so each worker process opens its own handles. ``torch_loader`` is faster: it wraps
:class:`dlpack.Loader` (threads over memory maps, no pickling of image bytes between processes)
and converts each batch to NCHW tensors.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .dataset import Dataset
from .dataset import open as open_store
from .errors import MissingExtraError
from .loader import Loader, LoaderOptions

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise MissingExtraError("torch", "torch", "dlpack.torch") from exc

__all__ = ["TorchDataset", "TorchLoader", "torch_loader", "to_tensor"]


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


class TorchDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Map-style dataset over a store: ``ds[i] -> {"image": CxHxW tensor, "label": int, "index": i}``.

    Safe with ``DataLoader(num_workers > 0)``: only the path is pickled to workers.
    """

    def __init__(self, path: str | os.PathLike[str], transform: Any = None) -> None:
        self.path = os.fspath(path)
        self.transform = transform
        self._ds: Dataset | None = None

    @property
    def ds(self) -> Dataset:
        if self._ds is None:
            self._ds = open_store(self.path)
        return self._ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict[str, Any]:
        s = self.ds[i]
        out = {"image": to_tensor(s["image"]), "label": s["label"], "index": s["index"]}
        return self.transform(out) if self.transform is not None else out

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "transform": self.transform, "_ds": None}


class TorchLoader:
    """Iterable of ``{"image": NCHW tensor, "label": int64 tensor, "index": int64 tensor}``.

    Delegates order, epochs, prefetch and resume to the wrapped :class:`dlpack.Loader`, including
    its rule of one live pass at a time.
    """

    def __init__(
        self,
        loader: Loader,
        dtype: torch.dtype = torch.uint8,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        pin_memory: bool | None = None,
        device: str | torch.device | None = None,
    ) -> None:
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
            if isinstance(images, list):  # variable-size store: one CHW tensor per sample
                image: Any = [to_tensor(im, self.dtype, self.mean, self.std) for im in images]
                label = torch.from_numpy(np.asarray(batch["label"], dtype=np.int64))
                index = torch.from_numpy(np.asarray(batch["index"], dtype=np.int64))
                yield {"image": image, "label": label, "index": index}
                continue
            image = to_tensor(images, self.dtype, self.mean, self.std)
            label = torch.from_numpy(np.asarray(batch["label"], dtype=np.int64))
            index = torch.from_numpy(np.asarray(batch["index"], dtype=np.int64))
            if self.pin_memory:
                image, label = image.pin_memory(), label.pin_memory()
            if self.device is not None:
                image = image.to(self.device, non_blocking=True)
                label = label.to(self.device, non_blocking=True)
            yield {"image": image, "label": label, "index": index}


def torch_loader(
    store: str | os.PathLike[str] | Dataset,
    options: LoaderOptions | None = None,
    *,
    dtype: torch.dtype = torch.uint8,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    pin_memory: bool | None = None,
    device: str | torch.device | None = None,
    **loader_kwargs: Any,
) -> TorchLoader:
    """A loader over ``store`` yielding NCHW tensors (uint8, or float scaled and normalised).

    ``loader_kwargs`` are :class:`~dlpack.LoaderOptions` fields (``batch_size``, ``shuffle``,
    ``seed``, ``prefetch``, ``workers``, ``rank``, ``world_size``, ...). ``pin_memory`` defaults to
    whether CUDA is available.
    """
    ds = store if isinstance(store, Dataset) else open_store(store)
    return TorchLoader(ds.loader(options, **loader_kwargs), dtype, mean, std, pin_memory, device)
