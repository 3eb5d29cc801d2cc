"""The error contract (docs/reference/errors.md): 400 for a body that is not JSON, 415 for a body
declared
as something else, 422 for JSON that breaks the schema or the model's rules, every status a
route answers and every limit stated in the OpenAPI document. In-process clients: error paths."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.api import Settings, create_app
from service.api.errors import is_protocol_route

SEVEN = [[0, 0, 4, 15, 16, 13, 13, 10]] + [[0, 0, 12, 13, 10, 15, 14, 2]] * 7
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def search_client(search_model_dir):
    settings = Settings(_env_file=None, model_dir=search_model_dir, max_batch_size=50)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


def _error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()["error"]
    assert body["message"]
    return body


def _nested(depth: int) -> bytes:
    return b'{"instances": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"texts": ["\xff\xfe"]}', "bytes that are not UTF-8"),
        (b'{"texts": ["\\ud800"]}', "not valid JSON"),  # a lone surrogate is no character
        (_nested(202), "nested deeper than 201 levels"),
        (_nested(100_000), "nested deeper than 201 levels"),
        (b'{"top_k": ' + b"9" * 5000 + b"}", "a number of more than 4,300 digits"),
        (b'{"instances": [' + b"1" * 4301 + b"]}", "a number of more than 4,300 digits"),
        (b'{"instances": [1] x', "not valid JSON"),
        (b"   ", "the body is empty"),
    ],
)
def test_bodies_that_are_not_json_get_400(search_client, raw, message):
    for path in ("/classify", "/search"):
        body = _error(search_client.post(path, content=raw, headers=JSON), 400)
        assert body["type"] == "bad_request"
        assert message in body["message"]


def test_the_parser_limits_are_where_the_contract_states_them(search_client):
    # One level less, and one digit less, is JSON: answered by the schema or the model (422).
    deepest = search_client.post("/classify", content=_nested(201), headers=JSON)
    assert "instances" in _error(deepest, 422)["message"]
    huge = (
        b'{"instances": [['
        + b"["
        + b"9" * 4300
        + b", 0, 0, 0, 0, 0, 0, 0],"
        + (b"[0, 0, 0, 0, 0, 0, 0, 0]," * 6)
        + b"[0, 0, 0, 0, 0, 0, 0, 0]]]}"
    )
    message = _error(search_client.post("/classify", content=huge, headers=JSON), 422)["message"]
    # It said "got null or mixed values".
    assert "instances[0] holds an integer beyond the range of float64" in message


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_declared_as_something_else_gets_415(search_client, content_type):
    response = search_client.post(
        "/classify", content=b'{"instances": []}', headers={"content-type": content_type}
    )
    body = _error(response, 415)
    assert body["type"] == "unsupported_media_type"
    assert "application/json" in body["message"]


@pytest.mark.parametrize(
    "content_type", [None, "application/json; charset=utf-8", "application/vnd.api+json"]
)
def test_json_media_types_and_none_are_read(search_client, content_type):
    headers = {} if content_type is None else {"content-type": content_type}
    response = search_client.post(
        "/classify", content=b'{"instances": [' + str(SEVEN).encode() + b"]}", headers=headers
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/classify", {"instances": [SEVEN], "top_k": "3"}, "top_k"),
        ("/classify", {"instances": [SEVEN], "top_k": True}, "top_k"),
        ("/classify", {"instances": [SEVEN], "top_k": 3.0}, "top_k"),
        ("/search", {"class": "7", "top_k": "3"}, "top_k"),
        ("/search", {"class": "7", "sparsity": True}, "sparsity"),
        ("/search", {"class": True}, "class"),
        ("/search", {"class": "7", "exclude": [True]}, "exclude[0]"),
        ("/search", {"class": "7", "exclude_positives": "false"}, "exclude_positives"),
        ("/search", {"code": {"indices": ["3"], "values": [1.0]}}, "code.indices[0]"),
    ],
)
def test_integers_and_booleans_are_strict(search_client, path, body, field):
    # "3" and true were read as 3 and 1.
    error = _error(search_client.post(path, json=body), 422)
    assert error["type"] == "invalid_request"
    assert error["details"][0]["location"].startswith(field)


def test_limits_are_stated_in_the_schema_and_enforced(search_client):
    spec = search_client.get("/openapi.json").json()
    atoms = spec["paths"]["/v1/models/{name}/atoms/{atom}"]["get"]
    (top_k,) = [p for p in atoms["parameters"] if p["name"] == "top_k"]
    assert {"type": "integer", "minimum": 1, "maximum": 1000} in top_k["schema"]["anyOf"]
    over = search_client.get("/v1/models/digits/atoms/1?top_k=1001")
    assert "at most 1000" in _error(over, 422)["message"]
    assert search_client.get("/v1/models/digits/atoms/1?top_k=1000").status_code == 200
    schemas = spec["components"]["schemas"]
    search_top_k = schemas["SearchRequest"]["properties"]["top_k"]["anyOf"][0]
    assert search_top_k["maximum"] == 1000
    instances = schemas["ClassifyRequest"]["properties"]["instances"]["anyOf"][0]
    assert (instances["minItems"], instances["maxItems"]) == (1, 50)
    assert (
        "16,777,216 bytes" in spec["paths"]["/classify"]["post"]["responses"]["413"]["description"]
    )
    batch = search_client.post("/classify", json={"instances": [SEVEN] * 51})
    assert "the limit is 50" in _error(batch, 413)["message"]


def test_every_route_documents_its_errors_with_the_error_body(search_client):
    spec = search_client.get("/openapi.json").json()
    error_body = {"$ref": "#/components/schemas/ErrorResponse"}
    protocol_error = {"$ref": "#/components/schemas/ProtocolError"}
    expected = {
        ("/classify", "post"): {"400", "404", "413", "415", "422", "503"},
        ("/search", "post"): {"400", "404", "413", "415", "422", "503"},
        ("/v1/models/{name}/atoms/{atom}", "get"): {"404", "422", "503"},
        ("/v1/models/{name}", "get"): {"404", "503"},
        ("/readyz", "get"): {"503"},
        ("/v2/repository/index", "post"): {"400", "401", "403", "413", "415", "422"},
        ("/v2/repository/models/{name}/load", "post"): {"401", "403", "404", "409"},
    }
    for (path, method), statuses in expected.items():
        responses = spec["paths"][path][method]["responses"]
        assert statuses <= responses.keys(), (path, sorted(responses))
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    expected_body = protocol_error if is_protocol_route(path) else error_body
                    assert schema == expected_body, (path, method, status)
                    assert status != "422" or not is_protocol_route(path), (path, method)


def test_what_the_routes_answer_is_what_they_document(search_client):
    spec = search_client.get("/openapi.json").json()
    answers = [
        ("post", "/classify", search_client.post("/classify", content=b"{", headers=JSON)),
        (
            "post",
            "/search",
            search_client.post("/search", content=b"x", headers={"content-type": "text/csv"}),
        ),
        ("get", "/v1/models/{name}/atoms/{atom}", search_client.get("/v1/models/digits/atoms/x")),
        ("post", "/v2/repository/index", search_client.post("/v2/repository/index")),
        ("post", "/classify", search_client.post("/classify", json={"instances": [[1]]})),
    ]
    for method, path, response in answers:
        assert str(response.status_code) in spec["paths"][path][method]["responses"], (
            path,
            response.status_code,
        )
        assert set(response.json()) == {"error"}
