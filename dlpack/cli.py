"""The ``dlpack`` command: a thin argparse layer over the library.

``main(argv) -> int`` is the one place where library errors become messages and exit codes:
0 success, 1 completed with skipped inputs, 2 usage or input errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__
from .errors import DlpackError

__all__ = ["main"]


def _jobs(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer (or -1 for all cores), got {text!r}") from None


def _add_build(sub: Any) -> None:
    p = sub.add_parser("build", help="pack a folder of images into one store")
    p.add_argument("src", help="source folder (class sub-folders become labels)")
    p.add_argument("out", help="output store: DIR.zarr (default) or FILE.h5")
    p.add_argument("--format", choices=["zarr", "hdf5"], help="store format (default: from OUT's suffix, else zarr)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--size", metavar="WxH", help="target resolution, e.g. 512x512")
    g.add_argument("--max-side", type=int, metavar="N", help="shrink so the longest side is at most N")
    p.add_argument(
        "--resize", choices=["stretch", "fit", "none"], help="stretch (default with --size), fit (pad), none"
    )
    p.add_argument("--allow-upscale", action="store_true", help="allow enlarging images smaller than --size")
    p.add_argument("--channels", choices=["keep", "1", "3"], default="keep", help="keep (majority), 1 gray, 3 RGB")
    p.add_argument("--labels", choices=["auto", "folders", "none"], default="auto")
    p.add_argument("--jobs", type=_jobs, default=-1, help="worker processes (default: all cores)")
    p.add_argument("--compression", choices=["none", "lz4", "zstd"], default="none")
    p.add_argument("--on-error", choices=["fail", "skip"], default="fail", help="on unreadable inputs")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument("--max-pixels", type=int, default=2**28, help="refuse images with more pixels (bomb guard)")
    p.add_argument("--shard-bytes", type=int, default=32 * 2**20, help="target bytes per Zarr shard file")
    p.add_argument("--follow-symlinks", action="store_true", help="pack symlinked files that stay inside SRC")
    p.set_defaults(run=_run_build)


def _run_build(a: argparse.Namespace) -> int:
    from .build import build
    from .options import BuildOptions

    opts = BuildOptions(
        format=a.format,
        size=a.size,
        max_side=a.max_side,
        resize=a.resize,
        allow_upscale=a.allow_upscale,
        channels=a.channels,
        labels=a.labels,
        jobs=a.jobs,
        compression=a.compression,
        on_error=a.on_error,
        overwrite=a.overwrite,
        quiet=a.quiet,
        max_pixels=a.max_pixels,
        shard_bytes=a.shard_bytes,
        follow_symlinks=a.follow_symlinks,
    )
    result = build(a.src, a.out, opts)
    if result.skipped:
        print(f"dlpack: skipped {len(result.skipped)} unreadable input(s):", file=sys.stderr)
        for e in result.skipped:
            print(f"  {e}", file=sys.stderr)
    if not a.quiet:
        print(result.summary())
    return 1 if result.skipped else 0


def _add_info(sub: Any) -> None:
    p = sub.add_parser("info", help="describe a store")
    p.add_argument("store")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=_run_info)


def _run_info(a: argparse.Namespace) -> int:
    from .dataset import open as open_store

    with open_store(a.store) as ds:
        info = ds.info()
    if a.json:
        print(json.dumps(info, indent=2, ensure_ascii=False))
        return 0
    res = "x".join(map(str, info["resolution"])) if info["resolution"] else "variable"
    rows = [
        ("store", f"{info['path']} ({info['backend']}, format v{info['format_version']})"),
        ("images", f"{info['count']}"),
        ("resolution", f"{res} x {info['channels']} channel(s), {info['dtype']}"),
        ("classes", ", ".join(info["classes"]) or "(unlabelled)"),
        ("compression", info["compression"]),
        ("on disk", f"{info['bytes_on_disk'] / 1e6:.1f} MB"),
        ("skipped", str(len(info["skipped"]))),
    ]
    if info["conversions"]:
        rows.append(("converted", ", ".join(f"{k}: {v}" for k, v in info["conversions"].items())))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    for e in info["skipped"]:
        print(f"  skipped {e['path']}: {e['reason']}")
    return 0


def _add_bench(sub: Any) -> None:
    p = sub.add_parser(
        "bench", help="measure read throughput: random vs sequential, warm vs cold cache, store vs folder"
    )
    p.add_argument(
        "targets", nargs="+", metavar="TARGET", help="a dlpack store (DIR.zarr, FILE.h5) or a folder of images"
    )
    p.add_argument("--order", default="sequential,random", help="comma list of sequential, random, block")
    p.add_argument("--cache", default="warm,cold", help="comma list of warm, cold (cold evicts the target first)")
    p.add_argument("--batch-size", type=int, default=32, metavar="B")
    p.add_argument("--workers", type=int, default=2, metavar="W", help="loader threads (default 2)")
    p.add_argument("--prefetch", type=int, default=4, metavar="P", help="batches read ahead (default 4)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--samples", type=int, metavar="N", help="images per run (default: one epoch, 1-10 s)")
    g.add_argument("--seconds", type=float, metavar="T", help="seconds per run")
    p.add_argument("--repeat", type=int, default=3, metavar="R", help="runs per cell; the median is reported")
    p.add_argument("--step-ms", type=float, metavar="MS", help="simulate a training step of MS per batch")
    p.add_argument("--size", metavar="WxH", help="resolution for folder targets (default: the first store's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random order")
    p.add_argument("--json", metavar="FILE", help="write every figure, the machine and the options as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write a bar chart (needs the [plot] extra)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    def run(a: argparse.Namespace) -> int:
        from .bench import BenchOptions, check_outputs, run_bench

        opts = BenchOptions(
            orders=a.order,
            caches=a.cache,
            batch_size=a.batch_size,
            workers=a.workers,
            prefetch=a.prefetch,
            samples=a.samples,
            seconds=a.seconds,
            repeat=a.repeat,
            step_ms=a.step_ms,
            size=a.size,
            seed=a.seed,
            quiet=a.quiet,
        )
        check_outputs(a.json, a.plot)
        report = run_bench(a.targets, opts)
        print(report.table())
        if a.json:
            report.write_json(a.json)
        if a.plot:
            report.plot(a.plot)
        return 0

    p.set_defaults(run=run)


def _add_verify(sub: Any) -> None:
    p = sub.add_parser("verify", help="check every image of a store against its checksum")
    p.add_argument("store")
    p.set_defaults(run=_run_verify)


def _run_verify(a: argparse.Namespace) -> int:
    from .dataset import open as open_store
    from .errors import StoreError

    with open_store(a.store) as ds:
        bad = ds.verify()
        n = len(ds)
    if bad:
        listing = "\n".join(f"  sample {i} ({src})" for i, src in bad[:50])
        raise StoreError(f"{len(bad)} of {n} images in {a.store} do not match their checksum:\n{listing}")
    print(f"{a.store}: all {n} images match their checksums")
    return 0


COMMANDS: list[Callable[[Any], None]] = [_add_build, _add_info, _add_verify, _add_bench]


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dlpack", description="Pack images into training-ready stores.")
    parser.add_argument("--version", action="version", version=f"dlpack {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting (tests call it in-process)."""
    parser = make_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help and on usage errors
        return int(exc.code or 0)
    try:
        return int(args.run(args))
    except (DlpackError, OSError) as exc:
        # OSError: a disk full, a folder not writable, ...: the message names the path.
        if args.debug:
            raise
        print(f"dlpack: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dlpack: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
