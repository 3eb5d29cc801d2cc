"""What the request middleware (request id, metrics, access log) costs a one-digit /classify.

    .venv/bin/python benchmarks/bench_observability.py [--model models/digits] [--calls 2000]
        [--repeats 15]

In one process, without HTTP: the app built by ``create_app`` (its lifespan run, the model
loaded) is called as an ASGI app with the same one-digit POST /classify, through

- ``bare``: its middleware stack without
:class:`~service.api.machinery.observability.RequestObservability`;
- ``metrics``: with it, access log off (ACCESS_LOG=false);
- ``metrics+log``: with it and the access log on, JSON lines written to /dev/null.

Rounds of --calls calls each, the three variants interleaved, --repeats rounds; prints the median
microseconds per call and the overheads against ``bare`` of the same run. Then the same around an
app that answers at once (``empty`` against ``empty+metrics``): the middleware's own cost, without
the model's and the framework's time and their noise.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import orjson

from service.api import Settings, create_app
from service.api.machinery.observability import JsonFormatter, RequestIdFilter, RequestObservability
from training.datasets import load_digits_dataset


def classify_request(app, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()):
    """A POST /classify of ``body`` to ``app`` as ASGI: a new scope per call, and receive."""

    def scope() -> dict:
        return {
            "app": app,  # set by the app's __call__, which the stacks bypass
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/classify",
            "raw_path": b"/classify",
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"host", b"bench"),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
            "state": {},
        }

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    return scope, receive


async def _main(args: argparse.Namespace) -> None:
    digit = load_digits_dataset().X_test[:1].reshape(1, 8, 8).tolist()
    body = orjson.dumps({"instances": digit, "top_k": 3})
    app = create_app(Settings(_env_file=None, model_dir=args.model))
    handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 (lives as long as the run)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    access = logging.getLogger("service.api.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    access.propagate = False

    async with app.router.lifespan_context(app):
        observed = app.build_middleware_stack()
        assert isinstance(observed, RequestObservability)
        bare = observed.app
        routes, metrics = observed.routes, observed.metrics
        variants = {
            "bare": bare,
            "metrics": RequestObservability(bare, routes, metrics, access_log=False),
            "metrics+log": RequestObservability(bare, routes, metrics, access_log=True),
        }
        scope, receive = classify_request(app, body)
        statuses: list[int] = []

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        for stack in variants.values():  # warm-up: first requests learn where work runs
            for _ in range(200):
                await stack(scope(), receive, send)
        per_call: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, stack in variants.items():
                statuses.clear()
                started = time.perf_counter()
                for _ in range(args.calls):
                    await stack(scope(), receive, send)
                per_call[name].append((time.perf_counter() - started) / args.calls * 1e6)
                assert statuses == [200] * args.calls, set(statuses)
        _report(
            f"one-digit POST /classify in process, {args.repeats} x {args.calls} calls", per_call
        )

        async def empty(scope, receive, send) -> None:
            scope["route"] = app.router.routes[-1]
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        variants = {
            "empty": empty,
            "empty+metrics": RequestObservability(empty, routes, metrics, access_log=False),
            "empty+log": RequestObservability(empty, routes, metrics, access_log=True),
        }
        per_call = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, stack in variants.items():
                started = time.perf_counter()
                for _ in range(args.calls):
                    await stack(scope(), receive, send)
                per_call[name].append((time.perf_counter() - started) / args.calls * 1e6)
        _report("the middleware alone, around an app that answers at once", per_call)


def _report(title: str, per_call: dict[str, list[float]]) -> None:
    base = statistics.median(next(iter(per_call.values())))
    print(title)
    print(f"{'variant':<14} {'median us/call':>15} {'overhead us':>12} {'ratio':>7}")
    for name, values in per_call.items():
        median = statistics.median(values)
        print(f"{name:<14} {median:15.1f} {median - base:12.1f} {median / base:7.3f}")


def in_process_options(description: str, calls: int, repeats: int) -> argparse.ArgumentParser:
    """The options of an in-process benchmark of a one-digit /classify: the model, the calls
    of a round and the rounds."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path("models/digits"))
    parser.add_argument("--calls", type=int, default=calls)
    parser.add_argument("--repeats", type=int, default=repeats)
    return parser


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_main(in_process_options(__doc__, 2000, 15).parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
