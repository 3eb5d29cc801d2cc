"""gRPC messages take their bytes from the process's one budget of request bytes
(MAX_BUFFERED_BYTES), the budget HTTP bodies take theirs from: through a real server process,
with a raw socket holding an HTTP body half sent and grpcio's client sending messages."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from benchmarks.serving import free_port
from tests.api.conftest import server_process

pytestmark = pytest.mark.slow

MAX_REQUEST = 1 << 20
BUDGET = 2 * MAX_REQUEST  # the least the settings allow
IMAGE_BYTES = 64 * 8  # one digit as FP64


def _images_request(n: int) -> service_pb2.ModelInferRequest:
    """``n`` digits as raw FP64 contents: a message of about ``n`` x 512 bytes."""
    request = service_pb2.ModelInferRequest(model_name="digits")
    request.inputs.add(name="input", datatype="FP64", shape=[n, 8, 8, 1])
    values = np.random.default_rng(n).uniform(0, 16, size=(n, 64))
    request.raw_input_contents.append(values.astype("<f8").tobytes())
    return request


def _code(call) -> tuple[grpc.StatusCode, str]:
    try:
        call.result()
    except grpc.RpcError as error:
        return error.code(), error.details()
    return grpc.StatusCode.OK, ""


def _refused_for_memory(code: grpc.StatusCode, details: str) -> bool:
    return code is grpc.StatusCode.UNAVAILABLE and "MAX_BUFFERED_BYTES" in details


def test_grpc_messages_share_the_http_budget_and_give_it_back(digits_model_dir):
    grpc_port = free_port()
    with (
        server_process(
            digits_model_dir,
            GRPC_PORT=str(grpc_port),
            MAX_REQUEST_BYTES=str(MAX_REQUEST),
            MAX_BUFFERED_BYTES=str(BUDGET),
            MAX_BATCH_SIZE="2000",
        ) as server,
        grpc.insecure_channel(
            f"127.0.0.1:{grpc_port}", options=[("grpc.max_send_message_length", -1)]
        ) as channel,
        httpx.Client(base_url=server.url, timeout=30) as http,
    ):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        small = _images_request(1)
        large = _images_request(600)  # 300 KiB: counted twice, about 0.5 MiB of the budget
        assert stub.ModelInfer(large).model_name == "digits"

        # An HTTP body sent up to 900 KB of its 1 MB and left there holds most of the budget
        # (twice what has arrived): a large gRPC message finds no room, small calls of both
        # protocols are served.
        host, port = server.url.removeprefix("http://").split(":")
        slow = socket.create_connection((host, int(port)))
        try:
            slow.sendall(
                b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
                + b" "
                * 900_000
            )
            time.sleep(0.5)
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(large, timeout=10)
            assert _refused_for_memory(refused.value.code(), refused.value.details()), (
                refused.value.code(),
                refused.value.details(),
            )
            assert stub.ModelInfer(small, timeout=10).model_name == "digits"
            assert http.get("/readyz").status_code == 200
            answer = http.post(
                "/v2/models/digits/infer",
                json={
                    "inputs": [
                        {
                            "name": "input",
                            "shape": [1, 8, 8],
                            "datatype": "FP64",
                            "data": [0.0] * 64,
                        }
                    ]
                },
            )
            assert answer.status_code == 200, answer.text
        finally:
            slow.close()

        # Concurrent large messages: those beyond the budget are refused (never a hang, never
        # another code), the others are answered.
        with ThreadPoolExecutor(12) as pool:
            calls = [pool.submit(stub.ModelInfer, large, timeout=20) for _ in range(12)]
            outcomes = [_code(call) for call in calls]
        assert all(
            code is grpc.StatusCode.OK or _refused_for_memory(code, details)
            for code, details in outcomes
        ), outcomes
        assert any(code is not grpc.StatusCode.OK for code, _ in outcomes), outcomes
        assert any(code is grpc.StatusCode.OK for code, _ in outcomes), outcomes

        # Everything was given back: a message that needs nearly the whole budget fits.
        whole = _images_request(MAX_REQUEST // IMAGE_BYTES - 100)
        assert 2 * whole.ByteSize() > BUDGET - 200_000
        deadline = time.monotonic() + 5
        code, details = _code(stub.ModelInfer.future(whole, timeout=10))
        while code is not grpc.StatusCode.OK and time.monotonic() < deadline:
            # The HTTP connection's close may still be on its way to the server.
            assert _refused_for_memory(code, details), (code, details)
            time.sleep(0.2)
            code, details = _code(stub.ModelInfer.future(whole, timeout=10))
        assert code is grpc.StatusCode.OK, ("the budget was not given back", details)
