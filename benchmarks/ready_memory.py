"""R of the memory bound (docs/operating/limits.md, "Memory"): the resident memory of a server
process once it is ready, its models loaded and warmed up.

::

    python benchmarks/ready_memory.py [--model models/digits] [--starts 3] [--grpc]

Starts ``python -m service.api`` on the model ``--starts`` times with a cold numba cache (a new,
empty NUMBA_CACHE_DIR: every kernel is compiled as the model warms up, as on a container's
first start) and as many times with a warm one (the cache the first cold start filled), and
prints, for each start, VmRSS when /readyz first answers 200 and VmHWM (the peak until then),
from /proc. ``--grpc`` serves gRPC too (GRPC_PORT), whose library adds its own threads and
buffers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serving import free_port, server_process, service_env

MIB = 2**20


def status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def ready_memory(model: Path, cache: Path, grpc: bool) -> dict[str, float]:
    """VmRSS and VmHWM (MiB) of one server process when /readyz first answers 200."""
    extra = {"NUMBA_CACHE_DIR": str(cache)}
    if grpc:
        extra["GRPC_PORT"] = str(free_port())
    command = [sys.executable, "-m", "service.api"]
    with server_process(command, service_env(model, **extra)) as server:
        pid = server.process.pid
        return {
            "rss_mib": round(status_kib(pid, "VmRSS") * 1024 / MIB, 1),
            "peak_mib": round(status_kib(pid, "VmHWM") * 1024 / MIB, 1),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/digits"))
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--grpc", action="store_true", help="serve gRPC too (GRPC_PORT)")
    args = parser.parse_args()
    model = args.model.resolve()
    results: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="besvm-numba-") as scratch:
        warm = Path(scratch) / "warm"
        for start in range(args.starts):
            cold = Path(scratch) / f"cold-{start}"
            results["cold"].append(ready_memory(model, cold, args.grpc))
            if start == 0:
                cold.rename(warm)  # the cache the first cold start filled
        for _ in range(args.starts):
            results["warm"].append(ready_memory(model, warm, args.grpc))
    print(json.dumps({"model": str(args.model), "grpc": args.grpc, **results}, indent=2))


if __name__ == "__main__":
    main()
