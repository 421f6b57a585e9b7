"""Where a store lives: a local path, or a prefix in an S3-compatible bucket (``s3://bucket/x.zarr``).

A location is parsed once, at the edge (the CLI, :func:`dlpack.build`, :func:`dlpack.open`), and
never turned back into a ``pathlib.Path`` unless it is local: ``Path("s3://b/x.zarr")`` is the
relative folder ``s3:/b/x.zarr``, which is how a URL used to become a local store.

Storage options (``--storage-option KEY=VALUE``, ``storage_options=``) are checked here, in the
process that parses them, before any work starts; the object-store client (:mod:`.objects`) reads
credentials, endpoint and region from the usual AWS environment and files first, and the options
override them.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .._files import URL as _URL
from ..errors import OptionError

__all__ = ["OPTION_KEYS", "SCHEMES", "Location", "is_url", "parse_storage_options"]

#: Object-store URL schemes dlpack reads and writes (S3 and every S3-compatible server).
SCHEMES = ("s3",)
#: S3 bucket names: 3-63 lower-case letters, digits, dots and hyphens.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")

#: Storage option -> what it sets. Aliases (botocore's and fsspec's spellings) map to one key.
OPTION_KEYS: dict[str, str] = {
    "endpoint_url": "the S3 endpoint, e.g. http://127.0.0.1:9000 (also AWS_ENDPOINT_URL)",
    "region": "the bucket's region (also AWS_REGION, AWS_DEFAULT_REGION)",
    "access_key_id": "the access key id (also AWS_ACCESS_KEY_ID)",
    "secret_access_key": "the secret key (also AWS_SECRET_ACCESS_KEY)",
    "session_token": "a session token (also AWS_SESSION_TOKEN)",
    "profile": "the profile of ~/.aws/config and ~/.aws/credentials (also AWS_PROFILE)",
    "anonymous": "true: send unsigned requests (a public bucket)",
    "virtual_hosted_style": "true: bucket.endpoint/key URLs instead of endpoint/bucket/key",
    "allow_http": "true: allow a plain http:// endpoint (on by itself for an http:// endpoint_url)",
    "conditional_writes": "false: the server cannot refuse a write by condition; one writer at a time, unchecked",
    "timeout": "seconds one request may take (default 120)",
    "connect_timeout": "seconds to connect (default 5)",
    "retries": "how often a failed request is retried (default 3)",
}
_ALIASES = {
    "endpoint": "endpoint_url",
    "aws_endpoint_url": "endpoint_url",
    "region_name": "region",
    "aws_region": "region",
    "key": "access_key_id",
    "aws_access_key_id": "access_key_id",
    "secret": "secret_access_key",
    "aws_secret_access_key": "secret_access_key",
    "token": "session_token",
    "aws_session_token": "session_token",
    "anon": "anonymous",
    "skip_signature": "anonymous",
}
_BOOLS = ("anonymous", "virtual_hosted_style", "allow_http", "conditional_writes")
_NUMBERS = ("timeout", "connect_timeout", "retries")


def is_url(text: object) -> bool:
    """Whether ``text`` is a ``scheme://...`` URL (never a local path)."""
    if isinstance(text, Location):
        return not text.is_local
    if not isinstance(text, (str, os.PathLike)) or isinstance(text, bytes):
        return False
    s = os.fspath(text)
    return isinstance(s, str) and _URL.match(s) is not None


def _bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise OptionError(f"storage option {key} must be true or false, got {value!r}")


def parse_storage_options(options: Mapping[str, object] | Iterable[str] | None) -> tuple[tuple[str, str], ...]:
    """Storage options as sorted ``(key, value)`` pairs, keys in their canonical spelling.

    ``options`` is a mapping (``storage_options=``) or ``KEY=VALUE`` strings (``--storage-option``).
    An unknown key or a bad value is an :class:`~dlpack.OptionError` naming it, raised here, before
    any request is sent.
    """
    if options is None:
        return ()
    if isinstance(options, Mapping):
        items = [(str(k), v) for k, v in options.items()]
    else:
        items = []
        for entry in options:
            if not isinstance(entry, str) or "=" not in entry:
                raise OptionError(f"--storage-option takes KEY=VALUE, got {entry!r}")
            k, v = entry.split("=", 1)
            items.append((k.strip(), v))
    out: dict[str, str] = {}
    for raw_key, value in items:
        key = _ALIASES.get(raw_key.lower(), raw_key.lower())
        if key not in OPTION_KEYS:
            near = difflib.get_close_matches(key, [*OPTION_KEYS, *_ALIASES], n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise OptionError(f"unknown storage option {raw_key!r}{hint}; known: {', '.join(sorted(OPTION_KEYS))}")
        if key in _BOOLS:
            text = "true" if _bool(raw_key, value) else "false"
        elif key in _NUMBERS:
            try:
                number = float(str(value))
            except ValueError:
                raise OptionError(f"storage option {raw_key} must be a number, got {value!r}") from None
            if number < 0 or (key == "retries" and number != int(number)) or (key != "retries" and number == 0):
                raise OptionError(f"storage option {raw_key} must be a positive number, got {value!r}")
            text = str(int(number)) if key == "retries" else str(number)
        else:
            text = str(value)
            if key == "endpoint_url" and not re.match(r"^https?://[^/\s]+", text):
                raise OptionError(f"storage option endpoint_url must be an http:// or https:// URL, got {text!r}")
        out[key] = text
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class Location:
    """A store's place: ``url`` is an absolute local path or ``s3://bucket/key`` (no trailing ``/``).

    ``options`` are checked storage options (:func:`parse_storage_options`); ``str()`` is the URL
    alone, so a secret given as an option never reaches a message or a log.
    """

    url: str
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(
        cls,
        where: str | os.PathLike[str] | Location,
        storage_options: Mapping[str, object] | Iterable[str] | None = None,
    ) -> Location:
        """The location of ``where``: a URL of a supported scheme, or a local path (made absolute).

        A URL of another scheme, a URL without a bucket, or storage options given with a local
        path are an :class:`~dlpack.OptionError`.
        """
        options = parse_storage_options(storage_options)
        if isinstance(where, Location):
            return where if not options else cls(where.url, options)
        text = os.fspath(where)
        if not isinstance(text, str):
            raise OptionError(f"a store location must be a str or a path, got {where!r}")
        m = _URL.match(text)
        if m is None:
            if options:
                raise OptionError(
                    f"storage options apply to object-store URLs (s3://...), not to the local path {text!r}"
                )
            if not text:
                raise OptionError("a store location must not be empty")
            return cls(os.path.abspath(text))
        scheme, rest = m.group(1).lower(), m.group(2)
        if scheme not in SCHEMES:
            raise OptionError(
                f"{text!r}: dlpack reads and writes local paths and {', '.join(s + '://' for s in SCHEMES)} "
                f"URLs, not {scheme}://; copy the data to local disk or to an S3-compatible bucket"
            )
        bucket, _, key = rest.partition("/")
        key = "/".join(part for part in key.split("/") if part)
        if not _BUCKET.match(bucket):
            raise OptionError(f"{text!r} does not name a valid bucket (s3://BUCKET/PREFIX, 3-63 lower-case characters)")
        if any(part in (".", "..") for part in key.split("/")):
            raise OptionError(f"{text!r}: '.' and '..' are not allowed in an object key")
        return cls(f"{scheme}://{bucket}/{key}" if key else f"{scheme}://{bucket}", options)

    @property
    def is_local(self) -> bool:
        """Whether this is a local path."""
        return _URL.match(self.url) is None

    @property
    def local(self) -> Path | None:
        """The local path, or None for an object-store location."""
        return Path(self.url) if self.is_local else None

    @property
    def scheme(self) -> str:
        """The URL's scheme, or "file" for a local path."""
        m = _URL.match(self.url)
        return m.group(1) if m else "file"

    @property
    def bucket(self) -> str:
        """The bucket ("" for a local path)."""
        m = _URL.match(self.url)
        return m.group(2).partition("/")[0] if m else ""

    @property
    def key(self) -> str:
        """The key prefix inside the bucket ("" for the bucket's root); a local path for a local location."""
        m = _URL.match(self.url)
        return m.group(2).partition("/")[2] if m else self.url

    @property
    def name(self) -> str:
        """The last part of the path or key (``x.zarr``)."""
        return self.key.rstrip("/").rsplit("/", 1)[-1] if not self.is_local else Path(self.url).name

    @property
    def suffix(self) -> str:
        """The name's suffix, lower case (``.zarr``)."""
        return os.path.splitext(self.name)[1].lower()

    def child(self, *parts: str) -> Location:
        """The location ``parts`` below this one (same options)."""
        if self.is_local:
            return Location(os.path.join(self.url, *parts), self.options)
        key = "/".join(p for p in (self.key, *parts) if p)
        return Location(f"{self.scheme}://{self.bucket}/{key}", self.options)

    def option(self, key: str, default: str | None = None) -> str | None:
        """Storage option ``key``, or ``default``."""
        return dict(self.options).get(key, default)

    def __str__(self) -> str:
        return self.url

    def __fspath__(self) -> str:
        if not self.is_local:
            # os.fspath(location) of a URL would hand a URL to code that opens local files.
            raise TypeError(f"{self.url} is an object-store location, not a local path")
        return self.url
