"""Train a small CNN from a dlpack store (or, for comparison, from a plain folder of images).

    python examples/train_torch.py demo/train.zarr --epochs 2
    python examples/train_torch.py fmnist.zarr --split train --val-split test --epochs 3
    python examples/train_torch.py demo/raw --folder --size 512x512 --epochs 2   # the scattered baseline
    python examples/train_torch.py aug.zarr --augment cached --epochs 4   # the store's augmentation variants

Prints, per epoch, images/s and the fraction of step time spent waiting for data: the number
that says whether the GPU (or CPU) is starved; from a store, also the loader's own line
(``epoch 0: 41,212 img/s, waited 2.1 % of the time (p99 0.4 ms)``); with --val-split, the accuracy on that split.
Without --split it trains on every sample of the store, whatever split it is in. With
``--augment cached`` each epoch serves one view of every image, its original or one of the
variants ``dlpack augment`` cached in the store, and says how many were variants. Needs the
[torch] extra.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import dlpack


def make_model(channels: int, classes: int) -> nn.Module:
    """A deliberately small CNN: the point is the data path, not the model."""
    return nn.Sequential(
        nn.Conv2d(channels, 16, 5, stride=4, padding=2),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, max(2, classes)),
    )


class FolderDataset(torch.utils.data.Dataset):  # type: ignore[misc]
    """What most training scripts do today: decode and resize every file, every epoch."""

    def __init__(self, root: str, size: tuple[int, int]) -> None:
        from dlpack.sources import FolderSource, TargetSpec

        scan = FolderSource(root).scan()
        self.root, self.items, self.classes = root, scan.items, scan.classes
        # The same decode -> resize -> convert rules as a dlpack build (RGB, 8-bit).
        self.target = TargetSpec(mode="stretch", size=size, allow_upscale=True, channels=3, dtype="|u1")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        from dlpack.sources import prepare_image

        item = self.items[i]
        img = prepare_image(Path(self.root, item.rel).read_bytes(), self.target).pixels
        label = self.classes.index(item.label) if item.label else 0
        return {"image": torch.from_numpy(img).permute(2, 0, 1), "label": label}


def loader_stats(batches: Any) -> list[Any]:
    """The dlpack loader's per-pass statistics behind ``batches`` (a torch DataLoader has none)."""
    stats = getattr(batches, "stats", None)
    if stats is None:  # a TorchLoader without stats() of its own: ask the dlpack.Loader it wraps
        stats = getattr(getattr(batches, "loader", None), "stats", None)
    return list(stats()) if callable(stats) else []


def evaluate(model: nn.Module, batches: Any, device: torch.device) -> tuple[int, int]:
    """(correct, labelled) over one pass of ``batches``; unlabelled samples (-1) are not counted."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in batches:
            y = batch["label"].to(device)
            keep = y >= 0
            if not keep.any():
                continue
            x = batch["image"].to(device, non_blocking=True).float().div_(255.0)
            pred = model(x).argmax(1)
            correct += int((pred[keep] == y[keep]).sum())
            total += int(keep.sum())
    model.train()
    return correct, total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="a dlpack store, or an image folder with --folder")
    p.add_argument("--folder", action="store_true", help="read a plain folder with a torch DataLoader")
    p.add_argument("--size", default="512x512", help="resize target for --folder (WxH)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=0, help="stop each epoch after this many steps (0: all)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--split", help="train on this split of the store only (e.g. train)")
    p.add_argument("--val-split", help="report accuracy on this split after each epoch (e.g. test)")
    p.add_argument(
        "--augment",
        choices=("none", "cached"),
        default="none",
        help="cached: train on the store's augmentation variants (dlpack augment), one view of each image per epoch",
    )
    a = p.parse_args(argv)
    if a.folder and (a.split or a.val_split):
        p.error("--split and --val-split select samples of a dlpack store, not of --folder")
    if a.folder and a.augment != "none":
        p.error("--augment cached serves the variants a dlpack store holds, not a --folder")
    device = torch.device(a.device)
    try:
        return train(a, device)
    except dlpack.DlpackError as exc:  # a wrong split name, a variable-size store, ...: say so, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2


def train(a: argparse.Namespace, device: torch.device) -> int:
    """The training loop of :func:`main`."""
    val: Any = None

    if a.folder:
        w, h = (int(v) for v in a.size.lower().split("x"))
        fds = FolderDataset(a.path, (w, h))
        batches: Any = torch.utils.data.DataLoader(
            fds,
            batch_size=a.batch_size,
            shuffle=True,
            num_workers=a.workers,
            prefetch_factor=max(1, a.prefetch) if a.workers else None,
            pin_memory=device.type == "cuda",
            drop_last=True,
            persistent_workers=a.workers > 0,
        )
        channels, classes = 3, len(fds.classes)
    else:
        from dlpack.torch import torch_loader

        ds = dlpack.open(a.path)
        batches = torch_loader(
            ds,
            split=a.split,
            batch_size=a.batch_size,
            shuffle=True,
            seed=0,
            workers=a.workers,
            prefetch=a.prefetch,
            drop_last=True,
            augment="cached" if a.augment == "cached" else None,
        )
        if a.val_split:
            val = torch_loader(ds, split=a.val_split, batch_size=a.batch_size, shuffle=False, workers=a.workers)
        if ds.splits and not a.split:
            print(
                f"note: the store has splits ({', '.join(ds.splits)}); training on all {len(ds)} samples "
                "(pass --split NAME to train on one)"
            )
        channels, classes = ds.manifest.image.channels, len(ds.classes)

    model = make_model(channels, classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    what = f" (split {a.split})" if a.split else ""
    if a.augment == "cached":
        what += " with its cached augmentation variants"
    print(f"training on {device} from {'folder' if a.folder else 'dlpack store'} {a.path}{what}")
    for epoch in range(a.epochs):
        if hasattr(batches, "set_epoch"):
            batches.set_epoch(epoch)
        t0 = time.perf_counter()
        wait = 0.0
        n = variants = 0
        last_loss = float("nan")  # an epoch may have no full batch (a tiny split)
        t_ready = time.perf_counter()
        for steps, batch in enumerate(batches, 1):
            t_got = time.perf_counter()
            wait += t_got - t_ready
            x = batch["image"].to(device, non_blocking=True).float().div_(255.0)
            y = torch.as_tensor(batch["label"]).to(device, non_blocking=True).clamp_(0, max(1, classes) - 1)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            last_loss = loss.item()
            if device.type == "cuda":
                torch.cuda.synchronize()
            n += len(x)
            if "variant" in batch:  # 0: the original, v: cached variant v
                variants += int((torch.as_tensor(batch["variant"]) > 0).sum())
            t_ready = time.perf_counter()
            if a.max_steps and steps >= a.max_steps:
                break
        dt = time.perf_counter() - t0
        print(
            f"epoch {epoch}: {n} images in {dt:.2f} s = {n / dt:.0f} images/s, "
            f"waiting for data {100 * wait / dt:.0f} % of the time, loss {last_loss:.3f}"
        )
        if a.augment == "cached":
            print(f"epoch {epoch}: {variants} of {n} images served as cached variants, the rest as originals")
        stats = loader_stats(batches)
        if stats:  # the loader's own figures for the pass: the wait inside next(), p99 per batch
            print(f"  loader: {stats[-1].line()}")
        if val is not None:
            correct, total = evaluate(model, val, device)
            acc = f"accuracy {correct / total:.3f} ({correct} of {total} images)" if total else "no labelled images"
            print(f"epoch {epoch}: validation on {a.val_split}: {acc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
