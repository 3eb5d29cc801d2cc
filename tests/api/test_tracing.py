"""OpenTelemetry tracing through a real server process, exporting to a real OTLP receiver built
here on the protocol's official definitions (opentelemetry-proto's generated TraceService over
gRPC, and its messages over HTTP): spans of REST and gRPC requests with the parent the client
sent, the model's work beneath them, none for probes and scrapes; and when the ``OTEL_*``
variables turn it on."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from benchmarks.serving import free_port
from service.api.machinery.tracing import exporter_names, tracing_from_environment
from service.model.artifact import manifest_digest
from tests.api.conftest import server_process

pytestmark = pytest.mark.slow

REST_TRACE, REST_PARENT = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
GRPC_TRACE, GRPC_PARENT = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
SERVER, INTERNAL = 2, 1  # Span.SpanKind of the protocol


class Receiver:
    """What an OTLP receiver was sent: every span, with its resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict, object]] = []
        self.lock = threading.Lock()

    def take(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend((resource, span) for span in scope_spans.spans)

    def wait_for(self, condition, what: str, timeout: float = 30.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                spans = [span for _, span in self.spans]
            if condition(spans):
                return spans
            time.sleep(0.05)
        pytest.fail(f"the receiver never got {what}: {[s.name for s in spans]}")


def _attributes(pairs) -> dict:
    values = {}
    for pair in pairs:
        kind = pair.value.WhichOneof("value")
        values[pair.key] = getattr(pair.value, kind) if kind else None
    return values


@contextlib.contextmanager
def grpc_receiver():
    """OTLP over gRPC: the TraceService of the protocol's definitions."""
    receiver = Receiver()

    class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            receiver.take(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield receiver, f"http://127.0.0.1:{port}"
    finally:
        server.stop(None)


@contextlib.contextmanager
def http_receiver():
    """OTLP over HTTP (binary protobuf): POST /v1/traces with an ExportTraceServiceRequest."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["content-length"]))
            assert self.path == "/v1/traces"
            assert self.headers["content-type"] == "application/x-protobuf"
            receiver.take(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _named(spans, name: str) -> list:
    return [span for span in spans if span.name == name]


@pytest.mark.parametrize(
    ("protocol", "receiving"), [("grpc", grpc_receiver), ("http/protobuf", http_receiver)]
)
def test_spans_reach_an_otlp_receiver_with_the_right_parents(
    digits_model_dir, digits, protocol, receiving
):
    version = manifest_digest(digits_model_dir)
    images = digits.X_test[:3].reshape(3, 8, 8)
    grpc_port = free_port()
    with (
        receiving() as (receiver, endpoint),
        server_process(
            digits_model_dir,
            GRPC_PORT=str(grpc_port),
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_BSP_SCHEDULE_DELAY="100",
            OTEL_SERVICE_NAME="besvm-under-test",
        ) as server,
    ):
        url = server.url
        for path in ("/healthz", "/readyz", "/metrics", "/v2/health/ready"):
            assert httpx.get(f"{url}{path}").status_code == 200
        answered = httpx.post(
            f"{url}/classify",
            json={"instances": images.tolist()},
            headers={"traceparent": f"00-{REST_TRACE}-{REST_PARENT}-01"},
        )
        assert answered.status_code == 200
        assert httpx.post(f"{url}/v1/models/nope/classify", json={}).status_code == 404
        tensor = images.reshape(3, 8, 8, 1)
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
            assert client.is_server_live()
            tensor_input = grpcclient.InferInput("input", list(tensor.shape), "FP64")
            tensor_input.set_data_from_numpy(tensor)
            traceparent = {"traceparent": f"00-{GRPC_TRACE}-{GRPC_PARENT}-01"}
            client.infer("digits", [tensor_input], headers=traceparent)
            with pytest.raises(Exception, match="no model named"):
                client.infer("nope", [tensor_input])
        spans = receiver.wait_for(
            lambda spans: (
                len(_named(spans, "classify")) >= 2
                and _named(spans, f"{'inference.GRPCInferenceService'}/ModelInfer")
                and len(_named(spans, "inference.GRPCInferenceService/ModelInfer")) >= 2
                and _named(spans, "POST /v1/models/{name}/classify")
            ),
            "the spans of every request",
        )
        resources = {resource["service.name"] for resource, _ in receiver.spans}
    assert resources == {"besvm-under-test"}
    # No probe, scrape or health call has a span.
    names = {span.name for span in spans}
    assert names == {
        "POST /classify",
        "POST /v1/models/{name}/classify",
        "classify",
        "inference.GRPCInferenceService/ModelInfer",
    }, names

    (rest,) = _named(spans, "POST /classify")
    assert rest.trace_id.hex() == REST_TRACE
    assert rest.parent_span_id.hex() == REST_PARENT
    assert rest.kind == SERVER
    attributes = _attributes(rest.attributes)
    assert attributes["http.route"] == "/classify"
    assert attributes["http.response.status_code"] == 200
    assert attributes["besvm.request_id"] == answered.headers["x-request-id"]

    work = [span for span in _named(spans, "classify") if span.trace_id.hex() == REST_TRACE]
    (classify,) = work
    assert classify.parent_span_id == rest.span_id
    assert classify.kind == INTERNAL
    assert _attributes(classify.attributes) == {
        "besvm.model": "digits",
        "besvm.model_version": version,
        "besvm.batch_size": 3,
    }
    assert rest.start_time_unix_nano <= classify.start_time_unix_nano
    assert classify.end_time_unix_nano <= rest.end_time_unix_nano

    missing = _named(spans, "POST /v1/models/{name}/classify")[0]
    assert _attributes(missing.attributes)["http.response.status_code"] == 404
    assert len(missing.parent_span_id) == 0  # no traceparent sent: a trace of its own

    calls = _named(spans, "inference.GRPCInferenceService/ModelInfer")
    (traced,) = [span for span in calls if span.trace_id.hex() == GRPC_TRACE]
    assert traced.parent_span_id.hex() == GRPC_PARENT
    assert _attributes(traced.attributes)["rpc.grpc.status_code"] == 0
    (beneath,) = [span for span in _named(spans, "classify") if span.trace_id.hex() == GRPC_TRACE]
    assert beneath.parent_span_id == traced.span_id
    assert _attributes(beneath.attributes)["besvm.batch_size"] == 3
    (failed,) = [span for span in calls if span.trace_id.hex() != GRPC_TRACE]
    assert (
        _attributes(failed.attributes)["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    )
    assert failed.status.code == 2  # STATUS_CODE_ERROR


def test_tracing_is_on_only_when_the_environment_says_so():
    assert exporter_names({}) == []
    assert tracing_from_environment({}) is None
    assert exporter_names({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}) == []
    assert exporter_names({"OTEL_TRACES_EXPORTER": "none"}) == []
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    assert exporter_names(endpoint) == ["otlp_proto_grpc"]  # the Python SDK's default protocol
    assert exporter_names({**endpoint, "OTEL_SDK_DISABLED": "true"}) == []
    assert exporter_names({**endpoint, "OTEL_TRACES_EXPORTER": "none"}) == []
    assert exporter_names(
        {"OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    ) == ["otlp_proto_http", "console"]
    assert exporter_names(
        {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
        }
    ) == ["otlp_proto_grpc"]
    with pytest.raises(ValueError, match="http/json"):
        exporter_names({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(ValueError, match="not installed"):
        tracing_from_environment({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_payload_records_carry_the_requests_traceparent(digits_model_dir, tmp_path):
    payloads = tmp_path / "payloads.jsonl"
    with (
        grpc_receiver() as (receiver, endpoint),
        server_process(
            digits_model_dir,
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_BSP_SCHEDULE_DELAY="100",
            PAYLOAD_LOG_RATE="1",
            PAYLOAD_LOG=str(payloads),
        ) as server,
    ):
        httpx.post(
            f"{server.url}/classify",
            json={"instances": np.zeros((1, 8, 8)).tolist()},
            headers={"traceparent": f"00-{REST_TRACE}-{REST_PARENT}-01"},
        )
        spans = receiver.wait_for(lambda spans: _named(spans, "POST /classify"), "the span")
        server.stop()
    (rest,) = _named(spans, "POST /classify")
    lines = payloads.read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert f'"traceparent":"00-{REST_TRACE}-{rest.span_id.hex()}-01"' in line
