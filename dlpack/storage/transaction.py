"""Change the arrays of a complete store in one step: arrays added, replaced and dropped, and the
manifest that lists them, switched in together (``dlpack.add_array``, ``dlpack augment``).

What differs per backend is the backend's half of the change (``begin_change``,
``commit_change``, ``abort_change`` of :class:`~dlpack.backends.Backend`). Zarr prepares the next
generation beside the store, and the commit publishes it as a build publishes
(:func:`~dlpack.storage.publish.publish_stage`), so the store is the old one or the new one, whole.
HDF5 writes the new arrays into the store file under staged names and switches them in one
session of the HDF5 library. See docs/format.md, "Adding an array".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..backends import ArraySpec, Backend, StoreWriter, owned_store
from ..backends.base import DEFAULT_SHARD_BYTES
from ..errors import StoreError
from ..manifest import Manifest
from .publish import publish_stage

__all__ = ["ArrayTransaction"]


class ArrayTransaction:
    """New arrays for the complete store ``out`` (whose manifest is ``manifest``), and the arrays
    ``drop`` it loses, switched in together by :meth:`commit`.

    Call :meth:`begin`, then :meth:`create` (or :meth:`attach`) and write each new array through
    :attr:`writer` under :meth:`name` (worker processes may write the fixed ones where the writer
    is ``parallel_safe``), then :meth:`commit` with the manifest to publish; :meth:`abort` on any
    failure. Call only while holding the store's build lock. ``stage`` is where a Zarr store's
    next generation is prepared (a sibling of ``out``); HDF5 ignores it.
    """

    def __init__(
        self,
        out: Path,
        manifest: Manifest,
        drop: Sequence[str],
        stage: Path,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
    ) -> None:
        backend = owned_store(out)
        if backend is None:
            raise StoreError(f"{out} is not a dlpack store")
        self.backend: type[Backend] = backend
        self.out = out
        self.manifest = manifest
        self.drop = tuple(drop)
        self.stage = stage
        self.shard_bytes = shard_bytes
        #: The writer of the new arrays, once :meth:`begin` opened it.
        self.opened: StoreWriter | None = None
        #: The new arrays by their final name, as they will be listed.
        self.created: dict[str, ArraySpec] = {}
        self.committed = False
        #: Whether ``stage`` is this transaction's (cleared or verified by it), so a failure removes it.
        self.own_stage = False

    @property
    def writer(self) -> StoreWriter:
        """The writer of the new arrays; a StoreError before :meth:`begin`."""
        if self.opened is None:
            raise StoreError(f"the change of {self.out} has not begun")
        return self.opened

    def name(self, final: str) -> str:
        """The name array ``final`` has in :attr:`writer` until the switch."""
        return self.backend.change_name(final)

    def _stored_spec(self, spec: ArraySpec) -> ArraySpec:
        name = self.name(spec.name)
        return spec if name == spec.name else replace(spec, name=name, key=None)

    # ------------------------------------------------------------------ begin

    def begin(self, resume: Sequence[ArraySpec] = ()) -> None:
        """Open the writer on a copy of the store as it is (Zarr) or on the store (HDF5).

        ``resume``: the fixed arrays that a killed transaction making the same change created and
        wrote blocks of; they are kept (attached) and everything else that transaction left is
        removed. Raises :class:`StoreError` when they cannot be kept (the caller then begins anew).
        """
        self.backend.begin_change(self, resume)

    # ------------------------------------------------------------------ arrays

    def create(self, spec: ArraySpec, rows: int | None = None) -> None:
        """Create new array ``spec`` (its final name and key); ``rows`` as in ``create_array``."""
        writer = self.writer
        self.backend.check_new_array(self, spec)
        writer.create_array(self._stored_spec(spec), self.manifest.count, rows)
        self.created[spec.name] = spec

    def attach(self, spec: ArraySpec) -> None:
        """Keep fixed array ``spec``, which a killed transaction of the same change created (see :meth:`begin`)."""
        self.writer.attach_array(self._stored_spec(spec), self.manifest.count)
        self.created[spec.name] = spec

    def write_values(self, spec: ArraySpec, data: np.ndarray | Sequence[np.ndarray]) -> None:
        """Create ``spec`` and write all its values (a fixed array in whole blocks)."""
        self.create(spec)
        writer, name, n = self.writer, self.name(spec.name), self.manifest.count
        if spec.ragged:
            writer.write_block(name, 0, data)
            return
        step = writer.shard_rows(name)
        for s in range(0, n, step):
            writer.write_block(name, s, data[s : s + step])

    # ------------------------------------------------------------------ commit / abort

    def commit(self, after: Manifest) -> None:
        """Switch the new arrays in with manifest ``after`` (its arrays are the writer's): the store
        is the new one once this returns, the old one if it raises."""
        _ = self.writer  # raises when not begun
        staged = self.backend.commit_change(self, after)
        if staged is not None:
            publish_stage(staged, self.out, overwrite=True)

    def abort(self, keep: bool = False) -> None:
        """Undo after a failure: the store stays as it was. ``keep`` leaves the new arrays written
        so far (not listed by any manifest) for a resumed transaction to :meth:`attach`."""
        self.backend.abort_change(self, keep)
