"""Fixtures of the storage tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

#: Images of :func:`src`: 16x16 RGB; with 65536-byte shards, 85 images a shard (3 blocks).
SRC_IMAGES = 200


@pytest.fixture
def src(make_tree: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of :data:`SRC_IMAGES` images in 3 class folders; the test runs in tmp_path (where a
    URL taken for a path would make ``s3:``)."""
    monkeypatch.chdir(tmp_path)
    return make_tree({f"c{k % 3}/{k:03d}.png": "rgb" for k in range(SRC_IMAGES)})
