"""POST /search and GET /v1/models/{name}/atoms/{a}: a real server for the main paths, an
in-process client for the error paths."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.api import Settings, create_app
from service.model import Predictor
from service.model.search import SearchIndex, SearchQuery
from tests.api.conftest import serving

# An 8x8 image of values from 1e20 to 1e308.
ABSURD = np.logspace(20, 308, 64).reshape(8, 8).tolist()


@pytest.fixture(scope="module")
def search_server(search_model_dir):
    with serving(search_model_dir) as url:
        yield url


@pytest.fixture(scope="module")
def index(search_model_dir) -> SearchIndex:
    return SearchIndex.load(search_model_dir, Predictor.load(search_model_dir))


@pytest.fixture(scope="module")
def search_client(search_model_dir):
    settings = Settings(_env_file=None, model_dir=search_model_dir, max_batch_size=50)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


def test_class_search_through_the_server(search_server, index):
    response = httpx.post(f"{search_server}/search", json={"class": "7", "top_k": 5})
    assert response.status_code == 200, response.text
    body = response.json()
    expected = index.run(SearchQuery(class_label="7", top_k=5))
    assert [hit["id"] for hit in body["results"]] == [i for i, _ in expected.items]
    np.testing.assert_allclose([hit["score"] for hit in body["results"]],
                               [s for _, s in expected.items])  # fmt: skip
    assert body["query"] == "class"
    assert body["sparsity"] == len(body["code"]["indices"]) == expected.code.n_nonzero
    assert body["code"]["indices"] == expected.code.atoms.tolist()
    assert body["strongest_atoms"] is None
    assert body["n_positives"] is None


def test_a_learned_code_can_be_sent_back_as_a_code(search_server):
    learned = httpx.post(
        f"{search_server}/search",
        json={"positives": ["test-9", "test-13", "test-19"], "top_k": 10, "sparsity": 4},
    ).json()
    assert learned["query"] == "positives"
    assert learned["n_positives"] == 3
    assert 1 <= learned["sparsity"] <= 4
    assert not {"test-9", "test-13", "test-19"} & {h["id"] for h in learned["results"]}
    code = learned["code"]
    again = httpx.post(
        f"{search_server}/search",
        json={
            "code": {"indices": code["indices"], "values": code["values"]},
            "bias": code["bias"],
            "top_k": 10,
            "exclude": ["test-9", "test-13", "test-19"],
        },
    ).json()
    assert again["results"] == learned["results"]


def assert_ranked_by(hits, reference: np.ndarray, k: int):
    """``hits`` are the top k catalogue items (``test-<position>`` ids) by ``reference``, best
    first, with its scores. A score on one atom is that atom's float32 value (times the sign):
    exact in float64, so a few ulps of tolerance; items tied within it may come in any order."""
    tolerance = 4 * np.finfo(np.float64).eps * float(np.abs(reference).max())
    positions = np.array([int(hit["id"].split("-")[1]) for hit in hits])
    assert len(hits) == k == len(set(positions.tolist()))
    scores = [hit["score"] for hit in hits]
    np.testing.assert_allclose(scores, reference[positions], rtol=0, atol=tolerance)
    assert (np.diff(reference[positions]) <= 2 * tolerance).all()
    kth = np.sort(reference)[::-1][k - 1]
    assert (reference[positions] >= kth - 2 * tolerance).all()
    assert (np.delete(reference, positions) <= kth + 2 * tolerance).all()


def test_strongest_atoms_and_the_atoms_endpoint(search_server, index):
    # A class whose two strongest atoms have opposite signs: items are ranked highest first for
    # a positive weight, lowest first for a negative one.
    codes = index.model.codes
    strongest = np.take_along_axis(codes, np.argsort(-np.abs(codes), axis=0)[:2], axis=0)
    k = int(np.flatnonzero((strongest > 0).any(axis=0) & (strongest < 0).any(axis=0))[0])
    label, z = index.model.classes[k], codes[:, k]
    body = httpx.post(
        f"{search_server}/search", json={"class": label, "top_k": 3, "strongest_atoms": 2}
    ).json()
    atoms = body["strongest_atoms"]
    assert [a["atom"] for a in atoms] == body["code"]["indices"][:2]
    # Against the model's code and the catalogue, ranked with numpy.
    chosen = [a["atom"] for a in atoms]
    np.testing.assert_array_equal(np.abs(z[chosen]), np.sort(np.abs(z))[::-1][:2])
    assert [a["weight"] for a in atoms] == z[chosen].tolist()
    projected = np.asarray(index.catalogue.projected, dtype=np.float64)
    for atom in atoms:
        assert_ranked_by(atom["items"], np.sign(atom["weight"]) * projected[atom["atom"]], 5)
    positive = next(a for a in atoms if a["weight"] > 0)
    page = httpx.get(f"{search_server}/v1/models/digits/atoms/{positive['atom']}?top_k=5")
    assert page.status_code == 200
    assert page.json()["results"] == positive["items"]
    # The atom that most classes use: its 10 best items, and those classes by decreasing |z|.
    atom = int(np.argmax((codes != 0).sum(axis=1)))
    page = httpx.get(f"{search_server}/v1/models/digits/atoms/{atom}").json()
    assert_ranked_by(page["results"], projected[atom], 10)
    users = np.flatnonzero(codes[atom])
    assert len(users) >= 2
    classes = page["classes"]
    assert sorted(c["label"] for c in classes) == sorted(index.model.classes[j] for j in users)
    assert [c["weight"] for c in classes] == [
        codes[atom, index.model.classes.index(c["label"])] for c in classes
    ]
    assert (np.diff([abs(c["weight"]) for c in classes]) <= 0).all()


def test_model_info_describes_the_search_model(search_server, index):
    info = httpx.get(f"{search_server}/v1/models/digits").json()["search"]
    assert info["n_atoms"] == index.model.n_atoms
    assert info["catalogue_size"] == 797
    assert info["feature_space"] == "inputs"
    assert info["n_nonzero"] == 10


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"class": "11"}, 422, "unknown class '11'"),
        ({"class": "1", "code": {"indices": [1], "values": [1.0]}}, 422, "exactly one"),
        ({}, 422, "exactly one"),
        ({"code": {"indices": [64], "values": [1.0]}}, 422, "code index 64 is out of range"),
        ({"code": {"indices": [1, 2], "values": [1.0]}}, 422, "one length"),
        # Finite, but the scores would overflow to infinity, which JSON cannot carry.
        (
            {"code": {"indices": [1], "values": [1.7e308]}, "bias": 1.7e308},
            422,
            "at most 1e+100 in magnitude",
        ),
        ({"positives": []}, 422, "positives is empty"),
        ({"positives": ["nope"]}, 422, "unknown catalogue positive(s): 'nope'"),
        ({"class": "1", "negatives": ["test-1"]}, 422, "negatives go with positives"),
        # It answered 200 with a code of weight 0, which ranks nothing.
        (
            {"positives": ["test-1", "test-4"], "negatives": ["test-1"]},
            422,
            "among both positives and negatives: 'test-1'",
        ),
        ({"class": "1", "top_k": 0}, 422, "top_k must be at least 1, got 0"),
        ({"class": "1", "top_k": 1001}, 422, "top_k must be at most 1000"),
        ({"class": "1", "exclude": ["x"]}, 422, "unknown catalogue id(s): 'x'"),
        ({"class": "1", "sparsity": 0}, 422, "sparsity must be at least 1, got 0"),
        ({"class": "1", "strongest_atoms": 101}, 422, "strongest_atoms must be at most 100"),
        ({"class": "1", "strongest_atoms": -1}, 422, "strongest_atoms must be >= 0"),
        ({"class": "1", "colour": "red"}, 422, "Extra inputs are not permitted"),
        ({"positives": [f"test-{i}" for i in range(51)]}, 413, "the limit is 50"),
        # Finite but absurd: learning the code took seconds, and kept one meaningless atom.
        ({"positives": [ABSURD]}, 422, "positives[0] lies over 1.8e308 times farther"),
        ({"positives": ["test-1", ABSURD]}, 422, "positives[1] lies"),
        ({"positives": ["test-1"], "negatives": [[[1e20] * 8] * 8]}, 422, "negatives[0] lies"),
    ],
)
def test_bad_searches_get_a_clear_4xx(search_client, body, status, message):
    response = search_client.post("/search", json=body)
    assert response.status_code == status, response.text
    assert message in response.text


def test_atom_errors(search_client):
    assert search_client.get("/v1/models/digits/atoms/64").status_code == 404
    assert "no atom 64" in search_client.get("/v1/models/digits/atoms/64").text
    assert search_client.get("/v1/models/other/atoms/1").status_code == 404
    response = search_client.get("/v1/models/digits/atoms/1?top_k=5000")
    assert response.status_code == 422
    assert "at most 1000" in response.text


def test_a_model_without_search_answers_404(client):
    response = client.post("/search", json={"class": "1"})
    assert response.status_code == 404
    assert "python -m training dictionary" in response.json()["error"]["message"]
    assert client.get("/v1/models/digits").json()["search"] is None


@pytest.mark.parametrize("field", ["exclude", "positives"])
def test_an_id_longer_than_every_catalogue_id_costs_nothing_and_is_not_echoed(search_client, field):
    long_id = "test-1" + "0" * 10_000_000  # 10 MB: widening the catalogue's ids would take GBs
    body = {"class": "7", "exclude": [long_id]} if field == "exclude" else {"positives": [long_id]}
    response = search_client.post("/search", json=body)
    assert response.status_code == 422
    assert "unknown catalogue" in response.json()["error"]["message"]
    assert len(response.content) < 1_000
    unknown_class = search_client.post("/search", json={"class": "7" * 1_000_000})
    assert unknown_class.status_code == 422
    assert len(unknown_class.content) < 1_000
