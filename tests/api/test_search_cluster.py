"""Catalogues searched on a Dask cluster (SEARCH_CLUSTER): a 2-worker LocalCluster of ours
(processes, not distributed.utils_test) holds the shards in actors; a real server fans each
search out to them. Its answers equal the in-process server's, batches, counts and facets
included; a shard that misses its deadline makes a search answer 503, or a partial answer when
allowed; a lost worker's shards come back."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from service.model.search.snapshots import read_snapshot, snapshot_model_catalogue
from tests.api.conftest import serving
from tests.api.test_catalogue_api import AUTH, TOKEN, copy_with_catalogue, images
from tests.catalogues import attributes_of

pytestmark = pytest.mark.slow
WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        env={"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
    ) as local:
        yield local


@pytest.fixture
def model(search_model_dir, digits, tmp_path):
    """The digits model with a catalogue of 3 shards (300, 300, 197 items) with attributes."""
    return copy_with_catalogue(search_model_dir, tmp_path / "digits", digits, 300,
                               attributes_of(797, seed=5))  # fmt: skip


QUERIES = [
    {"class": "7", "top_k": 20},
    {"code": {"indices": [3, 11, 50], "values": [1.0, -0.5, 0.25]}, "top_k": 797},
    {"positives": ["test-3", "test-400", "test-700"], "top_k": 25},
    {"class": "1", "top_k": 30, "exclude": ["test-0", "test-301", "test-796"]},
    {"class": "9", "top_k": 15, "filter": {"must": [{"key": "source", "match": {"value": "scan"}}],
                                           "must_not": [{"key": "year", "range": {"lt": 2000}}]}},
    {"class": "2", "top_k": 10, "offset": 290},
]  # fmt: skip


def pages(http: httpx.Client, url: str, query: dict) -> list[str]:
    ids, cursor = [], None
    while True:
        answer = http.post(
            f"{url}/search", json={**query, **({"cursor": cursor} if cursor else {})}
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        ids += [hit["id"] for hit in body["results"]]
        cursor = body["next_cursor"]
        if cursor is None:
            return ids


def test_a_fan_out_over_a_two_worker_cluster_equals_the_in_process_search(cluster, model, digits):
    with (
        serving(model, RELOAD_INTERVAL_S="0.2") as local,
        serving(model, SEARCH_CLUSTER=cluster.scheduler_address, ADMIN_TOKEN=TOKEN) as remote,
        httpx.Client(timeout=WAIT_S) as http,
    ):
        info = http.get(f"{remote}/v1/models/digits/catalogue").json()
        assert info["shard_sizes"] == [300, 300, 197]
        for query in QUERIES:
            expected = http.post(f"{local}/search", json=query).json()
            answered = http.post(f"{remote}/search", json=query).json()
            assert answered["results"] == expected["results"], query
            assert answered["code"] == expected["code"]
            assert answered["partial"] is False
        paged = {"code": {"indices": [7], "values": [1.0]}, "top_k": 60,
                 "filter": {"should": [{"key": "year", "range": {"gte": 2015}}]}}  # fmt: skip
        assert pages(http, remote, paged) == pages(http, local, paged)
        # An upsert through the cluster's server: a new shard, a new actor; both servers agree.
        done = http.post(f"{remote}/v1/models/digits/catalogue/items", headers=AUTH, json={
            "ids": ["test-5", "new-1"], "instances": images(digits, 2),
            "attributes": [{"source": "scan", "year": 2024}, None],
        }).json()  # fmt: skip
        assert done["catalogue_version"] == 2
        deadline = time.monotonic() + WAIT_S
        while http.get(f"{local}/v1/models/digits/catalogue").json()["version"] != 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        for query in [*QUERIES, {"positives": ["new-1"], "top_k": 40}]:
            expected = http.post(f"{local}/search", json=query).json()
            answered = http.post(f"{remote}/search", json=query).json()
            assert answered["results"] == expected["results"], query
        item = http.get(f"{remote}/v1/models/digits/catalogue/items/test-5").json()
        assert item["attributes"] == {"source": "scan", "year": 2024.0}


def _worker_pids(cluster) -> list[int]:
    return [nanny.process.process.pid for nanny in cluster.workers.values()]


def test_a_shard_past_its_deadline_fails_the_search_or_is_left_out(cluster, model):
    with (
        serving(model, SEARCH_CLUSTER=cluster.scheduler_address, SEARCH_SHARD_TIMEOUT_S="1") as url,
        httpx.Client(timeout=WAIT_S) as http,
    ):
        full = http.post(f"{url}/search", json={"class": "4", "top_k": 797}).json()["results"]
        assert len(full) == 797
        frozen = _worker_pids(cluster)[0]
        os.kill(frozen, signal.SIGSTOP)  # its shards stop answering
        try:
            response = http.post(f"{url}/search", json={"class": "4", "top_k": 797})
            assert response.status_code == 503, response.text
            assert "did not answer within 1 s" in response.json()["error"]["message"]
            assert response.headers["retry-after"]
            partial = http.post(
                f"{url}/search", json={"class": "4", "top_k": 797, "allow_partial": True}
            ).json()
        finally:
            os.kill(frozen, signal.SIGCONT)
        assert partial["partial"] is True
        assert partial["missing_shards"]
        kept = [hit for hit in full if hit in partial["results"]]
        assert partial["results"] == kept  # the other shards' items, in the same order
        assert 0 < len(kept) < 797


def test_a_lost_worker_s_shards_are_held_again(cluster, model):
    with (
        serving(model, SEARCH_CLUSTER=cluster.scheduler_address, SEARCH_SHARD_TIMEOUT_S="5") as url,
        httpx.Client(timeout=WAIT_S) as http,
    ):
        expected = http.post(f"{url}/search", json={"class": "6", "top_k": 50}).json()["results"]
        os.kill(_worker_pids(cluster)[1], signal.SIGKILL)  # its nanny starts another
        statuses = []
        deadline = time.monotonic() + WAIT_S
        while True:
            response = http.post(f"{url}/search", json={"class": "6", "top_k": 50})
            statuses.append(response.status_code)
            if response.status_code == 200:
                break
            assert response.status_code == 503, response.text
            assert time.monotonic() < deadline, statuses
            time.sleep(0.2)
        assert response.json()["results"] == expected
        assert set(statuses) <= {200, 503}


def test_batches_counts_facets_and_snapshots_on_the_cluster_equal_the_in_process_ones(
    cluster, model, digits, tmp_path
):
    """Over a 2-worker cluster: a batch answers each query as the in-process server does alone;
    count and facet equal a brute-force count of the live items (after an upsert and a
    deletion: tombstones on the workers); a snapshot is the same files as one taken here."""
    records = {f"test-{j}": record for j, record in enumerate(attributes_of(797, seed=5))}
    scans = {"must": [{"key": "source", "match": {"value": "scan"}}]}
    recent = {"must": [{"key": "year", "range": {"gte": 2015}}], "must_not": [scans]}
    with (
        serving(model, RELOAD_INTERVAL_S="0.2") as local,
        serving(model, SEARCH_CLUSTER=cluster.scheduler_address, ADMIN_TOKEN=TOKEN,
                SNAPSHOTS_DIR=str(tmp_path / "kept")) as remote,
        httpx.Client(timeout=WAIT_S) as http,
    ):  # fmt: skip
        done = http.post(f"{remote}/v1/models/digits/catalogue/items", headers=AUTH, json={
            "ids": ["test-5", "new-1"], "instances": images(digits, 2),
            "attributes": [{"source": "scan", "year": 2024}, {"year": 2016}],
        }).json()  # fmt: skip
        records.update({"test-5": {"source": "scan", "year": 2024}, "new-1": {"year": 2016}})
        gone = http.post(f"{remote}/v1/models/digits/catalogue/delete", headers=AUTH,
                         json={"ids": ["test-2", "test-650"]}).json()  # fmt: skip
        del records["test-2"], records["test-650"]
        assert gone["catalogue_version"] == done["catalogue_version"] + 1 == 3
        deadline = time.monotonic() + WAIT_S
        while http.get(f"{local}/v1/models/digits/catalogue").json()["version"] != 3:
            assert time.monotonic() < deadline
            time.sleep(0.1)

        alone = [http.post(f"{local}/search", json=query).json() for query in QUERIES]
        batch = http.post(f"{remote}/search", json={"searches": QUERIES})
        assert batch.status_code == 200, batch.text
        batch = batch.json()["searches"]
        for query, answered, expected in zip(QUERIES, batch, alone, strict=True):
            assert answered["results"] == expected["results"], query
            assert answered["next_cursor"] == expected["next_cursor"]

        for query_filter, holds in [
            (None, lambda r: True),
            (scans, lambda r: r.get("source") == "scan"),
            (recent, lambda r: r["year"] >= 2015 and r.get("source") != "scan"),
        ]:
            body = {} if query_filter is None else {"filter": query_filter}
            expected = sum(holds(r) for r in records.values())
            for url in (local, remote):
                count = http.post(f"{url}/v1/models/digits/catalogue/count", json=body).json()
                assert count["count"] == expected, (url, query_filter)
            for key in ("source", "year"):
                tally: dict = {}
                for record in records.values():
                    if holds(record) and record.get(key) is not None:
                        value = record[key] if key == "source" else float(record[key])
                        tally[value] = tally.get(value, 0) + 1
                ranked = sorted(tally.items(), key=lambda item: (-item[1], item[0]))[:5]
                for url in (local, remote):
                    facet = http.post(f"{url}/v1/models/digits/catalogue/facet",
                                      json={"key": key, "limit": 5, **body}).json()  # fmt: skip
                    assert [(h["value"], h["count"]) for h in facet["hits"]] == ranked, url
                    assert facet["n_values"] == len(tally)

        taken = http.post(f"{remote}/v1/models/digits/catalogue/snapshots", headers=AUTH).json()
        assert taken["catalogue_version"] == 3
    here = snapshot_model_catalogue(model, tmp_path / "here")
    there = read_snapshot(tmp_path / "kept" / "digits" / taken["name"])
    assert there.checksums == here.checksums  # the same files, byte for byte
