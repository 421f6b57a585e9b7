"""Where a build's store lives, and what a build does there: the lock, the store it writes, its
journal, where its spilled records go, and the publish.

- :class:`LocalSite`: a local path. The lock is :class:`~dlpack.storage.lock.BuildLock`, the store
  is written in the sibling partial folder, journalled in the sibling journal file
  (:mod:`.journal`), records spill beside OUT (:mod:`.spill`), and the publish renames the partial
  into place (:mod:`.publish`). It wraps those modules unchanged.
- :class:`ObjectSite`: an object-store prefix. The lock is a lease object (:mod:`.lease`), the store
  is written in place (there is no rename: the manifest written last is the commit, and the
  publish only removes the journal), the journal is one object per landed block under
  ``.dlpack-journal/``, and records spill into the local temporary folder. Nothing local is made.

docs/format.md ("Stores in an object store") states the rules another tool can rely on.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, Protocol, TypeGuard, TypeVar

from ..backends import Backend, StoreWriter, remove_store
from ..backends._object_zarr import GROUP_META, MANIFEST, ObjectZarrWriter, ShardInfo, dlpack_marker
from ..backends.base import DEFAULT_SHARD_BYTES, register_remote
from ..errors import OptionError, StoreError, StoreExistsError
from .journal import JOURNAL_KEY, JOURNAL_VERSION, BuildJournal, Journal, JournalState, Record, Restart, read_journal
from .lease import LEASE_KEY, Lease
from .location import Location
from .lock import BuildLock, journal_path, partial_path
from .objects import ObjectStorage
from .publish import check_replaceable, clear_leftovers, publish
from .runner import block_checks_out
from .spill import spilling_to

__all__ = [
    "BuildJournal",
    "BuildSite",
    "JOURNAL_PREFIX",
    "LocalSite",
    "ObjectJournal",
    "ObjectSite",
    "journal_in_task",
    "journals_in_task",
    "site_for",
]

R = TypeVar("R", bound=Record)

#: Where a build into an object store journals its landed blocks, inside the store's prefix.
JOURNAL_PREFIX = ".dlpack-journal/"


class BuildSite(Protocol):
    """What build does with the place its store lives (see the module's text)."""

    location: Location
    is_local: bool

    def hold(self) -> contextlib.AbstractContextManager[None]:
        """Hold the store's lock (and send spilled records to this site's scratch folder) while in it."""
        ...

    def clear_leftovers(self) -> str | None:
        """Undo what a killed build left; the fingerprint of a build that committed and published (else None)."""
        ...

    def exists(self) -> bool:
        """Whether a store (or anything) is at OUT."""
        ...

    def check_replaceable(self) -> None:
        """Raise unless OUT may be replaced (``--overwrite``)."""
        ...

    def open_writer(self, backend: type[Backend], mode: str, shard_bytes: int) -> StoreWriter:
        """A writer of the store being built (the partial store; OUT itself in an object store)."""
        ...

    def partial_exists(self) -> bool:
        """Whether a killed build's partial store is there."""
        ...

    def remove_partial(self) -> None:
        """Remove the partial store."""
        ...

    def create_journal(
        self, header: Mapping[str, Any], blocks: Mapping[int, Sequence[Any]], writer: StoreWriter
    ) -> BuildJournal:
        """A new journal of ``header`` and the ``blocks`` kept."""
        ...

    def read_journal(self, from_record: Callable[[Sequence[Any]], Any]) -> JournalState[Any]:
        """The partial's journal (:class:`Restart` when missing or unusable)."""
        ...

    def remove_journal(self) -> None:
        """Remove the journal."""
        ...

    def block_intact(
        self, writer: StoreWriter, start: int, records: Sequence[Any], image: str, mask: str | None
    ) -> bool:
        """Whether a journalled block of the reopened partial is still as written."""
        ...

    def before_commit(self) -> None:
        """Raise when the build may no longer commit (its lock lost)."""
        ...

    def publish(self, overwrite: bool) -> None:
        """Make the committed store OUT's, and remove the journal."""
        ...


class LocalSite:
    """A local OUT: today's lock file, sibling partial and journal, and publish by rename."""

    is_local = True

    def __init__(self, location: Location, path: Path | None = None) -> None:
        local = location.local
        assert local is not None
        self.location = location
        #: OUT as the caller gave it (a relative path stays relative in messages).
        self.out = path if path is not None else local

    @property
    def partial(self) -> Path:
        """The sibling folder (or file) the store is written in."""
        return partial_path(self.out)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """The build lock beside OUT; spilled records go beside OUT, on its disk."""
        self.out.parent.mkdir(parents=True, exist_ok=True)
        with BuildLock(self.out), spilling_to(self.out.parent):
            yield

    def clear_leftovers(self) -> str | None:
        """:func:`~dlpack.storage.publish.clear_leftovers`."""
        return clear_leftovers(self.out)

    def exists(self) -> bool:
        """Whether anything is at OUT (a link too)."""
        return self.out.exists() or self.out.is_symlink()

    def check_replaceable(self) -> None:
        """:func:`~dlpack.storage.publish.check_replaceable`."""
        check_replaceable(self.out)

    def open_writer(self, backend: type[Backend], mode: str, shard_bytes: int) -> StoreWriter:
        """The backend's writer of the partial path."""
        return backend.open_writer(self.partial, mode, shard_bytes)  # type: ignore[arg-type]

    def partial_exists(self) -> bool:
        """Whether the partial path holds anything."""
        return self.partial.exists() or self.partial.is_symlink()

    def remove_partial(self) -> None:
        """Remove the partial store."""
        remove_store(self.partial)

    def create_journal(
        self, header: Mapping[str, Any], blocks: Mapping[int, Sequence[Any]], writer: StoreWriter
    ) -> BuildJournal:
        """The journal file beside OUT."""
        return Journal.create(journal_path(self.out), header, blocks)

    def read_journal(self, from_record: Callable[[Sequence[Any]], Any]) -> JournalState[Any]:
        """The journal file beside OUT."""
        return read_journal(journal_path(self.out), from_record)

    def remove_journal(self) -> None:
        """Remove the journal file."""
        remove_store(journal_path(self.out))

    def block_intact(
        self, writer: StoreWriter, start: int, records: Sequence[Any], image: str, mask: str | None
    ) -> bool:
        """Read back with the records' CRC-32s (:func:`~dlpack.storage.runner.block_checks_out`)."""
        return block_checks_out(writer, start, records, image, mask)

    def before_commit(self) -> None:
        """The lock file cannot be lost while held."""

    def publish(self, overwrite: bool) -> None:
        """Rename the partial into place (:func:`~dlpack.storage.publish.publish`), then drop the journal."""
        try:
            publish(self.partial, self.out, overwrite)
        finally:
            self.remove_journal()


class ObjectJournal(Generic[R]):
    """A journal in an object store: a header object and one small object per landed block (its
    records and its shard objects' size, version tag and rows digest), each PUT whole.

    A pooled block task PUTs its block's object itself, right after its shards
    (:func:`journal_in_task`), so the build's process does not make one request per block on its
    own path; it is told so (:meth:`journalled_by_task`) and does not PUT it again."""

    def __init__(self, site: ObjectSite, writer: StoreWriter, blocks: int = 0) -> None:
        self.site, self.writer, self.blocks = site, writer, blocks
        self._by_task: set[int] = set()

    def journalled_by_task(self, start: int) -> None:
        """The task that wrote the block at ``start`` PUT its journal object."""
        self._by_task.add(start)

    def append_block(self, start: int, records: Sequence[R]) -> None:
        """PUT the block's object once the block landed (unless its task did)."""
        if start in self._by_task:
            self._by_task.discard(start)
        else:
            self.site.put_block(self.writer, start, [r.record() for r in records])
        self.blocks += 1

    def mark_commit(self) -> None:
        """PUT the commit marker."""
        self.site.storage.put(JOURNAL_PREFIX + "commit.json", b"{}")

    def close(self) -> None:
        """Nothing is held open."""


def _block_key(start: int) -> str:
    return f"{JOURNAL_PREFIX}{start:012d}.json"


def block_object(
    writer: StoreWriter, start: int, records: Sequence[Any], shards: Mapping[str, Mapping[int, ShardInfo]]
) -> tuple[str, bytes]:
    """The key and body of the journal object of the block at ``start``: its records (JSON lists)
    and its shards (images, and mask when there) taken from ``shards`` (stored array -> shard -> info)."""
    assert isinstance(writer, ObjectZarrWriter)
    s = start // writer.shard_rows("images")
    got = {n: shards[n][s].record() for n in ("images", "mask") if s in shards.get(n, {})}
    body = {"start": start, "samples": list(records), "shards": {n: [s, *v] for n, v in got.items()}}
    return _block_key(start), json.dumps(body, separators=(",", ":")).encode("utf-8")


def journal_in_task(
    writer: StoreWriter, start: int, records: Sequence[Any], shards: Mapping[str, Mapping[int, ShardInfo]]
) -> None:
    """PUT the journal object of the block at ``start`` from the task that wrote its ``shards`` (its
    copy of the writer's :meth:`~ObjectZarrWriter.take_landed`): the body the build's process would
    PUT. Whole, at a key of its own: a task run twice writes the same object twice."""
    assert isinstance(writer, ObjectZarrWriter)
    writer.storage.put(*block_object(writer, start, records, shards))


def journals_in_task(journal: BuildJournal | None) -> TypeGuard[ObjectJournal[Any]]:
    """Whether the pooled block tasks of a build with ``journal`` PUT their blocks' journal objects
    themselves (an object store's journal; a local journal file is appended by the build's process)."""
    return isinstance(journal, ObjectJournal)


class ObjectSite:
    """An OUT in an object store (``s3://bucket/x.zarr``): a lease, the store written in place, a
    journal of objects, records spilled into the local temporary folder."""

    is_local = False

    def __init__(self, location: Location, lease_seconds: float | None = None) -> None:
        self.location = location
        self.storage = ObjectStorage(location)
        self.lease = Lease(self.storage, lease_seconds)
        #: The shards each journalled block recorded (first sample -> stored array -> shard info).
        self.journalled: dict[int, dict[str, dict[int, ShardInfo]]] = {}
        self._listing: dict[str, tuple[int, str]] | None = None

    def _list(self) -> dict[str, tuple[int, str]]:
        if self._listing is None:
            self._listing = {o.key: (o.size, o.etag) for o in self.storage.list()}
        return self._listing

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """The lease inside OUT's prefix; spilled records go to the local temporary folder."""
        with self.lease, spilling_to(tempfile.gettempdir()):
            yield

    def _ours(self, keys: Sequence[str]) -> None:
        """Refuse a prefix whose objects are not a dlpack store (naming some of them)."""
        other = [k for k in keys if k != LEASE_KEY and not k.startswith(JOURNAL_PREFIX)]
        if not other:
            return
        if GROUP_META in other and dlpack_marker(self.storage.get(GROUP_META)) is not None:
            return
        shown = ", ".join(sorted(other)[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
        raise StoreExistsError(
            f"{self.location} holds objects that are not a dlpack store ({shown}); dlpack never replaces "
            "them: choose another prefix, or remove them yourself"
        )

    def clear_leftovers(self) -> str | None:
        """Refuse a prefix that is not dlpack's; remove a dead build's partial store that cannot be
        resumed (no journal), and the journal a build killed after its commit left. Never returns a
        fingerprint: a store here is complete (its manifest) or not, there is no separate publish."""
        keys = sorted(self._list())
        self._ours(keys)
        journal = [k for k in keys if k.startswith(JOURNAL_PREFIX)]
        if MANIFEST in keys:
            if journal:
                self.storage.delete(journal)  # committed: the journal is done with
            self._listing = None
            return None
        if GROUP_META in keys and JOURNAL_PREFIX + "header.json" not in keys:
            self.remove_partial()
            self.remove_journal()
        return None

    def exists(self) -> bool:
        """Whether a complete store is at OUT (its manifest)."""
        return MANIFEST in self._list()

    def check_replaceable(self) -> None:
        """Replace only a proven dlpack store: its manifest goes first (it opens as incomplete from
        then on), then every object under OUT's prefix but the lease."""
        self._ours(sorted(self._list()))
        self.remove_partial()
        self.remove_journal()

    def open_writer(self, backend: type[Backend], mode: str, shard_bytes: int) -> StoreWriter:
        """An :class:`ObjectZarrWriter` of OUT itself."""
        if backend.name != "zarr":
            raise OptionError(f"{self.location}: only Zarr stores are written to an object store")
        return ObjectZarrWriter(self.storage, mode, shard_bytes)  # type: ignore[arg-type]

    def partial_exists(self) -> bool:
        """Whether a dead build's store (its group marker) is there."""
        return GROUP_META in self._list()

    def remove_partial(self) -> None:
        """Delete the manifest first, then every object under OUT's prefix but the lease and the journal."""
        self.storage.delete([MANIFEST])
        keys = [o.key for o in self.storage.list()]
        self.storage.delete(
            k for k in keys if k not in (LEASE_KEY, MANIFEST, GROUP_META) and not k.startswith(JOURNAL_PREFIX)
        )
        self.storage.delete([GROUP_META])  # the marker last: what is left is still recognisably dlpack's
        self._listing = None

    def create_journal(
        self, header: Mapping[str, Any], blocks: Mapping[int, Sequence[Any]], writer: StoreWriter
    ) -> BuildJournal:
        """The header object, and the kept blocks' objects rewritten (only the ones that held up)."""
        self.remove_journal()
        self.storage.put(
            JOURNAL_PREFIX + "header.json",
            json.dumps({JOURNAL_KEY: JOURNAL_VERSION, **header}, separators=(",", ":")).encode("utf-8"),
        )
        journal: ObjectJournal[Any] = ObjectJournal(self, writer)
        for start, records in sorted(blocks.items()):
            journal.append_block(start, records)
        return journal

    def put_block(self, writer: StoreWriter, start: int, records: list[Any]) -> None:
        """PUT one block's journal object: its records and its shards (images, and mask when there)."""
        assert isinstance(writer, ObjectZarrWriter)
        self.storage.put(*block_object(writer, start, records, writer.shards))

    def read_journal(self, from_record: Callable[[Sequence[Any]], Any]) -> JournalState[Any]:
        """The header and every block object (one listing, one GET each)."""
        keys = sorted(k for k in self._list() if k.startswith(JOURNAL_PREFIX))
        if JOURNAL_PREFIX + "header.json" not in keys:
            raise Restart("the killed build left no journal")
        try:
            header = json.loads(self.storage.get(JOURNAL_PREFIX + "header.json"))
            if not isinstance(header, dict) or header.get(JOURNAL_KEY) != JOURNAL_VERSION:
                raise Restart("its journal is of another version")
            blocks: dict[int, list[Any]] = {}
            self.journalled = {}
            for key in keys:
                if key.endswith("header.json") or key.endswith("commit.json"):
                    continue
                body = json.loads(self.storage.get(key))
                start = int(body["start"])
                blocks[start] = [from_record(r) for r in body["samples"]]
                self.journalled[start] = {
                    n: {int(v[0]): ShardInfo.from_record(v[1:])} for n, v in body.get("shards", {}).items()
                }
        except Restart:
            raise
        except StoreError as exc:
            raise Restart(f"its journal cannot be read ({exc})") from exc
        except (IndexError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Restart(f"its journal is damaged ({exc!r})") from exc
        return JournalState(header, blocks, JOURNAL_PREFIX + "commit.json" in keys)

    def remove_journal(self) -> None:
        """Delete every journal object."""
        self.storage.delete([o.key for o in self.storage.list(JOURNAL_PREFIX)])
        self._listing = None

    def block_intact(
        self, writer: StoreWriter, start: int, records: Sequence[Any], image: str, mask: str | None
    ) -> bool:
        """Whether the block's shard objects are in the listing with their journalled size and version
        tag (never read back); kept ones are recorded in the writer with their rows digests."""
        assert isinstance(writer, ObjectZarrWriter)
        shards = self.journalled.get(start, {})
        names = [image] + ([mask] if mask is not None else [])
        if any(n not in shards for n in names):
            return False
        writer.note_landed({n: shards[n] for n in names})
        s = start // writer.shard_rows(image)
        if all(writer.shard_intact(n, s) for n in names):
            return True
        for n in names:
            writer.shards.get(n, {}).pop(s, None)
        return False

    def before_commit(self) -> None:
        """Stop when the lease was taken over."""
        self.lease.check()

    def publish(self, overwrite: bool) -> None:
        """Nothing to move: the manifest is written; the journal objects go."""
        self.remove_journal()

    def nbytes(self) -> int:
        """Bytes of the store's objects (without the lease and journal)."""
        return sum(o.size for o in self.storage.list() if o.key != LEASE_KEY and not o.key.startswith(JOURNAL_PREFIX))


def open_object_writer(where: Location | str, mode: str = "w-", shard_bytes: int = DEFAULT_SHARD_BYTES) -> StoreWriter:
    """A writer of the Zarr store at the object-store ``where`` (a URL, or a Location with its options);
    what ``ZarrBackend.open_writer`` of a URL opens."""
    return ObjectZarrWriter(ObjectStorage(Location.parse(where)), mode, shard_bytes)  # type: ignore[arg-type]


def holds_dlpack_marker(where: Location | str) -> bool:
    """Whether the object-store prefix ``where`` holds a group ``zarr.json`` with dlpack's marker."""
    storage = ObjectStorage(Location.parse(where))
    return storage.head(GROUP_META) is not None and dlpack_marker(storage.get(GROUP_META)) is not None


register_remote("writer", open_object_writer)
register_remote("owned", holds_dlpack_marker)


def site_for(location: Location, path: Path | None = None) -> BuildSite:
    """The site of ``location``: a local path (``path``: as the caller gave it), or an object-store prefix."""
    return LocalSite(location, path) if location.is_local else ObjectSite(location)
