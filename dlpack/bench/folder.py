"""The scattered baseline: a folder of images read, decoded and resized on the fly, as a BatchSource.

This is the work a training script without dlpack does every epoch. Decoding and resizing run on
the loader's worker threads (OpenCV releases the GIL), exactly as such a script's dataset would.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DlpackError, SourceError

if TYPE_CHECKING:
    from ..sources.decode import TargetSpec

__all__ = ["FolderSpec", "FolderReader"]


@dataclass(frozen=True)
class FolderSpec:
    """What every folder image becomes: ``size`` (W, H) by ``mode`` (stretch, fit), ``channels``, ``dtype``."""

    size: tuple[int, int]
    channels: int
    dtype: str
    mode: str
    allow_upscale: bool = True  # the training resolution is fixed, so small images are enlarged

    def target(self) -> TargetSpec:
        """The same target as a build: one decode -> resize -> convert path for both."""
        from ..sources.decode import TargetSpec

        return TargetSpec(
            mode=self.mode, size=self.size, allow_upscale=self.allow_upscale, channels=self.channels, dtype=self.dtype
        )


def _load_image(path: Path, target: TargetSpec) -> np.ndarray:
    """Read, decode, resize and convert one image to ``target`` (H x W x C)."""
    from ..sources.decode import DecodeError, prepare_image, read_source_file

    try:
        return prepare_image(read_source_file(path), target).pixels
    except DecodeError as exc:
        raise DlpackError(f"folder target: cannot decode {path}: {exc}; remove or fix the file") from exc


class FolderReader:
    """The images ``rels`` below ``root``, decoded to ``spec``; implements ``dlpack.read.loader.BatchSource``.

    Parameters
    ----------
    root
        The folder the relative paths start from.
    rels
        Relative paths of the images, in sample order.
    spec
        The resolution, channels and dtype every image is converted to.
    """

    def __init__(self, root: str | os.PathLike[str], rels: Sequence[str], spec: FolderSpec) -> None:
        self.root = Path(root)
        self.rels = list(rels)
        self.spec = spec
        self._target = spec.target()
        self._fingerprint: str | None = None

    def __len__(self) -> int:
        return len(self.rels)

    def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
        """Images ``indices`` decoded into ``out`` (B x H x W x C, allocated when None); ``epoch`` is unused."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if out is None:
            w, h = self.spec.size
            out = np.empty((len(idx), h, w, self.spec.channels), dtype=self.spec.dtype)
        for k, i in enumerate(idx.tolist()):
            out[k] = _load_image(self.root / self.rels[i], self._target)
        return {"image": out, "index": idx}

    def warm(self) -> None:
        """Nothing to open ahead: every image is its own file, opened when read."""

    def fingerprint(self) -> str:
        """A hash of the relative paths, their sizes and modification times, and the target spec."""
        if self._fingerprint is None:
            h = hashlib.sha256(json.dumps(astuple(self.spec)).encode())
            for rel in self.rels:
                try:
                    st = (self.root / rel).stat()
                except OSError as exc:
                    raise SourceError(
                        f"folder target: cannot read {self.root / rel}: {exc.strerror or exc}; was it removed?"
                    ) from exc
                h.update(json.dumps([rel, st.st_size, st.st_mtime_ns]).encode())
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    def image_layout(self) -> tuple[tuple[int, ...], str] | None:
        """(H, W, C) and dtype: every image is resized to the spec, so the layout is always fixed."""
        w, h = self.spec.size
        return (h, w, self.spec.channels), np.dtype(self.spec.dtype).str

    def close(self) -> None:
        """Nothing is held open."""
