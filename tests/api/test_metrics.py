"""GET /metrics, scraped from real server processes and parsed with prometheus-client's own
parser: the counts equal the requests sent, one worker or several."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.api.machinery.metrics import FOLD_DELAY_S, PrometheusMetrics
from service.model.artifact import manifest_digest
from tests.api.conftest import server_process, worker_pids

TOKEN = "metrics-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
METRIC_NAMES = {
    "besvm_http_requests": "counter",
    "besvm_http_request_duration_seconds": "histogram",
    "besvm_http_requests_in_flight": "gauge",
    "besvm_classify_batch_size": "histogram",
    "besvm_search_rows_read": "counter",
    "besvm_model_load_duration_seconds": "histogram",
    "besvm_model_load_failures": "counter",
    "besvm_model_version_info": "gauge",
}


@dataclasses.dataclass
class Scrape:
    """One scrape, parsed: every sample with its labels."""

    types: dict[str, str]
    samples: list

    @classmethod
    def of(cls, url: str) -> Scrape:
        response = httpx.get(f"{url}/metrics", timeout=30)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/plain")
        families = list(text_string_to_metric_families(response.text))
        return cls({f.name: f.type for f in families}, [s for f in families for s in f.samples])

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples named ``name`` whose labels include ``labels``."""
        return sum(
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def series(self, name: str, **labels: str) -> list:
        return [
            s
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]


def _images(digits, n: int) -> list:
    return digits.X_test[:n].reshape(n, 8, 8).tolist()


def _check_histograms_consistent(scrape: Scrape, name: str) -> None:
    """Per series: cumulative buckets, +Inf bucket == _count."""
    counts = scrape.series(f"{name}_count")
    assert counts
    for count in counts:
        buckets = sorted(
            (float(s.labels["le"]), s.value)
            for s in scrape.series(f"{name}_bucket", **count.labels)
        )
        values = [v for _, v in buckets]
        assert values == sorted(values)
        assert buckets[-1] == (float("inf"), count.value)


def _version_served(scrape: Scrape, model: str) -> str:
    (served,) = [s for s in scrape.series("besvm_model_version_info", model=model) if s.value == 1]
    return served.labels["version"]


def _models(url: str) -> dict[str, dict]:
    return {m["name"]: m for m in httpx.get(f"{url}/v1/models", timeout=30).json()["models"]}


def _wait_for(condition: Callable[[], object], what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.slow
def test_metrics_count_the_requests_sent(tmp_path, digits, digits_fit, search_model_dir):
    repository = tmp_path / "repository"
    repository.mkdir()
    shutil.copytree(search_model_dir, repository / "digits")
    # A second model whose version will be replaced, and one that cannot load.
    digits_fit.predictor.save(repository / "other")
    (repository / "broken").mkdir()
    (repository / "broken" / "manifest.json").write_text("{not json")
    with server_process(
        MODEL_REPOSITORY=str(repository), DEFAULT_MODEL="digits", ADMIN_TOKEN=TOKEN
    ) as server:
        url = server.url
        batch_sizes = [1, 3, 2]
        for size in batch_sizes:
            ok = httpx.post(f"{url}/classify", json={"instances": _images(digits, size)})
            assert ok.status_code == 200, ok.text
        wrong_shape = httpx.post(f"{url}/classify", json={"instances": [[1.0, 2.0]]})
        assert wrong_shape.status_code == 422
        not_json = httpx.post(f"{url}/classify", content=b"{", timeout=30)
        assert not_json.status_code == 400
        searches = [
            httpx.post(f"{url}/search", json={"class": "7", "top_k": 5}),
            httpx.post(
                f"{url}/v1/models/digits/search",
                json={"class": "3", "sparsity": 4, "strongest_atoms": 2},
            ),
        ]
        assert [s.status_code for s in searches] == [200, 200]
        unknown_model = httpx.post(
            f"{url}/v1/models/no-such-model/classify", json={"instances": _images(digits, 1)}
        )
        assert unknown_model.status_code == 404
        assert httpx.get(f"{url}/no/such/path").status_code == 404

        scrape = Scrape.of(url)
        for name, kind in METRIC_NAMES.items():
            assert scrape.types.get(name) == kind, name
        requests = "besvm_http_requests_total"
        post_classify = {"method": "POST", "route": "/classify"}
        assert scrape.value(requests, **post_classify, status="200", model="digits") == 3
        assert scrape.value(requests, **post_classify, status="422", model="digits") == 1
        # The shape is checked by the model, the JSON before any model is chosen.
        assert scrape.value(requests, **post_classify, status="400", model="") == 1
        assert scrape.value(requests, route="/search", status="200", model="digits") == 1
        named_search = {"route": "/v1/models/{name}/search", "model": "digits"}
        assert scrape.value(requests, **named_search, status="200") == 1
        # Unknown names and paths: one label value each, never the raw path.
        assert scrape.value(requests, route="/v1/models/{name}/classify", model="") == 1
        assert scrape.value(requests, route="unmatched", status="404") == 1
        assert {s.labels["route"] for s in scrape.series(requests)} <= {
            "/classify",
            "/search",
            "/v1/models/{name}/search",
            "/v1/models/{name}/classify",
            "/readyz",
            "unmatched",
        }
        # One latency observation per request, in every series.
        for count in scrape.series(requests):
            labels = count.labels
            duration = scrape.value("besvm_http_request_duration_seconds_count", **labels)
            assert duration == count.value, labels
        _check_histograms_consistent(scrape, "besvm_http_request_duration_seconds")
        # The scrape itself is the one request in flight.
        assert scrape.value("besvm_http_requests_in_flight") == 1

        assert scrape.value("besvm_classify_batch_size_count", model="digits") == 3
        assert scrape.value("besvm_classify_batch_size_sum", model="digits") == sum(batch_sizes)
        assert scrape.value("besvm_classify_batch_size_bucket", model="digits", le="1.0") == 1
        assert scrape.value("besvm_classify_batch_size_bucket", model="digits", le="2.0") == 2
        _check_histograms_consistent(scrape, "besvm_classify_batch_size")

        # One catalogue row per atom of each code, one more per strongest atom.
        rows = sum(s.json()["sparsity"] for s in searches) + 2
        assert searches[1].json()["sparsity"] == 4
        assert scrape.value("besvm_search_rows_read_total", model="digits") == rows

        models = _models(url)
        for name in ("digits", "other"):
            assert _version_served(scrape, name) == models[name]["version"]
            assert scrape.value("besvm_model_load_duration_seconds_count", model=name) == 1
            assert scrape.value("besvm_model_load_duration_seconds_sum", model=name) > 0
        assert models["broken"]["state"] == "failed"
        assert scrape.value("besvm_model_load_failures_total", model="broken") == 1
        assert scrape.value("besvm_model_load_failures_total", model="digits") == 0
        assert not scrape.series("besvm_model_version_info", model="broken")

        # A new version swapped in: the info moves to it.
        old = models["other"]["version"]
        revised = dataclasses.replace(
            digits_fit.predictor, metadata={**digits_fit.predictor.metadata, "revision": 1}
        )
        revised.save(repository / "other", overwrite=True)
        new = manifest_digest(repository / "other")
        assert new != old
        loaded = httpx.post(f"{url}/v2/repository/models/other/load", headers=AUTH, timeout=60)
        assert loaded.status_code == 200, loaded.text
        scrape = Scrape.of(url)
        assert _version_served(scrape, "other") == new == _models(url)["other"]["version"]
        assert scrape.value("besvm_model_version_info", model="other", version=old) == 0
        assert scrape.value("besvm_model_load_duration_seconds_count", model="other") == 2
        # A version that cannot load is counted, and the old one keeps its info.
        (repository / "other" / "manifest.json").write_text("{not json")
        refused = httpx.post(f"{url}/v2/repository/models/other/load", headers=AUTH, timeout=60)
        assert refused.status_code == 409
        scrape = Scrape.of(url)
        assert scrape.value("besvm_model_load_failures_total", model="other") == 1
        assert _version_served(scrape, "other") == new
        # Unloaded: no version is served any more.
        unloaded = httpx.post(f"{url}/v2/repository/models/other/unload", headers=AUTH)
        assert unloaded.status_code == 200
        assert Scrape.of(url).value("besvm_model_version_info", model="other") == 0


def _multiprocess_dir(worker_pid: int) -> Path:
    variables = Path(f"/proc/{worker_pid}/environ").read_bytes().split(b"\0")
    (value,) = [v for v in variables if v.startswith(b"PROMETHEUS_MULTIPROC_DIR=")]
    return Path(value.partition(b"=")[2].decode())


@pytest.mark.slow
def test_metrics_of_several_workers_are_summed(digits, digits_model_dir):
    n_requests = 40
    with server_process(digits_model_dir, WORKERS="2") as server:
        url = server.url
        # Let both workers finish starting, so that the requests are spread over both.
        workers = _wait_for(
            lambda: len(pids := set(worker_pids(server.process.pid))) == 2 and pids, "two workers"
        )
        directory = _multiprocess_dir(next(iter(workers)))
        assert directory.is_dir()
        _wait_for(
            lambda: all((directory / f"histogram_{pid}.db").exists() for pid in workers),
            "both workers to load the model",
        )
        for _ in range(n_requests):
            # A new connection each: the kernel spreads them over the workers.
            response = httpx.post(f"{url}/classify", json={"instances": _images(digits, 2)})
            assert response.status_code == 200, response.text
        labels = {"route": "/classify", "status": "200", "model": "digits"}
        # The worker that does not answer the scrape folds its last reports in shortly after.
        scrape = _wait_for(
            lambda: (
                (s := Scrape.of(url)).value("besvm_http_requests_total", **labels) == n_requests
                and s
            ),
            "both workers' counts",
        )
        duration_count = scrape.value("besvm_http_request_duration_seconds_count", **labels)
        assert duration_count == n_requests
        assert scrape.value("besvm_classify_batch_size_sum", model="digits") == 2 * n_requests
        # Each worker loaded the model once; both serve the version /v1/models names.
        assert scrape.value("besvm_model_load_duration_seconds_count", model="digits") == 2
        assert _version_served(scrape, "digits") == _models(url)["digits"]["version"]
        assert scrape.value("besvm_http_requests_in_flight") == 1

        # A worker killed: its live gauges go, what it counted stays, its replacement counts on.
        victim = next(iter(workers))
        os.kill(victim, 9)
        _wait_for(
            lambda: not (directory / f"gauge_livesum_{victim}.db").exists(),
            "the supervisor to mark the dead worker's gauges",
        )
        _wait_for(lambda: len(worker_pids(server.process.pid)) == 2, "a replacement worker")
        _wait_for(lambda: httpx.get(f"{url}/readyz", timeout=5).status_code == 200, "readiness")
        scrape = Scrape.of(url)
        assert scrape.value("besvm_http_requests_total", **labels) == n_requests
        assert scrape.value("besvm_http_requests_in_flight") == 1
        assert _version_served(scrape, "digits") == _models(url)["digits"]["version"]
    # The run's private directory goes with it.
    assert not directory.exists()


@pytest.mark.slow
def test_a_multiprocess_directory_the_user_sets_is_used_and_kept(
    tmp_path, digits, digits_model_dir
):
    directory = tmp_path / "prometheus"
    directory.mkdir()
    with server_process(
        digits_model_dir, WORKERS="2", PROMETHEUS_MULTIPROC_DIR=str(directory)
    ) as server:
        response = httpx.post(f"{server.url}/classify", json={"instances": _images(digits, 1)})
        assert response.status_code == 200
        # Counted by whichever worker answered, folded in within FOLD_DELAY_S.
        _wait_for(
            lambda: (
                Scrape.of(server.url).value("besvm_http_requests_total", route="/classify") == 1
            ),
            "the request's count",
        )
        assert list(directory.glob("counter_*.db"))
    assert directory.is_dir()


def test_apps_in_one_process_keep_their_own_metrics(make_client, digits):
    first, second = make_client(), make_client()
    for _ in range(3):
        assert first.post("/classify", json={"instances": _images(digits, 1)}).status_code == 200
    assert second.post("/classify", json={"instances": _images(digits, 1)}).status_code == 200
    counts = []
    for client in (first, second):
        text = client.get("/metrics").text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        counts.append(
            sum(
                s.value
                for s in families["besvm_http_requests"].samples
                if s.name == "besvm_http_requests_total" and s.labels["route"] == "/classify"
            )
        )
    assert counts == [3, 1]


def test_a_requests_reports_are_folded_in_shortly_and_before_every_exposition():
    labels = {"method": "POST", "route": "/classify", "model": "digits", "status": "200"}

    async def scenario() -> None:
        metrics = PrometheusMetrics()
        registry = metrics.registry

        def answered() -> float | None:
            return registry.get_sample_value("besvm_http_requests_total", labels)

        metrics.request_started()
        metrics.request_finished("POST", "/classify", "digits", 200, 0.002)
        metrics.batch("digits", 3)
        assert answered() is None  # noted, not yet recorded
        text = metrics.exposition().decode()
        assert answered() == 1
        assert 'besvm_http_requests_total{method="POST",model="digits",route="/classify",' in text
        assert registry.get_sample_value("besvm_classify_batch_size_sum", {"model": "digits"}) == 3
        assert registry.get_sample_value("besvm_http_requests_in_flight") == 0
        count = registry.get_sample_value("besvm_http_request_duration_seconds_count", labels)
        assert count == 1

        # Without a scrape, within FOLD_DELAY_S: one started and still in flight, one answered.
        metrics.request_started()
        metrics.request_started()
        metrics.request_finished("POST", "/classify", "digits", 200, 0.002)
        await asyncio.sleep(3 * FOLD_DELAY_S)
        assert answered() == 2
        assert registry.get_sample_value("besvm_http_requests_in_flight") == 1

    asyncio.run(scenario())


def test_folds_from_the_loop_and_scrapes_at_once_lose_nothing_and_never_fail():
    metrics = PrometheusMetrics()
    labels = {"method": "POST", "route": "/classify", "model": "digits", "status": "200"}
    n_reports, errors = 20_000, []

    def scrape_again_and_again(stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                metrics.fold()
        except Exception as error:  # what a scrape would answer 500 for
            errors.append(error)

    stop = threading.Event()
    scrapers = [threading.Thread(target=scrape_again_and_again, args=(stop,)) for _ in range(2)]
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads taking turns as often as they can
    for scraper in scrapers:
        scraper.start()
    try:
        for i in range(n_reports):
            metrics.request_started()  # no event loop here: each note folds at once
            metrics.request_finished("POST", "/classify", "digits", 200, 0.001)
            if i % 1000 == 0:
                metrics.fold()
    finally:
        stop.set()
        for scraper in scrapers:
            scraper.join()
        sys.setswitchinterval(switch_interval)
    metrics.fold()
    assert errors == []
    assert metrics.registry.get_sample_value("besvm_http_requests_total", labels) == n_reports
