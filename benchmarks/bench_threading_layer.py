"""numba's threading layer for a container: omp against workqueue (and tbb), alone and beside a
busy neighbour, on the two request paths that run parallel kernels.

    .venv/bin/python benchmarks/bench_threading_layer.py [--repeats 3] [--seconds 2]
        [--search-n 500000] [--batch 797] [--busy 1,all] [--calling-threads 4]

The threading layer is fixed when numba starts, so every cell is a fresh process (this script
with ``--child``) started with its environment: ``NUMBA_THREADING_LAYER`` = omp, workqueue,
tbb (only where it loads), omp with ``OMP_WAIT_POLICY=PASSIVE`` (GNU OpenMP's threads then sleep
at once instead of spinning after a region), and workqueue with ``NUMBA_NUM_THREADS=1`` (one
thread: what parallelism buys; since 30 November classify's similarities run on the serial
driver there, on the calling thread, where they ran the parallel driver on one pool thread).
Each cell loads the models, calls both paths untimed (compilation comes from numba's cache),
then times each path for ``--seconds``:

- classify: ``Predictor.classify`` of a batch of ``--batch`` digits (models/digits, the parallel
  similarity driver, far above ``SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS``);
- search: ``SearchIndex.run`` of a code query with 10 non-zeros, top 100, on a synthetic
  catalogue of ``--search-n`` items x 256 atoms (10 x N entries read, above
  ``SEARCH_PARALLEL_MIN_ENTRIES``: the parallel driver), built once per run in a temporary
  directory by benchmarks/bench_search_http.py's code.

As the server does, the calls come from several Python threads in turn (``--calling-threads``,
like the server's worker-thread pool; the parallel regions are serialised by
``service.model.threads.PARALLEL_REGION``). Per path the cell reports the median wall time of a
call, the process CPU time per call (threads spinning included) and the process's thread count
at the end.

Busy neighbour: for each count in ``--busy`` (default: 1 and every available CPU), that many
processes each spinning in a Python loop, started before the cell's process and stopped after
it: another container on one of the cores, or on all of them. One busy core is the harder case
for a thread team: one of its threads runs at half speed while the other waits for it. Every
repeat runs every cell, alone then each busy level, so drift spreads over all of them;
the table gives medians over repeats and each cell's ratio to omp alone (median of the
per-repeat ratios). The machine is shared: compare ratios within one run, not absolute times.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from service.model.threads import available_cpus

REPO = Path(__file__).resolve().parents[1]
PATHS = ("classify", "search")
# name -> environment of the cell's process (on top of the parent's, without these variables)
LAYERS = {
    "omp": {"NUMBA_THREADING_LAYER": "omp"},
    "omp passive": {"NUMBA_THREADING_LAYER": "omp", "OMP_WAIT_POLICY": "PASSIVE"},
    "workqueue": {"NUMBA_THREADING_LAYER": "workqueue"},
    "tbb": {"NUMBA_THREADING_LAYER": "tbb"},
    "workqueue 1 thread": {"NUMBA_THREADING_LAYER": "workqueue", "NUMBA_NUM_THREADS": "1"},
}
CLEARED = ("NUMBA_THREADING_LAYER", "NUMBA_NUM_THREADS", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")
BASELINE = ("omp", "alone")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--repeats", type=int, default=3, help="passes over every cell")
    add("--seconds", type=float, default=2.0, help="timed seconds per path and cell")
    add("--model", type=Path, default=REPO / "models/digits", help="the classify path's model")
    add("--batch", type=int, default=797, help="digits per classify call (the test split: 797)")
    add("--search-n", type=int, default=500_000, help="catalogue items of the search path")
    add("--busy", default="1,all", help="spinning processes of each busy level ('all': per CPU)")
    add("--calling-threads", type=int, default=4, help="Python threads taking turns")
    add(
        "--layers",
        default=",".join(LAYERS),
        help="cells, comma-separated, of: " + ", ".join(LAYERS),
    )
    add("--child", help=argparse.SUPPRESS)
    return parser


# --- the cell's process ----------------------------------------------------------------------


def _process_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _thread_count() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads")))


def _time_calls(call, seconds: float, callers: list[ThreadPoolExecutor]) -> dict[str, float]:
    """Sequential calls, each from the next calling thread in turn, for ``seconds`` (at least 5
    calls): median wall ms per call and process CPU ms per call."""
    walls = []
    cpu_before, started = _process_cpu_seconds(), time.perf_counter()
    while len(walls) < 5 or time.perf_counter() - started < seconds:
        caller = callers[len(walls) % len(callers)]
        began = time.perf_counter()
        caller.submit(call).result()
        walls.append(time.perf_counter() - began)
    cpu = _process_cpu_seconds() - cpu_before
    return {"wall_ms": 1e3 * statistics.median(walls), "cpu_ms": 1e3 * cpu / len(walls)}


def _child(config: dict) -> None:
    import numba

    from service.model import Predictor
    from service.model.search import SearchIndex, SearchQuery
    from training.data.datasets import load_digits_dataset

    digits = load_digits_dataset()
    instances = digits.X_test[: config["batch"]].reshape(-1, 8, 8)
    classifier = Predictor.load(config["model"])
    search_predictor = Predictor.load(config["search_model"])
    index = SearchIndex.load(config["search_model"], search_predictor)
    query = SearchQuery(code=(config["indices"], config["values"]), top_k=100)
    calls = {
        "classify": lambda: classifier.classify(instances, 3),
        "search": lambda: index.run(query),
    }
    callers = [ThreadPoolExecutor(1) for _ in range(config["calling_threads"])]
    for call in calls.values():  # untimed: compile (from the cache), start every thread pool
        for caller in callers:
            caller.submit(call).result()
    result = {"layer": numba.threading_layer(), "threads": numba.config.NUMBA_NUM_THREADS}
    for name, call in calls.items():
        result[name] = _time_calls(call, config["seconds"], callers)
    result["process_threads"] = _thread_count()
    for caller in callers:
        caller.shutdown()
    print(json.dumps(result), flush=True)


# --- the parent ------------------------------------------------------------------------------


@contextlib.contextmanager
def _busy_neighbour(processes: int):
    """``processes`` Python processes spinning until the block ends (none for 0)."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)
    ]
    try:
        time.sleep(0.3 if spinners else 0)  # started and spinning
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def _run_cell(layer: str, config: dict) -> dict | None:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(LAYERS[layer])
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(config)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        print(f"  {layer}: not available ({done.stderr.strip().splitlines()[-1][:160]})")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    args = _parser().parse_args()
    if args.child:
        _child(json.loads(args.child))
        return
    from bench_search_http import build_search_fixture

    layers = [name.strip() for name in args.layers.split(",") if name.strip()]
    unknown = set(layers) - set(LAYERS)
    if unknown or "omp" not in layers:
        raise SystemExit(f"--layers: unknown {sorted(unknown)} or no omp (the baseline)")
    levels = [("alone", 0)]
    for count in args.busy.split(","):
        processes = available_cpus() if count.strip() == "all" else int(count)
        levels.append((f"busy {processes}", processes))
    with tempfile.TemporaryDirectory() as work:
        print(f"building a {args.search_n:,}-item search catalogue ...")
        fixture = build_search_fixture(Path(work), n=args.search_n, top_k=100)
        indices, values = fixture.code_query.code
        config = {
            "model": str(args.model),
            "batch": args.batch,
            "search_model": str(fixture.model_dir),
            "indices": list(indices),
            "values": list(values),
            "seconds": args.seconds,
            "calling_threads": args.calling_threads,
        }
        results: dict[tuple[str, str], list[dict]] = {}
        for repeat in range(args.repeats):
            for neighbour, processes in levels:
                for layer in list(layers):
                    with _busy_neighbour(processes):
                        result = _run_cell(layer, config)
                    if result is None:
                        layers.remove(layer)
                        continue
                    results.setdefault((layer, neighbour), []).append(result)
                    times = ", ".join(f"{p} {result[p]['wall_ms']:.2f} ms" for p in PATHS)
                    print(f"  repeat {repeat + 1}/{args.repeats} {neighbour:7} {layer:18} "
                          f"({result['layer']}, {result['threads']} threads): {times}")  # fmt: skip
    _print_table(args, results, layers, [name for name, _ in levels])


def _print_table(args, results, layers: list[str], levels: list[str]) -> None:
    print(f"\n{available_cpus()} CPUs; busy n: n processes spinning; "
          f"classify: {args.batch} digits per call; search: N = {args.search_n:,}, 10 non-zeros, "
          f"top 100; {args.calling_threads} calling threads; medians of {args.repeats} repeats "
          f"x {args.seconds:g} s; ratio: to omp alone, median of per-repeat ratios")  # fmt: skip
    header = "".join(f" | {p + ' ms':>12} {'ratio':>6} {'CPU ms':>7}" for p in PATHS)
    print(f"{'layer':18} {'neighbour':9}{header} | threads")
    base = results[BASELINE]
    for neighbour in levels:
        for layer in layers:
            runs = results[layer, neighbour]
            cells = []
            for path in PATHS:
                wall = statistics.median(r[path]["wall_ms"] for r in runs)
                cpu = statistics.median(r[path]["cpu_ms"] for r in runs)
                ratio = statistics.median(
                    r[path]["wall_ms"] / b[path]["wall_ms"] for r, b in zip(runs, base, strict=True)
                )
                cells.append(f" | {wall:12.2f} {ratio:5.2f}x {cpu:7.2f}")
            threads = max(r["process_threads"] for r in runs)
            print(f"{layer:18} {neighbour:9}{''.join(cells)} | {threads}")


if __name__ == "__main__":
    main()
