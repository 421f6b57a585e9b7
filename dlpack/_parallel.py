"""Running calls in worker processes, and telling a progress bar how far they are.

Shared by every stage that fans out over files (the build's probe, decode and write, ``--update``):
workers get a watchdog, so a killed parent leaves none behind, and loky's resource tracker stays
quiet about the clean-up it does after a kill.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import Any

import numpy as np

__all__ = [
    "BlockProgress",
    "LocalPool",
    "Ticks",
    "parallel",
    "pool_ready",
    "pooled",
    "pool_for",
    "progress",
    "quiet_resource_tracker",
    "opencv_threads",
    "start_watchdog",
    "start_worker",
    "stop_workers",
    "warm_pool",
    "warming",
]


def pooled(n_jobs: int, n_calls: int) -> bool:
    """Whether :func:`parallel` runs ``n_calls`` calls in worker processes (else in this process)."""
    return not (n_jobs == 1 or n_calls <= 1)


def parallel(n_jobs: int, calls: Iterable[Any], count: int | None = None) -> Iterator[Any]:
    """Run delayed calls in order; in-process for one job (no pickling, honest --jobs 1 figures).

    ``calls`` may be a generator (``count`` then says how many it yields): it is drawn from only as
    workers take calls (at most two per job ahead), so calls that carry data (a block of pixels)
    hold no more of it in memory than the pool works on.
    """
    n = count if count is not None else len(calls) if isinstance(calls, Sized) else 2
    if not pooled(n_jobs, n):
        for fn, args, kwargs in calls:
            yield fn(*args, **kwargs)
        return
    wait_for_warm_pool()
    if not _pool_whole(n_jobs):
        # Workers (re)start in a thread that blocks Ctrl-C (see warm_pool), never from this one.
        warm_pool(n_jobs)
        wait_for_warm_pool()
    runner = _runner(n_jobs)
    _RUNNING.append(runner)
    try:
        yield from runner(calls)
    except KeyboardInterrupt:
        stop_workers()
        raise
    finally:
        _RUNNING.remove(runner)


def stop_workers() -> None:
    """Kill the pool's worker processes now and reap them (Ctrl-C).

    Workers ignore Ctrl-C (the build process decides), so they are ended here: one blocked sending
    a result that nobody reads any more would otherwise keep the build from exiting, and loky's own
    kill of a process tree needs psutil, which dlpack does not depend on. Every worker this process
    started is ended, not only those its pool lists: loky takes a worker off that list before it
    kills it (a pool it aborts or finds broken), and a worker just started is on no list yet.
    """
    if "joblib" not in sys.modules:
        return  # no pool was ever started
    # Workers being started ignore Ctrl-C: let them start, so that all of them are known here.
    wait_for_warm_pool(_STOP_WAIT)
    # Their runs are over: once a worker is killed (maybe midway through sending a result), joblib
    # must not wait for the pool to shut down in order (it would wait for the rest of that result).
    for runner in list(_RUNNING):
        runner._aborted = True
    known = {p.pid: p for p in _started_workers() if p.pid is not None}
    pids = set(known) | _worker_children()
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))
    for pid in pids:
        if pid in known:
            with contextlib.suppress(Exception):
                known[pid].join(5)
        else:
            _reap(pid, 5)
    with contextlib.suppress(Exception):  # the next pool is a new one, not this one without its workers
        from joblib.externals.loky import reusable_executor

        reusable_executor._executor = None


def _reap(pid: int, timeout: float) -> None:
    """Reap the killed child ``pid``, waiting at most ``timeout`` seconds for it to die."""
    deadline = time.monotonic() + timeout
    with contextlib.suppress(OSError):  # reaped meanwhile by whoever started it
        while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.01)


#: The joblib runs of :func:`parallel` under way (a list, not a weak set, whose clean-up callbacks
#: would be one more place for a Ctrl-C to land outside the program's reach).
_RUNNING: list[Any] = []


def _started_workers() -> list[Any]:
    """The worker processes this process started that are not reaped yet, as process objects."""
    import multiprocessing

    found = list(getattr(_executor(), "_processes", {}).values())
    # multiprocessing keeps every process started from here until it is joined, whichever thread
    # started it and whatever pool dropped it since (copied in one step: other threads add to it).
    started = list(multiprocessing.process._children)  # type: ignore[attr-defined]
    found += [p for p in started if "Loky" in type(p).__name__]
    return found


#: How a loky worker's command line starts it: the module that reads its start-up from the pool.
_WORKER_MODULE = "joblib.externals.loky.backend.popen_loky_posix"


def _worker_children() -> set[int]:
    """The pids of this process's worker children (read from /proc where there is one): those
    being started too, which no process object lists before their start returns."""
    me, found = os.getpid(), set()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read()
                if int(stat[stat.rindex(b")") + 2 :].split()[1]) != me:
                    continue
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if _WORKER_MODULE.encode() in f.read().split(b"\0"):
                        found.add(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile, or not a process
    return found


#: Seconds :func:`stop_workers` waits for the pool being started: far longer than a start takes.
_STOP_WAIT = 60.0


def _executor() -> Any:
    """The reusable loky executor of joblib, the one the pool runs in (None before the first pool)."""
    from joblib.externals.loky import reusable_executor

    return getattr(reusable_executor, "_executor", None)


def _pool_whole(n_jobs: int) -> bool:
    """Whether the pool has ``n_jobs`` live workers, so that using it starts none.

    joblib starts missing workers (a new pool, one that replaced an aborted one, workers gone
    after their idle timeout) from the thread that submits the first call; here that must be the
    pool-start thread, which blocks Ctrl-C. Read from loky's executor: what it does not tell
    counts as not whole, and the pool is started again (a few calls that return at once).
    """
    if "joblib" not in sys.modules:
        return False
    executor = _executor()
    flags = getattr(executor, "_flags", None)
    manager = getattr(executor, "_executor_manager_thread", None)
    processes = list(getattr(executor, "_processes", {}).values())
    return (
        flags is not None
        and not flags.shutdown
        and flags.broken is None
        and getattr(executor, "_max_workers", None) == n_jobs
        and manager is not None
        and manager.is_alive()
        and len(processes) == n_jobs
        and all(p.is_alive() for p in processes)
    )


def _block_interrupts() -> None:
    """In the thread about to start workers: block Ctrl-C, so that they start with it blocked.

    A process inherits the signal mask of the thread that forks it and keeps it through exec, so
    a worker is deaf to Ctrl-C from its first instruction until :func:`start_watchdog` ignores it
    (a Ctrl-C meanwhile would print its start-up's traceback). Threads this one starts inherit the
    mask too: loky's manager thread, which starts replacement workers. Both resource trackers are
    started first, because starting Python's own (multiprocessing) tracker *unblocks* Ctrl-C in
    the calling thread afterwards instead of restoring its mask; once running they are reused.
    """
    quiet_resource_tracker()  # before the trackers start: they take this process's -W options
    with contextlib.suppress(Exception):  # a tracker that cannot start fails again, loudly, in the pool
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        from joblib.externals.loky.backend import resource_tracker as loky_tracker

        loky_tracker.ensure_running()
    with contextlib.suppress(AttributeError, ValueError, OSError):  # no signal masks (Windows)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _runner(n_jobs: int) -> Any:
    from joblib import Parallel, parallel_config

    quiet_resource_tracker()
    # Every worker watches this process from its start, so a killed build leaves no workers.
    with parallel_config(backend="loky", initializer=start_worker, initargs=(os.getpid(),)):
        return Parallel(n_jobs=n_jobs, return_as="generator", pre_dispatch="2*n_jobs")


def _warm_worker(preload: Callable[[], Any] | None) -> int:
    """In a new worker: ``preload()`` (the caller's imports: decoding, the store writer), so the
    first real call starts at once."""
    if preload is not None:
        preload()
    return os.getpid()


#: The thread starting the worker pool ahead of its first use (:func:`warm_pool`), with its job count.
#: The event is set when it has finished (see :func:`wait_for_warm_pool` for why not the thread's).
_WARMING: tuple[threading.Thread, int, threading.Event] | None = None


def warm_pool(n_jobs: int, preload: Callable[[], Any] | None = None) -> None:
    """Start ``n_jobs`` worker processes in a background thread, while this process goes on.

    Starting a worker (a new interpreter importing NumPy, OpenCV and the store writer) takes about
    a second; a build that scans and probes meanwhile has its pool ready when it packs. The pool is
    joblib's reusable one: :func:`parallel` with the same job count takes it over. ``preload`` (a
    module-level function, pickled to each worker) runs in every new worker first.
    """
    global _WARMING
    if n_jobs <= 1 or warming():
        return
    from joblib import delayed

    done = threading.Event()

    def warm() -> None:
        try:
            _block_interrupts()  # workers are started from this thread: Ctrl-C blocked from their start
            with contextlib.suppress(Exception):  # a pool that fails to start fails again, loudly, when used
                for _ in _runner(n_jobs)(delayed(_warm_worker)(preload) for _ in range(n_jobs)):
                    pass
        finally:
            done.set()

    thread = threading.Thread(target=warm, name="dlpack-pool-start", daemon=True)
    if _WARMING is None:
        import atexit

        # A build that fails before it packs exits with the pool still starting: let it finish
        # first, so joblib shuts down a pool that is whole (registered after joblib's, run before).
        atexit.register(wait_for_warm_pool)
    _WARMING = (thread, n_jobs, done)
    thread.start()


def pool_ready(n_jobs: int) -> bool:
    """Whether a pool of ``n_jobs`` workers is started (its :func:`warm_pool` finished), so a call
    runs there without waiting; False while it is still starting, or when none was asked for."""
    return _WARMING is not None and _WARMING[1] == n_jobs and _WARMING[2].is_set()


def warming() -> bool:
    """Whether a pool is being started in the background (:func:`warm_pool`) right now."""
    return _WARMING is not None and not _WARMING[2].is_set()


def wait_for_warm_pool(timeout: float | None = None) -> None:
    """Let the pool being started finish first: two threads never drive the pool at once.

    Waits for the start's own event, not ``Thread.join``: a Ctrl-C that interrupts a join marks
    the thread finished on Python 3.11 although it runs on, and the next join (:func:`stop_workers`'s)
    would return at once, before the workers being started are known.
    """
    if _WARMING is not None and _WARMING[0] is not threading.current_thread():
        _WARMING[2].wait(timeout)


#: How loky's resource tracker is told not to print its own clean-up (a ``-W`` option it inherits).
_TRACKER_QUIET = "ignore:resource_tracker:UserWarning"


def quiet_resource_tracker() -> None:
    """Keep the warnings of loky's resource tracker off the terminal.

    When a build is killed (a SIGTERM to its process group, say), the tracker process outlives it,
    removes the semaphores and memory-mapping folders the pool had registered, and warns about each
    as "leaked": the clean-up is right, the warnings only alarm. The tracker is started with this
    process's ``-W`` options (``sys.warnoptions``), so the filter is set before the first pool.
    """
    if _TRACKER_QUIET not in sys.warnoptions:
        sys.warnoptions.append(_TRACKER_QUIET)


_WATCHDOG_STARTED = False


#: Seconds between a worker's checks that the build process is still there.
_WATCHDOG_INTERVAL = 0.5


#: OpenCV's thread count in a process of the build's own: one (:func:`opencv_threads`, :func:`start_worker`).
OPENCV_THREADS = 1


def start_worker(parent: int) -> None:
    """In each new worker process of the build process ``parent``: OpenCV on one thread, then :func:`start_watchdog`.

    A worker is one of ``--jobs`` processes, one per core: OpenCV's own threads (as many as cores)
    would oversubscribe them, and their waiting costs CPU that decodes nothing (about 2 % of a
    build's CPU on 1024 -> 512 images). The setting is read when OpenCV is imported, later."""
    if os.getpid() != parent:
        os.environ["OPENCV_FOR_THREADS_NUM"] = str(OPENCV_THREADS)
        if "cv2" in sys.modules:
            sys.modules["cv2"].setNumThreads(OPENCV_THREADS)
    start_watchdog(parent)


@contextlib.contextmanager
def opencv_threads(on: bool) -> Iterator[None]:
    """While the build decodes in this process (``--jobs 1``): OpenCV on one thread, as in a worker
    (:func:`start_worker`); its earlier setting is restored after. ``on`` false: nothing changes."""
    if not on:
        yield
        return
    import cv2  # the decoding this guards imports it anyway

    before = cv2.getNumThreads()
    cv2.setNumThreads(OPENCV_THREADS)
    try:
        yield
    finally:
        cv2.setNumThreads(before)


def start_watchdog(parent: int) -> None:
    """In a worker process of the build process ``parent``: exit as soon as that process is gone.

    Idle pool workers otherwise outlive a killed build for minutes (until the pool's idle timeout).
    A worker is always a child of the process that started its pool, and a dead parent's children
    are re-parented: a parent pid other than ``parent`` means the build is gone, already when the
    worker got here (it ended while this worker was starting). Asking whether ``parent``'s pid still
    exists would not do: an exited process that its own parent has not reaped yet still answers.
    Nothing is started in ``parent`` itself, whose own parent (a shell, a scheduler) may come and go.
    """
    global _WATCHDOG_STARTED
    if _WATCHDOG_STARTED or os.getpid() == parent or sys.platform == "win32":
        return
    if os.getppid() != parent:
        os._exit(1)
    # Ctrl-C reaches the whole process group; the build process ends its workers itself
    # (stop_workers), so a worker neither dies midway through a result nor prints a traceback.
    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WATCHDOG_STARTED = True

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_WATCHDOG_INTERVAL)
        os._exit(1)

    threading.Thread(target=watch, name="dlpack-parent-watchdog", daemon=True).start()


class Ticks:
    """How far one block's decoding is, told to the build's progress bar.

    In the build process it calls the bar's owner directly; pickled into a worker process, it writes
    the count into the block's slot of a small counter file that the build process polls. Either way
    the bytes written do not change: only the bar hears more often.
    """

    #: Files between two ticks: often enough for a smooth bar, rare enough to cost nothing.
    EVERY = 64

    def __init__(self, slot: int, path: str | None, local: Any = None) -> None:
        self.slot, self.path, self.local = slot, path, local
        self._counts: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"slot": self.slot, "path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["slot"], state["path"])  # type: ignore[misc]

    def __call__(self, done: int) -> None:
        if self.local is not None:
            self.local(self.slot, done)
        elif self.path is not None:
            if self._counts is None:
                self._counts = np.memmap(self.path, dtype="<i8", mode="r+")
            self._counts[self.slot] = done


class BlockProgress:
    """Advances ``bar`` as the files of each block are decoded, not only when a block lands.

    ``pooled``: the blocks run in worker processes, which write their counts into a counter file
    (a memory map) that a thread of this process reads every :attr:`INTERVAL` seconds.
    """

    INTERVAL = 0.1

    def __init__(self, bar: Any, blocks: int, pooled: bool) -> None:
        self.bar = bar
        self.off = bool(getattr(bar, "disable", False))  # --quiet, or no terminal: nobody to tell
        pooled = pooled and not self.off
        self.done = np.zeros(max(1, blocks), dtype=np.int64)
        self.shown = 0
        self.lock = threading.Lock()
        self.path: str | None = None
        self.counts: np.ndarray | None = None
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        if pooled and blocks:
            import tempfile

            fd, self.path = tempfile.mkstemp(prefix="dlpack-progress-")
            os.close(fd)
            self.counts = np.memmap(self.path, dtype="<i8", mode="w+", shape=(blocks,))
            self.thread = threading.Thread(target=self._poll, name="dlpack-progress", daemon=True)

    def __enter__(self) -> BlockProgress:
        if self.thread is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        self.counts = None
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def ticks(self, slot: int) -> Ticks | None:
        if self.off:
            return None
        return Ticks(slot, self.path, None if self.path is not None else self._local)

    def _local(self, slot: int, done: int) -> None:
        with self.lock:
            self.done[slot] = done
            self._sync()

    def finished(self, slot: int, n: int) -> None:
        """Block ``slot`` landed with ``n`` samples."""
        with self.lock:
            self.done[slot] = n
            self._sync()

    def _poll(self) -> None:
        while not self.stop.wait(self.INTERVAL):
            with self.lock:
                self._sync()

    def _sync(self) -> None:
        done = self.done if self.counts is None else np.maximum(self.done, self.counts)
        total = int(done.sum())
        if total > self.shown:
            self.bar.update(total - self.shown)
            self.shown = total


def progress(total: int, desc: str, quiet: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img", disable=quiet or not sys.stderr.isatty(), leave=False)


class LocalPool:
    """The block runner's pool (:class:`dlpack.storage.runner.Pool`) on this machine: joblib's loky
    worker processes (:func:`parallel`), or this process for one job; progress through :class:`Ticks`."""

    def __init__(self, n_jobs: int) -> None:
        self.n_jobs = n_jobs

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        """Nothing to close: joblib's reusable workers stay for the next pool of the process."""

    def pooled(self, n_calls: int) -> bool:
        return pooled(self.n_jobs, n_calls)

    def imap(self, calls: Iterable[Any], count: int) -> Iterator[Any]:
        return parallel(self.n_jobs, calls, count)

    @contextlib.contextmanager
    def progress(self, total: int, desc: str, quiet: bool, blocks: int) -> Iterator[BlockProgress]:
        with progress(total, desc, quiet) as bar, BlockProgress(bar, blocks, self.pooled(blocks)) as ticks:
            yield ticks


def pool_for(
    scheduler: str | None,
    n_jobs: int,
    preload: Callable[[], Any] | None = None,
    shared: Mapping[str, tuple[str, str | None, int | None]] | None = None,
) -> Any:
    """The pool of a run, a context manager that closes it: :class:`LocalPool` for no ``scheduler``,
    else a Dask pool (``local`` or ``tcp://HOST:PORT``, ``dlpack._dask``; ``preload`` runs on its
    workers first, and ``shared`` names the local folders every worker must see, each as
    ``label: (folder, file name or None, size or None)``, OUT's with no name: a token file is written there)."""
    if scheduler is None:
        return LocalPool(n_jobs)
    from ._dask import DaskPool

    return DaskPool(scheduler, n_jobs, preload, shared, progress)
