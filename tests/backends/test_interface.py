"""Every backend against the shipped conformance suite (dlpack.testing.BackendTests)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

from dlpack.backends import open_writer
from dlpack.errors import StoreError
from dlpack.testing import BackendTests, N, sample_arrays


class TestZarr(BackendTests):
    backend = "zarr"
    compressions = ("lz4", "zstd")

    def test_plain_zarr_reads_named_arrays(self, tmp_path: Path) -> None:
        arrays = sample_arrays()
        path = self.build_store(tmp_path, arrays)
        g = zarr.open_group(str(path), mode="r")
        assert np.array_equal(g["masks"][...], arrays["masks"])
        offsets, data = g["boxes_offsets"][...], g["boxes_data"][...]
        assert offsets.tolist()[0] == 0 and len(offsets) == N + 1
        for i in range(N):
            assert np.array_equal(data[offsets[i] : offsets[i + 1]], arrays["boxes"][i])

    def test_foreign_zarr_group_is_not_written_into(self, tmp_path: Path) -> None:
        path = tmp_path / "theirs.zarr"
        zarr.open_group(str(path), mode="w-").create_array("data", shape=(3,), dtype="<i4")
        before = sorted(p.relative_to(path).as_posix() for p in path.rglob("*"))
        with pytest.raises(StoreError, match="not a dlpack store"):
            open_writer(path, "r+")
        assert sorted(p.relative_to(path).as_posix() for p in path.rglob("*")) == before
        assert json.loads((path / "zarr.json").read_text())["attributes"] == {}


class TestHdf5(BackendTests):
    backend = "hdf5"
    compressions = ("lz4", "zstd")

    def test_plain_h5py_reads_named_arrays(self, tmp_path: Path) -> None:
        arrays = sample_arrays()
        path = self.build_store(tmp_path, arrays)
        with h5py.File(path, "r") as f:
            assert np.array_equal(f["masks"][()], arrays["masks"])
            offsets, data = f["boxes_offsets"][()], f["boxes_data"][()]
        for i in range(N):
            assert np.array_equal(data[offsets[i] : offsets[i + 1]], arrays["boxes"][i])
