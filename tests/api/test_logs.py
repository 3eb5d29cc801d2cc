"""Request ids and logs: JSON lines from a real server process, the id of a request in its
answer and in every line written while serving it."""

from __future__ import annotations

import json
import logging
import re

import httpx
import pytest
from fastapi import FastAPI

from service.api import Settings, create_app
from service.api.machinery.observability import RequestIdFilter, request_id_of
from tests.api.conftest import server_process

TOKEN = "logs-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GENERATED = re.compile(r"[0-9a-f]{32}")
PROBES = ("/healthz", "/readyz")


def _images(digits, n: int) -> list:
    return digits.X_test[:n].reshape(n, 8, 8).tolist()


def _json_lines(log: str) -> list[dict]:
    lines = [line for line in log.splitlines() if line.strip()]
    assert lines
    return [json.loads(line) for line in lines]  # every line is one JSON object


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        (b"abc-123", True),
        (b"Req.1:2_3-x", True),
        (b"a" * 128, True),
        (b"a" * 129, False),
        (b"", False),
        (b"has space", False),
        (b'quote"s', False),
        (b"caf\xc3\xa9", False),
        (b"new\nline", False),
    ],
)
def test_request_ids_are_validated(sent, kept):
    given = request_id_of([(b"x-request-id", sent)])
    if kept:
        assert given == sent.decode()
    else:
        assert GENERATED.fullmatch(given)
    assert GENERATED.fullmatch(request_id_of([]))
    assert request_id_of([]) != request_id_of([])


@pytest.mark.slow
def test_json_logs_carry_the_request_id(digits, digits_model_dir):
    with server_process(
        digits_model_dir,
        ACCESS_LOG="true",
        LOG_LEVEL="debug",
        ADMIN_TOKEN=TOKEN,
        MAX_REQUEST_BYTES="4096",
    ) as server:
        url = server.url
        ok = httpx.post(
            f"{url}/classify",
            json={"instances": _images(digits, 2)},
            headers={"X-Request-ID": "client-id-1"},
        )
        assert ok.status_code == 200
        assert ok.headers["x-request-id"] == "client-id-1"
        # A request that writes log lines of its own: an explicit load logs the version.
        load = httpx.post(
            f"{url}/v2/repository/models/digits/load",
            headers={**AUTH, "X-Request-ID": "load-id-2"},
            timeout=60,
        )
        assert load.status_code == 200, load.text
        assert load.headers["x-request-id"] == "load-id-2"
        # An invalid id is replaced, not echoed.
        invalid = httpx.get(f"{url}/healthz", headers={"X-Request-ID": "bad id!"})
        replaced = invalid.headers["x-request-id"]
        assert GENERATED.fullmatch(replaced)
        # Every answer has one, errors included: 404, 405, 413, 422, and made when none is sent.
        errors = [
            httpx.get(f"{url}/no/such/path"),
            httpx.delete(f"{url}/classify"),
            httpx.post(f"{url}/classify", content=b"x" * 8192),
            httpx.post(f"{url}/classify", json={"instances": [[1.0]]}),
        ]
        assert [e.status_code for e in errors] == [404, 405, 413, 422]
        error_ids = [e.headers["x-request-id"] for e in errors]
        assert all(GENERATED.fullmatch(i) for i in error_ids)
        assert len(set(error_ids)) == len(error_ids)
        log = server.stop()

    lines = _json_lines(log)
    for line in lines:
        assert {"ts", "level", "logger", "message", "request_id"} <= line.keys(), line
    by_id: dict = {}
    for line in lines:
        by_id.setdefault(line["request_id"], []).append(line)

    (access,) = by_id["client-id-1"]
    assert access["logger"] == "service.api.access"
    assert access["level"] == "info"
    assert (access["method"], access["path"], access["status"]) == ("POST", "/classify", 200)
    assert access["duration_ms"] > 0
    assert re.fullmatch(r"127\.0\.0\.1:\d+", access["client"])

    # The load's own lines and its access line, all with its id.
    loaded = by_id["load-id-2"]
    assert any(
        line["logger"] == "service.api" and "replaced version" in line["message"] for line in loaded
    )
    assert loaded[-1]["logger"] == "service.api.access"
    assert loaded[-1]["path"] == "/v2/repository/models/digits/load"
    assert "bad id!" not in log
    assert by_id[replaced][0]["path"] == "/healthz"
    for error, request_id in zip(errors, error_ids, strict=True):
        (line,) = by_id[request_id]
        assert line["status"] == error.status_code
    # uvicorn's own access log is off: one access line per request, the service's.
    assert not [line for line in lines if line["logger"] == "uvicorn.access"]
    # Health probes only at debug level (the readiness polls of the start included).
    probes = [line for line in lines if line.get("path") in PROBES]
    assert len(probes) >= 2
    assert {line["level"] for line in probes} == {"debug"}
    assert {line["level"] for line in lines if line.get("path") == "/classify"} == {"info"}


@pytest.mark.slow
def test_text_logs_without_access_log(digits, digits_model_dir):
    with server_process(
        digits_model_dir, ACCESS_LOG="false", LOG_FORMAT="text", ADMIN_TOKEN=TOKEN
    ) as server:
        url = server.url
        ok = httpx.post(
            f"{url}/classify",
            json={"instances": _images(digits, 1)},
            headers={"X-Request-ID": "quiet-1"},
        )
        assert ok.headers["x-request-id"] == "quiet-1"
        load = httpx.post(
            f"{url}/v2/repository/models/digits/load",
            headers={**AUTH, "X-Request-ID": "load-3"},
            timeout=60,
        )
        assert load.status_code == 200
        log = server.stop()
    assert "quiet-1" not in log  # no access line
    assert "/classify" not in log
    (loaded,) = [line for line in log.splitlines() if "replaced version" in line]
    assert re.match(r"\S+ \S+ INFO service\.api \[load-3\] model 'digits' replaced", loaded)


def test_an_unhandled_error_answers_500_with_the_id_in_header_and_log(digits_model_dir, caplog):
    from fastapi.testclient import TestClient

    app: FastAPI = create_app(Settings(_env_file=None, model_dir=digits_model_dir))

    # A route that fails the way a bug would: the error middleware answers 500 outside the
    # routes, and its answer and log line keep the request's id.
    async def boom():
        raise RuntimeError("a bug")

    app.add_api_route("/boom", boom)
    caplog.handler.addFilter(RequestIdFilter())
    with (
        caplog.at_level(logging.ERROR, logger="service"),
        TestClient(app, raise_server_exceptions=False) as client,
    ):
        response = client.get("/boom", headers={"X-Request-ID": "bug-7"})
    assert response.status_code == 500
    assert response.headers["x-request-id"] == "bug-7"
    assert response.json()["error"]["type"] == "internal_error"
    (record,) = [r for r in caplog.records if r.name == "service.api" and r.exc_info]
    assert record.request_id == "bug-7"
