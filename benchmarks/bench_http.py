"""What HTTP costs the service: POST /classify against a bare FastAPI endpoint, in the same run.

    .venv/bin/python benchmarks/bench_http.py [--concurrency 1,8,64] [--seconds 3] [--repeats 3]
        [--workers 1] [--client-processes 1] [--no-search]

Starts the real service (``python -m service.api`` on MODEL_DIR=--model, ACCESS_LOG=false,
WORKERS=--workers, a free port) and the floor, benchmarks/bare_endpoint.py: the same uvicorn
with the same settings and one ``async def`` FastAPI route that validates the same request body
(one 8 x 8 digit, top_k 3) with pydantic and answers a fixed answer of the service's shape,
without a model. Both are driven by benchmarks/loadgen.py, a keep-alive asyncio client in its
own process(es) sending precomputed request bytes (one connection per concurrent client), for
--seconds per cell after --warmup seconds, cells interleaved service, floor, service, floor, ...
and the whole grid repeated --repeats times. Non-200 answers are counted as errors and shown.

Prints per concurrency the service's and the floor's req/s, p50 and p99 (medians over repeats)
and the ratios service / floor (medians of the per-repeat ratios, each pair measured back to
back), then the targets: p50 within 1.3x of (floor p50 + the in-process model time, the median
of ``Predictor.classify([digit], 3)``), req/s at least 80% of the floor's, p99 within 2x the
floor's, and whether req/s falls as concurrency rises (more than 10% below the best at a lower
concurrency).

Unless --no-search: POST /search for a code query (10 non-zeros, top --search-top-k) on a
synthetic catalogue of --search-n items (about 1 GB at 1,000,000; built in a temporary directory
by benchmarks/bench_search_http.py's code, a minute or two) through a second service process, at
concurrency 1 and interleaved with the floor's search-shaped route, beside the same query in
process; the target: HTTP p50 within 0.5 ms of in-process p50 + the floor's /classify p50 at
concurrency 1.

The machine is shared with the clients: on few cores, --client-processes above 1 takes CPU from
the server. Numbers are medians, but still noisy; compare ratios, not absolute values.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from bench_search_http import build_search_fixture, check_http_matches
from loadgen import LoadResult, http_request, run_load
from serving import HOST, REPO, running_server, service_env, serving
from threadpoolctl import threadpool_limits

from service.model import Predictor
from training.datasets import load_digits_dataset
from training.evaluate import median_seconds

TARGETS = ("service", "floor")
P50_FACTOR, RPS_FRACTION, P99_FACTOR, FALL_TOLERANCE = 1.3, 0.8, 2.0, 0.9
SEARCH_SLACK_MS = 0.5


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def _concurrencies(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of positive integers")
    return sorted(set(values))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench_http.py", description=__doc__, formatter_class=_Formatter
    )
    add = parser.add_argument
    add("--model", type=Path, default=Path("models/digits"), help="model the service serves")
    add("--concurrency", type=_concurrencies, default="1,8,64", metavar="C1,C2,...",
        help="concurrent keep-alive connections, one cell each")  # fmt: skip
    add("--seconds", type=float, default=3.0, help="measured seconds per cell")
    add("--warmup", type=float, default=0.5, help="unmeasured seconds of load before each cell")
    add("--repeats", type=int, default=3, help="passes over the whole grid")
    add("--workers", type=int, default=1, help="server processes (WORKERS), service and floor")
    add("--client-processes", type=int, default=1, help="load-generator processes")
    add("--model-calls", type=int, default=2000, help="in-process classify calls timed")
    search = parser.add_mutually_exclusive_group()
    search.add_argument("--search", dest="search", action="store_true", default=True,
                        help="also time POST /search at N = --search-n")  # fmt: skip
    search.add_argument("--no-search", dest="search", action="store_false",
                        default=argparse.SUPPRESS,
                        help="skip /search (no 1 GB catalogue to build)")  # fmt: skip
    add("--search-n", type=int, default=1_000_000, help="catalogue items")
    add("--search-top-k", type=int, default=100, help="top_k of the code query")
    add("--search-dir", type=Path, default=argparse.SUPPRESS,
        help="parent of the catalogue's temporary directory (default: the system's)")  # fmt: skip
    return parser


def _json(body: object) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _median(values) -> float:
    return statistics.median(values)


def _model_seconds(model_dir: Path, instance: list, calls: int) -> tuple[float, str]:
    """Median seconds of the in-process ``classify([instance], 3)``, as the service runs it
    (single-threaded BLAS), and the label it answers."""
    predictor = Predictor.load(model_dir)  # median_seconds's untimed first call compiles
    with threadpool_limits(limits=1, user_api="blas"):
        seconds = median_seconds(lambda: predictor.classify([instance], 3), calls)
        label = predictor.classify([instance], 3)[0].label
    return seconds, label


def _first_answer(port: int, path: str, body: bytes) -> bytes:
    """One request through httpx: the answer's body, or exit with what the server said."""
    answer = httpx.post(
        f"http://{HOST}:{port}{path}",
        content=body,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    if answer.status_code != 200:
        raise SystemExit(f"POST {path} on port {port}: {answer.status_code} {answer.text[:500]}")
    return answer.content


def _show_errors(name: str, result: LoadResult) -> None:
    if result.n_errors:
        print(f"  ! {name}: {result.n_errors} errors {dict(result.errors)}; e.g. {result.samples}")


def _grid(args, ports: dict[str, int], body: bytes) -> dict[tuple[str, int], list[LoadResult]]:
    """Every (target, concurrency) cell --repeats times, service and floor back to back."""
    requests = {t: http_request(HOST, ports[t], "/classify", body) for t in TARGETS}
    for target in TARGETS:  # untimed: connections, caches, JIT and thread pools warm
        run_load(HOST, ports[target], requests[target], max(args.concurrency), 1.0, 0.0)
    results: dict[tuple[str, int], list[LoadResult]] = {}
    for repeat in range(args.repeats):
        for concurrency in args.concurrency:
            line = []
            for target in TARGETS:
                result = run_load(
                    HOST, ports[target], requests[target], concurrency, args.seconds,
                    args.warmup, args.client_processes,
                )  # fmt: skip
                results.setdefault((target, concurrency), []).append(result)
                line.append(f"{target} {result.requests_per_second:7.0f} req/s "
                            f"p50 {result.percentile_ms(50):6.3f} ms")  # fmt: skip
                _show_errors(f"{target}, c={concurrency}", result)
            print(f"  repeat {repeat + 1}/{args.repeats}, c={concurrency:<3}: {';  '.join(line)}")
    return results


def _summary(results, concurrency: int) -> dict[str, float]:
    service, floor = results["service", concurrency], results["floor", concurrency]
    row = {}
    for name, runs in (("service", service), ("floor", floor)):
        row[f"{name}_rps"] = _median(r.requests_per_second for r in runs)
        row[f"{name}_p50"] = _median(r.percentile_ms(50) for r in runs)
        row[f"{name}_p99"] = _median(r.percentile_ms(99) for r in runs)
        row[f"{name}_errors"] = sum(r.n_errors for r in runs)
    pairs = list(zip(service, floor, strict=True))
    row["rps_ratio"] = _median(s.requests_per_second / f.requests_per_second for s, f in pairs)
    row["p50_ratio"] = _median(s.percentile_ms(50) / f.percentile_ms(50) for s, f in pairs)
    row["p99_ratio"] = _median(s.percentile_ms(99) / f.percentile_ms(99) for s, f in pairs)
    return row


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _print_table(args, rows: dict[int, dict[str, float]], model_ms: float) -> None:
    print(f"\nPOST /classify, one 8x8 digit, top 3: medians of {args.repeats} repeat(s) x "
          f"{args.seconds:g} s per cell (ratios: medians of paired per-repeat ratios)")  # fmt: skip
    print(f"{'':5} | {'service':^26} | {'floor (bare FastAPI)':^26} | {'service / floor':^22} |")
    print(f"{'c':>5} | {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} | {'req/s':>8} {'p50 ms':>8} "
          f"{'p99 ms':>8} | {'req/s':>6} {'p50':>6} {'p99':>6} | errors")  # fmt: skip
    for c, row in rows.items():
        errors = f"{row['service_errors']:.0f} / {row['floor_errors']:.0f}"
        print(f"{c:>5} | {row['service_rps']:>8.0f} {row['service_p50']:>8.3f} "
              f"{row['service_p99']:>8.3f} | {row['floor_rps']:>8.0f} {row['floor_p50']:>8.3f} "
              f"{row['floor_p99']:>8.3f} | {row['rps_ratio']:>6.2f} {row['p50_ratio']:>6.2f} "
              f"{row['p99_ratio']:>6.2f} | {errors}")  # fmt: skip

    print(f"\ntargets (model time in process: {model_ms:.3f} ms, median of {args.model_calls} "
          f"Predictor.classify([digit], 3) calls)")  # fmt: skip
    print(f"{'c':>5}  {'p50 <= 1.3 x (floor p50 + model)':<36} {'req/s >= 80% of floor':<24} "
          "p99 <= 2 x floor p99")  # fmt: skip
    for c, row in rows.items():
        bound = P50_FACTOR * (row["floor_p50"] + model_ms)
        p50 = f"{row['service_p50']:.3f} <= {bound:.3f} ms {_verdict(row['service_p50'] <= bound)}"
        rps = f"{100 * row['rps_ratio']:.0f}% {_verdict(row['rps_ratio'] >= RPS_FRACTION)}"
        p99 = f"{row['p99_ratio']:.2f}x {_verdict(row['p99_ratio'] <= P99_FACTOR)}"
        print(f"{c:>5}  {p50:<36} {rps:<24} {p99}")
    if len(rows) > 1:
        print(
            "  (above c=1 requests queue: the p50 bound leaves out the model time of the "
            "requests queued ahead)"
        )
        for target in TARGETS:
            print(f"{target} req/s as concurrency rises: {_trend(rows, target)}")


def _trend(rows: dict[int, dict[str, float]], target: str) -> str:
    """Whether req/s falls (more than 10% below the best at a lower concurrency)."""
    rates = [(c, row[f"{target}_rps"]) for c, row in rows.items()]
    shown = " -> ".join(f"{rate:.0f} (c={c})" for c, rate in rates)
    falls = []
    for i, (c, rate) in enumerate(rates[1:], start=1):
        best_c, best = max(rates[:i], key=lambda cr: cr[1])
        if rate < FALL_TOLERANCE * best:
            falls.append(f"{100 * (1 - rate / best):.0f}% lower at c={c} than at c={best_c}")
    return f"{shown}: " + (f"FALLS ({'; '.join(falls)})" if falls else "holds")


def _search_part(args, floor_port: int, floor_c1_p50: float | None) -> None:
    """/search through a service on a synthetic catalogue, beside the query in process; each
    repeat times in process, service and floor back to back (the in-process kernel runs in
    parallel above a size, so a busy core slows it as much as it slows the server)."""
    print(f"\nPOST /search: building a {args.search_n:,}-item catalogue ...")
    with tempfile.TemporaryDirectory(dir=getattr(args, "search_dir", None)) as work:
        fixture = build_search_fixture(Path(work), n=args.search_n, top_k=args.search_top_k)
        with running_server(fixture.model_dir, WORKERS=str(args.workers)) as client:
            check_http_matches(fixture, client)
            ports = {"service": client.base_url.port, "floor": floor_port}
            body = _json(fixture.body)
            cells = {t: http_request(HOST, p, "/search", body) for t, p in ports.items()}
            classify = http_request(HOST, floor_port, "/classify", _classify_body())
            for target in TARGETS:  # untimed
                run_load(HOST, ports[target], cells[target], 1, 1.0, 0.0)
            p50s: dict[str, list[float]] = {
                "in process": [], "service": [], "floor": [], "floor /classify": []
            }  # fmt: skip
            for repeat in range(args.repeats):
                in_process = _latencies_for(fixture.run_in_process, args.warmup, args.seconds)
                p50s["in process"].append(1e3 * _median(in_process))
                for target in TARGETS:
                    result = run_load(HOST, ports[target], cells[target], 1, args.seconds,
                                      args.warmup)  # fmt: skip
                    _show_errors(f"{target} /search", result)
                    p50s[target].append(result.percentile_ms(50))
                if floor_c1_p50 is None:
                    result = run_load(HOST, floor_port, classify, 1, args.seconds, args.warmup)
                    p50s["floor /classify"].append(result.percentile_ms(50))
                print(f"  repeat {repeat + 1}/{args.repeats}: in process "
                      f"{p50s['in process'][-1]:.3f} ms, service {p50s['service'][-1]:.3f} ms, "
                      f"floor {p50s['floor'][-1]:.3f} ms (p50)")  # fmt: skip
    in_process_ms, http_ms = _median(p50s["in process"]), _median(p50s["service"])
    if floor_c1_p50 is None:
        floor_c1_p50 = _median(p50s["floor /classify"])
    bound = in_process_ms + floor_c1_p50 + SEARCH_SLACK_MS
    nnz = len(fixture.body["code"]["indices"])
    print(f"\ncode query, {nnz} non-zeros, top {args.search_top_k}, N = {args.search_n:,}: "
          f"p50 ms, medians of {args.repeats} x {args.seconds:g} s (HTTP: c=1)")  # fmt: skip
    print(f"  in process (SearchIndex.run)        {in_process_ms:8.3f}")
    print(f"  HTTP POST /search (service)         {http_ms:8.3f}")
    print(f"  floor POST /classify, c=1           {floor_c1_p50:8.3f}")
    print(f"  floor POST /search, {args.search_top_k} hits back  "
          f"{_median(p50s['floor']):8.3f}  (for information)")  # fmt: skip
    print(f"target: HTTP <= in process + floor p50 + {SEARCH_SLACK_MS} ms: {http_ms:.3f} <= "
          f"{bound:.3f} ms {_verdict(http_ms <= bound)}")  # fmt: skip


def _latencies_for(call, warmup: float, seconds: float) -> list[float]:
    """Seconds of each of the sequential calls that start in a window of ``seconds``, after
    ``warmup`` seconds of untimed calls: the in-process twin of a load-generator cell at c=1."""
    clock = time.perf_counter
    started = clock()
    while clock() - started < warmup:
        call()
    times, stop = [], clock() + seconds
    while (began := clock()) < stop:
        call()
        times.append(clock() - began)
    return times


@functools.cache
def _digit() -> list:
    """Item 0 of the digits test split, as the 8 x 8 nested list a client sends."""
    return load_digits_dataset().X_test[0].reshape(8, 8).tolist()


def _classify_body() -> bytes:
    return _json({"instances": [_digit()], "top_k": 3})


def main() -> None:
    args = _parser().parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress lines show as they come, piped too
    if args.repeats < 1 or args.seconds <= 0 or args.client_processes < 1 or args.workers < 1:
        raise SystemExit("--repeats, --seconds, --client-processes and --workers must be positive")
    model_dir = args.model if args.model.is_absolute() else REPO / args.model
    if not model_dir.is_dir():
        raise SystemExit(f"no model at {model_dir}: train it first (make train)")
    body = _classify_body()
    model_s, label = _model_seconds(model_dir, _digit(), args.model_calls)
    print(f"{os.cpu_count()} CPUs; {args.workers} worker process(es) per server; "
          f"{args.client_processes} load-generator process(es); request body {len(body)} B; "
          f"model answers {label!r} in {1e3 * model_s:.3f} ms in process")  # fmt: skip

    workers = {"WORKERS": str(args.workers)}
    with contextlib.ExitStack() as stack:
        ports = {
            "service": stack.enter_context(
                serving([sys.executable, "-m", "service.api"], service_env(model_dir, **workers))
            ),
            "floor": stack.enter_context(
                serving(
                    [sys.executable, str(REPO / "benchmarks" / "bare_endpoint.py")],
                    {"ACCESS_LOG": "false", "LOG_LEVEL": "warning", **workers},
                )
            ),
        }
        sizes = {t: len(_first_answer(port, "/classify", body)) for t, port in ports.items()}
        print(f"answer bodies: service {sizes['service']} B, floor {sizes['floor']} B")
        results = _grid(args, ports, body)
        rows = {c: _summary(results, c) for c in args.concurrency}
        _print_table(args, rows, 1e3 * model_s)
        samples = Counter(s for runs in results.values() for r in runs for s in r.samples)
        if samples:
            print("error answers seen:", *samples, sep="\n  ")
        if args.search:
            floor_c1 = rows[1]["floor_p50"] if 1 in rows else None
            _search_part(args, ports["floor"], floor_c1)


if __name__ == "__main__":
    main()
