"""What ``explain`` costs: the same request with and without it, in the same run.

    .venv/bin/python benchmarks/bench_explain.py [--model models/digits] [--k 5]
        [--calls 4000] [--seconds 2] [--repeats 5]

In process: ``Predictor.classify([digit], 3)`` against ``classify([digit], 3, explain=k)``,
alternating call by call (single-threaded BLAS, as the service runs), medians; then the same
for a batch of 32 digits. Over HTTP, one server as deployed (``python -m service.api``, access
log and metrics on): POST /classify with one digit, without and with ``"explain": k``, each for
--seconds per cell, alternating, --repeats times, at concurrency 1 (p50) and 8 (the server's CPU
microseconds a request, robust where neighbours move throughput). Ratios are medians of the
per-repeat ratios; the target is at most 1.2 (20% above the request without it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from loadgen import http_request, run_load
from serving import HOST, REPO, SESSIONS, service_env, serving, session_cpu_seconds
from threadpoolctl import threadpool_limits

from service.model import Predictor
from training.data.datasets import load_digits_dataset

TARGET = 1.2


def _paired(plain, explained, calls: int) -> tuple[float, float]:
    """Median seconds of ``plain()`` and of ``explained()``, called in turn."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(calls):
        for i, call in enumerate((plain, explained)):
            started = time.perf_counter()
            call()
            times[i].append(time.perf_counter() - started)
    return statistics.median(times[0]), statistics.median(times[1])


def _cell(port: int, request: bytes, concurrency: int, seconds: float):
    session = SESSIONS[port]
    cpu = session_cpu_seconds(session)
    result = run_load(HOST, port, request, concurrency, seconds, 0.3)
    served = max(result.requests_per_second * (seconds + 0.3), 1)
    return result, 1e6 * (session_cpu_seconds(session) - cpu) / served


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path("models/digits"))
    parser.add_argument("--k", type=int, default=5, help="items an explanation names")
    parser.add_argument("--calls", type=int, default=4000, help="in-process calls of each")
    parser.add_argument("--seconds", type=float, default=2.0, help="measured seconds a cell")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    model_dir = args.model if args.model.is_absolute() else REPO / args.model
    predictor = Predictor.load(model_dir)
    digits = load_digits_dataset().X_test
    one = [digits[0].reshape(8, 8).tolist()]
    batch = digits[:32].reshape(32, 8, 8).tolist()
    print(f"model {predictor.name}: {' + '.join(predictor.similarity_names)}, "
          f"{predictor.normalization}, B={predictor.n_basis}; explain={args.k}")  # fmt: skip
    with threadpool_limits(limits=1, user_api="blas"):
        for name, instances, calls in (("1 digit", one, args.calls),
                                       ("32 digits", batch, args.calls // 10)):  # fmt: skip
            plain, explained = _paired(
                lambda x=instances: predictor.classify(x, 3),
                lambda x=instances: predictor.classify(x, 3, explain=args.k),
                calls,
            )
            print(f"in process, {name}: {1e6 * plain:.1f} us, with explain "
                  f"{1e6 * explained:.1f} us: x{explained / plain:.2f}")  # fmt: skip

    env = service_env(model_dir, ACCESS_LOG="true", LOG_LEVEL="info")
    with serving([sys.executable, "-m", "service.api"], env) as port:
        bodies = {
            "plain": {"instances": one, "top_k": 3},
            "explain": {"instances": one, "top_k": 3, "explain": args.k},
        }
        requests = {
            name: http_request(HOST, port, "/classify", json.dumps(body).encode())
            for name, body in bodies.items()
        }
        answer = run_load(HOST, port, requests["explain"], 1, count=1, timeout=60)
        (body,) = answer.answers[0]
        assert len(json.loads(body)["predictions"][0]["explanation"]["items"]) == args.k
        for request in requests.values():  # untimed
            run_load(HOST, port, request, 8, 1.0, 0.0)
        p50s: dict[str, list[float]] = {name: [] for name in requests}
        cpus: dict[str, list[float]] = {name: [] for name in requests}
        for _ in range(args.repeats):
            for name, request in requests.items():
                result, _ = _cell(port, request, 1, args.seconds)
                p50s[name].append(result.percentile_ms(50))
                _, cpu = _cell(port, request, 8, args.seconds)
                cpus[name].append(cpu)
    p50 = statistics.median(e / p for e, p in zip(p50s["explain"], p50s["plain"], strict=True))
    cpu = statistics.median(e / p for e, p in zip(cpus["explain"], cpus["plain"], strict=True))
    print(f"HTTP /classify, one digit, medians of {args.repeats} x {args.seconds:g} s:")
    print(f"  c=1 p50: {statistics.median(p50s['plain']):.3f} ms, with explain "
          f"{statistics.median(p50s['explain']):.3f} ms: x{p50:.2f} "
          f"{'PASS' if p50 <= TARGET else 'FAIL'}")  # fmt: skip
    print(f"  c=8 server CPU a request: {statistics.median(cpus['plain']):.0f} us, with explain "
          f"{statistics.median(cpus['explain']):.0f} us: x{cpu:.2f} "
          f"{'PASS' if cpu <= TARGET else 'FAIL'}")  # fmt: skip
    np.testing.assert_array_less(0, [p50, cpu])


if __name__ == "__main__":
    main()
