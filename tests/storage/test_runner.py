"""The block runner's writing thread (``run_blocks(..., behind=True)``, a ``--jobs 1`` build) ends
with the run, also when Ctrl-C arrives while the thread is being started."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

from dlpack import _parallel
from dlpack.storage.runner import run_blocks


def _double(x: int, ticks: Any) -> int:
    return 2 * x


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread")
def test_ctrl_c_while_the_writing_thread_starts_leaves_no_thread_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    real_start = threading.Thread.start
    landed: list[int] = []

    def start_interrupted(self: threading.Thread) -> None:
        real_start(self)
        if self.name.startswith("dlpack-write"):
            # Raised as this returns: the thread runs, but the executor has not yet counted it.
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(threading.Thread, "start", start_interrupted)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_blocks(
                _parallel.LocalPool(1),
                [1, 2, 3],
                lambda b, ticks: (_double, (b, ticks), {}),
                lambda b, result: (landed.append(result) or None, 1),
                behind=True,
            )
    finally:
        signal.signal(signal.SIGINT, previous)
        monkeypatch.undo()
    left = [t for t in threading.enumerate() if t.name.startswith("dlpack-write")]
    assert left == []  # the thread was told to stop and joined: nothing keeps the process alive
