"""API keys through a real server process: every scope and route family, both headers, the key
file's digests, revocation on SIGHUP, what the logs and answers say (never the key), the OpenAPI
document; and the key file's parser."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time

import httpx
import pytest

from service.api.machinery.auth import KeyFileError, KeyScope, parse_key_file
from tests.api.conftest import REPO, server_process

READER = "reader-3f9c2a77e1d04b6b"
ADMIN = "admin-5b1e0c9d2f7a4e88"
TOKEN = "token-9d8c7b6a5f4e3d2c"
DIGIT = {"instances": [[[0.0] * 8] * 8], "top_k": 3}


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _key_file(tmp_path, *lines: str):
    path = tmp_path / "keys.txt"
    path.write_text("\n".join(["# keys of the test", *lines, ""]))
    return path


@pytest.fixture(scope="module")
def keyed_server(digits_model_dir, tmp_path_factory):
    """A server with a read key given as itself, an admin key given by its digest, and
    ADMIN_TOKEN; ACCESS_LOG on, so that the log can be searched for keys."""
    directory = tmp_path_factory.mktemp("keys")
    path = _key_file(
        directory, f"{READER} read   # the dashboard", f"sha256:{_digest(ADMIN)} admin"
    )
    with server_process(
        digits_model_dir, API_KEYS_FILE=str(path), ADMIN_TOKEN=TOKEN, ACCESS_LOG="true"
    ) as server:
        yield server, path


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_read_routes_need_a_key(keyed_server):
    server, _ = keyed_server
    missing = httpx.post(f"{server.url}/classify", json=DIGIT)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == 'Bearer realm="besvm"'
    assert missing.json()["error"]["type"] == "unauthorized"
    assert "X-API-Key" in missing.json()["error"]["message"]
    wrong = httpx.post(f"{server.url}/classify", json=DIGIT, headers=_bearer("not-a-key"))
    assert wrong.status_code == 401
    assert "not-a-key" not in wrong.text
    # The protocol's routes answer in the protocol's error shape.
    v2 = httpx.get(f"{server.url}/v2/models/digits")
    assert v2.status_code == 401
    assert set(v2.json()) == {"error"}
    for path in ("/v1/models", "/v1/models/digits", "/v2", "/nowhere"):
        assert httpx.get(f"{server.url}{path}").status_code == 401, path


@pytest.mark.parametrize("key", [READER, ADMIN, TOKEN])
def test_every_key_reads_with_either_header(keyed_server, key):
    server, _ = keyed_server
    by_bearer = httpx.post(f"{server.url}/classify", json=DIGIT, headers=_bearer(key))
    assert by_bearer.status_code == 200, by_bearer.text
    by_header = httpx.post(f"{server.url}/classify", json=DIGIT, headers={"X-API-Key": key})
    assert by_header.json() == by_bearer.json()
    assert httpx.get(f"{server.url}/v2/models/digits", headers=_bearer(key)).status_code == 200


def test_the_admin_scope_guards_the_repository_routes(keyed_server):
    server, _ = keyed_server
    route = f"{server.url}/v2/repository/index"
    forbidden = httpx.post(route, headers=_bearer(READER))
    assert forbidden.status_code == 403
    assert forbidden.json()["error"]["type"] == "forbidden"
    assert "read scope" in forbidden.json()["error"]["message"]
    assert READER not in forbidden.text
    assert httpx.post(route).status_code == 401
    for key in (ADMIN, TOKEN):
        listed = httpx.post(route, headers={"X-API-Key": key})
        assert listed.status_code == 200
        assert [model["name"] for model in listed.json()] == ["digits"]


def test_probes_and_metrics_stay_open(keyed_server):
    server, _ = keyed_server
    for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready", "/metrics"):
        assert httpx.get(f"{server.url}{path}").status_code == 200, path


def test_the_log_names_keys_by_fingerprint_only(keyed_server):
    server, _ = keyed_server
    httpx.post(f"{server.url}/classify", json=DIGIT, headers=_bearer(READER))
    httpx.post(f"{server.url}/classify", json=DIGIT, headers=_bearer("a-wrong-key"))
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
        access = [line for line in lines if line.get("path") == "/classify"]
        if len(access) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    fingerprints = {line["key"] for line in access if line["status"] == 200}
    assert _digest(READER)[:8] in fingerprints
    assert fingerprints <= {_digest(key)[:8] for key in (READER, ADMIN, TOKEN)}
    assert any(line["status"] == 401 and "key" not in line for line in access)
    log = server.log()
    for secret in (READER, ADMIN, TOKEN, "a-wrong-key"):
        assert secret not in log


def test_a_revoked_key_is_refused_after_sighup(digits_model_dir, tmp_path):
    path = _key_file(tmp_path, f"{READER} read", f"{ADMIN} admin")
    with server_process(digits_model_dir, API_KEYS_FILE=str(path)) as server:
        assert httpx.post(f"{server.url}/classify", json=DIGIT, headers=_bearer(READER)).is_success
        replacement = tmp_path / "keys.new"
        replacement.write_text(f"{ADMIN} admin\nnew-key-0123456789 read\n")
        replacement.replace(path)
        server.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while True:
            answer = httpx.post(f"{server.url}/classify", json=DIGIT, headers=_bearer(READER))
            if answer.status_code == 401 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert answer.status_code == 401
        fresh = httpx.post(
            f"{server.url}/classify", json=DIGIT, headers=_bearer("new-key-0123456789")
        )
        assert fresh.status_code == 200
        # A file broken by mistake is refused: the keys in force stay.
        path.write_text("one two three\n")
        server.process.send_signal(signal.SIGHUP)
        time.sleep(1)
        kept = httpx.post(
            f"{server.url}/classify", json=DIGIT, headers=_bearer("new-key-0123456789")
        )
        assert kept.status_code == 200
        log = server.stop()
    assert "API keys not re-read" in log
    assert "line 1" in log


def test_the_rescan_rereads_the_keys(digits_model_dir, tmp_path):
    path = _key_file(tmp_path, f"{READER} read")
    with server_process(
        digits_model_dir, API_KEYS_FILE=str(path), RELOAD_INTERVAL_S="0.2"
    ) as server:
        assert httpx.get(f"{server.url}/v1/models", headers=_bearer(READER)).is_success
        path.write_text(f"{ADMIN} read\n")
        deadline = time.monotonic() + 20
        while httpx.get(f"{server.url}/v1/models", headers=_bearer(READER)).status_code != 401:
            assert time.monotonic() < deadline, "the revoked key still reads"
            time.sleep(0.1)
        assert httpx.get(f"{server.url}/v1/models", headers=_bearer(ADMIN)).is_success


def test_metrics_can_require_a_key(digits_model_dir, tmp_path):
    path = _key_file(tmp_path, f"{READER} read")
    with server_process(
        digits_model_dir, API_KEYS_FILE=str(path), METRICS_REQUIRE_KEY="true"
    ) as server:
        assert httpx.get(f"{server.url}/metrics").status_code == 401
        assert httpx.get(f"{server.url}/metrics", headers=_bearer(READER)).status_code == 200
        assert httpx.get(f"{server.url}/readyz").status_code == 200


def test_without_a_key_file_reads_stay_open(digits_model_dir):
    with server_process(digits_model_dir, ADMIN_TOKEN=TOKEN) as server:
        assert httpx.post(f"{server.url}/classify", json=DIGIT).status_code == 200
        assert httpx.post(f"{server.url}/v2/repository/index").status_code == 401
        index = httpx.post(f"{server.url}/v2/repository/index", headers=_bearer(TOKEN))
        assert index.status_code == 200


def test_a_bad_key_file_stops_the_start_without_echoing_the_key(tmp_path, digits_model_dir):
    path = _key_file(tmp_path, "secret-value-42 reader")
    run = subprocess.run(
        [sys.executable, "-m", "service.api"],
        cwd=REPO,
        env={"MODEL_DIR": str(digits_model_dir), "API_KEYS_FILE": str(path), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert "line 2: unknown scope 'reader'" in run.stderr
    assert "secret-value-42" not in run.stderr


def test_the_openapi_document_declares_the_schemes(keyed_server):
    server, _ = keyed_server
    document = httpx.get(f"{server.url}/openapi.json").json()
    schemes = document["components"]["securitySchemes"]
    assert schemes["bearerKey"] == {**schemes["bearerKey"], "type": "http", "scheme": "bearer"}
    assert schemes["apiKeyHeader"]["name"] == "X-API-Key"
    paths = document["paths"]
    assert {"bearerKey": []} in paths["/classify"]["post"]["security"]
    assert "401" in paths["/classify"]["post"]["responses"]
    assert "403" in paths["/v2/repository/index"]["post"]["responses"]
    assert paths["/healthz"]["get"]["security"] == []
    assert httpx.get(f"{server.url}/docs").status_code == 200


def test_the_key_file_parser():
    keys = parse_key_file(
        f"# comment\n\n{READER} read\n  sha256:{_digest(ADMIN).upper()}   ADMIN  # why\n"
    )
    assert [key.scope for key in keys] == [KeyScope.READ, KeyScope.ADMIN]
    assert keys[0].digest.hex() == _digest(READER)
    assert keys[1].digest.hex() == _digest(ADMIN)
    assert keys[1].fingerprint == _digest(ADMIN)[:8]
    for text, problem in [
        ("s3cr3t-key", "line 1: expected '<key> <scope>', got 1 fields"),
        ("s3cr3t-key read extra", "neither rate= nor burst="),
        ("s3cr3t-key write", "unknown scope 'write'"),
        ("sha256:abc read", "64 hex digits"),
        ("sha256:" + "g" * 64 + " read", "64 hex digits"),
    ]:
        with pytest.raises(KeyFileError, match=problem) as raised:
            parse_key_file(text)
        assert "s3cr3t" not in str(raised.value)
