"""Another thread of the test process computing meanwhile, as a Dask worker's other tasks, or a
test suite's leftover threads, compute beside a fit: what a fit's CPU clock must not count."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class ComputingThread:
    """The thread's CPU seconds, known once the block has ended."""

    cpu_seconds: float = 0.0


@contextmanager
def another_thread_computing() -> Iterator[ComputingThread]:
    """A thread computing for the block's duration, a core's worth: hashing a large buffer
    releases the GIL, so the block's own thread runs meanwhile."""
    stop = threading.Event()
    result = ComputingThread()
    block = bytes(8 << 20)

    def compute() -> None:
        started = time.thread_time()
        while not stop.is_set():
            hashlib.sha256(block).digest()
        result.cpu_seconds = time.thread_time() - started

    thread = threading.Thread(target=compute, daemon=True)
    thread.start()
    try:
        yield result
    finally:
        stop.set()
        thread.join()
