"""Files a command writes besides a store: reports (``--json-file``), charts, preview sheets.

One rule for all of them, checked before any work: such a file is never one of the paths the
command reads or writes as a whole (a store, a source folder, an export folder) and never lies
inside one. A swapped argument (``dlpack info s.h5 --json-file s.h5``) would otherwise replace the
store with its own report. "The same" is judged on the resolved path (links followed), on the
file itself (``samefile``: another name of the same inode, a bind mount) and, for an existing
file with more than one hard link, on every file inside a folder read. They are written
atomically (:func:`write_atomic`): a reader, or a crash, never sees half a report.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Collection, Iterable
from pathlib import Path

from .errors import OptionError

__all__ = ["check_outputs", "write_atomic"]


def _same(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _linked_inside(out: Path, folder: Path) -> bool:
    """Whether the existing file ``out`` is a hard link to a file inside ``folder``."""
    try:
        st = os.stat(out)
    except (OSError, ValueError):
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2 or not folder.is_dir():
        return False
    key = (st.st_dev, st.st_ino)
    for root, _dirs, files in os.walk(folder):  # links are not followed: a store holds none
        for name in files:
            with contextlib.suppress(OSError):
                s = os.lstat(os.path.join(root, name))
                if (s.st_dev, s.st_ino) == key:
                    return True
    return False


def _overlap(out: Path, other: Path) -> str | None:
    """How ``out`` would overwrite ``other`` ("is", "lies inside"), or None."""
    real_out, real_other = Path(os.path.realpath(out)), Path(os.path.realpath(other))
    if real_out == real_other or _same(out, other):
        return "is"
    if real_other in real_out.parents or any(_same(p, other) for p in real_out.parents if p.exists()):
        return "lies inside"
    if _linked_inside(out, real_other):
        return "is a hard link to a file inside"
    return None


def check_outputs(
    outputs: Iterable[tuple[str, str | os.PathLike[str] | None]],
    reads: Iterable[tuple[str, str | os.PathLike[str] | None]],
    made_folders: Collection[str] = (),
) -> None:
    """Refuse, before any work, an output file that would overwrite what the command reads.

    ``outputs`` and ``reads`` are ``(what, path)`` pairs (``("--json-file", "r.json")``,
    ``("the store", "s.zarr")``); a None path is skipped. Each output's folder must exist, no output
    may be (or lie inside) a path read, and no two outputs may be the same file. The outputs named
    in ``made_folders`` get their folder made when written, so it need not exist.

    Raises
    ------
    OptionError
        Naming the output, the path it would overwrite, and both as resolved.
    """
    outs = [(what, Path(p)) for what, p in outputs if p is not None]
    ins = [(what, Path(p)) for what, p in reads if p is not None]
    for k, (what, out) in enumerate(outs):
        parent = Path(os.path.realpath(out)).parent
        if what not in made_folders and not parent.is_dir():
            raise OptionError(f"cannot write {os.fspath(out)!r}: the folder {str(parent)!r} does not exist")
        for other_what, other in ins + outs[:k]:
            how = _overlap(out, other)
            if how is None:
                continue
            if (other_what, other) in outs:
                raise OptionError(
                    f"{what} {os.fspath(out)!r} and {other_what} {os.fspath(other)!r} are the same file; "
                    "give each its own name"
                )
            harm = "overwrite it" if how != "lies inside" else "overwrite part of it, or be read as part of it"
            raise OptionError(
                f"{what} {os.fspath(out)!r} {how} {other_what} {os.fspath(other)!r} "
                f"(resolved: {os.path.realpath(out)} and {os.path.realpath(other)}), which this command reads; "
                f"writing there would {harm}; choose a path outside it"
            )


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Write ``data`` to ``path`` all at once: a temporary file beside it, flushed to disk, then renamed
    over it. A link at ``path`` keeps pointing where it did: the file it names is the one replaced."""
    from ._files import fsync_dir, writing

    target = Path(os.path.realpath(path))
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = target.with_name(f".{target.name}.{os.getpid()}.partial")
    # A new file of ours, never one a link at that name points to.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        with writing(path), os.fdopen(os.open(tmp, flags, 0o666), "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(target.parent)
