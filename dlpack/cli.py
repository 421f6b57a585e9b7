"""The ``dlpack`` command: a thin argparse layer over the library.

``main(argv) -> int`` is the one place where library errors become messages and exit codes:
0 success, 1 completed with skipped inputs, 2 usage or input errors, 3 internal error (a bug:
any other exception), 4 ``verify`` found damage, 130 interrupted (0 when the new store was
already published), 141 stdout closed early (``| head``). ``--debug`` adds the traceback and never
changes the code. With ``--json`` a failure still prints one JSON document on stdout
(``{"error": {"type", "message", "exit_code"}}``). Text printed for the terminal has control characters
escaped (:func:`printable`), so a file name cannot move the cursor or recolour the terminal.

The flags of ``build``, ``augment``, ``bench``, ``tune``, ``export`` and ``preview`` are generated from
the option dataclasses of :mod:`dlpack.options` (:func:`add_option_arguments`): a field's name, type,
default and help live on the field only.
Every command that outputs data takes ``--json`` (print one JSON document on stdout and nothing
else there) and ``--json-file FILE`` (write the same document to FILE, output as without it).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import errno
import json
import math
import os
import re
import sys
import types
import typing
import warnings
from collections.abc import Callable, Collection, Sequence
from typing import Any, Literal, TypeVar, Union

from ._names import shown
from ._version import __version__
from .errors import DlpackError, OptionError, StoreDamagedError
from .options import AugmentOptions, ExportOptions, PreviewOptions, TuneOptions

__all__ = ["main", "make_parser", "add_option_arguments", "options_from_args", "option_flag", "printable"]

T = TypeVar("T")

#: Exit codes, as the README lists them.
EXIT_OK, EXIT_SKIPPED, EXIT_USAGE, EXIT_INTERNAL, EXIT_DAMAGED = 0, 1, 2, 3, 4
#: 128 + SIGINT, and 128 + SIGPIPE (what a shell reports for a command whose reader went away).
EXIT_INTERRUPTED, EXIT_PIPE = 130, 141
EXIT_CODES = "exit codes: 0 success, 2 usage or input errors, 3 internal error, 130 interrupted"
BUILD_EXIT_CODES = (
    "exit codes: 0 success, 1 finished with skipped inputs (--on-error skip), 2 usage or input errors, "
    "3 internal error, 130 interrupted (run the same command again to resume)"
)
VERIFY_EXIT_CODES = (
    "exit codes: 0 every image matches, 2 usage or input errors (no store there, not a dlpack store), "
    "3 internal error, 4 the store is damaged (an image or array does not match its checksum, or a "
    "dlpack store too damaged to open), 130 interrupted"
)
ALL_EXIT_CODES = (
    "exit codes: 0 success, 1 build finished with skipped inputs (--on-error skip), 2 usage or input errors, "
    "3 internal error (please report it), 4 verify found damage, 130 interrupted, "
    "141 stdout closed early (| head). --debug adds tracebacks and never changes the code; "
    'with --json a failure prints {"error": {"type", "message", "exit_code"}} on stdout'
)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(ch: str) -> str:
    return ch.encode("unicode_escape", "backslashreplace").decode("ascii")


def printable(text: object, keep: str = "\n") -> str:
    """``text`` safe to print on a terminal: control and other invisible characters as escapes.

    ANSI escape sequences, bidirectional overrides and lone surrogates (non-UTF-8 file names) in a
    name would otherwise recolour the terminal, reorder the line or fail to print. Characters in
    ``keep`` (a newline by default, for multi-line messages) are left as they are: the names inside
    such a message are escaped where it is made (:func:`dlpack._names.shown`), newlines included.
    """
    return "".join(ch if ch.isprintable() or ch in keep else _escape(ch) for ch in str(text))


class _PipeClosed(Exception):
    """The reader of stdout or stderr went away (``dlpack bench | head -1``): end quietly."""


def _write(text: str, err: bool = False) -> None:
    """Write ``text`` on stdout (or stderr); a closed pipe there becomes :class:`_PipeClosed`,
    which no other broken pipe (a worker's) can be mistaken for."""
    try:
        (sys.stderr if err else sys.stdout).write(text)
    except BrokenPipeError:
        raise _PipeClosed from None


def _say(*parts: object, err: bool = False, keep: str = "\n") -> None:
    _write(printable(" ".join(map(str, parts)), keep) + "\n", err)


# ---------------------------------------------------------------- flags from option dataclasses


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


def _choice_parser(choices: Sequence[object]) -> Callable[[str], object]:
    """Map the text of a choice back to the choice (``"1"`` -> ``1``); argparse rejects anything else."""
    by_text = {str(c): c for c in choices}

    def parse(text: str) -> object:
        return by_text.get(text, text)

    return parse


def _without_none(tp: Any) -> Any:
    """``X | None`` -> ``X``; anything else unchanged."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _default_of(cls: type, f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"{cls.__name__}.{f.name} has no default; a CLI flag needs one")


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return str(value)


def option_flag(f: dataclasses.Field[Any]) -> str | None:
    """The flag of an option field (``--max-side`` for ``max_side``), or None when it has none."""
    if f.metadata.get("cli", True) is False:
        return None
    return str(f.metadata.get("flag", "--" + f.name.replace("_", "-")))


def add_option_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, options_cls: type, skip: Collection[str] = ()
) -> None:
    """Add one flag per field of the option dataclass ``options_cls`` to ``parser``.

    Each field's ``metadata`` says how: ``"help"`` (required), optional ``"metavar"``, ``"flag"``
    (default ``--`` + the name with ``_`` as ``-``), ``"choices"`` (a sequence, or a callable returning one; default: the values of a
    ``Literal`` annotation), ``"repeat"`` (the flag may be given several times: the field gets the
    list of texts), ``"nargs"`` (argparse's: the flag takes several values) and ``"required"``;
    ``"cli": False`` gives the field no flag. ``bool`` fields are
    ``store_true`` flags; ``int`` and ``float`` fields are parsed as numbers; any other type is
    passed as the text given, for the dataclass to parse and validate (``"512x512"``,
    ``"sequential,random"``). The flag's default is ``argparse.SUPPRESS``: a flag not given is
    left out of the namespace, so :func:`options_from_args` lets the dataclass apply its own
    default, which the help text shows.

    Parameters
    ----------
    parser
        The (sub-command) parser or argument group to add the flags to.
    options_cls
        A dataclass whose fields all have defaults.
    skip
        Field names to leave out (a command that sets them another way).

    Raises
    ------
    TypeError
        A field has neither ``"help"`` nor ``"cli": False`` metadata, has no default, or is a
        ``bool`` defaulting to True (a ``store_true`` flag could not turn it off).
    """
    hints = typing.get_type_hints(options_cls)
    for f in dataclasses.fields(options_cls):
        flag = option_flag(f)
        if f.name in skip or flag is None:
            continue
        if "help" not in f.metadata:
            raise TypeError(
                f"{options_cls.__name__}.{f.name} needs field metadata 'help' for its CLI flag (or 'cli': False)"
            )
        default = _default_of(options_cls, f)
        help_text = str(f.metadata["help"]).replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS}
        tp = _without_none(hints[f.name])
        if tp is bool:
            if default is not False:
                raise TypeError(
                    f"{options_cls.__name__}.{f.name}: a bool flag is store_true, so it must default to False"
                )
            parser.add_argument(flag, action="store_true", help=help_text, **kwargs)
            continue
        choices = f.metadata.get("choices")
        if callable(choices):  # looked up when the parser is made (e.g. the registry's formats)
            choices = choices()
        if choices is None and typing.get_origin(tp) is Literal:
            choices = typing.get_args(tp)
        if choices is not None:
            kwargs["choices"] = list(choices)
            kwargs["type"] = _choice_parser(kwargs["choices"])
        elif tp is int or ("nargs" in f.metadata and typing.get_args(tp)[:1] == (int,)):
            kwargs["type"] = _integer  # an int, or each of the ints a flag with "nargs" takes
        elif tp is float:
            kwargs["type"] = _number
        if f.metadata.get("repeat"):  # a tuple of texts, one per use of the flag
            kwargs["action"] = "append"
        for key in ("nargs", "required"):
            if key in f.metadata:
                kwargs[key] = f.metadata[key]
        if "metavar" in f.metadata:
            kwargs["metavar"] = f.metadata["metavar"]
        if default is not None and default != ():
            help_text += f" (default: {_show(default)})".replace("%", "%%")
        parser.add_argument(flag, help=help_text, **kwargs)


def options_from_args(options_cls: type[T], namespace: argparse.Namespace) -> T:
    """Build ``options_cls`` from the flags given in ``namespace``; fields not given keep their defaults."""
    given = {f.name: getattr(namespace, f.name) for f in dataclasses.fields(options_cls) if hasattr(namespace, f.name)}  # type: ignore[arg-type]
    return options_cls(**given)


class _UsageError(Exception):
    """A usage error that argparse found, raised instead of exiting so that :func:`main` reports it."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors reach :func:`main` (for the ``--json`` error document)."""

    def error(self, message: str) -> typing.NoReturn:
        raise _UsageError(self, message)


class _SubParser(_Parser):
    """A sub-command parser whose option flags may be added on first use, so their module loads only then."""

    def __init__(
        self, *args: Any, add_flags: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._add_flags = add_flags

    def _complete(self) -> None:
        add, self._add_flags = self._add_flags, None
        if add is not None:
            add(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._complete()
        ns, extras = super().parse_known_args(args, namespace)
        if extras:  # here, not in the top-level parser: the usage and the suggestion are this command's
            self.error(self._unrecognized(extras))
        return ns, extras

    def _unrecognized(self, extras: list[str]) -> str:
        """The "unrecognized arguments" message of argparse, with the flags of this command nearest to each typo."""
        flags = [f for f in self._option_string_actions if f.startswith("--")]
        hints = []
        for arg in extras:
            if arg.startswith("-"):
                close = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1, cutoff=0.7)
                hints += [c for c in close if c not in hints]
        message = f"unrecognized arguments: {' '.join(extras)}"
        return message + (f"; did you mean {' or '.join(hints)}?" if hints else "")

    def format_help(self) -> str:
        self._complete()
        return super().format_help()

    def format_usage(self) -> str:
        self._complete()
        return super().format_usage()


# ---------------------------------------------------------------- --json and --json-file


def _add_json_flags(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--json", action="store_true", help=f"print {what} as one JSON document on stdout, and nothing else there"
    )
    p.add_argument("--json-file", metavar="FILE", help="also write that JSON document to FILE")


def _check_json_file(
    a: argparse.Namespace, *reads: tuple[str, str | None], outputs: Sequence[tuple[str, str | None]] = ()
) -> None:
    """Fail before the work, not after: FILE's folder must exist, and FILE (like the command's other
    ``outputs``) must not be, nor lie inside, any of ``reads``, the paths the command reads or writes whole."""
    from ._output import check_outputs

    check_outputs([("--json-file", a.json_file), *outputs], reads, made_folders=[what for what, _ in outputs])


#: The help of ``--storage-option`` on the commands that read a store.
_STORAGE_OPTION_HELP = (
    "for an s3:// store: KEY=VALUE of the object-store client (endpoint_url, region, access_key_id, "
    "secret_access_key, profile, anonymous, ...); overrides the AWS environment and files; repeatable"
)


def _add_storage_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-option",
        dest="storage_option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=_STORAGE_OPTION_HELP,
    )


def _with_storage(
    command: str, fn: Any, store: str | list[str], a: argparse.Namespace, *args: Any, **kwargs: Any
) -> Any:
    """``fn(store, *args, **kwargs)``, with ``storage_options=`` when ``--storage-option`` was given
    (checked first: unknown keys, or options with a local path, are refused before any work)."""
    import inspect

    from .storage.location import Location, is_url

    given = list(getattr(a, "storage_option", None) or [])
    if not given:
        return fn(store, *args, **kwargs)
    places = store if isinstance(store, list) else [store]
    urls = [p for p in places if is_url(p)] or places[:1]  # no URL at all: the local path refuses the options
    for where in urls:
        Location.parse(where, given)
    if "storage_options" not in inspect.signature(fn).parameters:
        raise OptionError(
            f"dlpack {command} reads local stores only in this version, so --storage-option does not apply; "
            "copy the store to local disk first"
        )
    return fn(store, *args, storage_options=given, **kwargs)


def _jsonable(x: Any) -> Any:
    """Paths as strings, tuples as lists, NaN and infinity (not JSON) as null; a URL as its text."""
    from .storage.location import is_url

    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if is_url(x):
        return str(x)
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _emit_json(a: argparse.Namespace, doc: Any | str) -> None:
    """Print ``doc`` on stdout with ``--json``, write it to ``--json-file``; a str is already JSON."""
    text = doc if isinstance(doc, str) else json.dumps(_jsonable(doc), indent=2, ensure_ascii=False, allow_nan=False)
    # JSON escapes control characters itself; a lone surrogate (a non-UTF-8 file name) cannot be
    # encoded as UTF-8, so it becomes its \uXXXX escape, which parses back to the same string.
    text = _SURROGATE.sub(lambda m: _escape(m.group()), text)
    text = text.rstrip("\n") + "\n"
    if a.json_file is not None:
        from ._output import write_atomic

        write_atomic(a.json_file, text)
    if a.json:
        _write(text)
        a.json_printed = True  # a failure after this prints no second document


# ---------------------------------------------------------------- commands


def _add_build(sub: Any) -> None:
    from .options import BuildOptions

    p = sub.add_parser("build", help="pack a folder of images into one store", epilog=BUILD_EXIT_CODES)
    p.add_argument("src", help="source folder (class sub-folders become labels)")
    p.add_argument("out", help="output store: DIR.zarr (default), FILE.h5, or s3://BUCKET/PREFIX.zarr")
    # --size and --max-side exclude each other: BuildOptions refuses both with a message naming them.
    add_option_arguments(p, BuildOptions)
    _add_json_flags(p, "what was packed (the store, counts, bytes, seconds, skipped inputs)")
    p.set_defaults(run=_run_build)


#: Library keywords in error hints -> the ``dlpack build`` flags that say the same on the command line.
_BUILD_FLAGS = {"overwrite=True": "--overwrite", "format=FORMAT": "--format FORMAT"}


def _run_build(a: argparse.Namespace) -> int:
    from .building import build
    from .errors import StoreExistsError
    from .options import BuildOptions

    opts = options_from_args(BuildOptions, a)
    _check_json_file(a, ("SRC", a.src), ("OUT", a.out))
    try:
        result = build(a.src, a.out, opts)
    except (StoreExistsError, OptionError) as exc:
        text = str(exc)
        if not any(k in text for k in _BUILD_FLAGS):
            raise
        for keyword, flag in _BUILD_FLAGS.items():
            text = text.replace(keyword, flag)
        raise type(exc)(text) from exc
    try:
        if result.skipped:
            _say(f"dlpack: skipped {len(result.skipped)} unreadable input(s):", err=True)
            for e in result.skipped:
                _say(f"  {e}", err=True)
        if a.json or a.json_file is not None:
            _emit_json(a, {**dataclasses.asdict(result), "images_per_s": result.images_per_s, "notes": result.notes})
        if not opts.quiet and not a.json:
            _say(result.summary(verbose=opts.verbose))
    except KeyboardInterrupt:
        from .storage.publish import PublishedInterrupt

        raise PublishedInterrupt(a.out) from None  # the build returned: its store is in place
    return 1 if result.skipped else 0


AUGMENT_EXIT_CODES = (
    "exit codes: 0 success, 2 usage or input errors (no store, a bad config, variants present without "
    "--replace), 3 internal error, 130 interrupted (run the same command again to resume)"
)


def _add_augment(sub: Any) -> None:
    p = sub.add_parser(
        "augment",
        help="add (or replace) K augmentation variants of every image of a store, on every core",
        epilog=AUGMENT_EXIT_CODES,
        add_flags=lambda p: add_option_arguments(p, AugmentOptions),
    )
    p.add_argument("store", help="a fixed-size dlpack store (DIR.zarr, FILE.h5)")
    _add_storage_option(p)
    _add_json_flags(p, "what was computed (the store, K, variants, seconds, variants/s, resume note)")
    p.set_defaults(run=_run_augment)


def _run_augment(a: argparse.Namespace) -> int:
    from .errors import StoreExistsError
    from .variants import augment

    if not getattr(a, "k", 0):
        raise OptionError("dlpack augment needs --augment K (variants per image, K >= 1) and --augment-config FILE")
    opts = options_from_args(AugmentOptions, a)
    _check_json_file(a, ("the store", a.store))
    try:
        result = _with_storage("augment", augment, a.store, a, options=opts)
    except StoreExistsError as exc:
        raise StoreExistsError(str(exc).replace("replace=True", "--replace")) from exc
    if a.json or a.json_file is not None:
        doc = {**dataclasses.asdict(result), "variants": result.variants, "variants_per_s": result.variants_per_s}
        _emit_json(a, doc)
    if not opts.quiet and not a.json:
        _say(result.summary())
    return 0


def _add_info(sub: Any) -> None:
    p = sub.add_parser("info", help="describe a store", epilog=EXIT_CODES)
    p.add_argument("store")
    _add_storage_option(p)
    _add_json_flags(p, "the store's facts")
    p.set_defaults(run=_run_info)


def _run_info(a: argparse.Namespace) -> int:
    import numpy as np

    from .read import dataset

    _check_json_file(a, ("the store", a.store))
    opened = _with_storage("info", dataset.open, a.store, a)
    if not isinstance(opened, dataset.Dataset):
        opened.close()
        raise OptionError(
            f"{a.store!r} is a HALCON DLDataset, not a store: `dlpack bench {a.store}` measures it, "
            f"`dlpack build {a.store} OUT` packs it"
        )
    with opened as ds:
        info = ds.info()
    _emit_json(a, info)
    if a.json:
        return 0
    res = "x".join(map(str, info["resolution"])) if info["resolution"] else "variable"
    rows = [
        ("store", f"{info['path']} ({info['backend']}, format v{info['format_version']})"),
        ("images", f"{info['count']}"),
        # NumPy's name (uint8), not the format's dtype string (|u1), which --json keeps.
        ("resolution", f"{res} x {info['channels']} channel(s), {np.dtype(info['dtype']).name}"),
        ("classes", ", ".join(info["classes"]) or "(unlabelled)"),
        ("task", info["task"]),
        ("compression", info["compression"]),
        ("on disk", f"{info['bytes_on_disk'] / 1e6:.1f} MB"),
        ("skipped", str(len(info["skipped"]))),
    ]
    counts: list[tuple[str, str]] = []
    boxes = info.get("box_counts")
    if boxes is not None:  # a detection store's classes label its boxes: count those
        counts.append(("boxes", _box_total(boxes)))
        if info["classes"]:
            counts.append(("per class", _box_counts(boxes)))
    elif info["class_counts"]:
        counts.append(("per class", _counts(info["class_counts"], info["unlabelled"], "unlabelled")))
    if info["splits"]:
        order = sorted(info["splits"], key=lambda n: (_SPLIT_ORDER.get(n, len(_SPLIT_ORDER)), n))
        counts.append(("splits", _counts({n: info["splits"][n]["count"] for n in order}, info["unsplit"], "no split")))
        if boxes is not None:
            counts += [
                (f"  {n}", f"{_box_total(boxes['splits'][n])}; {_box_counts(boxes['splits'][n])}") for n in order
            ]
        elif info["classes"]:
            counts += [(f"  {n}", _counts(info["splits"][n]["classes"])) for n in order]
    if info["class_ids"] != list(range(len(info["classes"]))):
        rows.insert(4, ("class ids", ", ".join(map(str, info["class_ids"]))))
    if "defects" in info:
        rows.insert(5, ("defects", ", ".join(info["defects"])))
    if "augment" in info:
        aug = info["augment"]
        what = f"{aug['k']} per image (seed {aug['seed']}, engine {aug['engine']}"
        what += f", config {shown(aug['config'])})" if aug.get("config") else ")"
        rows.insert(3, ("variants", what))
    rows[4:4] = counts  # after the classes
    if info["conversions"]:
        rows.append(("converted", ", ".join(f"{k}: {v}" for k, v in info["conversions"].items())))
    if "stats" in info:
        st = info["stats"]
        rows.append(
            (
                "pixel stats",
                f"mean {', '.join(f'{v:.2f}' for v in st['mean'])}; std {', '.join(f'{v:.2f}' for v in st['std'])}",
            )
        )
    width = max(len(k) for k, _ in rows)
    # One line each: a newline in a class or file name is escaped like any control character.
    for k, v in rows:
        _say(f"{k:<{width}}  {v}", keep="")
    for e in info["skipped"]:
        _say(f"  skipped {e['path']}: {e['reason']}", keep="")
    return 0


#: The order ``info`` lists splits in; others follow by name.
_SPLIT_ORDER = {"train": 0, "val": 1, "validation": 2, "test": 3}


def _counts(counts: dict[str, int], rest: int = 0, rest_name: str = "") -> str:
    """``cat 40, dog 40`` (and ``, unlabelled 3`` when ``rest``)."""
    parts = [f"{shown(name)} {n}" for name, n in counts.items()]
    return ", ".join(parts + ([f"{rest_name} {rest}"] if rest else []))


def _box_total(counts: dict[str, Any]) -> str:
    """``951 box(es), 2 image(s) without boxes``."""
    return f"{counts['boxes']} box(es), {counts['images_without_boxes']} image(s) without boxes"


def _box_counts(counts: dict[str, Any]) -> str:
    """``Tree 940 in 7 images, Dead 11 in 3 images``."""
    images = counts["images_per_class"]
    return ", ".join(f"{shown(c)} {n} in {images[c]} image(s)" for c, n in counts["boxes_per_class"].items())


def _add_bench_flags(p: argparse.ArgumentParser) -> None:
    from .bench import BenchOptions

    add_option_arguments(p, BenchOptions)


def _add_bench(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="measure read throughput: random vs sequential, warm vs cold cache, store vs folder",
        epilog=EXIT_CODES,
        add_flags=_add_bench_flags,  # the benchmark module loads only for `dlpack bench`
    )
    p.add_argument(
        "targets", nargs="+", metavar="TARGET", help="a dlpack store (DIR.zarr, FILE.h5) or a folder of images"
    )
    _add_storage_option(p)
    _add_json_flags(p, "every figure, the machine and the options")
    p.add_argument("--plot", metavar="FILE.png", help="write a bar chart (needs the [plot] extra)")
    p.set_defaults(run=_run_bench)


def _run_bench(a: argparse.Namespace) -> int:
    from .bench import BenchOptions, check_outputs, run_bench

    opts = options_from_args(BenchOptions, a)
    for t in a.targets:
        if t.endswith(".json") and not os.path.exists(t):
            raise OptionError(
                f"bench target {t!r} does not exist; --json prints the JSON on stdout and takes no file name, "
                "write a file with --json-file FILE"
            )
    check_outputs(a.json_file, a.plot, a.targets)
    report = _with_storage("bench", run_bench, a.targets, a, opts)
    if a.json or a.json_file is not None:
        _emit_json(a, report.to_json())
    if not a.json:
        _say(report.table())
    if a.plot:
        report.plot(a.plot)
    return 0


def _add_verify(sub: Any) -> None:
    p = sub.add_parser("verify", help="check every image of a store against its checksum", epilog=VERIFY_EXIT_CODES)
    p.add_argument("store")
    _add_storage_option(p)
    _add_json_flags(p, "the result (count, ok, mismatched images, damaged arrays), also for a damaged store")
    p.set_defaults(run=_run_verify)


def _run_verify(a: argparse.Namespace) -> int:
    from .errors import StoreError
    from .read.dataset import verify_store

    _check_json_file(a, ("the store", a.store))
    report = _with_storage("verify", verify_store, a.store, a)
    if a.json or a.json_file is not None:
        # One document whatever was found, so a script tells "damaged" (ok false, exit 4) from a crash.
        doc = {
            "store": a.store,
            "count": report.count,
            "ok": report.ok,
            "mismatched": [{"index": i, "source": src} for i, src in report.mismatched],
            "damaged": [{"array": name, "reason": reason} for name, reason in report.damaged],
        }
        _emit_json(a, doc)
    bad, n = report.mismatched, report.count
    if report.damaged:
        lines = [reason for _, reason in report.damaged]
        if bad:
            lines.append(f"{len(bad)} image(s) do not match their checksum")
        if report.count is None:  # the store does not open: its own message says why
            raise (StoreDamagedError if _is_damaged_store(a.store) else StoreError)(lines[0])
        raise StoreDamagedError(f"store {a.store} is damaged:\n  " + "\n  ".join(lines) + "\nrebuild it")
    if bad:
        listing = "\n".join(f"  sample {i} ({shown(src)})" for i, src in bad[:50])
        raise StoreDamagedError(f"{len(bad)} of {n} images in {a.store} do not match their checksum:\n{listing}")
    if not a.json:
        _say(f"{a.store}: all {n} images match their checksums")
    return 0


def _is_damaged_store(store: str) -> bool:
    """Whether a store that does not open is a damaged dlpack store (exit 4), not a usage error (2):
    it carries dlpack's marker (a complete store, or one a failed build left), or its backend names it
    damaged (an HDF5 store cut short), and is not merely written in a newer format. A missing path,
    or one that is not a dlpack store, is neither."""
    from .backends import open_reader, owned_store
    from .errors import FormatVersionError

    try:
        with open_reader(store) as reader:
            len(reader)
    except StoreDamagedError:
        return True  # damage the backend recognises in a file that still starts as dlpack's (cut short)
    except FormatVersionError:
        return False
    except DlpackError:
        pass
    return owned_store(store) is not None


def _add_export(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="write a store as a HALCON DLDataset, COCO, or HALCON's reader folders",
        epilog=EXIT_CODES,
    )
    p.add_argument("store", help="a dlpack store (DIR.zarr, FILE.h5)")
    _add_storage_option(p)
    p.add_argument("out", help="the export folder: new or empty (or a previous export, with --overwrite)")
    add_option_arguments(p, ExportOptions)
    _add_json_flags(p, "what was exported (folder, format, task, counts, notes)")
    p.set_defaults(run=_run_export)


def _run_export(a: argparse.Namespace) -> int:
    from .exports import export

    _check_json_file(a, ("the store", a.store), ("OUT", a.out))
    opts = options_from_args(ExportOptions, a)
    result = _with_storage(
        "export",
        export,
        a.store,
        a,
        opts.to or "",
        a.out,
        overwrite=opts.overwrite,
        include_variants=opts.include_variants,
    )
    if a.json or a.json_file is not None:
        _emit_json(a, dataclasses.asdict(result))
    for note in result.notes:
        _say(f"dlpack: note: {note}", err=True, keep="")
    if not a.json:
        _say(result.summary())
    return 0


def _add_preview(sub: Any) -> None:
    p = sub.add_parser(
        "preview",
        help="draw a contact sheet (PNG) of originals and their augmentation variants, boxes and masks drawn",
        epilog=EXIT_CODES,
    )
    p.add_argument("store", help="a dlpack store (DIR.zarr, FILE.h5)")
    _add_storage_option(p)
    p.add_argument("out", metavar="OUT.png", help="the PNG to write (replaced if it exists)")
    add_option_arguments(p, PreviewOptions)
    _add_json_flags(p, "what was drawn (the PNG, the store, the sample indices, variants per row)")
    p.set_defaults(run=_run_preview)


def _run_preview(a: argparse.Namespace) -> int:
    from .variants.preview import preview

    _check_json_file(a, ("the store", a.store), outputs=[("OUT", a.out)])
    opts = options_from_args(PreviewOptions, a)
    result = _with_storage("preview", preview, a.store, a, a.out, **dataclasses.asdict(opts))
    if a.json or a.json_file is not None:
        _emit_json(a, dataclasses.asdict(result))
    if not a.json:
        _say(result.summary())
    return 0


TUNE_EXIT_CODES = (
    "exit codes: 0 success, 2 usage or input errors (no store, a bad option), 3 internal error, 130 interrupted"
)


def _add_tune(sub: Any) -> None:
    p = sub.add_parser(
        "tune",
        help="recommend loader options (workers, prefetch, order) for a training step of a given length",
        description="Run a short grid of loader options against a simulated training step (half GIL-holding "
        "Python, half sleep) and recommend the one that keeps the step busiest (docs/tune.md).",
        epilog=TUNE_EXIT_CODES,
    )
    p.add_argument("store", help="a dlpack store (DIR.zarr, FILE.h5)")
    _add_storage_option(p)
    add_option_arguments(p, TuneOptions)
    _add_json_flags(p, "the whole result (recommended options, predicted busy, every cell, trials, machine)")
    p.set_defaults(run=_run_tune)


def _run_tune(a: argparse.Namespace) -> int:
    from .tuning import tune

    opts = options_from_args(TuneOptions, a)
    _check_json_file(a, ("the store", a.store), ("--source", None if opts.source is None else os.fspath(opts.source)))
    result = _with_storage("tune", tune, a.store, a, options=opts, progress=lambda text: _say(text, err=True))
    if a.json or a.json_file is not None:
        _emit_json(a, result.to_dict())
    if not a.json:
        _say(result.summary())
    return 0


COMMANDS: list[Callable[[Any], None]] = [
    _add_build,
    _add_augment,
    _add_preview,
    _add_info,
    _add_verify,
    _add_bench,
    _add_export,
    _add_tune,
]


def make_parser() -> argparse.ArgumentParser:
    """The ``dlpack`` argument parser with every sub-command."""
    parser = _Parser(prog="dlpack", description="Pack images into training-ready stores.", epilog=ALL_EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"dlpack {__version__}")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_SubParser)
    for add in COMMANDS:
        add(sub)
    for p in sub.choices.values():  # also after the command: `dlpack info X --debug`
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
    return parser


_DEBUG_HELP = "also print the traceback of an error (the exit code stays the same)"


def _with_target(exc: BaseException, args: argparse.Namespace) -> str:
    """The message of ``exc``; a full disk that names no file is said in words, with the store written."""
    if isinstance(exc, OSError) and not isinstance(exc, DlpackError) and exc.errno in _NO_SPACE and not exc.filename:
        target = getattr(args, "out", None) or getattr(args, "store", None) or "the output"
        return f"cannot write {target}: the disk is full (no space left on device); free some space and run the command again"
    return str(exc)


_NO_SPACE = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


#: joblib's warnings when a build's generator of results is cut short (by Ctrl-C or an error):
#: the cut is dlpack's own doing, so they only alarm.
_JOBLIB_CUT_SHORT = r"\d+ tasks (have been successfully executed|which were still being processed)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting (tests call it in-process)."""
    # For the whole process: joblib warns when its generator is collected, which may be after main.
    warnings.filterwarnings("ignore", message=_JOBLIB_CUT_SHORT, category=UserWarning)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe could no longer be handled
    except (_PipeClosed, BrokenPipeError):
        _stdout_to_devnull()
        return EXIT_PIPE
    except KeyboardInterrupt:  # before the command ran (while its options were read): nothing to resume
        _say("dlpack: interrupted", err=True)
        return EXIT_INTERRUPTED
    return code


def _stdout_to_devnull() -> None:
    """Point stdout (and stderr) at /dev/null so the interpreter's last flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
            pass
    os.close(devnull)


def _main(argv: list[str]) -> int:
    parser = make_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help and --version
        return int(exc.code or 0)
    except _UsageError as exc:
        exc.parser.print_usage(sys.stderr)
        _say(f"{exc.parser.prog}: error: {exc}", err=True)
        if "--json" in argv:
            _error_json(type(exc).__name__.lstrip("_"), str(exc), EXIT_USAGE)
        return EXIT_USAGE
    try:
        return int(args.run(args))
    except KeyboardInterrupt as exc:
        from ._interrupt import quiet_cleanup
        from ._parallel import stop_workers

        quiet_cleanup()
        stop_workers()  # they ignore Ctrl-C: ended here, before anything waits for them at exit
        published = getattr(exc, "published", None)
        if published is not None:
            # The new store was in place before the interrupt: the command did what it was asked.
            _say(f"dlpack: interrupted, but {published} was already published and is complete", err=True)
            return EXIT_OK
        message = "interrupted"
        hint = getattr(exc, "hint", None)
        if isinstance(hint, str):  # the store is complete, but not what it was to get next
            message += f"; {hint}"
        elif (args.run is _run_build and _resume_kept(args.out)) or (
            args.run is _run_augment and _augment_kept(args.store)
        ):
            message += "; run the same command again to resume"
        _say(f"dlpack: {message}", err=True)
        _fail_json(args, "KeyboardInterrupt", message, EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    except _PipeClosed:
        raise
    except Exception as exc:
        if isinstance(exc, BrokenPipeError) and _stdout_closed():
            raise _PipeClosed from None
        if args.debug:
            import traceback

            traceback.print_exc()
        if isinstance(exc, (DlpackError, OSError)):
            # OSError: a disk full, a folder not writable, ...: the message names the path.
            code = EXIT_DAMAGED if isinstance(exc, StoreDamagedError) else EXIT_USAGE
            message = _with_target(exc, args)
            _say(f"dlpack: error: {message}", err=True)
        else:
            # Anything else is a bug: its own exit code, never 1 ("finished with skipped inputs") or 2.
            code, message = EXIT_INTERNAL, f"{type(exc).__name__}: {exc}"
            _say(
                f"dlpack: internal error: {message}\n"
                f"this is a bug in dlpack {__version__}; please report it with the command, and the traceback "
                "that the same command shows with --debug (dlpack --debug COMMAND ...)",
                err=True,
            )
        _fail_json(args, type(exc).__name__, message, code)
        return code


def _stdout_closed() -> bool:
    """Whether stdout's reader went away (a broken pipe from elsewhere is an ordinary error)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return True
    except (OSError, ValueError):
        pass
    return False


def _resume_kept(out: str) -> bool:
    """Whether the interrupted build of ``out`` left a partial store and its journal to resume from."""
    from .storage.lock import journal_path, partial_path

    return journal_path(out).is_file() and os.path.lexists(partial_path(out))


def _augment_kept(store: str) -> bool:
    """Whether the interrupted ``dlpack augment`` of ``store`` left its journal to resume from."""
    from .storage.lock import augment_journal_path

    return augment_journal_path(store).is_file()


def _fail_json(args: argparse.Namespace, kind: str, message: str, code: int) -> None:
    """With ``--json``, the one JSON document of a failed command, unless it printed its own."""
    if getattr(args, "json", False) and not getattr(args, "json_printed", False):
        _error_json(kind, message, code)


def _error_json(kind: str, message: str, code: int) -> None:
    doc = {"error": {"type": kind, "message": message, "exit_code": code}}
    text = json.dumps(doc, indent=2, ensure_ascii=False)
    _write(_SURROGATE.sub(lambda m: _escape(m.group()), text) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
