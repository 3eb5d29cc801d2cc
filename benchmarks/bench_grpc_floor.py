"""What grpcio's two server shapes cost a call before any of ours: a trivial ModelInfer (a fixed
answer, no model, no interceptor) on grpcio's asyncio server (on uvloop, the loop uvicorn runs
the service on where it is installed) and on its thread-pool server (with 2, 4 and 8 threads),
in the same run. ``aio-stream`` is the asyncio server with the service's call shape: an
interceptor that answers the unary method as stream-unary, the handler reading the message
itself (so that the service's call gate can time the message out, service/api/protocol/grpc.py).

    .venv/bin/python benchmarks/bench_grpc_floor.py [--concurrency 8,64] [--seconds 1.5]
        [--repeats 4]

Each server is its own process (``python benchmarks/bench_grpc_floor.py --serve aio|threads:N
PORT``); benchmarks/loadgen.py drives each in turn with the digit message bench_http.py sends,
--repeats times, and the server's CPU microseconds a call (its process's CPU time over the cell
by the calls answered) are printed with req/s, medians over repeats. Compare them with REST
/classify's whole request in bench_http.py.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from concurrent import futures

import grpc
import numpy as np
from bench_http import GRPC_METHOD
from loadgen import GrpcCall, run_load
from serving import HOST, REPO, free_port, session_cpu_seconds

from service.api.protocol import inference_pb2 as pb
from service.api.protocol import inference_pb2_grpc as pb_grpc
from training.data.datasets import load_digits_dataset

SHAPES = ("aio", "aio-stream", "threads:2", "threads:4", "threads:8")


def _answer() -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name="digits", model_version="0" * 64)
    response.outputs.add(name="label", datatype="BYTES", shape=[1])
    response.raw_output_contents.append(b"\x01\x00\x00\x007")
    return response


class AsStreamUnary(grpc.aio.ServerInterceptor):
    """Each unary method answered as stream-unary, its handler awaiting the one message, as the
    service's call gate does (without the gate's key check, slot and timeout)."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method not in self.handlers:
            handler = await continuation(handler_call_details)
            unary = handler.unary_unary

            async def handle(requests, context):
                return await unary(await anext(requests), context)

            self.handlers[method] = grpc.stream_unary_rpc_method_handler(
                handle,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return self.handlers[method]


def serve(shape: str, port: int) -> None:
    """Serve the trivial ModelInfer in ``shape`` on ``port`` until killed."""
    answer = _answer()
    if shape.startswith("aio"):
        import uvloop

        class Trivial(pb_grpc.GRPCInferenceServiceServicer):
            async def ModelInfer(self, request, context):
                return answer

        async def main() -> None:
            interceptors = [AsStreamUnary()] if shape == "aio-stream" else []
            server = grpc.aio.server(interceptors=interceptors)
            pb_grpc.add_GRPCInferenceServiceServicer_to_server(Trivial(), server)
            server.add_insecure_port(f"{HOST}:{port}")
            await server.start()
            print("ready", flush=True)
            await server.wait_for_termination()

        uvloop.run(main())
        return

    class Threaded(pb_grpc.GRPCInferenceServiceServicer):
        def ModelInfer(self, request, context):
            return answer

    threads = int(shape.split(":")[1])
    server = grpc.server(futures.ThreadPoolExecutor(threads))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Threaded(), server)
    server.add_insecure_port(f"{HOST}:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", default="8,64")
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    call = GrpcCall(GRPC_METHOD, ())
    # The digit bench_http.py sends, as tritonclient.grpc sends it: FP64 in raw_input_contents.
    request = pb.ModelInferRequest(model_name="digits")
    request.inputs.add(name="input", datatype="FP64", shape=[1, 8, 8])
    digit = load_digits_dataset().X_test[0]
    request.raw_input_contents.append(np.asarray(digit, dtype="<f8").tobytes())
    message = request.SerializeToString()
    servers = {}
    try:
        for shape in SHAPES:
            port = free_port()
            process = subprocess.Popen(
                [sys.executable, __file__, "--serve", shape, str(port)],
                stdout=subprocess.PIPE,
                text=True,
                cwd=REPO,
                start_new_session=True,
            )
            process.stdout.readline()
            servers[shape] = (process, port)
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            cells: dict[str, list[tuple[float, float]]] = {shape: [] for shape in servers}
            for _ in range(args.repeats):
                for shape, (process, port) in servers.items():
                    cpu = session_cpu_seconds(process.pid)
                    result = run_load(HOST, port, message, concurrency, args.seconds, 0.3,
                                      grpc=call)  # fmt: skip
                    served = max(result.requests_per_second * (args.seconds + 0.3), 1)
                    cpu_us = 1e6 * (session_cpu_seconds(process.pid) - cpu) / served
                    cells[shape].append((result.requests_per_second, cpu_us))
            for shape, runs in cells.items():
                print(f"c={concurrency:<3} {shape:<10} req/s "
                      f"{statistics.median(r for r, _ in runs):7.0f}  CPU us a call "
                      f"{statistics.median(c for _, c in runs):5.0f}")  # fmt: skip
    finally:
        for process, _ in servers.values():
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
