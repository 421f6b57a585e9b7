"""A store file that shrinks under an open reader (another program rewriting it in place) is a
StoreError naming the file, never a SIGBUS that kills the process.

Each case runs in a subprocess: a SIGBUS there shows as a negative return code instead of killing
pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import dlpack

TREE = {f"{'ab'[k % 2]}/{k}.png": ("rgb", 64, 64) for k in range(24)}

SCRIPT = textwrap.dedent(
    """
    import glob, os, sys
    import dlpack
    from dlpack import Loader, LoaderOptions

    store, how = sys.argv[1], sys.argv[2]
    ds = dlpack.open(store)
    if how in ("loader", "cached"):
        # prefetch 0: each batch is read when asked for, after the cut, not read ahead before it
        augment = "cached" if how == "cached" else None
        loader = Loader(ds, LoaderOptions(batch_size=4, seed=1, workers=1, prefetch=0, augment=augment))
        batches = iter(loader)
        next(batches)
    else:
        ds[0]
    if store.endswith(".h5"):
        files = [store]
    else:  # every shard but the first, so the first batch was read whole
        files = sorted(glob.glob(os.path.join(store, "images*", "c", "*", "0", "0", "0")))
        files = [f for f in files if not f.endswith(os.path.join("c", "0", "0", "0", "0"))]
    for f in files:
        os.truncate(f, os.path.getsize(f) // 3)
    try:
        if how in ("loader", "cached"):
            for _ in batches:
                pass
        else:
            for i in range(len(ds)):
                ds[i]
            ds.get_batch(list(range(len(ds))))
    except dlpack.StoreError as exc:
        print("StoreError:", exc)
        sys.exit(0)
    print("read everything without an error")
    sys.exit(1)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["open", "loader", "cached"])
@pytest.mark.parametrize("fmt", ["s.zarr", "s.h5"])
def test_a_store_file_truncated_under_a_reader_is_a_store_error_not_sigbus(
    fmt: str, how: str, tmp_path: Path, make_tree: Callable[..., Path]
) -> None:
    """``cached``: batches that mix the originals and their variants (one take over all arrays'
    maps, skipped checks while no file had an event) see the cut as the originals' batches do."""
    store = tmp_path / fmt
    # Small shards: the Zarr store has several, so a later one can be cut while the first is read.
    dlpack.build(make_tree(TREE), store, size=(64, 64), shard_bytes=65536, quiet=True, jobs=1)
    if how == "cached":
        config = tmp_path / "flip.json"
        config.write_text(json.dumps({"augmentation_percentage": 100, "mirror": "c"}), encoding="utf-8")
        dlpack.augment(store, 2, config, seed=0, quiet=True, jobs=1)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(store), how], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)  # -7: killed by SIGBUS
    said = proc.stdout
    assert said.startswith("StoreError:") and "shrank" in said, said
    assert (str(store) if fmt == "s.h5" else str(store / "images" / "c")) in said
