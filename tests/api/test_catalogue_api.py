"""The catalogue as a live index through the HTTP API: upserts and deletions under concurrent
searches, kill -9 during updates, filters and pages against numpy, a sharded catalogue against
one shard, and every worker serving an update. Real server processes for the main paths, an
in-process client for the error paths."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.api import Settings, create_app
from service.model.search import read_catalogue, search_dir
from service.model.search.layout import catalogue_dir
from tests.api.conftest import server_process, serving
from tests.catalogues import attributes_of, rebuild_catalogue

TOKEN = "catalogue-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PHOTO = {"value": "photo"}
# Only to turn a hang into a failure.
WAIT_S = 60.0


def copy_with_catalogue(source: Path, path: Path, digits, shard_items: int, attributes=None):
    """A copy of the model at ``source`` with its catalogue rebuilt (see
    :func:`tests.catalogues.rebuild_catalogue`)."""
    shutil.copytree(source, path)
    return rebuild_catalogue(path, digits, shard_items, attributes)


@pytest.fixture(scope="module")
def attributed_model(search_model_dir, digits, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("catalogue") / "digits"
    return copy_with_catalogue(search_model_dir, path, digits, 300, attributes_of(797))


@pytest.fixture
def client(attributed_model, tmp_path):
    """An in-process client on a copy (updates change it), with the admin token set."""
    copy = tmp_path / "digits"
    shutil.copytree(attributed_model, copy)
    settings = Settings(_env_file=None, model_dir=copy, admin_token=TOKEN, max_batch_size=50)
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def images(digits, n: int, start: int = 0) -> list:
    return digits.X_train[start : start + n].reshape(n, 8, 8).tolist()


def upsert(url: str, ids, instances, attributes=None, http=httpx) -> dict:
    body = {"ids": ids, "instances": instances}
    if attributes is not None:
        body["attributes"] = attributes
    response = http.post(f"{url}/v1/models/digits/catalogue/items", json=body, headers=AUTH,
                         timeout=WAIT_S)  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


# -- errors ------------------------------------------------------------------------------------


def _error(response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"ids": ["a"], "instances": [[[1.0, 2.0]]]}, 422, "instances[0] has shape [1, 2]"),
        ({"ids": ["a", "b"], "instances": "images"}, 422, "instances"),
        ({"ids": ["a", "b"], "instances": 1}, 422, "instances"),
        ({"ids": [""], "instances": "one"}, 422, "ids[0] is empty"),
        ({"ids": ["a", "a"], "instances": "two"}, 422, "'a' is given twice"),
        ({"ids": ["a", "b"], "instances": "one"}, 422, "2 ids but 1 instances"),
        ({"ids": [], "instances": []}, 422, "ids is empty"),
        ({"ids": [f"n-{j}" for j in range(51)], "instances": "one"}, 413, "the limit is 50"),
        (
            {"ids": ["a"], "instances": "one", "attributes": [{"year": "old"}]},
            422,
            "'year' holds numbers",
        ),
        ({"ids": ["a"], "instances": "one", "attributes": [{"tags": [1]}]}, 422, "attributes"),
        ({"ids": ["a"], "instances": "one", "colour": "red"}, 422, "Extra inputs"),
    ],
)
def test_bad_upserts_get_a_clear_4xx(client, digits, body, status, message):
    named = {"one": images(digits, 1), "two": images(digits, 2)}
    instances = body["instances"]
    body = {**body, "instances": named[instances] if instances in ("one", "two") else instances}
    response = client.post("/v1/models/digits/catalogue/items", json=body, headers=AUTH)
    assert message in _error(response, status)
    assert client.get("/v1/models/digits/catalogue").json()["version"] == 1  # nothing written


def test_updates_need_the_admin_token(client, digits, attributed_model, tmp_path):
    body = {"ids": ["a"], "instances": images(digits, 1)}
    assert "Bearer" in _error(client.post("/v1/models/digits/catalogue/items", json=body), 401)
    wrong = {"Authorization": "Bearer nope"}
    response = client.post("/v1/models/digits/catalogue/delete", json={"ids": ["a"]}, headers=wrong)
    _error(response, 401)
    settings = Settings(_env_file=None, model_dir=attributed_model)  # no ADMIN_TOKEN
    with TestClient(create_app(settings), raise_server_exceptions=False) as no_admin:
        response = no_admin.post("/v1/models/digits/catalogue/items", json=body, headers=AUTH)
        assert "ADMIN_TOKEN" in _error(response, 403)


def test_with_a_key_file_updates_need_an_admin_key_and_reads_a_read_key(
    attributed_model, digits, tmp_path
):
    copy = tmp_path / "digits"
    shutil.copytree(attributed_model, copy)
    keys = tmp_path / "keys.txt"
    keys.write_text("reader-key read\nadmin-key admin\n")
    settings = Settings(_env_file=None, model_dir=copy, api_keys_file=keys)
    reader, admin = {"X-API-Key": "reader-key"}, {"Authorization": "Bearer admin-key"}
    items = "/v1/models/digits/catalogue/items"
    body = {"ids": ["keyed"], "instances": images(digits, 1)}
    with TestClient(create_app(settings), raise_server_exceptions=False) as keyed:
        assert "read scope" in _error(keyed.post(items, json=body, headers=reader), 403)
        delete = "/v1/models/digits/catalogue/delete"
        deleting = keyed.post(delete, json={"ids": ["0"]}, headers=reader)
        assert "needs admin" in _error(deleting, 403)
        _error(keyed.get("/v1/models/digits/catalogue"), 401)
        assert keyed.get("/v1/models/digits/catalogue", headers=reader).json()["version"] == 1
        assert keyed.post(items, json=body, headers=admin).json()["catalogue_version"] == 2
        item = keyed.get(f"{items}/keyed", headers=reader)
        assert item.json()["catalogue_version"] == 2
        paths = keyed.get("/openapi.json", headers=reader).json()["paths"]
    assert "403" in paths["/v1/models/{name}/catalogue/items"]["post"]["responses"]
    assert {"bearerKey": []} in paths["/v1/models/{name}/catalogue"]["get"]["security"]


@pytest.mark.parametrize(
    ("search", "status", "message"),
    [
        ({"filter": {"must": [{"key": "colour", "match": {"value": "red"}}]}}, 422,
         "unknown attribute 'colour'; the catalogue's attributes are: 'source', 'weight', 'year'"),
        ({"filter": {"must": [{"key": "year", "match": {"value": "1999"}}]}}, 422,
         "attribute 'year' holds numbers, not '1999'"),
        ({"filter": {"must": [{"key": "source", "range": {"gte": 3}}]}}, 422,
         "range needs a number attribute"),
        ({"filter": {"must": [{"key": "year"}]}}, 422, "one of match or range"),
        ({"filter": {"must": [{"key": "year", "match": {"like": 3}}]}}, 422, "filter"),
        ({"filter": {"should": "year"}}, 422, "filter.should"),
        ({"cursor": "not-a-cursor"}, 422, "not a cursor of this service"),
        ({"offset": -1}, 422, "offset must be >= 0"),
        ({"offset": 10_001}, 422, "offset must be at most 10000 (MAX_SEARCH_OFFSET)"),
    ],
)  # fmt: skip
def test_bad_searches_get_a_clear_4xx(client, search, status, message):
    response = client.post("/search", json={"class": "7", **search})
    assert message in _error(response, status)


def test_a_cursor_of_a_replaced_version_is_a_409_naming_the_new_one(client, digits):
    page = client.post("/search", json={"class": "7", "top_k": 3}).json()
    assert page["catalogue_version"] == 1
    client.post("/v1/models/digits/catalogue/delete", json={"ids": ["test-1"]}, headers=AUTH)
    response = client.post(
        "/search", json={"class": "7", "top_k": 3, "cursor": page["next_cursor"]}
    )
    message = _error(response, 409)
    assert "catalogue version 1, which is no longer served: version 2 is" in message
    other = client.post("/search", json={"class": "3", "cursor": page["next_cursor"]})
    assert "version 1" in _error(other, 409)  # a stale cursor is stale whatever the query


def test_catalogue_routes_describe_items_and_updates(client, digits):
    info = client.get("/v1/models/digits/catalogue").json()
    assert info["version"] == 1
    assert info["n_items"] == 797
    assert info["shard_sizes"] == [300, 300, 197]
    assert info["attributes"] == {"source": "string", "weight": "number", "year": "number"}
    item = client.get("/v1/models/digits/catalogue/items/test-1").json()
    assert item["attributes"]["year"] == attributes_of(797)[1]["year"]
    assert "no catalogue item 'nope'" in _error(
        client.get("/v1/models/digits/catalogue/items/nope"), 404
    )
    done = client.post("/v1/models/digits/catalogue/delete", json={"ids": ["test-2", "nope"]},
                       headers=AUTH).json()  # fmt: skip
    assert (done["deleted"], done["missing"], done["catalogue_version"]) == (1, ["nope"], 2)
    assert client.get("/v1/models/digits/catalogue/items/test-2").status_code == 404
    assert client.get("/v1/models/digits").json()["search"]["catalogue_version"] == 2


# -- through a real server ---------------------------------------------------------------------


def test_upserts_and_deletes_under_concurrent_searches_never_mix_versions(
    attributed_model, digits, tmp_path
):
    model = tmp_path / "digits"
    shutil.copytree(attributed_model, model)
    live = {1: {f"test-{j}" for j in range(797)}}
    answers: list[tuple[int, list[str]]] = []
    failures: list[str] = []
    stop = threading.Event()
    # A code query of every item: each answer must be exactly the live items of its version.
    query = {"code": {"indices": [3], "values": [1.0]}, "top_k": 1000}

    def search(url: str) -> None:
        with httpx.Client(timeout=WAIT_S) as http:
            while not stop.is_set():
                response = http.post(f"{url}/search", json=query)
                if response.status_code != 200:
                    failures.append(f"{response.status_code} {response.text[:200]}")
                    continue
                body = response.json()
                answers.append((body["catalogue_version"], [h["id"] for h in body["results"]]))

    with serving(model, ADMIN_TOKEN=TOKEN) as url:
        searchers = [threading.Thread(target=search, args=(url,)) for _ in range(3)]
        for thread in searchers:
            thread.start()
        try:
            with httpx.Client(timeout=WAIT_S) as http:
                current = set(live[1])
                for r in range(8):
                    ids = [f"new-{r}-{j}" for j in range(10)] + [f"test-{r}"]  # test-r replaced
                    done = upsert(url, ids, images(digits, 11, 11 * r), http=http)
                    current |= set(ids)
                    live[done["catalogue_version"]] = set(current)
                    gone = [f"test-{100 + r}", f"new-{r}-0"]
                    response = http.post(f"{url}/v1/models/digits/catalogue/delete",
                                         json={"ids": gone}, headers=AUTH)  # fmt: skip
                    current -= set(gone)
                    live[response.json()["catalogue_version"]] = set(current)
                    time.sleep(0.05)
        finally:
            stop.set()
            for thread in searchers:
                thread.join()
    assert not failures
    assert sorted(live) == list(range(1, 18))
    seen = {version for version, _ in answers}
    assert len(seen) >= 5, seen  # the searches ran across the updates
    for version, ids in answers:
        assert len(ids) == len(set(ids)) == len(live[version])
        assert set(ids) == live[version], version


def test_kill_9_during_updates_loses_no_acknowledged_item(attributed_model, digits, tmp_path):
    model = tmp_path / "digits"
    shutil.copytree(attributed_model, model)
    acknowledged: list[str] = []
    for round_ in range(3):
        stop = threading.Event()

        def write(url: str, round_: int = round_, stop: threading.Event = stop) -> None:
            with httpx.Client(timeout=WAIT_S) as http:
                j = 0
                while not stop.is_set():
                    item = f"kill-{round_}-{j}"
                    try:
                        response = http.post(
                            f"{url}/v1/models/digits/catalogue/items",
                            json={"ids": [item], "instances": images(digits, 1, j % 100),
                                  "attributes": [{"source": "scan"}]},
                            headers=AUTH,
                        )  # fmt: skip
                    except httpx.TransportError:
                        return  # killed with the request in flight: not acknowledged
                    if response.status_code == 200:
                        acknowledged.append(item)
                    j += 1

        with server_process(model, ADMIN_TOKEN=TOKEN) as server:
            writer = threading.Thread(target=write, args=(server.url,))
            writer.start()
            deadline = time.monotonic() + WAIT_S
            while len(acknowledged) < 5 * (round_ + 1) and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.05 + 0.1 * round_)  # somewhere inside a write
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=WAIT_S)
            stop.set()
            writer.join()
    assert len(acknowledged) >= 15
    # A new process on the same directory: ready, and every acknowledged item is there.
    with serving(model, ADMIN_TOKEN=TOKEN) as url, httpx.Client(timeout=WAIT_S) as http:
        info = http.get(f"{url}/v1/models/digits/catalogue").json()
        assert info["n_items"] >= 797 + len(acknowledged)
        for item in acknowledged:
            response = http.get(f"{url}/v1/models/digits/catalogue/items/{item}")
            assert response.status_code == 200, item
            assert response.json()["attributes"] == {"source": "scan"}
        scans = {"must": [{"key": "source", "match": {"value": "scan"}}]}
        body = {"class": "7", "top_k": 1000, "filter": scans}
        hits = http.post(f"{url}/search", json=body).json()["results"]
        assert set(acknowledged) <= {hit["id"] for hit in hits}
        # Nothing a killed writer left half done survives the next write.
        done = upsert(url, ["after-the-kills"], images(digits, 1), http=http)
    catalogue = read_catalogue(catalogue_dir(model), search_dir(model))
    assert catalogue.version == done["catalogue_version"]
    assert catalogue.n_items == info["n_items"] + 1
    assert not [p for p in catalogue_dir(model).rglob(".*")]
    assert len(list((catalogue_dir(model) / "shards").iterdir())) <= len(catalogue.shards) + 1


def test_filters_and_pages_through_the_server_are_exact_against_numpy(attributed_model, digits):
    records = attributes_of(797)
    catalogue = read_catalogue(catalogue_dir(attributed_model), search_dir(attributed_model))
    projected = np.asarray(catalogue.projected, dtype=np.float64)
    atoms, weights = [5, 17, 40], [1.0, -0.5, 0.75]
    scores = np.asarray(weights) @ projected[atoms]
    scans = {"must": [{"key": "source", "match": {"value": "scan"}}]}
    ends = {
        "must_not": [{"key": "source", "match": {"any": ["scan", "photo"]}}],
        "should": [{"key": "year", "range": {"gte": 2020}}, {"key": "year", "range": {"lt": 1992}}],
    }
    cases = [
        (scans, lambda r: r.get("source") == "scan"),
        (ends, lambda r: r.get("source") not in ("scan", "photo")
         and (r["year"] >= 2020 or r["year"] < 1992)),
        ({"must": [{"key": "year", "match": {"value": 2003}}]}, lambda r: r["year"] == 2003),
    ]  # fmt: skip
    with serving(attributed_model) as url, httpx.Client(timeout=WAIT_S) as http:
        for query_filter, predicate in cases:
            mask = np.array([predicate(r) for r in records])
            allowed = np.flatnonzero(mask)
            expected = allowed[np.argsort(-scores[allowed], kind="stable")]
            query = {"code": {"indices": atoms, "values": weights}, "filter": query_filter}
            top = http.post(f"{url}/search", json={**query, "top_k": 20}).json()["results"]
            assert [h["id"] for h in top] == [f"test-{j}" for j in expected[:20]]
            np.testing.assert_allclose([h["score"] for h in top], scores[expected[:20]],
                                       rtol=1e-12, atol=1e-12)  # fmt: skip
            # Pages of 7 by cursor: the whole filtered ranking, no gap, no repeat.
            pages, cursor = [], None
            while True:
                body = {**query, "top_k": 7, **({"cursor": cursor} if cursor else {})}
                answer = http.post(f"{url}/search", json=body).json()
                pages += [h["id"] for h in answer["results"]]
                cursor = answer["next_cursor"]
                if cursor is None:
                    break
            assert pages == [f"test-{j}" for j in expected]
            by_offset = http.post(f"{url}/search", json={**query, "top_k": 7, "offset": 14}).json()
            assert [h["id"] for h in by_offset["results"]] == pages[14:21]


def test_a_sharded_catalogue_answers_as_one_shard_through_the_server(
    search_model_dir, digits, tmp_path
):
    repository = tmp_path / "repository"
    records = attributes_of(797, seed=3)
    copy_with_catalogue(search_model_dir, repository / "one", digits, 10_000, records)
    copy_with_catalogue(search_model_dir, repository / "sharded", digits, 64, records)
    queries = [
        {"class": "4", "top_k": 50},
        {"code": {"indices": [1, 2, 3, 4, 5], "values": [1.0, 1.0, -1.0, 0.5, 2.0]}, "top_k": 797},
        {"positives": ["test-8", "test-80"], "top_k": 30},
        {"class": "9", "top_k": 40, "filter": {"must": [{"key": "source", "match": PHOTO}]}},
        {"class": "2", "top_k": 25, "offset": 100},
    ]  # fmt: skip
    with serving(MODEL_REPOSITORY=str(repository)) as url, httpx.Client(timeout=WAIT_S) as http:
        info = http.get(f"{url}/v1/models/sharded/catalogue").json()
        assert info["n_shards"] == 13
        for query in queries:
            one = http.post(f"{url}/v1/models/one/search", json=query).json()
            sharded = http.post(f"{url}/v1/models/sharded/search", json=query).json()
            assert sharded["results"] == one["results"], query
            assert sharded["code"] == one["code"]


def test_every_worker_serves_an_update_at_once(attributed_model, digits, tmp_path):
    # No polling (RELOAD_INTERVAL_S=0): the worker that wrote the update has the supervisor
    # pass a SIGHUP to every worker.
    model = tmp_path / "digits"
    shutil.copytree(attributed_model, model)
    with serving(model, ADMIN_TOKEN=TOKEN, WORKERS="2", RELOAD_INTERVAL_S="0") as url:
        done = upsert(url, ["late-0"], images(digits, 1))
        assert done["catalogue_version"] == 2
        deadline = time.monotonic() + WAIT_S
        fresh = 0
        while fresh < 30:  # 30 answers in a row on new connections, whichever worker takes each
            assert time.monotonic() < deadline, "a worker kept serving the old version"
            answer = httpx.post(f"{url}/search", json={"class": "7", "top_k": 1}, timeout=WAIT_S)
            fresh = fresh + 1 if answer.json()["catalogue_version"] == 2 else 0
            if not fresh:
                time.sleep(0.05)
