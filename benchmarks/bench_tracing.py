"""What tracing costs a one-digit POST /classify: off (the acceptance: under 2 us), and on.

    .venv/bin/python benchmarks/bench_tracing.py [--model models/digits] [--calls 100]
        [--repeats 200]

In one process, without HTTP: apps built by ``create_app`` (lifespans run, the model loaded),
each called as an ASGI app with the same request. A round calls each variant --calls times, in
a rotating order; --repeats rounds. Each block is timed in CPU time of the calling thread (the
event loop's, where a one-digit request's work runs inline): time the process spends preempted
by others on a shared machine does not count, which wall time would. Prints, per variant, the
median microseconds per call, and the median over rounds of its paired difference from ``off``
in the same round, with the 10th and 90th percentiles of those differences.

- ``off``: OTEL_* unset, as shipped. Tracing off installs nothing: the benchmark checks that its
  stack holds no tracing middleware and that its data plane is the plain one;
- ``no hook``: the same app built with the tracing code bypassed altogether (the factory's
  ``tracing_from_environment`` replaced by one answering None): the pair's difference is what
  tracing off costs, next to the measurement's own spread;
- ``on, unsampled``: OTEL_TRACES_EXPORTER=console with OTEL_TRACES_SAMPLER=always_off: the
  spans are made and dropped (what a low sampling rate costs most requests);
- ``on``: every request's spans (server and model work) made and exported by the console
  exporter to /dev/null; the export runs on the SDK's batch thread, whose CPU is not counted
  here (it competes for the interpreter all the same: see the wall time).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import orjson
from bench_observability import classify_request, in_process_options

import service.api.app as app_module
from service.api import Settings, create_app
from service.api.dataplane import DataPlane
from service.api.machinery.tracing import TracingMiddleware
from training.datasets import load_digits_dataset

# A client's context: the server span is its child (when tracing is on).
TRACEPARENT = ((b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),)
VARIANTS = {
    "off": {},
    "no hook": None,
    "on, unsampled": {"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "always_off"},
    "on": {"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "always_on"},
}


def _build(model: Path, environment: dict[str, str] | None):
    """An app built with ``environment`` added to os.environ (None: the tracing code bypassed)."""
    saved = dict(os.environ)
    find = app_module.tracing_from_environment
    try:
        for name in [n for n in os.environ if n.startswith("OTEL_")]:
            del os.environ[name]
        if environment is None:
            app_module.tracing_from_environment = lambda: None
        else:
            os.environ.update(environment)
        return create_app(Settings(_env_file=None, model_dir=model, access_log=False))
    finally:
        app_module.tracing_from_environment = find
        os.environ.clear()
        os.environ.update(saved)


def _has_tracing(stack) -> bool:
    while stack is not None:
        if isinstance(stack, TracingMiddleware):
            return True
        stack = getattr(stack, "app", None)
    return False


async def _main(args: argparse.Namespace) -> None:
    digit = load_digits_dataset().X_test[:1].reshape(1, 8, 8).tolist()
    body = orjson.dumps({"instances": digit, "top_k": 3})
    # The console exporter writes to the standard output it finds when it is made.
    stdout, sys.stdout = sys.stdout, open(os.devnull, "w")  # noqa: SIM115
    try:
        apps = {name: _build(args.model, env) for name, env in VARIANTS.items()}
    finally:
        sys.stdout = stdout
    async with contextlib.AsyncExitStack() as stack:
        for app in apps.values():
            await stack.enter_async_context(app.router.lifespan_context(app))
        stacks = {name: app.build_middleware_stack() for name, app in apps.items()}
        for name in ("off", "no hook"):
            assert not _has_tracing(stacks[name]), name
            assert type(apps[name].state.dataplane) is DataPlane, name
        assert _has_tracing(stacks["on"])
        statuses: list[int] = []

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        requests = {name: classify_request(app, body, TRACEPARENT) for name, app in apps.items()}
        for name, asgi in stacks.items():  # warm-up: first requests learn where work runs
            scope, receive = requests[name]
            for _ in range(200):
                await asgi(scope(), receive, send)
        names = list(stacks)
        cpu: dict[str, list[float]] = {name: [] for name in names}
        wall: dict[str, list[float]] = {name: [] for name in names}
        for round_number in range(args.repeats):
            shift = round_number % len(names)
            for name in names[shift:] + names[:shift]:
                asgi = stacks[name]
                scope, receive = requests[name]
                statuses.clear()
                started, started_cpu = time.perf_counter(), time.thread_time()
                for _ in range(args.calls):
                    await asgi(scope(), receive, send)
                cpu[name].append((time.thread_time() - started_cpu) / args.calls * 1e6)
                wall[name].append((time.perf_counter() - started) / args.calls * 1e6)
                assert statuses == [200] * args.calls, set(statuses)
    print(
        f"one-digit POST /classify in process, {args.repeats} rounds x {args.calls} calls; "
        "us per call"
    )
    print(
        f"{'variant':<15} {'CPU median':>11} {'wall median':>12} "
        f"{'CPU - off, paired: median':>26} {'p10':>7} {'p90':>7}"
    )
    for name in names:
        paired = sorted(a - b for a, b in zip(cpu[name], cpu["off"], strict=True))
        print(
            f"{name:<15} {statistics.median(cpu[name]):11.2f} "
            f"{statistics.median(wall[name]):12.1f} "
            f"{statistics.median(paired):+26.2f} {_quantile(paired, 0.1):+7.2f} "
            f"{_quantile(paired, 0.9):+7.2f}"
        )


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_main(in_process_options(__doc__, 100, 200).parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
