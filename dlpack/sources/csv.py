"""CSV source: a table of image paths with their class names and, optionally, splits.

The rules (also in docs/labels.md, "CSV"):

- The first row is the header: columns ``path`` and ``label``, optionally ``split`` (names compared
  in lower case, any order). Any other column is refused, so a misspelt ``lable`` or ``spilt`` is
  never dropped unseen.
- Items are the rows in file order; ``path`` is relative to ``root`` with ``/`` separators.
  Labels are class names; classes are the names found, sorted. A ``split`` value is kept as
  written (an empty one means no split).
- Whole-source errors (SourceError): a missing, unreadable or empty file, a malformed header,
  rows with another number of fields than the header, and two rows naming one path.
- Per-row errors (InputFileError naming the line number and the path): a path that is absolute or
  leaves ``root``, a missing file, an empty label.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from pathlib import Path

from .._names import shown
from ..errors import InputFileError, LabelFileError, SourceError, SourceNotFoundError
from ._entries import bucket_files, check_root, file_problem, place, read_text, relative_name
from .base import SourceFiles, SourceItem, SourceScan

__all__ = ["CsvSource", "CSV_COLUMNS"]

#: The columns a CSV source reads; ``path`` and ``label`` are required.
CSV_COLUMNS = ("path", "label", "split")


@dataclass(frozen=True, init=False)
class CsvSource:
    """Images under ``root`` listed in ``csv_file`` with their labels (see the module docstring).

    Either may be an ``s3://`` URL (a bucket prefix, an object), read with ``storage_options``; a
    URL source's ``root`` is its URL text."""

    root: Path
    csv_file: Path
    storage_options: object = None

    def __init__(
        self, root: str | os.PathLike[str], csv_file: str | os.PathLike[str], storage_options: object = None
    ) -> None:
        object.__setattr__(self, "root", place(root))
        object.__setattr__(self, "csv_file", place(csv_file))
        object.__setattr__(self, "storage_options", storage_options)

    @property
    def files(self) -> SourceFiles | None:
        """The bucket's files when ``root`` is a URL (None: the local folder ``root``)."""
        return bucket_files(self.root, self.storage_options)

    def scan(self) -> SourceScan:
        """List the rows' images and labels.

        Raises
        ------
        SourceError
            The folder or the file is unusable as a whole (see the module docstring).
        """
        root = self.root
        bucket = self.files
        if bucket is None and not root.is_dir():
            if not root.exists():
                raise SourceNotFoundError(f"image folder {shown(os.fspath(root))!r} does not exist")
            raise SourceError(f"image folder {shown(os.fspath(root))!r} is not a folder")
        where = shown(str(self.csv_file))
        text = read_text(self.csv_file, "CSV file", self.storage_options)
        reader = csv.reader(io.StringIO(text, newline=""))
        try:
            rows = [(reader.line_num, row) for row in reader if row]
        except csv.Error as exc:
            raise LabelFileError(f"CSV file {where!r} is malformed at line {reader.line_num}: {exc}") from None
        if not rows:
            raise LabelFileError(f"CSV file {where!r} is empty; it needs a header row: path,label[,split]")
        header = [h.strip().lower() for h in rows[0][1]]
        unknown = [h for h in header if h not in CSV_COLUMNS]
        if unknown or len(set(header)) != len(header) or not {"path", "label"} <= set(header):
            problem = (
                f"unknown column(s) {', '.join(map(repr, unknown))}"
                if unknown
                else "a column named twice"
                if len(set(header)) != len(header)
                else "no 'path' and 'label' columns"
            )
            raise LabelFileError(
                f"CSV file {where!r}: the header {shown(','.join(rows[0][1]))!r} has {problem}; "
                "the first row must name the columns path,label[,split] (any order)"
            )
        col = {name: header.index(name) for name in header}
        items: list[SourceItem] = []
        errors: list[InputFileError] = []
        seen: dict[str, int] = {}
        missing: list[str] = []
        for line, row in rows[1:]:
            if len(row) != len(header):
                raise LabelFileError(
                    f"CSV file {where!r}: line {line} has {len(row)} field(s), the header {len(header)}"
                )
            given = row[col["path"]]
            rel, reason = relative_name(given.strip())
            if rel is None:
                errors.append(InputFileError(shown(given), f"line {line} of {where}: {reason}"))
                continue
            if rel in seen:
                raise LabelFileError(f"CSV file {where!r}: lines {seen[rel]} and {line} both name {shown(rel)!r}")
            seen[rel] = line
            label = row[col["label"]].strip()
            split: str | None = (row[col["split"]].strip() or None) if "split" in col else None
            bad = file_problem(root if bucket is None else bucket, rel) or (None if label else "the label is empty")
            if bad is not None and bucket is None and not os.path.lexists(os.path.join(os.fspath(root), rel)):
                missing.append(rel)
            if bad is not None:
                errors.append(InputFileError(rel, f"line {line} of {where}: {bad}"))
                continue
            items.append(SourceItem(rel, label, None, split))
        if not items and not errors:
            raise LabelFileError(f"CSV file {where!r} lists no images (only the header)")
        check_root(root, missing, len(rows) - 1, f"CSV file {where!r}")
        classes = tuple(sorted({i.label for i in items if i.label is not None}))
        return SourceScan(tuple(items), classes, tuple(errors), "csv", task="classification")
