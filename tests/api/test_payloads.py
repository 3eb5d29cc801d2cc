"""Payload logging through a real server process: sampled requests and answers as CloudEvents
(read back by the CloudEvents SDK), REST and gRPC, errors included, the size bound, the share
sampled, and a destination that cannot keep up: records dropped and counted, requests never
held."""

from __future__ import annotations

import base64
import os
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from cloudevents.core.formats.json import JSONFormat
from prometheus_client.parser import text_string_to_metric_families
from scipy.stats import binom

from benchmarks.serving import free_port
from tests.api.conftest import server_process

pytestmark = pytest.mark.slow

REQUEST, RESPONSE = "org.besvm.inference.request", "org.besvm.inference.response"


def _events(path) -> list:
    reader = JSONFormat()
    return [reader.read(None, line) for line in path.read_text().splitlines()]


def _wait_for_lines(path, count: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        time.sleep(0.05)
    pytest.fail(f"{path} has fewer than {count} lines")


def _dropped(url: str) -> float:
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name == "besvm_payload_records_dropped_total":
                return sample.value
    return 0.0


def test_every_exchange_is_recorded_as_a_pair_of_cloudevents(digits_model_dir, digits, tmp_path):
    path = tmp_path / "payloads-{pid}.jsonl"
    port = free_port()
    image = digits.X_test[:2].reshape(2, 8, 8)
    with server_process(
        digits_model_dir,
        PAYLOAD_LOG_RATE="1",
        PAYLOAD_LOG=str(path),
        PAYLOAD_LOG_MAX_BYTES="2000",
        GRPC_PORT=str(port),
    ) as server:
        url = server.url
        written = tmp_path / f"payloads-{server.process.pid}.jsonl"
        body = {"instances": image.tolist(), "top_k": 2}
        classified = httpx.post(f"{url}/classify", json=body, headers={"x-request-id": "one"})
        invalid = httpx.post(f"{url}/classify", json={"instances": [[1, 2]]})
        assert invalid.status_code == 422
        large = httpx.post(f"{url}/classify", json={"instances": [image[0].tolist()] * 20})
        tensor = image.reshape(2, 8, 8, 1)
        with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
            tensor_input = grpcclient.InferInput("input", list(tensor.shape), "FP64")
            tensor_input.set_data_from_numpy(tensor)
            result = client.infer("digits", [tensor_input], request_id="two")
            with pytest.raises(Exception, match="no model named"):
                client.infer("nope", [tensor_input])
        assert httpx.get(f"{url}/readyz").status_code == 200  # not an inference: not recorded
        _wait_for_lines(written, 10)
        server.stop()
    events = _events(written)
    assert len(events) == 10
    assert len({e.get_id() for e in events}) == 10
    pairs = [events[i : i + 2] for i in range(0, 10, 2)]
    for request, response in pairs:
        assert (request.get_type(), response.get_type()) == (REQUEST, RESPONSE)
        assert request.get_extension("requestid") == response.get_extension("requestid")
        assert request.get_source() == f"/besvm/{os.uname().nodename}/{server.process.pid}"

    request, response = pairs[0]
    assert request.get_extension("requestid") == "one"
    assert request.get_extension("endpoint") == "/classify"
    assert request.get_data() == body
    assert response.get_data() == classified.json()
    assert response.get_extension("modelversion") == classified.headers["x-model-version"]
    assert response.get_extension("model") == "digits"
    assert response.get_extension("status") == 200

    request, response = pairs[1]
    assert response.get_extension("status") == 422
    assert response.get_data() == invalid.json()

    request, response = pairs[2]  # over PAYLOAD_LOG_MAX_BYTES: recorded without its data
    assert large.status_code == 200
    assert request.get_extension("truncated") is True
    assert request.get_data() is None
    assert request.get_extension("datasize") > 2000

    request, response = pairs[3]
    assert request.get_extension("endpoint") == "/inference.GRPCInferenceService/ModelInfer"
    assert request.get_extension("requestid") != "two"  # the protocol's id is the message's
    assert request.get_data()["id"] == "two"
    assert request.get_data()["modelName"] == "digits"
    sent = np.frombuffer(tensor.astype("<f8").tobytes(), "<f8")
    raw = base64.b64decode(request.get_data()["rawInputContents"][0])
    np.testing.assert_array_equal(np.frombuffer(raw, "<f8"), sent)
    assert response.get_extension("status") == "OK"
    assert response.get_extension("modelversion") == result.get_response().model_version
    assert response.get_data()["modelVersion"] == result.get_response().model_version

    request, response = pairs[4]
    assert response.get_extension("status") == "NOT_FOUND"
    assert "no model named" in response.get_data()["error"]


def test_the_share_sampled_and_a_destination_that_cannot_keep_up(digits_model_dir, tmp_path):
    """PAYLOAD_LOG_RATE=0.25 records a quarter of the requests (binomial bounds); then a
    destination that blocks (a FIFO nobody reads) drops the records and counts them, and the
    requests go on being answered at once."""
    path = tmp_path / "sampled.jsonl"
    n = 400
    digit = {"instances": [[[0.0] * 8] * 8]}
    with server_process(digits_model_dir, PAYLOAD_LOG_RATE="0.25", PAYLOAD_LOG=str(path)) as server:
        with httpx.Client(base_url=server.url) as http:
            for _ in range(n):
                assert http.post("/classify", json=digit).status_code == 200
        time.sleep(0.5)
        server.stop()
    sampled = len(path.read_text().splitlines()) // 2
    low, high = binom.ppf([5e-7, 1 - 5e-7], n, 0.25)
    assert low <= sampled <= high, (sampled, low, high)

    fifo = tmp_path / "blocked"
    os.mkfifo(fifo)
    opened = threading.Event()

    def hold_open() -> None:  # a reader that opens the FIFO and never reads
        with open(fifo, "rb"):
            opened.set()
            stopped.wait(120)

    stopped = threading.Event()
    holder = threading.Thread(target=hold_open)
    holder.start()
    try:
        with server_process(
            digits_model_dir, PAYLOAD_LOG_RATE="1", PAYLOAD_LOG=str(fifo), PAYLOAD_LOG_QUEUE="10"
        ) as server:
            assert opened.wait(30)
            with httpx.Client(base_url=server.url, timeout=10) as http:
                started = time.monotonic()
                # Larger than a pipe's buffer (64 KiB) in all: the writer blocks, the queue fills.
                big = {"instances": [[[float(i % 17)] * 8] * 8 for i in range(50)]}
                for _ in range(200):
                    assert http.post("/classify", json=big).status_code == 200
                elapsed = time.monotonic() - started
            dropped = _dropped(server.url)
            # 400 records made, at most the queue's 10 and what the pipe took got through.
            assert dropped >= 400 - 10 - 64 * 1024 // 2000
            assert elapsed < 60  # answered, not held: a held request would wait for ever
            stopped.set()
    finally:
        stopped.set()
        holder.join(timeout=30)
