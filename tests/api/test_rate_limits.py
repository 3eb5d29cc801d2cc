"""Rate limits per API key (a rate and a burst on the key's line of API_KEYS_FILE) through a
real server process: 429 with Retry-After on REST in both error shapes, RESOURCE_EXHAUSTED over
gRPC, probes and scrapes exempt, other keys untouched, the bucket refilling at the key's rate
and kept across a re-read of the file; and the parser of the limits."""

from __future__ import annotations

import json
import signal
import time

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from benchmarks.serving import free_port
from service.api.machinery.auth import KeyFileError, TokenBucket, parse_key_file
from tests.api.conftest import server_process

pytestmark = pytest.mark.slow

LIMITED = "limited-6c0f1e2d3a4b5c6d"  # 3 requests, then 10 an hour: no refill in a test
REFILLED = "refilled-1a2b3c4d5e6f7a8b"  # 1 request, then 4 a second
OPEN = "open-9e8d7c6b5a4f3e2d"
DIGIT = {"instances": [[[0.0] * 8] * 8]}


@pytest.fixture(scope="module")
def limited_server(digits_model_dir, tmp_path_factory):
    keys = tmp_path_factory.mktemp("rate-keys") / "keys.txt"
    keys.write_text(
        f"{LIMITED} read rate=10/h burst=3\n{REFILLED} read rate=4 burst=1\n{OPEN} read\n"
    )
    port = free_port()
    with server_process(
        digits_model_dir,
        API_KEYS_FILE=str(keys),
        METRICS_REQUIRE_KEY="true",
        GRPC_PORT=str(port),
        ACCESS_LOG="true",
    ) as server:
        yield server, port, keys


def _key(key: str) -> dict[str, str]:
    return {"X-API-Key": key}


def test_a_key_over_its_burst_gets_429_with_retry_after_and_others_do_not(limited_server):
    server, port, _ = limited_server
    url = server.url
    with httpx.Client(base_url=url, headers=_key(LIMITED), timeout=30) as http:
        # Probes and scrapes (with this key: METRICS_REQUIRE_KEY) never count.
        for _ in range(10):
            assert http.get("/readyz").status_code == 200
            assert http.get("/metrics").status_code == 200
        assert [http.post("/classify", json=DIGIT).status_code for _ in range(3)] == [200] * 3
        refused = http.post("/classify", json=DIGIT)
        assert refused.status_code == 429
        # 10 an hour: the next token is 6 minutes away, at most.
        assert 300 <= int(refused.headers["retry-after"]) <= 360
        error = refused.json()["error"]
        assert error["type"] == "rate_limited"
        assert "10/h" in error["message"]
        assert LIMITED not in refused.text
        protocol = http.get("/v2/models/digits")
        assert protocol.status_code == 429
        assert "over its rate" in protocol.json()["error"]  # the protocol's shape
        assert http.get("/v2/health/ready").status_code == 200
    # Another key, and the same key over gRPC: refused there too (one bucket per key).
    assert httpx.post(f"{url}/classify", json=DIGIT, headers=_key(OPEN)).status_code == 200
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        metadata = [("x-api-key", LIMITED)]
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), metadata=metadata).live
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="digits"), metadata=metadata)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert int(dict(raised.value.trailing_metadata())["retry-after"]) >= 300
        open_call = stub.ModelMetadata(
            service_pb2.ModelMetadataRequest(name="digits"), metadata=[("x-api-key", OPEN)]
        )
        assert open_call.name == "digits"
    counted = httpx.get(f"{url}/metrics", headers=_key(OPEN)).text
    assert 'route="/classify",status="429"' in counted.replace('model="",', "")
    # The refusal's access line names the key by its fingerprint.
    lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    refusals = [line for line in lines if line.get("status") == 429]
    assert refusals
    assert all(len(line["key"]) == 8 for line in refusals)


def test_the_bucket_refills_at_the_keys_rate_and_survives_a_reread(limited_server):
    server, _, keys = limited_server
    with httpx.Client(base_url=server.url, headers=_key(REFILLED), timeout=30) as http:
        statuses = [http.post("/classify", json=DIGIT).status_code for _ in range(20)]
        assert statuses[0] == 200
        assert 429 in statuses
        refused = http.post("/classify", json=DIGIT)
        if refused.status_code == 429:
            assert refused.headers["retry-after"] == "1"  # 0.25 s, rounded up
        time.sleep(0.3)  # one token at 4 a second
        assert http.post("/classify", json=DIGIT).status_code == 200
        # A re-read of an unchanged limit keeps the bucket as it is (spent).
        keys.write_text(keys.read_text() + "# re-read\n")
        server.process.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        limited = httpx.post(f"{server.url}/classify", json=DIGIT, headers=_key(LIMITED))
        assert limited.status_code == 429


def test_the_limits_parser():
    (limited, plain, hourly) = parse_key_file(
        "a-key read rate=600/min burst=20\nb-key admin\nc-key read rate=1/h\n"
    )
    assert (limited.rate, limited.burst) == (10.0, 20)
    assert (plain.rate, plain.burst) == (0.0, 0)
    assert hourly.rate == pytest.approx(1 / 3600)
    assert hourly.burst == 1  # a second's worth, at least one
    assert parse_key_file("d-key read rate=2.5")[0].burst == 3
    for line, problem in [
        ("s3cr3t read rate=0", "positive"),
        ("s3cr3t read rate=5/day", "positive"),
        ("s3cr3t read rate=nan", "positive"),
        ("s3cr3t read burst=3", "burst needs a rate"),
        ("s3cr3t read rate=5 burst=0", "at least 1"),
        ("s3cr3t read rate=5 rate=6", "'rate'"),
        ("s3cr3t read s3cr3t2", "neither rate= nor burst="),
    ]:
        with pytest.raises(KeyFileError, match=problem) as raised:
            parse_key_file(line)
        assert "s3cr3t" not in str(raised.value)


def test_a_token_bucket_allows_the_burst_then_the_rate():
    bucket = TokenBucket(rate=2.0, burst=3)
    start = bucket.updated
    assert [bucket.take(start) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(start) == pytest.approx(0.5)  # the next token in 1 / rate
    assert bucket.take(start + 0.25) == pytest.approx(0.25)
    assert bucket.take(start + 0.5) == 0.0
    # Empty at 0.5 s, then asked every 10 ms for 9.99 s: 2 a second pass, 19 in all.
    allowed = sum(bucket.take(start + 0.5 + t / 100) == 0.0 for t in range(1, 1000))
    assert allowed == 19
    # After a long pause no more than the burst at once.
    later = start + 1000.0
    assert [bucket.take(later) for _ in range(4)][:3] == [0.0] * 3
    assert bucket.take(later) > 0
