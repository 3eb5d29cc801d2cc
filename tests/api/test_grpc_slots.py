"""gRPC against clients that hold its calls open (issue 36, defect 2): raw HTTP/2 streams that
send their headers and a message prefix declaring 1 MiB, then a byte now and then, beside
grpcio's client making ordinary calls. A real server process; the attacker's frames are written
by hand (:mod:`benchmarks.http2`)."""

from __future__ import annotations

import contextlib
import threading
import time

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from benchmarks.http2 import SETTINGS_MAX_CONCURRENT_STREAMS, RawHttp2Connection
from benchmarks.serving import free_port
from tests.api.conftest import key_file, server_process

pytestmark = pytest.mark.slow

READER = "reader-0a1b2c3d4e5f6a7b"
SLOTS = 8  # MAX_CONCURRENT_REQUESTS
INFER = "/inference.GRPCInferenceService/ModelInfer"
MESSAGE_TIMEOUT_S = 3  # BODY_TIMEOUT_S
WAIT_S = 30


@pytest.fixture(scope="module")
def served(digits_model_dir, tmp_path_factory):
    port = free_port()
    keys = key_file(tmp_path_factory.mktemp("grpc-slots"), f"{READER} read")
    with server_process(
        digits_model_dir,
        GRPC_PORT=str(port),
        API_KEYS_FILE=str(keys),
        MAX_CONCURRENT_REQUESTS=str(SLOTS),
        BODY_TIMEOUT_S=str(MESSAGE_TIMEOUT_S),
        GRPC_MAX_STREAMS="16",
    ) as server:
        yield server, port


@pytest.fixture
def stub(served):
    with grpc.insecure_channel(f"127.0.0.1:{served[1]}") as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _digit() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="digits")
    request.inputs.add(name="input", datatype="FP64", shape=[1, 8, 8])
    request.raw_input_contents.append(np.zeros(64).astype("<f8").tobytes())
    return request


KEY = (("x-api-key", READER),)


@contextlib.contextmanager
def attack(port: int, key: str, connections: int = 2, streams: int = 7):
    """``connections`` x ``streams`` calls of ModelInfer with ``key``, each declaring 1 MiB and
    sending one byte at once and one more every 0.5 s, until the block ends; yields the
    connections and their streams."""
    opened = [RawHttp2Connection("127.0.0.1", port) for _ in range(connections)]
    calls = [
        (connection, connection.start_call(INFER, [("x-api-key", key)], 1 << 20, b"\x00"))
        for connection in opened
        for _ in range(streams)
    ]
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.5):
            for connection, stream in calls:
                connection.trickle(stream)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        time.sleep(0.5)  # every call under way
        yield calls
    finally:
        stop.set()
        thread.join(5)
        for connection in opened:
            connection.close()


def test_calls_without_a_valid_key_never_take_a_slot(served, stub):
    """Issue 36, defect 2: 130 streams trickling 1 MiB messages with an invalid key took all
    128 slots: every ModelInfer, and ServerReady, got RESOURCE_EXHAUSTED until they closed."""
    _, port = served
    started = time.monotonic()
    with attack(port, "not-a-key", connections=2, streams=2 * SLOTS) as calls:
        for _ in range(3):
            assert stub.ModelInfer(_digit(), metadata=KEY, timeout=WAIT_S).model_name == "digits"
            assert stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=WAIT_S).ready
        # Each was refused on its headers, its message never waited for.
        time.sleep(0.5)
        ended = [connection.ended.get(stream) for connection, stream in calls]
        assert None not in ended
        assert max(ended) - started < 5


def test_two_key_headers_over_grpc_are_refused(stub):
    """Issue 36, defect 10, over gRPC: of two x-api-key entries the last won."""
    for metadata in ([("x-api-key", "bad"), ("x-api-key", READER)],
                     [("x-api-key", READER), ("authorization", f"Bearer {READER}")]):  # fmt: skip
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(_digit(), metadata=metadata, timeout=WAIT_S)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert "send one key" in refused.value.details()


def test_health_is_answered_and_slots_come_back_at_the_message_deadline(served, stub):
    """Issue 36, defect 2: with every slot held by calls trickling their messages (here with a
    valid key), health calls are still answered, and each slot comes back BODY_TIMEOUT_S after
    its call began; before, the slots were held as long as the trickle went on."""
    _, port = served
    with attack(port, READER, connections=2, streams=SLOTS) as calls:
        began = time.monotonic()
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=WAIT_S).live
        assert stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=WAIT_S).ready
        ready = stub.ModelReady(service_pb2.ModelReadyRequest(name="digits"), metadata=KEY,
                                timeout=WAIT_S)  # fmt: skip
        assert ready.ready
        with pytest.raises(grpc.RpcError) as busy:
            stub.ModelInfer(_digit(), metadata=KEY, timeout=WAIT_S)
        assert busy.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "MAX_CONCURRENT_REQUESTS" in busy.value.details()
        # The trickle goes on; the server ends each call at its message deadline.
        deadline = began + MESSAGE_TIMEOUT_S + 10
        while len([c for c, s in calls if s in c.ended]) < len(calls):
            assert time.monotonic() < deadline, "calls held past BODY_TIMEOUT_S"
            time.sleep(0.2)
        assert stub.ModelInfer(_digit(), metadata=KEY, timeout=WAIT_S).model_name == "digits"


def test_streams_per_connection_are_capped(served):
    """Issue 36, defect 2: no cap on the streams of one connection."""
    _, port = served
    connection = RawHttp2Connection("127.0.0.1", port)
    try:
        assert connection.settings.get(SETTINGS_MAX_CONCURRENT_STREAMS) == 16
    finally:
        connection.close()
