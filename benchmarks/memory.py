"""Peak resident memory of the calling process, for the benchmarks that measure it."""

from __future__ import annotations

import resource


def peak_rss_bytes() -> int:
    """This process's peak resident memory: the kernel's high-water mark of its own memory
    (``VmHWM``). Not ``ru_maxrss`` where ``/proc`` has it: a child started by vfork and exec
    (subprocess does) keeps its parent's peak there (a benchmark's parent that had generated a
    million items lent its children 1.75 GB)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
