"""Typed errors, every one a :class:`DlpackError`. Each leaf also subclasses the builtin a caller would
naturally catch: a missing path is a ``FileNotFoundError``, a bad value or malformed file a
``ValueError``, a store that cannot be read an ``OSError`` (as a file that cannot be read is).

:class:`InputFileError` is no exception: it is the record of one unreadable input that
:class:`BadInputsError` lists (and a build's ``skipped``), kept here beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._names import shown

__all__ = [
    "DlpackError",
    "OptionError",
    "ConfigError",
    "SourceError",
    "SourceNotFoundError",
    "LabelFileError",
    "BadInputsError",
    "StoreExistsError",
    "StoreNotFoundError",
    "StoreError",
    "StoreDamagedError",
    "StoreLockedError",
    "IncompleteStoreError",
    "FormatVersionError",
    "StateError",
    "SampleIndexError",
    "MissingExtraError",
    "ClusterError",
]


class DlpackError(Exception):
    """Base of every error dlpack raises on purpose; the CLI turns these into exit code 2."""


class OptionError(DlpackError, ValueError):
    """An option has a value dlpack cannot use."""


class SourceError(DlpackError):
    """The source cannot be packed as a whole: a folder without images, images outside the class
    folders, a label folder that matches no image. The base of the two below, so ``except
    SourceError`` catches every problem with the source."""


class SourceNotFoundError(SourceError, FileNotFoundError):
    """The source folder, a label folder or a label file does not exist."""


class LabelFileError(SourceError, ValueError):
    """A label file (COCO or DLDataset JSON, CSV, a mask folder's class list) is malformed; the
    message names the file and where in it."""


@dataclass(frozen=True)
class InputFileError:
    """One unreadable input file: its path relative to the source root, and why."""

    path: str
    reason: str

    def __str__(self) -> str:
        # One line whatever the name holds: a newline in a file name cannot fake a line of output.
        return shown(f"{self.path}: {self.reason}")


class BadInputsError(DlpackError, ValueError):
    """Some input files could not be packed; ``errors`` lists every one found.

    ``nothing_left`` says that every input is bad: skipping them would leave nothing to pack, so the
    message does not suggest ``--on-error skip`` (which may be the option already given). ``hint``
    replaces the advice line where the default cannot be followed (an update's replaced files).
    """

    def __init__(
        self,
        errors: Sequence[InputFileError],
        source: str = "",
        nothing_left: bool = False,
        hint: str | None = None,
    ) -> None:
        self.errors = list(errors)
        self.nothing_left = nothing_left
        where = f" in {source}" if source else ""
        if nothing_left:
            head = f"no input could be packed: all {len(self.errors)} input file(s){where} are bad"
            advice = "fix or replace them: skipping the bad inputs would leave nothing to pack"
        else:
            head = f"{len(self.errors)} input file(s) could not be read{where}"
            advice = "fix or remove them, or pass --on-error skip to pack the rest and list them in the manifest"
        listing = "\n".join(f"  {e}" for e in self.errors[:50])
        more = f"\n  ... and {len(self.errors) - 50} more" if len(self.errors) > 50 else ""
        super().__init__(f"{head}:\n{listing}{more}\n{advice if hint is None else hint}")


class StoreExistsError(DlpackError, FileExistsError):
    """The output path exists and ``overwrite`` was not given."""


class StoreNotFoundError(DlpackError, FileNotFoundError):
    """No dlpack store at the given path."""


class StoreError(DlpackError, OSError):
    """A store exists but cannot be read: corrupt, truncated, or not a dlpack store.

    A bad value inside a store's manifest is one too: the store cannot be read, as a damaged file
    cannot (zarr calls its own ``MetadataValidationError`` a ``ValueError``; dlpack treats the
    store as the unit)."""


class StoreDamagedError(StoreError):
    """``verify`` found damage in a dlpack store: an image that does not match its checksum, a
    damaged array, or a store too damaged to open. The CLI gives it its own exit code (4), so a
    script tells a damaged store from a mistyped command."""


class StoreLockedError(StoreError):
    """Another build holds the lock on the output path; the message names the holder and the lock file."""


class IncompleteStoreError(StoreError):
    """The store was never finished (a failed or killed build)."""


class FormatVersionError(StoreError):
    """The store was written by a newer dlpack with a format this version cannot read."""


class ConfigError(OptionError):
    """An augmentation config that cannot be used; the message names the file and the field."""


class SampleIndexError(DlpackError, IndexError):
    """A sample index outside the store."""


class StateError(DlpackError, ValueError):
    """A loader state cannot be restored into this loader."""


class MissingExtraError(DlpackError, ImportError):
    """An optional dependency is not installed."""

    def __init__(self, module: str, extra: str, purpose: str, note: str = "") -> None:
        super().__init__(
            f"{purpose} needs the optional package '{module}'; install it with: pip install 'dlpack-datasets[{extra}]'"
            + (f"; {note}" if note else "")
        )


class ClusterError(DlpackError, ConnectionError):
    """The Dask scheduler of ``--scheduler`` cannot be reached or was lost, or a task failed on the
    cluster after its retries; the message names the scheduler. A build's partial store is kept:
    the same command run again resumes from the blocks already written."""
