"""gRPC ModelInfer's server CPU a call against REST /classify's, on one server, in the same run;
optionally for a second checkout of the service beside this one (before and after a change).

    .venv/bin/python benchmarks/bench_grpc.py [--before DIR] [--concurrency 8,64]
        [--seconds 1.5] [--repeats 5]

Each server is ``python -m service.api`` on models/digits as deployed (access log on and written
to a file, metrics on, GRPC_PORT set), started from this checkout ("after") and, with --before,
from DIR (a checkout or ``git archive`` of another commit, run with this environment: its
``service`` package is imported from DIR). Per repeat and concurrency, each server's REST
/classify then its gRPC ModelInfer (one digit a request, as bench_http.py sends them), back to
back; the server's CPU microseconds a request are its processes' CPU time over the cell by the
requests answered. Prints medians over repeats and the median of the per-repeat ratios gRPC /
REST, against the target 1.25.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np
from bench_http import GRPC_METHOD
from loadgen import GrpcCall, http_request, run_load
from serving import HOST, REPO, free_port, server_process, service_env, session_cpu_seconds

from service.api.protocol import inference_pb2 as pb
from training.data.datasets import load_digits_dataset

TARGET = 1.25


def _messages(port: int) -> tuple[bytes, bytes]:
    digit = load_digits_dataset().X_test[0]
    body = json.dumps({"instances": [digit.reshape(8, 8).tolist()]}).encode()
    rest = http_request(HOST, port, "/classify", body)
    request = pb.ModelInferRequest(model_name="digits")
    request.inputs.add(name="input", datatype="FP64", shape=[1, 8, 8])
    request.raw_input_contents.append(np.asarray(digit, dtype="<f8").tobytes())
    return rest, request.SerializeToString()


def _cell(session: int, port: int, message: bytes, concurrency: int, seconds: float, grpc):
    cpu = session_cpu_seconds(session)
    result = run_load(HOST, port, message, concurrency, seconds, 0.3, grpc=grpc)
    served = max(result.requests_per_second * (seconds + 0.3), 1)
    return 1e6 * (session_cpu_seconds(session) - cpu) / served, result.n_errors


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, help="another checkout of the service")
    parser.add_argument("--concurrency", default="8,64")
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    checkouts = {"after": REPO, **({"before": args.before.resolve()} if args.before else {})}
    call = GrpcCall(GRPC_METHOD, ())
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, checkout in checkouts.items():
            grpc_port = free_port()
            env = {
                **os.environ,
                **service_env(
                    REPO / "models" / "digits",
                    ACCESS_LOG="true",
                    LOG_LEVEL="info",
                    GRPC_PORT=str(grpc_port),
                ),
                "PYTHONPATH": str(checkout),
            }
            server = stack.enter_context(
                server_process([sys.executable, "-m", "service.api"], env, cwd=checkout)
            )
            servers[name] = (server.process.pid, server.port, grpc_port)
        messages = {name: _messages(port) for name, (_, port, _) in servers.items()}
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            cells: dict[tuple[str, str], list[float]] = {}
            errors = 0
            for name, (session, port, grpc_port) in servers.items():  # untimed
                rest, grpc = messages[name]
                _cell(session, port, rest, concurrency, 0.5, None)
                _cell(session, grpc_port, grpc, concurrency, 0.5, call)
            for _ in range(args.repeats):
                for name, (session, port, grpc_port) in servers.items():
                    rest, grpc = messages[name]
                    for route, cell in (("REST", (port, rest, None)),
                                        ("gRPC", (grpc_port, grpc, call))):  # fmt: skip
                        cpu, failed = _cell(session, cell[0], cell[1], concurrency,
                                            args.seconds, cell[2])  # fmt: skip
                        cells.setdefault((name, route), []).append(cpu)
                        errors += failed
            for name in servers:
                rest, grpc = cells[name, "REST"], cells[name, "gRPC"]
                ratio = statistics.median(g / r for g, r in zip(grpc, rest, strict=True))
                print(f"c={concurrency:<3} {name:<6} CPU us a request: REST /classify "
                      f"{statistics.median(rest):4.0f}, gRPC ModelInfer "
                      f"{statistics.median(grpc):4.0f}; gRPC / REST {ratio:.2f} "
                      f"{'PASS' if ratio <= TARGET else 'FAIL'}"
                      f"{f' ({errors} errors)' if errors else ''}")  # fmt: skip


if __name__ == "__main__":
    main()
