"""Where a REST request's CPU goes outside the app's own code (issue 35 item 8): the same
``/classify`` request to the thinnest ASGI app and to the service's app, each on plain uvicorn
and on the service's limited protocols (its header and body timeouts, connection limits), and
to the service as deployed (``python -m service.api``, gRPC served beside it), in one run.

    .venv/bin/python benchmarks/bench_http_layers.py [--model models/digits] [--concurrency 8]
        [--seconds 1.5] [--repeats 5] [--access-log true|false]

Each server is its own process, driven in turn by benchmarks/loadgen.py with one 8 x 8 digit
a request (bench_http.py's request) over keep-alive connections, --repeats times; printed are
req/s and the server's CPU microseconds a request (medians over repeats). With the service's
app on plain uvicorn beside it on the limited protocols, the difference is the protocols'; the
deployed service adds the process's other threads (gRPC's poller) and its own start-up path.
``bench_asgi.py`` times the same app in process, without sockets.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from pathlib import Path

from bench_http import Cell, _classify_body, _load
from loadgen import http_request
from serving import HOST, SESSIONS, free_port, serving

MODES = ("thin, plain", "thin, limited", "service app, plain", "service app, limited", "deployed")


def _serve(mode: str) -> None:
    """Serve ``mode`` (``thin|app`` and ``plain|limited``) on HOST:PORT until killed."""
    import uvicorn

    app_kind, protocols = mode.split("-")
    host, port = os.environ["HOST"], int(os.environ["PORT"])
    if app_kind == "thin":
        from bare_endpoint import thin as app
    else:
        from service.api.app import create_app
        from service.api.settings import Settings

        app = create_app(Settings())
    options = dict(host=host, port=port, access_log=False, log_level="warning")
    if protocols == "plain":
        config = uvicorn.Config(app, **options)
    else:
        from service.api.machinery.http_protocols import limited_config, service_limits
        from service.api.settings import Settings

        limits = service_limits(Settings())
        config = limited_config(app, limits=limits, **options)
    uvicorn.Server(config).run()


def _command(mode: str) -> list[str]:
    if mode == "deployed":
        return [sys.executable, "-m", "service.api"]
    app_kind = "thin" if mode.startswith("thin") else "app"
    protocols = "plain" if mode.endswith("plain") else "limited"
    return [sys.executable, str(Path(__file__).resolve()), "--serve", f"{app_kind}-{protocols}"]


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        _serve(sys.argv[2])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path("models/digits"))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--access-log", choices=("true", "false"), default="true")
    args = parser.parse_args()
    if not (args.model / "manifest.json").exists():
        raise SystemExit(f"no model at {args.model}: make train first")
    env = {"MODEL_DIR": str(args.model.resolve()), "ACCESS_LOG": args.access_log}
    env["LOG_LEVEL"] = "warning"
    body = _classify_body()
    with contextlib.ExitStack() as stack:
        cells = {}
        for mode in MODES:
            # gRPC beside HTTP in the deployed service only (a port of its own)
            grpc = {"GRPC_PORT": str(free_port())} if mode == "deployed" else {}
            port = stack.enter_context(serving(_command(mode), {**env, **grpc}))
            request = http_request(HOST, port, "/classify", body, {})
            cells[mode] = Cell(port, request, SESSIONS[port])
        for cell in cells.values():  # untimed: connections, caches, JIT warm
            _load(cell, args.concurrency, 1.0, 0.0)
        runs: dict[str, list[tuple[float, float, int]]] = {mode: [] for mode in MODES}
        for _ in range(args.repeats):
            for mode, cell in cells.items():
                result = _load(cell, args.concurrency, args.seconds, 0.3)
                runs[mode].append((result.requests_per_second, result.cpu_us, result.n_errors))
    print(
        f"one 8x8 digit a request, c={args.concurrency}, access log {args.access_log}: "
        f"medians of {args.repeats} x {args.seconds:g} s"
    )
    for mode, results in runs.items():
        print(
            f"  {mode:24s} req/s {statistics.median(r for r, _, _ in results):8.0f}  "
            f"CPU us a request {statistics.median(c for _, c, _ in results):6.1f}  "
            f"errors {sum(e for *_, e in results)}"
        )


if __name__ == "__main__":
    main()
