"""Stage 7: move the finished store into place, and undo what a killed build left behind."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._files import file_kind, irregular_entries
from ..backends import foreign_reason, owned_store, remove_store
from ..errors import StoreError, StoreExistsError
from .journal import Restart, is_journal, read_journal
from .lock import journal_path, old_path, partial_path


def not_ours(path: Path) -> str | None:
    """Why ``path`` cannot be proven to be a dlpack partial store, or None when it is one."""
    if path.is_symlink():
        return "it is a symbolic link"
    if owned_store(path) is not None:
        return None
    if path.is_dir():
        return foreign_reason(path)
    if path.is_file():
        links = path.lstat().st_nlink
        if links != 1:
            return f"it is a file with {links} hard links"
        return foreign_reason(path)
    return "it is neither a file nor a folder"


def unmarked(path: Path) -> str:
    """What ``path``, found without dlpack's marker, is: "a folder without dlpack's marker", naming
    a named pipe or link inside it that kept its marker from being read."""
    if path.is_dir():
        odd = irregular_entries(path)
        return "a folder without dlpack's marker" + (f"; {', '.join(odd)}, which no dlpack store holds" if odd else "")
    kind = "a file" if path.is_file() else file_kind(path.lstat().st_mode)
    return f"{kind} without dlpack's marker"


class _Fields:
    """A journal record kept as its fields (whoever reads a journal only for its header)."""

    def __init__(self, fields: Any) -> None:
        self.fields = list(fields)

    def record(self) -> list[Any]:
        return self.fields


@dataclass(frozen=True)
class Output:
    """What is published at an output path: a store (builds, ``--update``, changes of a store's
    arrays) or an export folder. Its sibling names, how a complete one is told from anything
    else, and how one is removed; :func:`publish_stage` and :func:`clear_replaced` take it."""

    #: where a replaced one waits while the new one moves in
    old: Callable[[Path], Path]
    #: the error for something left at one of its sibling names that is not dlpack's; None when it is
    refuse: Callable[[Path], Exception | None]
    #: whether ``path`` holds a complete one (the one that may come back to ``out``)
    complete: Callable[[Path], bool]
    #: raise unless ``out`` may be replaced
    check_replaceable: Callable[[Path], None]
    remove: Callable[[Path], None]
    #: moves the finished one ``tmp`` to a missing ``out``
    place: Callable[[Path, Path], None]


def _refuse_old_store(old: Path) -> Exception | None:
    reason = not_ours(old)
    if reason is None:
        return None
    return StoreError(
        f"{old} is where a build keeps the store it replaces, but it is not a dlpack store ({reason}); "
        "remove or rename it, then build again"
    )


def clear_replaced(out: Path, what: Output) -> None:
    """Undo a publication of ``out`` that a kill cut short (call only under the lock on ``out``):
    the one that was being replaced comes back to a missing ``out``, else it is removed; anything
    else at its name is refused and left as it is."""
    old = what.old(out)
    if not (old.exists() or old.is_symlink()):
        return
    refused = what.refuse(old)
    if refused is not None:
        raise refused
    if out.exists() or out.is_symlink() or not what.complete(old):
        what.remove(old)
    else:
        os.replace(old, out)  # killed after OUT was moved aside: the old one comes back


def clear_leftovers(out: Path) -> str | None:
    """Undo what a killed build of ``out`` left behind; call only while holding the build lock.

    An overwritten store that was waiting for its replacement comes back to ``out`` (or is removed
    when the replacement made it). A stale partial proven to be dlpack's is kept when it has a
    journal (the build then continues it or starts over, see :func:`open_partial`), else removed;
    a journal whose partial is gone is removed. Returns the plan fingerprint of a journal whose
    build had committed and then published its store (killed before it removed its journal), so
    that the same build run again can say it is done; else None.
    """
    clear_replaced(out, STORE)
    from ..backends._hdf5 import clear_compact_copy

    clear_compact_copy(out)  # a compact copy an HDF5 rewrite killed before its rename left
    tmp, journal = partial_path(out), journal_path(out)
    for path in (journal, journal.with_name(journal.name + ".tmp")):
        if (path.exists() or path.is_symlink()) and not is_journal(path):
            why = (
                "it is a symbolic link" if path.is_symlink()
                else "it is not a regular file" if not path.is_file()
                else f"it is a file with {path.lstat().st_nlink} hard links" if path.lstat().st_nlink != 1
                else "it does not start with a journal header"
            )  # fmt: skip
            raise StoreError(
                f"{path} is where this build keeps its journal, but it is not a dlpack journal ({why}); "
                "it was left untouched: remove or rename it, then build again"
            )
    remove_store(journal.with_name(journal.name + ".tmp"))
    if tmp.exists() or tmp.is_symlink():
        reason = not_ours(tmp)
        if reason is not None:
            raise StoreError(
                f"{tmp} is where this build writes, but it is not a dlpack partial store ({reason}); "
                "remove or rename it, then build again"
            )
        if journal.exists():
            return None  # a killed build's blocks: open_partial continues them or starts over
        remove_store(tmp)
    published = None
    if journal.exists() and owned_store(out) is not None:
        with contextlib.suppress(Restart):
            state = read_journal(journal, _Fields)  # only its header and commit mark are read
            fingerprint = state.header.get("fingerprint")
            if state.commit and isinstance(fingerprint, str):
                published = fingerprint
    remove_store(journal)  # its partial is gone (published or removed): nothing to continue
    return published


def check_replaceable(out: Path) -> None:
    """Refuse to replace ``out`` unless it is a complete or partial dlpack store (its marker says so).

    Raises
    ------
    StoreExistsError
        ``out`` is a symbolic link, or anything without dlpack's marker (a folder, a file, a
        plain Zarr group, an HDF5 file of someone else's).
    """
    if out.is_symlink():
        raise StoreExistsError(
            f"{out} is a symbolic link, not a dlpack store; --overwrite replaces only dlpack stores: "
            "remove the link or choose another OUT"
        )
    if owned_store(out) is None:
        raise StoreExistsError(
            f"{out} exists and is not a dlpack store ({unmarked(out)}); --overwrite replaces "
            "only dlpack stores: move it away yourself or choose another OUT"
        )


#: A dlpack store, published by builds, ``--update`` and changes of its arrays.
STORE = Output(
    # Looked up when called, not bound here (the safety tests stand other functions in for them).
    old=lambda out: old_path(out),
    refuse=lambda old: _refuse_old_store(old),
    complete=lambda path: owned_store(path) is not None,
    check_replaceable=lambda out: check_replaceable(out),
    remove=lambda path: remove_store(path),
    place=lambda tmp, out: _place_store(tmp, out),
)


def _place_store(tmp: Path, out: Path) -> None:
    """Move ``tmp`` to ``out`` unless something appeared there (atomically where the platform can)."""
    if not _rename_noreplace(tmp, out):
        os.replace(tmp, out)


def publish_stage(tmp: Path, out: Path, overwrite: bool, what: Output = STORE) -> None:
    """7. Move the finished store into place; an old store is replaced only after the new one is complete.

    Where the platform offers an atomic exchange (Linux ``renameat2``), OUT always holds a complete
    store: the new one waits under the old name, then trades places with OUT in one step. Elsewhere
    OUT is moved aside and the new store moved in, and a build killed in between leaves the old
    store under the old name, where the next build's :func:`clear_leftovers` brings it back.
    ``what``: a store, or another kind of output (an export folder).
    """
    if not (out.exists() or out.is_symlink()):
        what.place(tmp, out)
        return
    if not overwrite:
        raise StoreExistsError(f"{out} appeared while building; pass --overwrite to replace it")
    what.check_replaceable(out)
    old = what.old(out)
    os.replace(tmp, old)
    try:
        exchanged = _exchange(old, out)
    except BaseException:
        os.replace(old, tmp)
        raise
    if exchanged:
        if not what.complete(old):  # something else was put at OUT since the check: put it back
            _exchange(old, out)
            os.replace(old, tmp)
            what.check_replaceable(out)
    else:
        os.replace(old, tmp)
        os.replace(out, old)
        if not what.complete(old):
            os.replace(old, out)
            what.check_replaceable(out)
        os.replace(tmp, out)
    what.remove(old)


class PublishedInterrupt(KeyboardInterrupt):
    """Ctrl-C arrived once the new store was already published: the build or update is complete.

    Still a KeyboardInterrupt, so a script stops as its user asked; ``published`` is the complete
    store (the CLI says so and exits 0).
    """

    def __init__(self, published: Path | str) -> None:
        self.published = published  # a path, or the URL of a store in a bucket
        super().__init__(f"interrupted after {published} was published; the store is complete")


class UnfinishedInterrupt(KeyboardInterrupt):
    """Ctrl-C arrived once the store was published, before what it was to get next (its
    augmentation variants): ``hint`` says how to finish (the CLI prints it and exits 130)."""

    def __init__(self, hint: str) -> None:
        self.hint = hint
        super().__init__(hint)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def publish(tmp: Path, out: Path, overwrite: bool) -> None:
    """:func:`publish_stage`, removing the partial ``tmp`` when it fails.

    Raises :class:`PublishedInterrupt` when Ctrl-C arrives once ``tmp`` is at ``out``
    (the very file or folder, whatever step of publishing the interrupt cut short): the store is
    complete, and the caller says so instead of "interrupted".
    """
    new = _identity(tmp)
    try:
        publish_stage(tmp, out, overwrite)
    except BaseException as exc:
        done = isinstance(exc, KeyboardInterrupt) and new is not None and _identity(out) == new
        # After a cut-short exchange, the partial's name may hold the store that was replaced.
        remove_store(tmp)
        if done:
            old = old_path(out)
            if (old.exists() or old.is_symlink()) and not_ours(old) is None:
                remove_store(old)  # the replaced store, as publishing would have removed it
            raise PublishedInterrupt(out) from None
        raise


_AT_FDCWD = -100


_RENAME_NOREPLACE = 1


_RENAME_EXCHANGE = 2


@functools.cache
def _renameat2_function() -> Any:
    """The ``renameat2`` of libc (Linux, glibc 2.28+ or musl), or None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2(src, dst, flags)``; False when this system or file system does not offer it."""
    fn = _renameat2_function()
    if fn is None:
        return False
    import ctypes

    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(src), None, os.fspath(dst))


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically; False (nothing done) where the platform cannot."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def _rename_noreplace(src: Path, dst: Path) -> bool:
    """Move ``src`` to ``dst`` unless ``dst`` exists, atomically; False (nothing done) where the platform cannot."""
    try:
        return _renameat2(src, dst, _RENAME_NOREPLACE)
    except FileExistsError:
        raise StoreExistsError(f"{dst} appeared while building; pass --overwrite to replace it") from None
