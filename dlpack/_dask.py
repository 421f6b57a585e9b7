"""The block runner's pool on a Dask ``distributed`` cluster (``--scheduler local|tcp://HOST:PORT``).

A task is one whole block (a shard), a module-level function and its arguments as the local pool
gets them: it reads the source and writes its shard at a place fixed by the plan, so a task that
is retried, stolen or run twice writes the same bytes again. Results come back in call order, and
at most two tasks per worker thread are in flight (calls are drawn only as tasks are sent), so the
client's memory stays flat as the local pool's does. ``distributed`` is imported here only, on
first use: the core never needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .errors import ClusterError, MissingExtraError, OptionError

__all__ = ["DaskPool", "DaskProgress", "check_scheduler", "local_cluster", "release_slot", "require_distributed"]

#: Seconds a client waits for an existing scheduler before the build is refused.
CONNECT_TIMEOUT = 5.0

#: A task is tried this many more times after it failed (a worker lost, an error): its shard's
#: place is fixed, so a second run writes the same bytes.
RETRIES = 2

#: Tasks in flight per worker thread: one running, one queued, as the local pool's ``2*n_jobs``.
IN_FLIGHT = 2

#: What dlpack's own LocalCluster (``--scheduler local``) changes in Dask's defaults: the nanny's
#: ``MALLOC_TRIM_THRESHOLD_=65536`` is left unset (glibc's default), as in the local pool's workers.
#: With it glibc hands every freed buffer above 64 KiB (a decoded image) back to the kernel and
#: faults the pages in again for the next one: 12 % more worker CPU per image (benchmarks/scale.py).
LOCAL_CONFIG: dict[str, Any] = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}

#: What a rerun does after the cluster failed: said in every cluster error.
RESUME = "the partial store is kept: rerunning the same command resumes from the blocks already written"


#: Loggers of ``distributed`` that print a traceback when the scheduler is lost (the client's
#: reconnect): the pool says it in its :class:`ClusterError` instead, so they are quiet while it runs.
_QUIET = ("distributed.client",)

#: A LocalCluster with no dashboard. ``dashboard_address=None`` alone still starts the scheduler's
#: HTTP server (its health and metrics routes) on port 8787, and warns "Port 8787 is already in use"
#: when another cluster has it; a free port on the loopback (0) takes none and warns of none.
NO_DASHBOARD: Mapping[str, Any] = {"dashboard_address": None, "scheduler_kwargs": {"dashboard_address": "127.0.0.1:0"}}

#: A running Dask scheduler's address, ``tcp://HOST:PORT``.
_SCHEDULER = re.compile(r"^tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def check_scheduler(value: object) -> str | None:
    """``value`` as a scheduler: None (this machine's worker processes), ``local`` (a Dask
    LocalCluster for the run) or ``tcp://HOST:PORT``; else an :class:`OptionError`. A scheduler
    needs ``distributed`` (the ``dask`` extra): without it, an :class:`OptionError` saying how to install it."""
    if value is None:
        return None
    m = _SCHEDULER.match(value) if isinstance(value, str) else None
    if value != "local" and not (m and 0 < int(m.group(2)) < 65536):
        raise OptionError(
            f"scheduler must be 'local' (a Dask LocalCluster for this run) or the address of a running Dask "
            f"scheduler, tcp://HOST:PORT; got {value!r}"
        )
    require_distributed()
    return str(value)


def require_distributed() -> None:
    """A :class:`MissingExtraError` (an :class:`OptionError` too) when ``distributed`` is not installed."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise _MissingDask() from None


class _MissingDask(MissingExtraError, OptionError):
    """``--scheduler`` without the ``dask`` extra: refused as a bad option (exit 2), before any work."""

    def __init__(self) -> None:
        super().__init__("distributed", "dask", "--scheduler (building on a Dask cluster)")


#: Per thread: how the task running on it leaves its worker's slot (set by :func:`_call`).
_SLOT = threading.local()


def release_slot() -> None:
    """A task whose work is done and that now only waits on its writes lets its worker start its
    next task beside it: on a Dask worker (one task per thread at a time) the task leaves the
    worker's thread pool (``distributed.secede``), as the local ``--jobs 1`` build writes a block in
    a thread while it decodes the next. The task still ends only once its writes are done. Elsewhere
    (loky workers, this process) nothing: their writes already overlap (one process per core)."""
    leave = getattr(_SLOT, "leave", None)
    if leave is not None:
        _SLOT.leave = None
        leave()


def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], cwd: str) -> Any:
    """One call on a worker (its keywords never taken for ``Client.submit``'s own), in the client's
    working folder: a relative SRC or OUT means there what it means on the client (a shared file system)."""
    try:
        here: str | None = os.getcwd()
    except OSError:  # the folder a worker was in may be gone
        here = None
    if here != cwd:
        with contextlib.suppress(OSError):
            os.chdir(cwd)
    from distributed import secede

    _SLOT.leave = secede  # release_slot: the task's writes overlap the worker's next task
    try:
        return fn(*args, **kwargs)
    finally:
        _SLOT.leave = None


def _preloaded(preload: Callable[[], Any]) -> bool:
    """On a worker: import what the tasks use before the first one arrives."""
    preload()
    return True


def _sees(checks: list[tuple[str, str, str | None, int | None]]) -> list[str]:
    """On a worker: the checks it fails, each ``(label, folder, name, size)``: the folder is there
    and its file ``name`` is too (with ``size`` bytes, or the token ``size=None`` written with the name as content)."""
    missing = []
    for label, folder, name, size in checks:
        try:
            if name is None:
                ok = os.path.isdir(folder)
            elif size is None:
                ok = Path(folder, name).read_text() == name
            else:
                ok = os.stat(os.path.join(folder, name)).st_size == size
        except OSError:
            ok = False
        if not ok:
            missing.append(f"{label} ({folder})")
    return missing


def local_cluster(n_workers: int) -> Any:
    """A ``LocalCluster`` of ``n_workers`` single-threaded worker processes on 127.0.0.1, without a
    dashboard, its workers' environment as :data:`LOCAL_CONFIG` says (``--scheduler local``)."""
    import dask
    from distributed import LocalCluster

    with dask.config.set(LOCAL_CONFIG):
        return LocalCluster(  # type: ignore[no-untyped-call]
            n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1", **NO_DASHBOARD
        )


class DaskProgress:
    """The bar of a Dask run: it moves as blocks land; the tasks the cluster finished (a done-callback
    of each future) are shown beside it. No counter file: tasks get no ticks (``ticks`` is None)."""

    def __init__(self, bar: Any, blocks: int) -> None:
        self.bar, self.blocks, self.ran = bar, blocks, 0

    def ticks(self, slot: int) -> None:
        """No per-file ticks from a cluster's workers."""
        return None

    def task_done(self, future: Any) -> None:
        """A future finished on the cluster (called from the client's thread)."""
        self.ran += 1
        with contextlib.suppress(Exception):
            self.bar.set_postfix_str(f"{self.ran}/{self.blocks} tasks done on the cluster", refresh=False)

    def finished(self, slot: int, n: int) -> None:
        """Block ``slot`` landed, with ``n`` samples."""
        self.bar.update(n)


class DaskPool:
    """The block runner's pool (:class:`dlpack.storage.runner.Pool`) on a Dask cluster.

    ``scheduler="local"`` starts a ``LocalCluster`` of ``n_jobs`` single-threaded worker processes
    on this machine for the run; ``tcp://HOST:PORT`` connects to a running scheduler, whose workers
    must see a local SRC and OUT at the same paths (``shared``: checked before the first task).
    Started on first use, closed by :meth:`close` (the ``with`` block).
    """

    def __init__(
        self,
        scheduler: str,
        n_jobs: int,
        preload: Callable[[], Any] | None = None,
        shared: Mapping[str, tuple[str, str | None, int | None]] | None = None,
        bar: Callable[[int, str, bool], Any] | None = None,
    ) -> None:
        self.scheduler = check_scheduler(scheduler) or "local"
        self.n_jobs = n_jobs
        self.preload = preload
        self.shared = dict(shared or {})
        self.bar = bar
        self._client: Any = None
        self._cluster: Any = None
        self._progress: DaskProgress | None = None
        self._levels: dict[str, int] = {}

    def __enter__(self) -> DaskPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DaskPool({self.scheduler!r})"

    # ------------------------------------------------------------ lifecycle

    def client(self) -> Any:
        """The connected client (connecting, or starting the LocalCluster, on first use)."""
        if self._client is None:
            self._levels = {name: logging.getLogger(name).level for name in _QUIET}
            for name in _QUIET:
                logging.getLogger(name).setLevel(logging.CRITICAL)
            self._client = self._connect()
            try:
                if self.preload is not None:
                    self._client.run(_preloaded, self.preload)
                if self.scheduler != "local" and self.shared:
                    self._check_shared()
            except BaseException:
                self.close()
                raise
        return self._client

    def _connect(self) -> Any:
        from distributed import Client

        if self.scheduler == "local":
            self._cluster = local_cluster(self.n_jobs)
            return Client(self._cluster, set_as_default=False)  # type: ignore[no-untyped-call]
        try:
            return Client(self.scheduler, timeout=CONNECT_TIMEOUT, set_as_default=False)  # type: ignore[no-untyped-call]
        except (OSError, TimeoutError) as exc:
            raise ClusterError(
                f"cannot reach the Dask scheduler at {self.scheduler} within {CONNECT_TIMEOUT:g} s ({exc}); "
                "start it (dask scheduler), or pass its address as --scheduler tcp://HOST:PORT"
            ) from None

    def close(self) -> None:
        """Close the client, and the LocalCluster this pool started."""
        client, cluster, self._client, self._cluster = self._client, self._cluster, None, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close()
        levels, self._levels = self._levels, {}
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)

    def _check_shared(self) -> None:
        """One small task per worker: does it see every local folder of the run (a token file the
        client writes beside OUT; the source root and one of its files)? Refused at once otherwise."""
        checks: list[tuple[str, str, str | None, int | None]] = []
        tokens: list[Path] = []
        try:
            for label, (folder, name, size) in self.shared.items():
                if label == "OUT":
                    token = f".dlpack-visible-{uuid.uuid4().hex}"
                    Path(folder, token).write_text(token)
                    tokens.append(Path(folder, token))
                    checks.append((label, folder, token, None))
                else:
                    checks.append((label, folder, name, size))
            workers = list(self._client.scheduler_info().get("workers", {}))
            if not workers:
                raise ClusterError(f"the Dask scheduler at {self.scheduler} has no workers")
            futures = [
                self._client.submit(_sees, checks, workers=[w], allow_other_workers=False, pure=False) for w in workers
            ]
            blind = {w: missing for w, f in zip(workers, futures, strict=True) if (missing := f.result())}
        finally:
            for t in tokens:
                with contextlib.suppress(OSError):
                    t.unlink()
        if blind:
            worker, missing = next(iter(blind.items()))
            what = " and ".join(sorted({m.split(" ")[0] for ms in blind.values() for m in ms}))
            raise OptionError(
                f"{len(blind)} of {len(workers)} workers of the Dask scheduler at {self.scheduler} cannot see "
                f"{', '.join(missing)} (worker {worker}): {what} must be a URL or a shared file system visible "
                "to every worker"
            )

    # ------------------------------------------------------------ Pool

    def pooled(self, n_calls: int) -> bool:
        """Always: every call runs on the cluster."""
        return True

    def imap(self, calls: Iterable[Any], count: int) -> Iterator[Any]:
        """Run ``calls`` on the cluster, at most two per worker thread in flight, yielding in call order."""
        client = self.client()
        try:
            threads = sum(client.nthreads().values())
        except Exception as exc:
            raise self._lost(exc) from None
        limit = max(2, IN_FLIGHT * max(1, threads))
        todo, cwd = iter(calls), os.getcwd()
        pending: deque[Any] = deque()
        try:
            while True:
                while len(pending) < limit:
                    call = next(todo, None)
                    if call is None:
                        break
                    fn, args, kwargs = call
                    future = client.submit(_call, fn, args, kwargs, cwd, pure=False, retries=RETRIES)
                    if self._progress is not None:
                        future.add_done_callback(self._progress.task_done)
                    pending.append(future)
                if not pending:
                    return
                future = pending.popleft()
                try:
                    result = future.result()
                except (Exception, asyncio.CancelledError) as exc:
                    failed = self._failed(exc)
                    if failed is exc:
                        raise
                    raise failed from exc
                future.release()
                yield result
                del result
        finally:
            for f in pending:
                with contextlib.suppress(Exception):
                    f.cancel()

    def _lost(self, exc: BaseException) -> ClusterError:
        # One line: the first of distributed's message (the rest tells to re-run, as RESUME does).
        said = next(iter(str(exc).strip().splitlines()), "")
        return ClusterError(f"lost the Dask scheduler at {self.scheduler} ({type(exc).__name__}: {said}); {RESUME}")

    def _failed(self, exc: BaseException) -> BaseException:
        """What a task's failure becomes: dlpack's own errors as they are; a lost worker, scheduler
        or connection a :class:`ClusterError`; any other error (deterministic) as it is, as locally."""
        import concurrent.futures

        from distributed.comm.core import CommClosedError
        from distributed.scheduler import KilledWorker

        from .errors import DlpackError

        if isinstance(exc, DlpackError):
            return exc
        if isinstance(exc, KilledWorker):
            return ClusterError(
                f"a task failed on the Dask cluster at {self.scheduler} after {RETRIES} retries, its workers "
                f"lost ({exc}); {RESUME}"
            )
        if isinstance(exc, (concurrent.futures.CancelledError, asyncio.CancelledError, CommClosedError)):
            return self._lost(exc)
        return exc

    @contextlib.contextmanager
    def progress(self, total: int, desc: str, quiet: bool, blocks: int) -> Iterator[DaskProgress]:
        """A bar over ``total`` samples, moved as blocks land and told of the tasks the cluster finished."""
        from tqdm import tqdm

        make = self.bar or (lambda n, d, q: tqdm(total=n, desc=d, unit="img", disable=q, leave=False))
        with make(total, desc, quiet) as bar:
            self._progress = DaskProgress(bar, blocks)
            try:
                yield self._progress
            finally:
                self._progress = None
