"""RaggedBatch: a batch's rows of one ragged array, cut per sample on demand."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import dlpack
from dlpack.ragged import RaggedBatch


def _batch() -> tuple[RaggedBatch, list[np.ndarray]]:
    parts = [np.arange(8, dtype=np.float32).reshape(2, 4), np.zeros((0, 4), np.float32), np.ones((3, 4), np.float32)]
    offsets = np.array([0, 2, 2, 5])
    return RaggedBatch(np.concatenate(parts), offsets), parts


def test_it_is_a_sequence_of_the_samples_rows() -> None:
    b, parts = _batch()
    assert len(b) == 3 and b.counts().tolist() == [2, 0, 3]
    assert all(np.array_equal(got, want) and got.dtype == want.dtype for got, want in zip(b, parts, strict=True))
    assert np.array_equal(b[-1], parts[2]) and b[1].shape == (0, 4)
    assert [x.shape for x in b[1:]] == [(0, 4), (3, 4)] and len(list(b)) == 3
    with pytest.raises(IndexError, match="sample 3 of a batch of 3"):
        b[3]
    with pytest.raises(IndexError):
        b[-4]


def test_a_sample_is_a_view_so_changing_it_changes_no_other_sample() -> None:
    b, parts = _batch()
    b[0][...] = -1
    assert np.array_equal(b[2], parts[2]) and (b.data[:2] == -1).all()


def test_equality_is_by_rows_dtype_and_shape() -> None:
    b, parts = _batch()
    assert b == parts and b == [p.copy() for p in parts]
    assert b != [p.astype(np.float64) for p in parts]
    assert b != parts[:2] and b != [parts[0], parts[1], parts[1]]
    assert RaggedBatch(np.zeros((0, 4)), np.array([0])) == []


def test_offsets_must_cover_the_rows() -> None:
    with pytest.raises(ValueError, match="offsets must rise from 0 to 5"):
        RaggedBatch(np.zeros((5, 4)), np.array([0, 2, 4]))
    with pytest.raises(ValueError, match=r"offsets must rise from 0 to 5 \(the rows\), got \[1 5\]"):
        RaggedBatch(np.zeros((5, 4)), np.array([1, 5]))


def test_it_pickles_and_is_public() -> None:
    b, parts = _batch()
    assert pickle.loads(pickle.dumps(b)) == parts
    assert dlpack.RaggedBatch is RaggedBatch
