"""The lock of a store in an object store, across hosts: a lease object inside its prefix.

A build takes the lease by creating ``.dlpack-lease.json`` with a create-only write (the store
refuses it when the object exists), holding who holds it (host, pid, user) and until when. A thread
renews it every third of its length, each time only over the version it wrote (``if_match``); a
lease whose ``expires`` has passed is taken over the same way, so a build killed without releasing
it blocks the next one for at most one lease length. The build deletes it at the end.

A store that cannot refuse a write by condition (storage option ``conditional_writes=false``) gets
the lease written plainly: it refuses a build started while another runs, but two started at the
same moment are not told apart, so the build warns and the single-writer rule applies
(docs/format.md, "Stores in an object store").
Expiry is judged by the clocks of the hosts involved: they must agree to well within a lease.
"""

from __future__ import annotations

import datetime
import getpass
import json
import os
import socket
import threading
import time
import warnings
from typing import Any

from ..errors import StoreError, StoreLockedError
from .objects import ConditionFailed, Storage

__all__ = ["LEASE_KEY", "LEASE_SECONDS", "Lease"]

#: The lease object's key, inside the store's prefix.
LEASE_KEY = ".dlpack-lease.json"
#: Seconds a lease lasts unless renewed (renewed every third of it while the build runs).
LEASE_SECONDS = 60.0


def _now() -> float:
    return time.time()


def _stamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment (a container without one)
        return str(os.getuid()) if hasattr(os, "getuid") else "?"


class Lease:
    """The lease on one store's prefix, held from :meth:`acquire` to :meth:`release` (a context manager)."""

    def __init__(self, storage: Storage, seconds: float | None = None) -> None:
        self.storage = storage
        self.seconds = float(seconds if seconds is not None else LEASE_SECONDS)
        self.etag: str | None = None
        self.started = 0.0
        #: Set when a renewal found the lease taken over (another writer holds the store now).
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "user": _user(),
                "started": _stamp(self.started),
                "expires": _now() + self.seconds,
            },
            sort_keys=True,
        ).encode("utf-8")

    def acquire(self) -> None:
        """Take the lease, or raise :class:`StoreLockedError` naming its holder."""
        where = self.storage.where()
        conditional = self.storage.conditional
        if not conditional:
            warnings.warn(
                f"{where}: the object store cannot refuse a write by condition (conditional_writes=false), so "
                "the lease only refuses a build started while this one runs, not one started at the same "
                "moment: run one writer at a time on this store",
                stacklevel=3,
            )
        self.started = _now()
        for _attempt in range(5):
            if conditional:
                try:
                    self.etag = self.storage.put(LEASE_KEY, self._body(), create=True).etag
                    break
                except ConditionFailed:
                    pass
            info = self.storage.head(LEASE_KEY)
            if info is None:
                if conditional:
                    continue  # released in between: try again
                self.etag = self.storage.put(LEASE_KEY, self._body()).etag
                break
            try:
                holder = json.loads(self.storage.get(LEASE_KEY, if_match=info.etag))
                expires = float(holder["expires"])
            except ConditionFailed:
                continue  # renewed in between
            except (ValueError, KeyError, TypeError):
                holder, expires = {}, 0.0  # not a lease dlpack wrote whole: treated as expired
            if expires > _now():
                raise StoreLockedError(
                    f"{where} is being written by another build: host {holder.get('host')}, pid "
                    f"{holder.get('pid')}, user {holder.get('user')}, since {holder.get('started')} "
                    f"(lease {self.storage.where(LEASE_KEY)}, renewed until {_stamp(expires)}); wait for it "
                    "to finish, or, if it was killed, for its lease to expire"
                )
            try:
                self.etag = self.storage.put(LEASE_KEY, self._body(), if_match=info.etag).etag
                break
            except ConditionFailed:
                continue  # another build took it over first: look again
        else:
            raise StoreLockedError(f"{where}: the lease {LEASE_KEY} keeps changing; another build is starting there")
        self._thread = threading.Thread(target=self._renew, name="dlpack-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                assert self.etag is not None
                self.etag = self.storage.put(LEASE_KEY, self._body(), if_match=self.etag).etag
            except ConditionFailed:
                self.lost = f"the lease {self.storage.where(LEASE_KEY)} was taken over by another build"
                return
            except StoreError:
                continue  # unreachable for a moment: the next renewal tries again (the build fails on its own)

    def check(self) -> None:
        """Raise :class:`StoreLockedError` when the lease was lost (before the commit)."""
        if self.lost:
            raise StoreLockedError(f"{self.storage.where()}: {self.lost}; this build stops without committing")

    def release(self) -> None:
        """Stop renewing and delete the lease object when it is still this build's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.etag is not None and not self.lost:
            try:
                info = self.storage.head(LEASE_KEY)
                if info is not None and info.etag == self.etag:
                    self.storage.delete([LEASE_KEY])
            except StoreError:
                pass  # unreachable: it expires on its own
            self.etag = None

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
