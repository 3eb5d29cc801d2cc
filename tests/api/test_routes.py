"""The shape of the HTTP layer: every route is a coroutine with no dependencies, so no request
makes a trip through the thread pool that its work does not need; and every body a route reads
itself is documented in the OpenAPI schema."""

import inspect

from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from service.api import Settings, create_app


def test_every_route_is_async_without_dependencies(digits_model_dir):
    app = create_app(Settings(_env_file=None, model_dir=digits_model_dir))
    routes = [r for r in app.router.routes if isinstance(r, APIRoute)]
    assert {"/classify", "/search", "/v1/models/{name}/classify"} <= {r.path for r in routes}
    for route in routes:
        assert inspect.iscoroutinefunction(route.endpoint), route.path
        assert route.dependant.dependencies == [], route.path
        # Bodies are read by the route (one validation pass over the bytes), not by FastAPI.
        assert route.dependant.body_params == [], route.path


def test_bodies_read_by_routes_are_in_the_openapi_schema(digits_model_dir):
    app = create_app(Settings(_env_file=None, model_dir=digits_model_dir))
    with TestClient(app) as client:
        spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for path, name in [
        ("/classify", "ClassifyRequest"),
        ("/v1/models/{name}/classify", "ClassifyRequest"),
        ("/search", "SearchRequest"),
        ("/v1/models/{name}/search", "SearchRequest"),
        ("/search", "SearchBatchRequest"),
        ("/v1/models/{name}/search", "SearchBatchRequest"),
        ("/v2/repository/index", "RepositoryIndexRequest"),
        ("/v1/models/{name}/catalogue/count", "CountRequest"),
        ("/v1/models/{name}/catalogue/facet", "FacetRequest"),
    ]:
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        # One schema, or one of several (/search: one query or a batch).
        refs = [option["$ref"] for option in body["schema"].get("oneOf", [body["schema"]])]
        assert f"#/components/schemas/{name}" in refs, path
        assert name in schemas
    # Nested models of a body resolve too.
    assert "CodeIn" in schemas
    assert schemas["SearchRequest"]["properties"]["top_k"]["minimum"] == 1
