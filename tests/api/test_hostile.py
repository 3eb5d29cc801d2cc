"""Hostile inputs against a real server process serving an image, a text and a search model:
each gets a 4xx with the one error body, in bounded time (the client's timeout), and the server
answers /healthz and a normal /classify afterwards. What each answers is the contract of
docs/reference/errors.md."""

from __future__ import annotations

import json
import shutil

import httpx
import numpy as np
import pytest

from tests.api.conftest import server_process

pytestmark = pytest.mark.slow

LIMIT = 16 * 1024 * 1024  # MAX_REQUEST_BYTES, the default
JSON = {"content-type": "application/json"}
# Every request is over in this many seconds, or the test fails (not a timing assertion: a
# bound on a hang; the slowest below takes about 3 s on 2 busy cores).
BOUND_S = 120


@pytest.fixture(scope="module")
def server(digits_model_dir, text_model_dir, search_model_dir, tmp_path_factory):
    repository = tmp_path_factory.mktemp("hostile")
    for name, path in (
        ("digits", digits_model_dir),
        ("topics", text_model_dir),
        ("search", search_model_dir),
    ):
        shutil.copytree(path, repository / name)
    with server_process(
        MODEL_REPOSITORY=str(repository), DEFAULT_MODEL="digits", MAX_REQUEST_BYTES=str(LIMIT)
    ) as running:
        yield running


@pytest.fixture(scope="module")
def image(digits) -> list:
    return digits.X_test[0].reshape(8, 8).tolist()


def _image_of(value: bytes) -> bytes:
    """An 8x8 image of one JSON number, as it is written (1e400 is no Python float)."""
    row = b"[" + b", ".join([value] * 8) + b"]"
    return b"[" + b", ".join([row] * 8) + b"]"


SEARCH = "/v1/models/search/search"
ROUTES = {"image": "/classify", "text": "/v1/models/topics/classify", "search": SEARCH}


def _send(server, path: str, body: bytes | None = None, **kwargs) -> httpx.Response:
    if body is not None:
        kwargs.setdefault("headers", JSON)
        kwargs["content"] = body
    return httpx.post(f"{server.url}{path}", timeout=BOUND_S, **kwargs)


def _refused(response: httpx.Response, status: int, says: str) -> None:
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert says in error["message"], error
    assert len(response.content) < 10_000  # nothing of the request echoed back whole


@pytest.fixture(autouse=True)
def still_healthy(server, image, digits):
    yield
    assert server.process.poll() is None, server.log()[-3000:]
    assert httpx.get(f"{server.url}/healthz", timeout=BOUND_S).status_code == 200
    normal = httpx.post(f"{server.url}/classify", json={"instances": [image]}, timeout=BOUND_S)
    assert normal.status_code == 200
    assert normal.json()["predictions"][0]["label"] == str(digits.y_test[0])


@pytest.mark.parametrize("model", ROUTES)
def test_json_nested_100_000_deep(server, model):
    _refused(_send(server, ROUTES[model], b"[" * 100_000), 400, "nested deeper than 201")
    deep_object = b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    _refused(_send(server, ROUTES[model], deep_object), 400, "nested deeper than 201")


def test_a_body_over_the_limit_declared_or_streamed(server):
    big = b"[" + b"0, " * (LIMIT // 3) + b"0]"
    _refused(_send(server, "/classify", big), 413, "larger than the limit of 16,777,216")

    def chunks():
        for start in range(0, len(big), 1 << 20):
            yield big[start : start + (1 << 20)]

    streamed = _send(server, SEARCH, None, content=chunks(), headers=JSON)
    assert "content-length" not in streamed.request.headers
    _refused(streamed, 413, "larger than the limit of 16,777,216")


@pytest.mark.parametrize(
    ("model", "body", "says"),
    [
        ("image", b'{"instances": [' + _image_of(b"1e400") + b"]}", "contains NaN or infinity"),
        ("image", b'{"instances": [' + _image_of(b"1e300") + b"]}", "times farther"),
        ("image", b'{"instances": [' + _image_of(b"-1e300") + b"]}", "times farther"),
        ("image", b'{"instances": [' + _image_of(b"9" * 400) + b"]}", "beyond the range of"),
        ("search", b'{"positives": [' + _image_of(b"1e400") + b"]}", "contains NaN or infinity"),
        ("search", b'{"positives": [' + _image_of(b"1e300") + b"]}", "positives[0] lies"),
        ("search", b'{"code": {"indices": [1], "values": [1e400]}}', "must be finite"),
        ("search", b'{"code": {"indices": [1], "values": [1e300]}}', "at most 1e+100"),
        ("search", b'{"class": "7", "top_k": 1e300}', "valid integer"),
        ("text", b'{"instances": [{"indices": [1], "counts": [1e400]}]}', "whole number"),
        ("text", b'{"instances": [{"indices": [1], "counts": [1e300]}]}', "more than 9,007"),
        ("text", b'{"instances": [{"indices": [1e300], "counts": [1]}]}', "not an integer"),
    ],
)
def test_numbers_out_of_float_range_and_huge_finite_numbers(server, model, body, says):
    _refused(_send(server, ROUTES[model], body), 422, says)


@pytest.mark.parametrize("model", ROUTES)
def test_invalid_utf8(server, model):
    body = b'{"texts": ["caf\xe9 \xff\xfe"], "class": "\xc3\x28"}'
    _refused(_send(server, ROUTES[model], body), 400, "not UTF-8")


def test_one_text_of_5_million_words(server):
    # Over the body limit: refused before it is read.
    words = "rocket " * 5_000_000
    _refused(_send(server, ROUTES["text"], json={"texts": [words]}), 413, "larger than")
    # Within it (two letters a word, 15 MB): a text like any other, answered in a few seconds,
    # the work linear in the body that MAX_REQUEST_BYTES bounds.
    within = httpx.post(
        f"{server.url}{ROUTES['text']}", json={"texts": ["ab " * 5_000_000]}, timeout=BOUND_S
    )
    assert within.status_code == 200
    assert within.json()["predictions"][0]["known_words"] == 0  # "ab" is no word it knows


@pytest.mark.parametrize(
    ("model", "body"),
    [
        ("image", {"instances": [[[0.0] * 8] * 8] * 51}),
        ("text", {"texts": ["moon"] * 51}),
        (
            "search",
            {
                "positives": [f"test-{i}" for i in range(30)],
                "negatives": [f"test-{i}" for i in range(30, 60)],
            },
        ),
    ],
)
def test_a_batch_over_the_limit(server, model, body):
    _refused(_send(server, ROUTES[model], json=body), 413, "the limit is 50")


@pytest.mark.parametrize("field", ["exclude", "positives"])
def test_thousands_of_ids_or_one_10_mb_id(server, field):
    many = [f"nope-{i}" for i in range(5000)]
    body = {"class": "7", "exclude": many} if field == "exclude" else {"positives": many[:50]}
    _refused(_send(server, SEARCH, json=body), 422, "unknown catalogue")
    if field == "positives":  # more than the batch limit
        _refused(_send(server, SEARCH, json={"positives": many}), 413, "the limit is 50")
    long_id = "test-1" + "0" * 10_000_000
    body = {"class": "7", "exclude": [long_id]} if field == "exclude" else {"positives": [long_id]}
    _refused(_send(server, SEARCH, json=body), 422, "unknown catalogue")


def test_a_code_with_thousands_of_indices(server):
    code = {"indices": list(range(5000)), "values": [1.0] * 5000}
    _refused(_send(server, SEARCH, json={"code": code}), 422, "out of range")
    repeated = {"indices": [3] * 5000, "values": [1.0] * 5000}
    _refused(_send(server, SEARCH, json={"code": repeated}), 422, "distinct")
    in_range = np.arange(64).tolist()
    wide = {"code": {"indices": in_range, "values": [1.0] * 64}, "top_k": 3}
    assert _send(server, SEARCH, json.dumps(wide).encode()).status_code == 200
