"""What one ``/classify`` request costs inside the app, without sockets (issue 35 item 8).

    .venv/bin/python benchmarks/bench_asgi.py [--model models/digits] [--calls 2000]
        [--repeats 7]

The app is built as the service builds it (``create_app`` on ``--model``, its lifespan run,
metrics on, the access log as configured by the environment) and called as uvicorn calls it,
``app(scope, receive, send)``, with one 8 x 8 digit a request, --calls times per repeat. It is
timed from the outside in: the whole app, then each layer of its middleware stack down to the
hot routes (so each line's difference with the next is that layer's own cost), beside
bare_endpoint.py's thinnest ASGI app (``thin``: read the body, parse the JSON, answer fixed
bytes) on the same request. Then the steps a 28 x 28 image's JSON body (15 KB) takes before the
model sees it: the value count of the memory limit, pydantic's validation of the body, and the
array conversion of the instances.

Prints microseconds a call, medians over --repeats. What uvicorn's protocol and the sockets
add is bench_http.py's to measure; the difference between the two is theirs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import timeit
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bare_endpoint import thin

from service.api.app import create_app
from service.api.machinery.limits import json_values
from service.api.rest.schemas.classify import ClassifyRequest
from service.api.settings import Settings
from service.model.inputs.spec import InputSpec

DIGIT = [[float((row * 8 + column) % 16) for column in range(8)] for row in range(8)]
BODY = orjson.dumps({"instances": [DIGIT], "top_k": 3})


def _scope(app) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "method": "POST",
        "root_path": "",
        "path": "/classify",
        "raw_path": b"/classify",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(BODY)).encode()),
        ],
        "state": {},
        "extensions": {},
        "app": app,  # what Starlette sets before its middleware stack runs
    }


async def _microseconds(layer, app, calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the microseconds one call of ``layer`` takes."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            await layer(_scope(app), receive, send)
        times.append((time.perf_counter() - started) / calls * 1e6)
        refused = [m for m in sent if m["type"] == "http.response.start" and m["status"] != 200]
        if refused:
            raise SystemExit(f"{type(layer).__name__} answered {refused[0]['status']}")
        sent.clear()
    return statistics.median(times)


def _layers(app) -> list:
    """The app's middleware stack, outermost first, down to the hot routes."""
    layers, layer = [], app.middleware_stack
    while layer is not None:
        layers.append(layer)
        if type(layer).__name__ == "HotRoutes":
            break
        layer = getattr(layer, "app", None)
    return layers


async def _app_part(args) -> None:
    app = create_app(Settings(model_dir=args.model))
    async with app.router.lifespan_context(app):
        await _microseconds(app, app, 100, 1)  # builds the stack, warms the model up
        print(f"one 8x8 digit a request, {args.calls} calls x {args.repeats} repeats (median)")
        targets = [("thin ASGI app", thin), ("the app (FastAPI)", app)]
        targets += [(f"from {type(layer).__name__}", layer) for layer in _layers(app)]
        for name, target in targets:
            took = await _microseconds(target, app, args.calls, args.repeats)
            print(f"  {name:40s} {took:8.1f} us")


def _decode_part(repeats: int) -> None:
    image = np.random.default_rng(0).random((28, 28)).tolist()
    raw = orjson.dumps({"instances": [image], "top_k": 3})
    parsed = ClassifyRequest.model_validate_json(raw)
    spec = InputSpec("grid", (28, 28, 1))
    steps = {
        "value count (json_values)": lambda: json_values(raw, 10**9),
        "pydantic validation": lambda: ClassifyRequest.model_validate_json(raw),
        "array conversion (as_batch)": lambda: spec.as_batch(parsed.instances),
    }
    print(f"one 28x28 image's JSON body ({len(raw):,} bytes), before the model")
    for name, step in steps.items():
        runs = [timeit.timeit(step, number=500) / 500 * 1e6 for _ in range(repeats)]
        print(f"  {name:40s} {statistics.median(runs):8.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/digits"))
    parser.add_argument("--calls", type=int, default=2000, help="calls a repeat")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if not (args.model / "manifest.json").exists():
        raise SystemExit(f"no model at {args.model}: make train first")
    asyncio.run(_app_part(args))
    _decode_part(args.repeats)


if __name__ == "__main__":
    main()
