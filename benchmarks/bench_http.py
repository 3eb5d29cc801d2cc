"""What serving costs: the service's REST routes and gRPC against a bare FastAPI endpoint, in the
same run.

    .venv/bin/python benchmarks/bench_http.py [--concurrency 1,8,64] [--seconds 3] [--repeats 3]
        [--workers 1] [--client-processes 1] [--no-keys] [--no-grpc] [--no-search]

Starts the floor, benchmarks/bare_endpoint.py (the same uvicorn with one ``async def`` FastAPI
route that validates the same request body, one 8 x 8 digit and top_k 3, with pydantic and
answers a fixed answer of the service's shape, without a model), the thinnest ASGI app
(bare_endpoint.py's ``thin``: a raw ``async def app(scope, receive, send)`` on the same uvicorn
that parses the same JSON and answers the same fixed bytes, no access log), and the real
service as it is deployed (``python -m service.api`` on MODEL_DIR=--model, WORKERS=--workers,
the access log on and written to a file, metrics on, GRPC_PORT set), twice: without keys, and
with
API_KEYS_FILE (every request then sends a key). The targets, one digit a request:

- ``/classify`` (JSON) and ``/v2/models/digits/infer`` (the protocol's JSON, FP64), over HTTP;
- gRPC ``ModelInfer`` (FP64 in raw_input_contents, as tritonclient.grpc sends it).

All are driven by benchmarks/loadgen.py in its own process(es): keep-alive connections sending
precomputed request bytes (one connection, or one gRPC channel, per concurrent client), for
--seconds per cell after --warmup seconds; per repeat and concurrency the floor first, then every
target back to back, the whole grid --repeats times. Non-OK answers are counted as errors.

Prints per target and concurrency req/s, p50, p99 and the server's CPU microseconds per request
(its processes' CPU time over the cell by the requests served: robust where a shared machine's
neighbours move throughput), medians over repeats, and the ratios to the floor (medians of the
per-repeat ratios); then the target, req/s at least 80% of the floor's on both REST routes
(gRPC is shown beside them: its client library costs the shared cores far more than the raw
HTTP client), and whether req/s falls as concurrency rises (more than 10% below the best at a
lower concurrency). Against the thinnest ASGI app: every REST target's req/s and CPU a request
over the thin app's, with the target /classify req/s >= 0.5 of its; and gRPC ModelInfer's
server CPU a request over REST /classify's on the same server, with the target <= 1.25.

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bench_search_http import build_search_fixture, check_http_matches
from loadgen import GrpcCall, LoadResult, http_request, run_load
from serving import (
    HOST,
    REPO,
    SESSIONS,
    free_port,
    running_server,
    service_env,
    serving,
    session_cpu_seconds,
)
from threadpoolctl import threadpool_limits

from service.api.protocol import inference_pb2
from service.model import Predictor
from training.data.datasets import load_digits_dataset
from training.evaluation.held_out import median_seconds

RPS_FRACTION, P99_FACTOR, FALL_TOLERANCE = 0.8, 2.0, 0.9
THIN_FRACTION, GRPC_CPU_FACTOR = 0.5, 1.25
SEARCH_TARGETS = ("service", "floor")
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
    add("--no-keys", dest="keys", action="store_false",
        help="skip the service with API keys (API_KEYS_FILE, a key in every request)")  # fmt: skip
    add("--no-grpc", dest="grpc", action="store_false", help="skip gRPC ModelInfer")
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


def _show_errors(name: str, result: LoadResult) -> None:
    if result.n_errors:
        print(f"  ! {name}: {result.n_errors} errors {dict(result.errors)}; e.g. {result.samples}")


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


@dataclass(frozen=True)
class Target:
    """One measured cell's column: a server and what is sent to it."""

    name: str
    server: str  # "floor", "service" or "service+keys"
    route: str  # "/classify", "/v2/models/digits/infer" or "gRPC ModelInfer"

    @property
    def keys(self) -> bool:
        return self.server == "service+keys"


FLOOR = Target("floor", "floor", "/classify")
THIN = Target("thin ASGI app", "thin", "/classify")
V2_ROUTE, GRPC_ROUTE = "/v2/models/digits/infer", "gRPC ModelInfer"
GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"
BENCH_KEY = "bench-key-9f8e7d6c5b4a39281706"


def _targets(args) -> list[Target]:
    targets = [FLOOR, THIN]
    for server in ("service", "service+keys") if args.keys else ("service",):
        for route in ("/classify", V2_ROUTE, *([GRPC_ROUTE] if args.grpc else [])):
            suffix = ", key" if server == "service+keys" else ""
            targets.append(Target(f"{route}{suffix}", server, route))
    return targets


def _v2_body() -> bytes:
    digit = np.asarray(_digit(), dtype=np.float64)
    tensor = {
        "name": "input",
        "shape": [1, 8, 8],
        "datatype": "FP64",
        "data": digit.ravel().tolist(),
    }
    return _json({"inputs": [tensor]})


def _grpc_body() -> bytes:
    """The same digit as tritonclient.grpc sends it: FP64 in raw_input_contents."""
    request = inference_pb2.ModelInferRequest(model_name="digits")
    request.inputs.add(name="input", datatype="FP64", shape=[1, 8, 8])
    request.raw_input_contents.append(np.asarray(_digit(), dtype="<f8").tobytes())
    return request.SerializeToString()


@dataclass(frozen=True)
class Cell:
    """What a target's load generator sends: request bytes, to a port, over HTTP or gRPC; and
    the session of the server that answers (whose CPU time is measured)."""

    port: int
    request: bytes
    session: int
    grpc: GrpcCall | None = None


def _cells(targets: list[Target], ports: dict[str, int], grpc_ports: dict[str, int]) -> dict:
    cells = {}
    for target in targets:
        headers = {"Authorization": f"Bearer {BENCH_KEY}"} if target.keys else {}
        port = ports[target.server]
        session = SESSIONS[port]
        if target.route == GRPC_ROUTE:
            metadata = tuple((k.lower(), v) for k, v in headers.items())
            call = GrpcCall(GRPC_METHOD, metadata)
            cells[target] = Cell(grpc_ports[target.server], _grpc_body(), session, call)
        else:
            body = _v2_body() if target.route == V2_ROUTE else _classify_body()
            request = http_request(HOST, port, target.route, body, headers)
            cells[target] = Cell(port, request, session)
    return cells


def _load(cell: Cell, concurrency: int, seconds: float, warmup: float, processes: int = 1):
    """One timed run; its result carries ``cpu_us``, the server's CPU microseconds per request
    (its CPU time over the run, warm-up included, by the requests at the measured rate)."""
    cpu = session_cpu_seconds(cell.session)
    result = run_load(HOST, cell.port, cell.request, concurrency, seconds, warmup, processes,
                      grpc=cell.grpc)  # fmt: skip
    served = result.requests_per_second * (seconds + warmup)
    result.cpu_us = 1e6 * (session_cpu_seconds(cell.session) - cpu) / max(served, 1)
    return result


def _grid(args, targets: list[Target], cells: dict) -> dict[tuple[Target, int], list[LoadResult]]:
    """Every (target, concurrency) cell --repeats times, the floor first then every target, back
    to back."""
    for target in targets:  # untimed: connections, caches, JIT and thread pools warm
        _load(cells[target], max(args.concurrency), 1.0, 0.0)
    results: dict[tuple[Target, int], list[LoadResult]] = {}
    for repeat in range(args.repeats):
        for concurrency in args.concurrency:
            line = []
            for target in targets:
                result = _load(cells[target], concurrency, args.seconds, args.warmup,
                               args.client_processes)  # fmt: skip
                results.setdefault((target, concurrency), []).append(result)
                line.append(f"{target.name} {result.requests_per_second:.0f}")
                _show_errors(f"{target.name}, c={concurrency}", result)
            print(f"  repeat {repeat + 1}/{args.repeats}, c={concurrency:<3} req/s: "
                  f"{';  '.join(line)}")  # fmt: skip
    return results


def _summary(results, target: Target, concurrency: int, base: Target = FLOOR) -> dict[str, float]:
    runs, floor = results[target, concurrency], results[base, concurrency]
    pairs = list(zip(runs, floor, strict=True))
    return {
        "rps": _median(r.requests_per_second for r in runs),
        "p50": _median(r.percentile_ms(50) for r in runs),
        "p99": _median(r.percentile_ms(99) for r in runs),
        "cpu_us": _median(r.cpu_us for r in runs),
        "cpu_ratio": _median(s.cpu_us / f.cpu_us for s, f in pairs),
        "errors": sum(r.n_errors for r in runs),
        "rps_ratio": _median(s.requests_per_second / f.requests_per_second for s, f in pairs),
        "p50_ratio": _median(s.percentile_ms(50) / f.percentile_ms(50) for s, f in pairs),
        "p99_ratio": _median(s.percentile_ms(99) / f.percentile_ms(99) for s, f in pairs),
    }


def _print_table(args, targets: list[Target], results, model_ms: float) -> None:
    print(f"\none 8x8 digit a request (REST JSON; gRPC raw FP64): medians of {args.repeats} "
          f"repeat(s) x {args.seconds:g} s per cell; ratios: medians of the per-repeat ratios to "
          "the floor measured just before; access log and metrics on")  # fmt: skip
    print(f"{'target':<34} {'c':>4} | {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'CPU us':>7} | "
          f"{'req/s':>6} {'p50':>6} {'p99':>6} {'CPU':>6} | errors")  # fmt: skip
    print(f"{'':<34} {'':>4} | {'':>31} | {'/ floor':^27} |")
    for target in targets:
        for c in args.concurrency:
            row = _summary(results, target, c)
            print(f"{target.name:<34} {c:>4} | {row['rps']:>7.0f} {row['p50']:>7.3f} "
                  f"{row['p99']:>7.3f} {row['cpu_us']:>7.0f} | {row['rps_ratio']:>6.2f} "
                  f"{row['p50_ratio']:>6.2f} {row['p99_ratio']:>6.2f} {row['cpu_ratio']:>6.2f} | "
                  f"{row['errors']:.0f}")  # fmt: skip
    print(f"\nagainst the thinnest ASGI app on the same uvicorn (a raw ASGI callable parsing "
          f"the JSON and answering fixed bytes, no access log): req/s and CPU a request over "
          f"its; target: /classify req/s >= {THIN_FRACTION:g} of its")  # fmt: skip
    for target in targets:
        if target in (FLOOR, THIN) or target.route == GRPC_ROUTE:
            continue
        cells = []
        for c in args.concurrency:
            row = _summary(results, target, c, base=THIN)
            verdict = ""
            if target.name == "/classify":
                verdict = " " + _verdict(row["rps_ratio"] >= THIN_FRACTION)
            cells.append(f"c={c}: {row['rps_ratio']:.2f}{verdict} (CPU x{row['cpu_ratio']:.2f})")
        print(f"  {target.name:<32} {';  '.join(cells)}")
    grpc_targets = [t for t in targets if t.route == GRPC_ROUTE]
    if grpc_targets:
        print(f"gRPC ModelInfer's server CPU a request over REST /classify's (same server, same "
              f"run; target <= {GRPC_CPU_FACTOR:g}):")  # fmt: skip
        for target in grpc_targets:
            rest = next(t for t in targets if t.server == target.server and t.route == "/classify")
            cells = []
            for c in args.concurrency:
                pairs = zip(results[target, c], results[rest, c], strict=True)
                ratio = _median(g.cpu_us / r.cpu_us for g, r in pairs)
                cells.append(f"c={c}: {ratio:.2f} {_verdict(ratio <= GRPC_CPU_FACTOR)}")
            print(f"  {target.name:<32} {';  '.join(cells)}")
    print(f"\ntargets (model time in process: {model_ms:.3f} ms, median of {args.model_calls} "
          f"Predictor.classify([digit], 3) calls): req/s >= {RPS_FRACTION:.0%} of the floor "
          f"on both REST routes; p99 <= {P99_FACTOR:g} x the floor's")  # fmt: skip
    for target in targets[1:]:
        verdicts = []
        for c in args.concurrency:
            row = _summary(results, target, c)
            rps = (
                ""
                if target.route == GRPC_ROUTE
                else f" {_verdict(row['rps_ratio'] >= RPS_FRACTION)}"
            )
            verdicts.append(f"c={c}: {row['rps_ratio']:.2f}{rps}")
        print(f"  {target.name:<32} {';  '.join(verdicts)}")
    if len(args.concurrency) > 1:
        for target in targets[:2]:
            print(f"{target.name} req/s as concurrency rises: {_trend(results, target, args)}")


def _trend(results, target: Target, args) -> str:
    """Whether req/s falls (more than 10% below the best at a lower concurrency)."""
    rates = [(c, _summary(results, target, c)["rps"]) for c in args.concurrency]
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
            for target in SEARCH_TARGETS:  # untimed
                run_load(HOST, ports[target], cells[target], 1, 1.0, 0.0)
            p50s: dict[str, list[float]] = {
                "in process": [], "service": [], "floor": [], "floor /classify": []
            }  # fmt: skip
            for repeat in range(args.repeats):
                in_process = _latencies_for(fixture.run_in_process, args.warmup, args.seconds)
                p50s["in process"].append(1e3 * _median(in_process))
                for target in SEARCH_TARGETS:
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
    # The service as deployed: access log on (lines written to a file), metrics on.
    observed = {"ACCESS_LOG": "true", "LOG_LEVEL": "info", **workers}
    targets = _targets(args)
    with contextlib.ExitStack() as stack:
        keys = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "keys.txt"
        keys.write_text(f"{BENCH_KEY} read\n")
        grpc_ports = {server: free_port() for server in ("service", "service+keys")}
        envs = {
            "service": {**observed, "GRPC_PORT": str(grpc_ports["service"])},
            "service+keys": {
                **observed,
                "GRPC_PORT": str(grpc_ports["service+keys"]),
                "API_KEYS_FILE": str(keys),
            },
        }
        bare = [sys.executable, str(REPO / "benchmarks" / "bare_endpoint.py")]
        quiet = {"ACCESS_LOG": "false", "LOG_LEVEL": "warning", **workers}
        ports = {
            "floor": stack.enter_context(serving(bare, quiet)),
            "thin": stack.enter_context(serving(bare, {**quiet, "APP": "thin"})),
        }
        for server in sorted({target.server for target in targets} - {"floor", "thin"}):
            command = [sys.executable, "-m", "service.api"]
            ports[server] = stack.enter_context(
                serving(command, service_env(model_dir, **envs[server]))
            )
        cells = _cells(targets, ports, grpc_ports)
        answers = _check_answers(targets, cells)
        print("answers: " + "; ".join(f"{name} {size} B" for name, size in answers.items()))
        results = _grid(args, targets, cells)
        _print_table(args, targets, results, 1e3 * model_s)
        samples = Counter(s for runs in results.values() for r in runs for s in r.samples)
        if samples:
            print("error answers seen:", *samples, sep="\n  ")
        if args.search:
            floor_c1 = _summary(results, FLOOR, 1)["p50"] if 1 in args.concurrency else None
            _search_part(args, ports["floor"], floor_c1)


def _check_answers(targets: list[Target], cells: dict) -> dict[str, int]:
    """One counted request per target: every answer a 200 (exit with what was answered
    otherwise); the size of each answer."""
    sizes = {}
    for target in targets:
        result = run_load(HOST, cells[target].port, cells[target].request, 1, count=1,
                          timeout=60, grpc=cells[target].grpc)  # fmt: skip
        if result.n_errors:
            raise SystemExit(f"{target.name}: {dict(result.errors)} {result.samples}")
        (answer,) = result.answers[0]
        sizes[target.name] = len(answer) if answer else 0
    return sizes


if __name__ == "__main__":
    main()
