"""Test helper: edit a store's manifest in place, bypassing dlpack (as damage or a newer dlpack would)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py


def rewrite_manifest(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``change`` to the manifest of the Zarr folder or HDF5 file at ``path``."""
    if path.is_dir():
        d = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
        change(d)
        (path / "manifest.json").write_text(json.dumps(d), encoding="utf-8")
        return
    with h5py.File(path, "r+") as f:
        d = json.loads(f["manifest"][()].decode("utf-8"))
        change(d)
        del f["manifest"]
        f.create_dataset("manifest", data=json.dumps(d), dtype=h5py.string_dtype("utf-8"))
