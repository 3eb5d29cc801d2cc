"""Dynamic batching on a heavy model: the same server with and without it, in the same run.

    .venv/bin/python benchmarks/bench_batching.py [--basis-per-class 400] [--side 28]
        [--concurrency 1,32] [--seconds 3] [--repeats 3] [--max-instances 64]

Trains a heavy model first (a minute or two): 10 classes of synthetic 28 x 28 images (each
class a random smooth prototype plus noise), ``rbf(gamma=1)`` on a basis of 400 images a class
(4,000 basis items, about 3 million multiply-adds an image), ``besvm`` normalisation; written
to a temporary directory. Then starts two servers on it as deployed (``python -m service.api``,
access log on and written to a file, metrics on): ``unbatched`` (DYNAMIC_BATCH_MAX_INSTANCES=0)
and ``batched`` (DYNAMIC_BATCH_MAX_INSTANCES and DYNAMIC_BATCH_MAX_DELAY_MS from
--max-instances and --max-delay-ms).

Every connection sends one image a request (``/classify``, top_k 3), a different image per
connection (16 images in turn). Per repeat and concurrency, the two servers back to back (each
first in every other repeat), each for --seconds after --warmup (benchmarks/loadgen.py). Every
distinct answer either server gave is checked against the model's answer to that image alone
in process (labels equal, scores within 1e-9 relative): batching changes no answer.

Prints req/s, p50 and the server's CPU microseconds a request per server and concurrency
(medians over repeats), the ratio batched /
unbatched (median of the per-repeat ratios), and the targets: at the highest concurrency, req/s
at least 3x; at concurrency 1, p50 within 0.1 ms of unbatched. Then the batch sizes and queue
times the batched server's metrics recorded, and a lone request through the data plane in
process with and without batching, --pairs times in turn: the median of the paired differences
(the kernels' noise, on a busy machine far larger than the batcher's cost, cancels out). The
machine is shared with the clients: numbers are medians, but noisy; compare ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from loadgen import http_request, run_load
from serving import HOST, SESSIONS, service_env, serving, session_cpu_seconds

from service.api import Settings
from service.api.dataplane import DataPlane
from service.api.registry import ModelRegistry
from service.api.repository import Repository
from service.model import Predictor
from service.model.threads import limit_threads
from training import BasisExpandingSVC

N_CLASSES = 10
N_IMAGES = 16
P50_SLACK_MS = 0.1
RPS_FACTOR = 3.0
SCORE_RTOL = 1e-9


def heavy_images(n_per_class: int, side: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n_per_class`` synthetic ``side`` x ``side`` images of each of 10 classes: a smooth
    random prototype per class (values 0..1, the same for every seed) plus noise drawn with
    ``seed``; shape (n, side, side), labels (n,)."""
    coarse = np.random.default_rng(0).random((N_CLASSES, 7, 7))
    prototypes = np.kron(coarse, np.ones((side // 7 + 1, side // 7 + 1)))[:, :side, :side]
    labels = np.repeat(np.arange(N_CLASSES), n_per_class)
    noise = np.random.default_rng(seed).normal(scale=0.35, size=(len(labels), side, side))
    return np.clip(prototypes[labels] + noise, 0.0, 1.0), labels


def build_heavy_model(directory: Path, basis_per_class: int, side: int) -> Path:
    """Train the heavy model on its own basis images and save it in ``directory``."""
    X, y = heavy_images(basis_per_class, side)
    started = time.perf_counter()
    estimator = BasisExpandingSVC(
        similarity="rbf(gamma=1)",
        basis_per_class=basis_per_class,
        normalization="besvm",
        max_iter=200,
    ).fit(X, y.astype(str))
    model_dir = directory / "heavy"
    estimator.predictor_.save(model_dir)
    predictor = Predictor.load(model_dir)
    print(f"heavy model: {predictor.n_basis} basis items of {side * side} numbers, "
          f"{' + '.join(predictor.similarity_names)}, trained in "
          f"{time.perf_counter() - started:.0f} s")  # fmt: skip
    return model_dir


def _check(answers, bodies: list[list], predictor: Predictor, name: str) -> int:
    """Every distinct 200 answer equals the in-process answer to its image alone."""
    checked = 0
    for index, tally in enumerate(answers):
        expected = predictor.classify([bodies[index % len(bodies)]], 3)[0]
        for body in tally:
            if body is None:
                continue
            (prediction,) = json.loads(body)["predictions"]
            if prediction["label"] != expected.label:
                raise SystemExit(f"{name}: label {prediction['label']} != {expected.label}")
            got = [s["score"] for s in prediction["top_k"]]
            want = [score for _, score in expected.ranked]
            if not np.allclose(got, want, rtol=SCORE_RTOL, atol=SCORE_RTOL):
                raise SystemExit(f"{name}: scores {got} != {want}")
            checked += 1
    return checked


def lone_requests(model_dir: Path, image: list, pairs: int, max_instances: int) -> list[float]:
    """Seconds of a lone request through the data plane without and with batching, in turn
    (``pairs`` times, after 20 untimed), in process on one event loop: the paired differences
    (batched - unbatched), where the kernels' own noise, the same in both, cancels out."""

    async def run() -> list[float]:
        planes = []
        for instances in (0, max_instances):
            registry = ModelRegistry(Repository(model_dir, single=True))
            settings = Settings(
                _env_file=None, model_dir=model_dir, dynamic_batch_max_instances=instances
            )
            planes.append(DataPlane(registry, settings))
            await registry.sync()
        differences = []
        for i in range(pairs + 20):
            seconds = []
            for plane in planes:
                started = time.perf_counter()
                await plane.classify(None, [image], None, 3)
                seconds.append(time.perf_counter() - started)
            if i >= 20:
                differences.append(seconds[1] - seconds[0])
        for plane in planes:
            plane.close()
        return differences

    with limit_threads(blas_threads=1):  # as the server runs
        return asyncio.run(run())


def _histogram(text: str, name: str) -> tuple[float, float]:
    """Count and sum of a histogram in a Prometheus exposition."""
    values = {}
    for suffix in ("count", "sum"):
        found = re.findall(rf"^besvm_{name}_{suffix}{{[^}}]*}} (\S+)$", text, re.MULTILINE)
        values[suffix] = sum(float(v) for v in found)
    return values["count"], values["sum"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", default="1,32", help="comma-separated client counts")
    for flag, kind, default, text in (
        ("--basis-per-class", int, 400, "basis images a class (10 classes)"),
        ("--side", int, 28, "image side"),
        ("--seconds", float, 3.0, "measured seconds a cell"),
        ("--warmup", float, 0.5, "unmeasured seconds before each cell"),
        ("--repeats", int, 3, "passes over the grid"),
        ("--max-instances", int, 64, "DYNAMIC_BATCH_MAX_INSTANCES"),
        ("--max-delay-ms", float, 0.0, "DYNAMIC_BATCH_MAX_DELAY_MS"),
        ("--pairs", int, 200, "lone requests in process, each way"),
    ):
        parser.add_argument(flag, type=kind, default=default, help=text)
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    concurrencies = sorted({int(c) for c in args.concurrency.split(",")})
    with tempfile.TemporaryDirectory() as work:
        model_dir = build_heavy_model(Path(work), args.basis_per_class, args.side)
        predictor = Predictor.load(model_dir)
        images, _ = heavy_images(2, args.side, seed=1)
        bodies = [image.tolist() for image in images[:N_IMAGES]]
        common = {"ACCESS_LOG": "true", "LOG_LEVEL": "info"}
        settings = {
            "unbatched": {"DYNAMIC_BATCH_MAX_INSTANCES": "0"},
            "batched": {
                "DYNAMIC_BATCH_MAX_INSTANCES": str(args.max_instances),
                "DYNAMIC_BATCH_MAX_DELAY_MS": str(args.max_delay_ms),
            },
        }
        command = [sys.executable, "-m", "service.api"]
        with (
            serving(command, service_env(model_dir, **common, **settings["unbatched"])) as plain,
            serving(command, service_env(model_dir, **common, **settings["batched"])) as batched,
        ):
            ports = {"unbatched": plain, "batched": batched}
            requests = {
                name: [
                    http_request(HOST, port, "/classify", json.dumps({"instances": [b]}).encode())
                    for b in bodies
                ]
                for name, port in ports.items()
            }
            for name in ports:  # untimed: connections, thread pools, the cost estimates
                run_load(HOST, ports[name], requests[name], max(concurrencies), 1.0, 0.0)
            results: dict[tuple[str, int], list] = {}
            checked = 0
            for repeat in range(args.repeats):
                for c in concurrencies:
                    line = []
                    # Each server first in every other repeat: what one leaves running (its
                    # kernels' threads winding down) costs both alike.
                    for name in list(ports)[:: 1 if repeat % 2 == 0 else -1]:
                        cpu = session_cpu_seconds(SESSIONS[ports[name]])
                        result = run_load(HOST, ports[name], requests[name], c, args.seconds,
                                          args.warmup)  # fmt: skip
                        served = result.requests_per_second * (args.seconds + args.warmup)
                        cpu = session_cpu_seconds(SESSIONS[ports[name]]) - cpu
                        result.cpu_us = 1e6 * cpu / max(served, 1)
                        if result.n_errors:
                            print(f"  ! {name}, c={c}: {dict(result.errors)} {result.samples}")
                        checked += _check(result.answers, bodies, predictor, name)
                        results.setdefault((name, c), []).append(result)
                        line.append(f"{name} {result.requests_per_second:.0f}")
                    print(f"  repeat {repeat + 1}/{args.repeats}, c={c:<3} req/s: "
                          f"{';  '.join(line)}")  # fmt: skip
            metrics = httpx.get(f"http://{HOST}:{batched}/metrics").text
        differences = lone_requests(model_dir, bodies[0], args.pairs, args.max_instances)
    print(f"\n/classify, one {args.side}x{args.side} image a request; medians of {args.repeats} "
          f"x {args.seconds:g} s; ratios: medians of per-repeat ratios (batched over "
          "unbatched)")  # fmt: skip
    print(f"{'c':>4} | {'unbatched req/s':>15} {'p50 ms':>7} {'CPU us':>7} | "
          f"{'batched req/s':>13} {'p50 ms':>7} {'CPU us':>7} | {'req/s x':>7} "
          f"{'p50 diff ms':>11}")  # fmt: skip
    for c in concurrencies:
        plain_runs, batched_runs = results["unbatched", c], results["batched", c]
        pairs = list(zip(plain_runs, batched_runs, strict=True))
        ratio = statistics.median(b.requests_per_second / p.requests_per_second for p, b in pairs)
        diff = statistics.median(b.percentile_ms(50) - p.percentile_ms(50) for p, b in pairs)
        print(f"{c:>4} | {statistics.median(r.requests_per_second for r in plain_runs):>15.0f} "
              f"{statistics.median(r.percentile_ms(50) for r in plain_runs):>7.3f} "
              f"{statistics.median(r.cpu_us for r in plain_runs):>7.0f} | "
              f"{statistics.median(r.requests_per_second for r in batched_runs):>13.0f} "
              f"{statistics.median(r.percentile_ms(50) for r in batched_runs):>7.3f} "
              f"{statistics.median(r.cpu_us for r in batched_runs):>7.0f} | "
              f"{ratio:>7.2f} {diff:>+11.3f}")  # fmt: skip
    top, low = max(concurrencies), min(concurrencies)

    def median_of(c, stat):
        pairs = zip(results["unbatched", c], results["batched", c], strict=True)
        return statistics.median(stat(p, b) for p, b in pairs)

    ratio = median_of(top, lambda p, b: b.requests_per_second / p.requests_per_second)
    diff = median_of(low, lambda p, b: b.percentile_ms(50) - p.percentile_ms(50))
    print(f"target: req/s at c={top} >= {RPS_FACTOR:g}x unbatched: {ratio:.2f}x "
          f"{'PASS' if ratio >= RPS_FACTOR else 'FAIL'}")  # fmt: skip
    print(f"target: p50 at c={low} within {P50_SLACK_MS} ms of unbatched: {diff:+.3f} ms "
          f"{'PASS' if diff <= P50_SLACK_MS else 'FAIL'}")  # fmt: skip
    print(f"answers checked against the in-process answer alone: {checked} distinct, all equal")
    lone_ms = 1e3 * statistics.median(differences)
    print(f"a lone request through the data plane in process, batched - unbatched, median of "
          f"{len(differences)} paired differences: {lone_ms:+.3f} ms "
          f"{'PASS' if lone_ms <= P50_SLACK_MS else 'FAIL'}")  # fmt: skip
    batches, instances = _histogram(metrics, "dynamic_batch_size")
    waits, waited = _histogram(metrics, "dynamic_batch_queue_seconds")
    if batches:
        mean_wait_ms = 1e3 * waited / max(waits, 1)
        print(f"batched server: {batches:.0f} batches, {instances / batches:.1f} instances a "
              f"batch on average, mean queue time {mean_wait_ms:.3f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
