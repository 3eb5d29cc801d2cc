"""Property-based fuzzing of every route from the server's own OpenAPI document (schemathesis):
for an image, a text and a search model, each served by a real server process, and the
repository routes with and without ADMIN_TOKEN. No answer is a 5xx, and every answer, the 4xx
included, has a status the document lists for its route, the body schema and the content type it
gives. Bounded: a few examples per operation, derandomized (the same cases every run)."""

from __future__ import annotations

import shutil
from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.conftest import server_process

pytestmark = pytest.mark.slow

ADMIN_TOKEN = "fuzz-token"
# Examples per operation and generation mode (valid and invalid data): with 13 operations, three
# models and the token, about 1,000 requests.
EXAMPLES = 10
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
SERVED = {
    # name: (model fixture, settings)
    "image": ("digits_model_dir", {}),
    "text": ("text_model_dir", {"ADMIN_TOKEN": ADMIN_TOKEN}),
    "search": ("search_model_dir", {}),
}


@pytest.fixture(scope="module", params=list(SERVED))
def served(request, tmp_path_factory):
    fixture, extra = SERVED[request.param]
    # A copy: a fuzzed repository route may reload or unload the model, never touch the shared
    # artifact.
    model = tmp_path_factory.mktemp("fuzz") / request.param
    shutil.copytree(request.getfixturevalue(fixture), model)
    with server_process(model, **extra) as server:
        yield request.param, server


def _operations(url: str):
    """Every operation of the server's OpenAPI document, loaded from the server."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def _fuzz(
    operation,
    mode: GenerationMode,
    url: str,
    headers: dict | None,
    statuses: Counter,
    path_parameters: dict | None = None,
) -> None:
    @given(operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,  # the same cases every run
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # a failure shows its case, unshrunk
        suppress_health_check=list(HealthCheck),
    )
    def answers_as_documented(case):
        response = case.call_and_validate(base_url=url, headers=headers, checks=CHECKS, timeout=60)
        statuses[response.status_code] += 1

    try:
        answers_as_documented()
    except Unsatisfiable:
        if mode is GenerationMode.POSITIVE:
            raise
        # Nothing of the operation can be invalid (GET /healthz takes no input).


def test_every_answer_is_documented_and_no_server_error(served):
    name, server = served
    operations = _operations(server.url)
    statuses: Counter[int] = Counter()
    assert len(operations) >= 13  # every route of the document, the repository's included
    (model,) = [m["name"] for m in httpx.get(f"{server.url}/v1/models").json()["models"]]
    for operation in operations:
        admin = operation.path.startswith("/v2/repository")
        for mode in GenerationMode:
            _fuzz(operation, mode, server.url, None, statuses)
            if "{name}" in operation.path and not admin:  # the served model's routes too
                _fuzz(operation, mode, server.url, None, statuses, {"name": model})
            if admin and name == "text":
                # With the token the routes act (index, load, unload answer 200, 404, 409, 422);
                # without it, and where no token is set, they answer 401 or 403.
                token = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
                _fuzz(operation, mode, server.url, token, statuses)
        assert server.process.poll() is None, operation.label
    print(name, sorted(statuses.items()))
    # Both kinds of data reached the models: answered, and refused with a documented 4xx.
    assert {200, 404, 422} <= statuses.keys()
    assert sum(statuses.values()) > 100
