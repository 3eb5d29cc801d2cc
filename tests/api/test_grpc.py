"""The Open Inference Protocol over gRPC through a real server process, with tritonclient's gRPC
client (and its generated stub, for typed contents): every call, scores equal to the REST
answer and to the model library's, the error codes, keys, request ids, metrics, deadlines, the
message size limit, several workers on one port, and the drain on SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from benchmarks.serving import free_port
from service.api.protocol import inference_pb2, inference_pb2_grpc
from service.model.artifact import manifest_digest
from tests.api.conftest import server_process, worker_pids

pytestmark = pytest.mark.slow

READER, ADMIN = "grpc-reader-0a1b2c3d4e", "grpc-admin-5f6a7b8c9d"
FULL_BATCH = 1000


@pytest.fixture(scope="module")
def repository(protocol_repository):
    return protocol_repository


@pytest.fixture(scope="module")
def served(repository, tmp_path_factory):
    keys = tmp_path_factory.mktemp("grpc-keys") / "keys.txt"
    keys.write_text(f"{READER} read\n{ADMIN} admin\n")
    port = free_port()
    with server_process(
        MODEL_REPOSITORY=str(repository),
        DEFAULT_MODEL="digits",
        GRPC_PORT=str(port),
        API_KEYS_FILE=str(keys),
        MAX_BATCH_SIZE=str(FULL_BATCH),
    ) as server:
        yield server, port


@pytest.fixture
def client(served):
    _, port = served
    with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
        yield client


@pytest.fixture
def stub(served):
    _, port = served
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


READ = {"authorization": f"Bearer {READER}"}
ADMIN_HEADERS = {"x-api-key": ADMIN}


def _metadata(headers: dict[str, str]) -> list[tuple[str, str]]:
    return list(headers.items())


def _images(digits, n: int, dtype) -> np.ndarray:
    return digits.X_test[:n].reshape(n, 8, 8, 1).astype(dtype)


def _rest_scores(url: str, images: np.ndarray, datatype: str) -> np.ndarray:
    body = {
        "inputs": [
            {
                "name": "input",
                "shape": list(images.shape),
                "datatype": datatype,
                "data": images.ravel().tolist(),
            }
        ]
    }
    answer = httpx.post(f"{url}/v2/models/digits/infer", json=body, headers=READ, timeout=30)
    assert answer.status_code == 200, answer.text
    scores = next(o for o in answer.json()["outputs"] if o["name"] == "scores")
    return np.asarray(scores["data"]).reshape(scores["shape"])


# -- health and metadata -----------------------------------------------------------------------


def test_health_needs_no_key_and_metadata_does(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    with pytest.raises(InferenceServerException) as refused:
        client.get_server_metadata()
    assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
    assert "X-API-Key" in refused.value.message()
    metadata = client.get_server_metadata(headers=READ)
    assert metadata.name == "besvm"
    assert list(metadata.extensions) == ["model_repository"]


def test_model_metadata_and_readiness(served, client, repository, digits_predictor):
    version = manifest_digest(repository / "digits")
    metadata = client.get_model_metadata("digits", headers=READ)
    assert metadata.name == "digits"
    assert list(metadata.versions) == [version]
    assert metadata.platform == "besvm"
    (tensor,) = metadata.inputs
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == ("input", "FP64", [-1, 8, 8, 1])
    outputs = {output.name: output for output in metadata.outputs}
    assert list(outputs) == ["label", "scores", "top_k_labels", "top_k_scores", "explanation"]
    assert list(outputs["scores"].shape) == [-1, 10]
    # A client that knows the addition reads the classes (tritonclient's messages skip it).
    with grpc.insecure_channel(f"127.0.0.1:{served[1]}") as channel:
        ours = inference_pb2_grpc.GRPCInferenceServiceStub(channel).ModelMetadata(
            inference_pb2.ModelMetadataRequest(name="digits"), metadata=_metadata(READ)
        )
    scores = next(output for output in ours.outputs if output.name == "scores")
    assert json.loads(scores.parameters["classes"].string_param) == list(digits_predictor.classes)
    assert client.is_model_ready("digits", headers=READ)
    assert client.is_model_ready("digits", model_version=version, headers=READ)
    assert client.is_model_ready("topics", headers=READ)
    assert not client.is_model_ready("digits", model_version="0" * 64, headers=READ)
    assert not client.is_model_ready("notes", headers=READ)  # failed to load
    assert not client.is_model_ready("nothing", headers=READ)


# -- inference ---------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_raw_inputs_score_as_rest_and_the_library(
    served, client, repository, digits, digits_predictor, datatype
):
    server, _ = served
    images = _images(digits, 12, np.float32 if datatype == "FP32" else np.float64)
    tensor = grpcclient.InferInput("input", list(images.shape), datatype)
    tensor.set_data_from_numpy(images)  # raw_input_contents
    outputs = [grpcclient.InferRequestedOutput(name) for name in ("scores", "label")]
    result = client.infer("digits", [tensor], outputs=outputs, request_id="req-9", headers=READ)
    scores = result.as_numpy("scores")
    assert scores.dtype == np.float64
    np.testing.assert_array_equal(scores, _rest_scores(server.url, images, datatype))
    expected = digits_predictor.decision_function(images.reshape(12, -1).astype(np.float64))
    np.testing.assert_allclose(scores, expected, rtol=1e-12, atol=1e-12)
    labels = [label.decode() for label in result.as_numpy("label")]
    assert labels == [digits_predictor.classes[i] for i in expected.argmax(axis=1)]
    response = result.get_response()
    assert response.id == "req-9"
    assert response.model_name == "digits"
    assert response.model_version == manifest_digest(repository / "digits")
    assert [output.name for output in response.outputs] == ["scores", "label"]


@pytest.mark.parametrize(
    ("datatype", "field", "dtype"),
    [("FP32", "fp32_contents", np.float32), ("FP64", "fp64_contents", np.float64)],
)
def test_typed_contents_score_as_raw_ones(served, stub, digits, datatype, field, dtype):
    server, _ = served
    images = _images(digits, 5, dtype)
    request = service_pb2.ModelInferRequest(model_name="digits", id="typed")
    tensor = request.inputs.add(name="input", datatype=datatype, shape=list(images.shape))
    getattr(tensor.contents, field).extend(images.ravel().tolist())
    request.parameters["top_k"].int64_param = 2
    response, call = stub.ModelInfer.with_call(
        request, metadata=[*_metadata(READ), ("x-request-id", "trace-42")]
    )
    assert ("x-request-id", "trace-42") in call.trailing_metadata()
    assert dict(call.trailing_metadata())["x-model-version"] == response.model_version
    outputs = {output.name: i for i, output in enumerate(response.outputs)}
    assert list(outputs) == ["label", "scores", "top_k_labels", "top_k_scores"]
    scores = np.frombuffer(response.raw_output_contents[outputs["scores"]], "<f8").reshape(5, 10)
    np.testing.assert_array_equal(scores, _rest_scores(server.url, images, datatype))
    best = np.frombuffer(response.raw_output_contents[outputs["top_k_scores"]], "<f8")
    np.testing.assert_array_equal(best.reshape(5, 2), -np.sort(-scores, axis=1)[:, :2])


def test_texts_as_raw_and_typed_bytes(client, stub, text_fit):
    texts = np.array([b"court judge jury", b"rocket orbit"], dtype=np.object_)
    tensor = grpcclient.InferInput("text", [2], "BYTES")
    tensor.set_data_from_numpy(texts)
    outputs = [grpcclient.InferRequestedOutput(name) for name in ("label", "scores")]
    result = client.infer("topics", [tensor], outputs=outputs, headers=READ)
    assert [label.decode() for label in result.as_numpy("label")] == ["law", "space"]
    request = service_pb2.ModelInferRequest(model_name="topics")
    typed = request.inputs.add(name="text", datatype="BYTES", shape=[2])
    typed.contents.bytes_contents.extend(list(texts))
    response = stub.ModelInfer(request, metadata=_metadata(READ))
    labels = response.raw_output_contents[0]
    assert labels == b"".join(len(t).to_bytes(4, "little") + t for t in (b"law", b"space"))
    scores = np.frombuffer(response.raw_output_contents[1], "<f8").reshape(2, -1)
    np.testing.assert_array_equal(scores, result.as_numpy("scores"))
    bad = service_pb2.ModelInferRequest(model_name="topics")
    bad.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"\xff")
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(bad, metadata=_metadata(READ))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "not valid UTF-8" in refused.value.details()


def _digit_request(**changes) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=changes.pop("model_name", "digits"))
    tensor = request.inputs.add(
        name=changes.pop("name", "input"),
        datatype=changes.pop("datatype", "FP64"),
        shape=changes.pop("shape", [1, 8, 8, 1]),
    )
    tensor.contents.fp64_contents.extend(changes.pop("values", [0.0] * 64))
    for name, value in changes.pop("parameters", {}).items():
        request.parameters[name].int64_param = value
    for output in changes.pop("outputs", []):
        request.outputs.add(name=output)
    assert not changes
    return request


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (_digit_request(model_name="nothing"), "NOT_FOUND", "no model named 'nothing'"),
        (_digit_request(model_name="notes"), "UNAVAILABLE", "notes"),
        (_digit_request(name="image"), "INVALID_ARGUMENT", "unknown input 'image'"),
        (_digit_request(shape=[1, 8, 7]), "INVALID_ARGUMENT", "has shape [1, 8, 7]"),
        (_digit_request(shape=[2, 8, 8]), "INVALID_ARGUMENT", "has 64 values"),
        (_digit_request(shape=[1, -8, -8]), "INVALID_ARGUMENT", "< 0"),
        (_digit_request(values=[float("nan")] * 64), "INVALID_ARGUMENT", "NaN"),
        (_digit_request(datatype="FP32"), "INVALID_ARGUMENT", "contents.fp32_contents"),
        (_digit_request(datatype="FP16"), "INVALID_ARGUMENT", "raw_input_contents"),
        (_digit_request(parameters={"top_k": 0}), "INVALID_ARGUMENT", "top_k"),
        (_digit_request(outputs=["probabilities"]), "INVALID_ARGUMENT", "unknown output"),
        (
            _digit_request(shape=[FULL_BATCH + 1, 8, 8], values=[0.0] * 64 * (FULL_BATCH + 1)),
            "RESOURCE_EXHAUSTED",
            f"the limit is {FULL_BATCH}",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_errors_as_status_codes(stub, request_, code, message):
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request_, metadata=_metadata(READ))
    assert refused.value.code().name == code, refused.value.details()
    assert message in refused.value.details()


def test_a_message_over_the_size_limit_is_refused(digits_model_dir):
    port = free_port()
    with (
        server_process(digits_model_dir, GRPC_PORT=str(port), MAX_REQUEST_BYTES="4096"),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(_digit_request(shape=[10, 8, 8], values=[0.0] * 640))
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert stub.ModelInfer(_digit_request()).model_name == "digits"


def test_the_clients_deadline_bounds_the_call(stub):
    # gRPC keeps deadlines in whole milliseconds, so a 1 µs timeout leaves the server up to a
    # millisecond: one digit can be answered in it. A full batch cannot be decoded and scored
    # in a millisecond, so whichever side notices first, the call ends DEADLINE_EXCEEDED.
    full = _digit_request(shape=[FULL_BATCH, 8, 8, 1], values=[0.0] * (64 * FULL_BATCH))
    with pytest.raises(grpc.RpcError) as late:
        stub.ModelInfer(full, metadata=_metadata(READ), timeout=1e-6)
    assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert stub.ModelInfer(_digit_request(), metadata=_metadata(READ), timeout=30).outputs


# -- keys and the repository extension ---------------------------------------------------------


def test_keys_and_scopes(stub, client):
    with pytest.raises(grpc.RpcError) as missing:
        stub.ModelInfer(_digit_request())
    assert missing.value.code() is grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as unknown:
        stub.ModelInfer(_digit_request(), metadata=[("x-api-key", "not-a-key")])
    assert unknown.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "not-a-key" not in unknown.value.details()
    assert stub.ModelInfer(_digit_request(), metadata=[("x-api-key", READER)]).outputs
    with pytest.raises(InferenceServerException) as forbidden:
        client.get_model_repository_index(headers=READ)
    assert forbidden.value.status() == "StatusCode.PERMISSION_DENIED"
    assert "read scope" in forbidden.value.message()


def test_the_repository_extension(client, digits):
    index = client.get_model_repository_index(headers=ADMIN_HEADERS)
    states = {model.name: model.state for model in index.models}
    assert states == {"digits": "ready", "topics": "ready", "notes": "failed"}
    failed = next(model for model in index.models if model.name == "notes")
    assert "manifest.json" in failed.reason
    client.unload_model("topics", headers=ADMIN_HEADERS)
    assert not client.is_model_ready("topics", headers=READ)
    client.load_model("topics", headers=ADMIN_HEADERS)
    assert client.is_model_ready("topics", headers=READ)
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("notes", headers=ADMIN_HEADERS)
    assert refused.value.status() == "StatusCode.FAILED_PRECONDITION"
    ready = client.get_model_repository_index(headers=ADMIN_HEADERS)
    assert {model.name for model in ready.models} >= {"digits", "topics"}


def test_metrics_count_the_calls(served, stub):
    server, _ = served
    stub.ModelInfer(_digit_request(), metadata=_metadata(READ))
    text = httpx.get(f"{server.url}/metrics").text
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    labels = (("code", "OK"), ("method", "ModelInfer"), ("model", "digits"))
    assert samples["besvm_grpc_requests_total", labels] >= 1
    codes = {dict(labels)["code"] for name, labels in samples if name.startswith("besvm_grpc")}
    assert "UNAUTHENTICATED" in codes


# -- processes ---------------------------------------------------------------------------------


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    return inodes


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def test_every_worker_serves_grpc_on_the_shared_port(digits_model_dir):
    port = free_port()
    with server_process(digits_model_dir, GRPC_PORT=str(port), WORKERS="2") as server:
        workers = worker_pids(server.process.pid)
        assert len(workers) == 2
        deadline = time.monotonic() + 60  # the first worker ready made the server ready
        while True:
            listening = _listening_inodes(port)
            serving = [pid for pid in workers if _socket_inodes(pid) & listening]
            if len(serving) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert serving == workers, f"workers {workers}, listening on {port}: {serving}"
        for _ in range(8):  # new connections, spread by the kernel: every one answered
            with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
                tensor = grpcclient.InferInput("input", [1, 8, 8], "FP64")
                tensor.set_data_from_numpy(np.zeros((1, 8, 8)))
                assert client.infer("digits", [tensor]).as_numpy("label").shape == (1,)


def test_sigterm_drains_grpc(digits_model_dir):
    port = free_port()
    with server_process(digits_model_dir, GRPC_PORT=str(port)) as server:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
            assert client.is_server_ready()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0
        log = server.log()
    assert "gRPC: draining" in log
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
