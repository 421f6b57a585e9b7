"""Batch arrays for the benchmarks' gathers, placed in memory as the loader places its own."""

from __future__ import annotations

import numpy as np

#: The loader's pooled batches start this far into a memory page (dlpack/read/loader.py says why).
PAGE, PAGE_OFFSET = 4096, 2048


def placed_empty(shape: tuple[int, ...], dtype: type | str = np.uint8) -> np.ndarray:
    """An uninitialised array that starts :data:`PAGE_OFFSET` bytes into a page.

    ``np.empty`` puts a large array 16 bytes past a page boundary, while the rows of a memory-mapped
    store mostly start on one: a copy between the two runs several times slower (4K aliasing), so a
    ceiling gathered into a plain ``np.empty`` batch would be a low one, and its rate would move
    with wherever the allocator happens to put it.
    """
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dt.itemsize
    block = np.empty(nbytes + PAGE, dtype=np.uint8)
    start = (PAGE_OFFSET - block.ctypes.data) % PAGE
    out: np.ndarray = block[start : start + nbytes].view(dt).reshape(shape)
    return out
