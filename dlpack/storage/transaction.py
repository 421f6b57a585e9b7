"""Change the arrays of a complete store in one step: arrays added, replaced and dropped, and the
manifest that lists them, switched in together (``dlpack.add_array``, ``dlpack augment``).

Zarr: the next generation is prepared beside the store (every data file a hard link to the
store's), written, committed and published as a build publishes, so the store is the old one or
the new one, whole. HDF5: the new arrays are written into the store file under staged names,
without keys, and committed; then one session of the HDF5 library (which writes the file when
it closes it) renames the arrays they replace aside, the new ones into place, and writes the
manifest; the arrays replaced are deleted last. Whatever fails in that session is undone in it.
See docs/format.md, "Adding an array".
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from .._files import writing
from ..backends import ArraySpec, StoreWriter, open_writer
from ..backends.base import DEFAULT_SHARD_BYTES
from ..errors import StoreError
from ..manifest import Manifest

__all__ = ["ArrayTransaction", "STAGED_PREFIX", "staged_name"]

#: Names the HDF5 switch gives the arrays it writes or moves aside: users' names never start so.
STAGED_PREFIX = "dlpack_"


def _tag(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:16]


def staged_name(name: str) -> str:
    """The name an HDF5 transaction writes array ``name`` under until the switch: ``dlpack_new_<tag>``."""
    return STAGED_PREFIX + "new_" + _tag(name)


def _retired_name(name: str) -> str:
    return STAGED_PREFIX + "old_" + _tag(name)


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
        self.out = out
        self.manifest = manifest
        self.drop = tuple(drop)
        self.zarr = out.is_dir()
        self.stage = stage
        self.shard_bytes = shard_bytes
        self._writer: StoreWriter | None = None
        #: The new arrays by their final name, as they will be listed.
        self.created: dict[str, ArraySpec] = {}
        self._committed = False
        #: Whether ``stage`` is this transaction's (cleared or verified by it), so a failure removes it.
        self._own_stage = False

    @property
    def writer(self) -> StoreWriter:
        if self._writer is None:
            raise StoreError(f"the change of {self.out} has not begun")
        return self._writer

    def name(self, final: str) -> str:
        """The name array ``final`` has in :attr:`writer` until the switch."""
        return final if self.zarr else staged_name(final)

    def _stored_spec(self, spec: ArraySpec) -> ArraySpec:
        return spec if self.zarr else replace(spec, name=staged_name(spec.name), key=None)

    # ------------------------------------------------------------------ begin

    def begin(self, resume: Sequence[ArraySpec] = ()) -> None:
        """Open the writer on a copy of the store as it is (Zarr) or on the store (HDF5).

        ``resume``: the fixed arrays that a killed transaction making the same change created and
        wrote blocks of; they are kept (attached) and everything else that transaction left is
        removed. Raises :class:`StoreError` when they cannot be kept (the caller then begins anew).
        """
        if self.zarr:
            self._begin_zarr(resume)
        else:
            self._begin_hdf5(resume)

    def _begin_zarr(self, resume: Sequence[ArraySpec]) -> None:
        from ..backends._zarr import ZarrBackend, clear_beside, prepare_beside, read_manifest

        if resume:
            if not ZarrBackend.is_own(self.stage) or self.stage.is_symlink():
                raise StoreError(f"{self.stage} is not a dlpack store folder to continue")
            if read_manifest(self.stage).to_json() != self.manifest.to_json():
                raise StoreError(f"{self.stage} no longer holds a copy of {self.out}")
            self._own_stage = True
        else:
            clear_beside(self.out, self.stage)
            self._own_stage = True
            prepare_beside(self.out, self.stage, skip=[n for name in self.drop for n in self._stored_names(name)])
        writer = self._writer = open_writer(self.stage, "r+", shard_bytes=self.shard_bytes)
        for name in self.drop:
            if name in writer.arrays:
                if resume:  # never copied into the stage: a folder of that name is a new array of this change
                    del writer.arrays[name]
                else:
                    writer.delete_array(name)
        for spec in resume:
            self.attach(spec)
        if resume:
            writer.remove_temp_files()
            writer.clear_debris()  # arrays the killed transaction began beside the kept ones

    def _stored_names(self, name: str) -> tuple[str, ...]:
        spec = self.manifest.arrays.get(name)
        return spec.stored_names() if spec is not None else (name,)

    def _begin_hdf5(self, resume: Sequence[ArraySpec]) -> None:
        writer = self._writer = open_writer(self.out, "r+", shard_bytes=self.shard_bytes)
        for spec in resume:
            self.attach(spec)
        writer.clear_debris()  # what killed writers left, but the arrays kept
        kept = {staged_name(name) for name in self.created}
        for leftover in [n for n in writer.arrays if n.startswith(STAGED_PREFIX) and n not in kept]:
            writer.delete_array(leftover)  # committed by a call killed before its switch
        writer.abort()  # closes the file: worker processes may read it and write raw blocks next

    # ------------------------------------------------------------------ arrays

    def create(self, spec: ArraySpec, rows: int | None = None) -> None:
        """Create new array ``spec`` (its final name and key); ``rows`` as in ``create_array``."""
        writer = self.writer
        if self.zarr:
            taken = [
                n
                for n in spec.stored_names()
                if ((self.stage / n).exists() or (self.stage / n).is_symlink()) and n not in writer.arrays
            ]
            if taken:
                raise StoreError(
                    f"{self.out} holds {', '.join(taken)}, which is not one of its arrays; choose another array name"
                )
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
        writer = self.writer
        if self.zarr:
            from .publish import publish_stage

            writer.commit(after)
            self._committed = True
            publish_stage(self.stage, self.out, overwrite=True)
            return
        from ..backends._hdf5 import ensure_space

        writer.commit(self.manifest)  # the staged arrays' checksums; no sample shows them (no key)
        self._committed = True
        ensure_space(self.out, 4 * len(after.to_json().encode("utf-8")) + 2**20, "the manifest")
        retired: dict[str, ArraySpec] = {}
        renamed: list[str] = []
        try:
            for name in self.drop:
                if name in writer.arrays:
                    writer.rename_array(name, _retired_name(name))
                    # No longer listed; deleted once the switch is written.
                    retired[name] = writer.arrays.pop(_retired_name(name))
            for name, spec in self.created.items():
                writer.rename_array(staged_name(name), name, spec.key)
                renamed.append(name)
            writer.commit(after)  # the switch
        except BaseException:
            for name in reversed(renamed):
                if name in writer.arrays and staged_name(name) not in writer.arrays:
                    writer.rename_array(name, staged_name(name))
            for name, old in retired.items():
                writer.arrays[_retired_name(name)] = old
                writer.rename_array(_retired_name(name), name, self.manifest.arrays[name].key)
            raise
        self.created = {}  # switched in: nothing of this change is left to undo
        for name, old in retired.items():
            writer.arrays[_retired_name(name)] = old
            writer.delete_array(_retired_name(name))  # listed by no manifest: a kill before this leaves debris
        writer.abort()
        if retired:
            from ..backends._hdf5 import compact

            # HDF5 never reuses the space of the arrays just deleted: without this, each replacement
            # would grow the file by the size of what it replaced.
            with writing(self.out):
                compact(self.out)

    def abort(self, keep: bool = False) -> None:
        """Undo after a failure: the store stays as it was. ``keep`` leaves the new arrays written
        so far (not listed by any manifest) for a resumed transaction to :meth:`attach`."""
        writer = self._writer
        if self.zarr:
            if writer is not None:
                writer.abort()
            if not keep and self._own_stage and self.stage.exists():
                shutil.rmtree(self.stage, ignore_errors=True)  # made by this transaction, under the lock
            return
        if writer is None:
            return  # it failed before the writer opened: nothing of this change was written
        try:
            staged = [staged_name(n) for n in self.created if staged_name(n) in writer.arrays]
            if staged and (not keep or self._committed):
                with contextlib.suppress(Exception):
                    for name in staged:
                        writer.delete_array(name)
                    writer.commit(self.manifest)
        finally:
            writer.abort()
