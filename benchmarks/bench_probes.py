"""The health probes under heavy valid load (issue 36, defect 6): how long /healthz and /readyz
take to answer while ``--clients`` clients each post ``--instances`` digits to /classify.

An orchestrator kills a pod whose liveness probe times out (1 s by default, Kubernetes), and
takes it out of service when readiness does: the probes must be answered at once whatever the
server is doing. The default load is 150 clients x 1,000 digits (0.24 MB of JSON each); the
figures measured are in docs/measurements/benchmarks-operations.md.

::

    python benchmarks/bench_probes.py --model models/digits [--clients 150] [--instances 1000]
        [--seconds 30] [--workers 1] [--port P]   # --port: a server already running
    git archive main | tar -x -C /tmp/main       # a version to compare with, then:
    python benchmarks/bench_probes.py --baseline /tmp/main --rounds 6

The load runs in client processes of its own (:func:`benchmarks.loadgen.run_load`); the probes
come from this process, on a new connection each (as kubelet's do), every
``--probe-interval`` seconds, alternating /healthz and /readyz, timed from the connect to the
answer's last byte. Printed: the probes' percentiles, and the load's answers per second and
statuses (429s and 503s are the server shedding load, which the limits allow).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: the repository's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.loadgen import http_request, run_load
from benchmarks.serving import child_pids, free_port, server_process, service_env

HOST = "127.0.0.1"
PROBES = ("/healthz", "/readyz")


def probe_once(port: int, path: str, timeout: float = 30.0) -> tuple[float, str]:
    """Seconds from connecting to the last byte of the answer to GET ``path``, and its
    status (or what went wrong)."""
    started = time.perf_counter()
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as sock:
            sock.sendall(
                f"GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n".encode()
            )
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        status = answer.split(b" ", 2)[1].decode() if answer else "closed"
    except OSError as error:
        status = type(error).__name__
    return time.perf_counter() - started, status


def loop_thread_times(pid: int | None) -> tuple[float, float]:
    """Seconds the server's main thread (its event loop) has run, and has waited for a CPU
    (Linux's schedstat): a loop that waits for a CPU is a machine that is busy elsewhere."""
    if pid is None:
        return 0.0, 0.0
    ran, waited, _ = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    return int(ran) / 1e9, int(waited) / 1e9


def probe_process_rss_mib(server_pid: int | None) -> float | None:
    """The resident memory of the server's probe process (PROBE_PORT), in MiB; None if it
    has none."""
    if server_pid is None:
        return None
    for pid in child_pids(server_pid, b"service.probes"):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def measure(
    port: int,
    clients: int,
    instances: int,
    seconds: float,
    interval: float,
    pid: int | None = None,
    probe_port: int | None = None,
) -> dict:
    """Run the load for ``seconds`` (after a second's warm-up) and probe meanwhile; with the
    server's ``pid``, also what its event loop's thread ran and waited for a CPU; with its
    ``probe_port`` (PROBE_PORT), the probes on that port too, in turn with the service port's."""
    digits = np.random.default_rng(0).integers(0, 17, size=(instances, 8, 8)).tolist()
    body = json.dumps({"instances": digits}).encode()
    request = http_request(HOST, port, "/classify", body)
    outcome: dict = {}

    def load() -> None:
        processes = max(1, min(4, clients // 50))
        outcome["load"] = run_load(HOST, port, request, clients, seconds, 1.0, processes)

    thread = threading.Thread(target=load)
    before = loop_thread_times(pid)
    load_before = Path("/proc/loadavg").read_text().split()[0]
    thread.start()
    time.sleep(2.0)  # the load's connections made and under way
    targets = [(path, port, path) for path in PROBES]
    if probe_port is not None:
        targets += [(f"PROBE_PORT {path}", probe_port, path) for path in PROBES]
    times: dict[str, list[float]] = {label: [] for label, _, _ in targets}
    statuses: dict[str, dict[str, int]] = {label: {} for label, _, _ in targets}
    end = time.monotonic() + seconds - 2.0
    i = 0
    while time.monotonic() < end:
        label, target_port, path = targets[i % len(targets)]
        took, status = probe_once(target_port, path)
        times[label].append(took)
        statuses[label][status] = statuses[label].get(status, 0) + 1
        i += 1
        time.sleep(interval)
    thread.join()
    ran, waited = (
        after - start for after, start in zip(loop_thread_times(pid), before, strict=True)
    )
    result = outcome["load"]
    summary = {
        "body_bytes": len(body),
        "machine_load_1min": [
            float(load_before),
            float(Path("/proc/loadavg").read_text().split()[0]),
        ],
        "loop_thread_s": {"ran": round(ran, 2), "waited_for_a_cpu": round(waited, 2)},
        **({"probe_process_rss_mib": probe_process_rss_mib(pid)} if probe_port is not None else {}),
        "load": {
            "answers_per_s": round(len(result.latencies_ns) / result.seconds, 1),
            "p50_ms": round(float(np.percentile(result.latencies_ns, 50)) / 1e6, 1)
            if len(result.latencies_ns)
            else None,
            "errors": dict(result.errors),
        },
    }
    for label in times:
        values = np.asarray(times[label]) * 1000
        summary[label] = {
            "probes": len(values),
            "statuses": statuses[label],
            **{f"p{q}_ms": round(float(np.percentile(values, q)), 1) for q in (50, 90, 99)},
            "max_ms": round(float(values.max()), 1),
        }
    return summary


def server_command(tree: Path | None) -> list[str]:
    """``python -m service.api`` of this repository, or of the source tree ``tree`` (another
    version of the service, e.g. ``git archive main | tar -x -C /tmp/main``)."""
    if tree is None:
        return [sys.executable, "-m", "service.api"]
    start = (
        f"import runpy, sys; sys.path.insert(0, {str(tree)!r}); "
        "runpy.run_module('service.api', run_name='__main__')"
    )
    return [sys.executable, "-c", start]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/digits"))
    parser.add_argument("--port", type=int, help="a server already running (else one is started)")
    for option, kind, default in (
        ("--clients", int, 150),
        ("--instances", int, 1000),
        ("--seconds", float, 30.0),
        ("--probe-interval", float, 0.05),
        ("--workers", int, 1),
    ):
        parser.add_argument(option, type=kind, default=default)
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a source tree of another version to compare with: rounds alternate between it "
        "and this one, each with a server of its own, and the medians over rounds are printed",
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--probe-port",
        action="store_true",
        help="serve the probes on PROBE_PORT too (a process of their own) and time them there, "
        "in turn with the service port's, in the same run",
    )
    args = parser.parse_args()
    if args.probe_port and (args.baseline is not None or args.port is not None):
        parser.error("--probe-port starts its own server: not with --baseline or --port")
    run = (args.clients, args.instances, args.seconds, args.probe_interval)
    if args.port is not None:
        print(json.dumps(measure(args.port, *run), indent=2))
        return
    probe_port = free_port() if args.probe_port else None
    extra = {} if probe_port is None else {"PROBE_PORT": str(probe_port)}
    env = service_env(args.model.resolve(), WORKERS=str(args.workers), **extra)
    trees = {"this": None} if args.baseline is None else {"baseline": args.baseline, "this": None}
    rounds: dict[str, list[dict]] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name in trees if r % 2 == 0 else reversed(list(trees)):
            with server_process(server_command(trees[name]), env) as server:
                result = measure(server.port, *run, pid=server.process.pid, probe_port=probe_port)
            rounds[name].append(result)
            print(json.dumps({"round": r, "server": name, **result}))
    for name, results in rounds.items():
        labels = [label for label in results[0] if label.endswith(PROBES)]
        medians = {
            label: {
                key: float(np.median([result[label][key] for result in results]))
                for key in ("p50_ms", "p90_ms", "p99_ms", "max_ms")
            }
            for label in labels
        }
        print(json.dumps({"server": name, "rounds": len(results), "medians": medians}))


if __name__ == "__main__":
    main()
