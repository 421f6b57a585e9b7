"""Ctrl-C in the command line: a KeyboardInterrupt where the program can act on it, never a
traceback from the interpreter's own machinery.

Python raises KeyboardInterrupt at the next instruction of the main thread, which after a long
call into C (loading an extension module, say) is often a finaliser or import's lock clean-up:
raised there, it is printed as "Exception ignored" and lost, and the program runs on. The handler
here waits for the next instruction outside such code. Installed only for the ``dlpack`` command
(``python -m dlpack`` and the installed script both run ``dlpack.__main__.run``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

__all__ = ["InterruptsHeld", "install", "is_the_command", "quiet_cleanup"]

#: Seconds before an interrupt that arrived inside a finaliser is raised again.
_RETRY = 0.005


#: Where Python runs the callbacks of collected weak references (a weak set's, a finalizer's).
_WEAKREF_FILES = ("_weakrefset.py", "weakref.py")


#: Standard-library packages whose objects, interrupted half-built, fail again when collected (an
#: asyncio event loop cut off in its constructor, as zarr makes one on first use, raises in ``__del__``).
_HALF_BUILT_PACKAGES = (f"{os.sep}asyncio{os.sep}",)


def _inside_finaliser(frame: FrameType | None) -> bool:
    code = frame.f_code if frame is not None else None
    return code is not None and (
        code.co_filename.startswith("<frozen importlib")
        or code.co_name in ("__del__", "__set_name__")  # Python turns an error in __set_name__ into a RuntimeError
        or os.path.basename(code.co_filename) in _WEAKREF_FILES
        or any(part in code.co_filename for part in _HALF_BUILT_PACKAGES)
    )


def _on_interrupt(signum: int, frame: FrameType | None) -> None:
    if _inside_finaliser(frame):
        timer = threading.Timer(_RETRY, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return
    raise KeyboardInterrupt


def _excepthook(kind: type[BaseException], value: BaseException, tb: object) -> None:
    cause: BaseException | None = value
    for _ in range(64):  # the chain an interrupt Python wrapped (a RuntimeError, say) hangs from
        if cause is None or isinstance(cause, KeyboardInterrupt):
            break
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, KeyboardInterrupt):  # before the command's own handling began: nothing started
        sys.stderr.write("dlpack: interrupted\n")
        sys.stderr.flush()
        os._exit(130)
    sys.__excepthook__(kind, value, tb)  # type: ignore[arg-type]


def is_the_command() -> bool:
    """Whether this process is the ``dlpack`` command: the installed script, or ``python -m dlpack``
    (``-m`` is argv[0] while any ``python -m PKG`` imports its package, so the module run is checked)."""
    argv = getattr(sys, "argv", None) or [""]
    if os.path.basename(argv[0]) in ("dlpack", "dlpack.exe", "dlpack-script.py"):
        return True
    if argv[0] != "-m":
        return False
    orig = list(getattr(sys, "orig_argv", ()))
    return "-mdlpack" in orig or any(a == "-m" and b == "dlpack" for a, b in zip(orig, orig[1:], strict=False))


def install() -> None:
    """Handle Ctrl-C as above in this process (the main thread of the ``dlpack`` command)."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return  # ignored, or handled by whoever embeds dlpack
    signal.signal(signal.SIGINT, _on_interrupt)
    sys.excepthook = _excepthook


def _quiet_unraisable(unraisable: object) -> None:
    """After an interrupt: errors of objects collected half-built are not the user's to read."""


def quiet_cleanup() -> None:
    """Once an interrupt is being handled, keep the clean-up of what it cut short off the terminal.

    An object whose constructor the interrupt cut off can fail again when it is collected
    ("Exception ignored in ... __del__"), and a coroutine created but never run warns; both are
    consequences of the interrupt the command already reports, not something to act on.
    """
    import warnings

    sys.unraisablehook = _quiet_unraisable
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)


class InterruptsHeld:
    """On the main thread, a Ctrl-C that arrives inside the block is raised as the block ends.

    Python raises ``KeyboardInterrupt`` at any bytecode of the main thread, also inside the
    standard library's bookkeeping, which it can leave half done: raised inside the decoder's
    capture of descriptor 2 (``dlpack.sources.decode``), descriptor 2 would keep pointing at a
    private file for the rest of the process; raised while ``ThreadPoolExecutor.submit`` starts
    its thread (``dlpack.storage.runner``), the thread is never told to stop and keeps the process
    from exiting. Holding the signal costs two ``signal.signal`` calls. A handler the caller
    installed is called as it would have been.
    """

    __slots__ = ("_previous", "_held")

    def __init__(self) -> None:
        self._previous: Any = None
        self._held: tuple[int, Any] | None = None

    def _hold(self, signum: int, frame: Any) -> None:
        self._held = (signum, frame)

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        # None: a handler installed outside Python, which could not be put back: left alone.
        if signal.getsignal(signal.SIGINT) is None:
            return
        try:
            self._previous = signal.signal(signal.SIGINT, self._hold)
        except (ValueError, OSError):  # not the main interpreter: nothing to hold
            self._previous = None

    def __exit__(self, *exc: object) -> None:
        previous, self._previous = self._previous, None
        if previous is None:
            return
        signal.signal(signal.SIGINT, previous)
        held, self._held = self._held, None
        if held is None:
            return
        if callable(previous):
            previous(*held)  # the default handler raises KeyboardInterrupt here
        elif previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)
