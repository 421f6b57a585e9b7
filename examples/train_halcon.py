"""Train a HALCON deep-learning model from a dlpack store, with the batches read ahead.

    python examples/train_halcon.py train.zarr --model pretrained.hdl --epochs 5 --batch-size 16
    python examples/train_halcon.py train.zarr --model pretrained.hdl --split train --save trained.hdl

HALCON's own ``train_dl_model`` reads each batch's sample files one by one on the training thread;
here ``dlpack.halcon.sample_batches`` reads the next batches on worker threads while
``train_dl_model_batch`` runs. The store's images must already have the model's input size and
channels (build it with ``--size WxH``): no HALCON preprocessing is applied, only the pixel values
are scaled to the model's image range. Prints, per epoch, images/s and the fraction of the time
spent waiting for data, and the loader's own line for the epoch (``batches.stats()[-1].line()``:
the share of the time waited inside ``next()`` and the p99 wait per batch).

Needs the [halcon] extra and a native HALCON installation with a licence. The store, the split and
the model path are checked first, without HALCON; then, where HALCON does not import, it says so
and exits 2 without training (a job that runs it never reads that as a success).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import dlpack
from dlpack.halcon import import_halcon, sample_batches, store_class_ids, store_task


def _first(value: Any) -> Any:
    """A HALCON parameter's single value (the binding hands tuples as lists)."""
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    return value


def main(argv: list[str] | None = None, halcon: Any = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store", help="a dlpack store whose images have the model's input size")
    p.add_argument("--model", required=True, help="a HALCON model file (.hdl) to read and train")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--split", help="train on this split of the store only (e.g. train)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--prefetch", type=int, default=4, help="batches read ahead (HALCON's own loop reads none)")
    p.add_argument("--max-steps", type=int, default=0, help="stop each epoch after this many batches (0: all)")
    p.add_argument("--save", help="write the trained model to this .hdl file")
    a = p.parse_args(argv)
    try:
        ds = check_inputs(a)  # what can be wrong without HALCON is said before HALCON is asked for
        if halcon is None:
            try:
                halcon = import_halcon()
            except dlpack.MissingExtraError as exc:
                print(f"HALCON is not available, nothing was trained: {exc}", file=sys.stderr)
                return 2
        return train(a, ds, halcon)
    except dlpack.DlpackError as exc:  # a wrong split, a store without labels, ...: say so, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2


def check_inputs(a: argparse.Namespace) -> dlpack.Dataset:
    """The open store, once it has one image size, the split asked for, and the model file exists."""
    ds = dlpack.open(a.store)
    if ds.image_layout() is None:
        raise dlpack.OptionError(f"{a.store} is a variable-size store; HALCON trains on one input size (--size WxH)")
    if a.split:
        ds.indices(a.split)  # a split the store does not have is refused, naming those it has
    store_task(ds.manifest)
    model = Path(a.model)
    if not model.is_file():
        what = "is not a file" if model.exists() else "does not exist"
        raise dlpack.OptionError(f"the model {a.model} {what}; give a HALCON model file (.hdl) with --model")
    return ds


def train(a: argparse.Namespace, ds: dlpack.Dataset, ha: Any) -> int:
    """The training loop of :func:`main`, on the store :func:`check_inputs` opened."""
    task = store_task(ds.manifest)
    layout = ds.image_layout()
    assert layout is not None  # checked by check_inputs
    (height, width, channels), _ = layout
    model = ha.read_dl_model(a.model)
    want = {
        name: _first(ha.get_dl_model_param(model, name))
        for name in ("image_width", "image_height", "image_num_channels")
    }
    have = {"image_width": width, "image_height": height, "image_num_channels": channels}
    wrong = [f"{k} {have[k]} (the model wants {v})" for k, v in want.items() if v not in (None, have[k])]
    if wrong:
        raise dlpack.OptionError(f"the images of {a.store} do not fit {a.model}: " + ", ".join(wrong))
    ha.set_dl_model_param(model, "batch_size", a.batch_size)
    if task == "classification":
        ha.set_dl_model_param(model, "class_ids", list(store_class_ids(ds.manifest)))
    low = _first(ha.get_dl_model_param(model, "image_range_min"))
    high = _first(ha.get_dl_model_param(model, "image_range_max"))
    image_range = (float(low), float(high)) if low is not None and high is not None else (-127.0, 128.0)
    what = f" (split {a.split})" if a.split else ""
    print(f"training {a.model} ({task}) from dlpack store {a.store}{what}, {width}x{height}x{channels}")
    for epoch in range(a.epochs):
        batches = sample_batches(
            ds,
            a.batch_size,
            split=a.split,
            seed=0,
            epoch=epoch,
            prefetch=a.prefetch,
            workers=a.workers,
            drop_last=True,
            image_range=image_range,
            halcon=ha,
        )
        t0 = t_ready = time.perf_counter()
        wait = 0.0
        n = 0
        for steps, batch in enumerate(batches, 1):
            wait += time.perf_counter() - t_ready
            ha.train_dl_model_batch(model, batch)
            n += len(batch)
            t_ready = time.perf_counter()
            if a.max_steps and steps >= a.max_steps:
                batches.close()
                break
        dt = max(time.perf_counter() - t0, 1e-9)
        print(
            f"epoch {epoch}: {n} images in {dt:.2f} s = {n / dt:.0f} images/s, "
            f"waiting for data {100 * wait / dt:.0f} % of the time"
        )
        stats = batches.stats()
        if stats:  # the loader's own figures: the wait inside next(), p99 per batch
            print(f"  loader: {stats[-1].line()}")
    if a.save:
        ha.write_dl_model(model, a.save)
        print(f"wrote {a.save}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
