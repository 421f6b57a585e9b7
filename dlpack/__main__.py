"""``python -m dlpack`` and the installed ``dlpack`` script: the command line, which Ctrl-C ends
quietly at any moment (the handler of :mod:`dlpack._interrupt` is installed before the CLI loads)."""

from __future__ import annotations

import os
import signal
import sys
from typing import NoReturn

from ._interrupt import install


def run() -> NoReturn:
    """The ``dlpack`` command: ``python -m dlpack`` and the installed ``dlpack`` script alike."""
    install()
    try:
        from .cli import main
    except KeyboardInterrupt:  # while the command line loads: nothing started yet
        sys.stderr.write("dlpack: interrupted\n")
        raise SystemExit(130) from None

    code = main()
    # Done: a Ctrl-C now would only cut the interpreter's own clean-up short (a traceback, or its
    # workers left to their watchdogs), so it is ignored for the few moments left.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if code == 130:
        # Interrupted: what it wrote is on disk and its workers are ended; nothing is left to wait for.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more can be said there
                pass
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    run()
