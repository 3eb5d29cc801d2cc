"""Another thread of the test process computing meanwhile, as a Dask worker's other tasks, or a
test suite's leftover threads, compute beside a fit: what a fit's CPU clock must not count."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class ComputingThread:
    """A thread computing until stopped, a core's worth: hashing a large buffer releases the
    GIL, so the other threads of the process run meanwhile."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._compute, daemon=True)
        self._block = bytes(1 << 20)

    def _compute(self) -> None:
        while not self._stop.is_set():
            hashlib.sha256(self._block).digest()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_time(self) -> float:
        """The thread's CPU seconds so far (read while it runs)."""
        return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))


@contextmanager
def another_thread_computing() -> Iterator[ComputingThread]:
    """A :class:`ComputingThread` running for the block's duration."""
    computing = ComputingThread()
    computing.start()
    try:
        yield computing
    finally:
        computing.stop()
