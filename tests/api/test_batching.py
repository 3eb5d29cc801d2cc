"""Dynamic batching: requests that wait together computed as one batch, a lone request never
held back, each request answered (and refused) as it would be alone, the queue within the work
limit and the deadline; a model's own serving.json; and through a real server on every route
(REST /classify, the protocol's infer over REST and gRPC), with its metrics."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.serving import free_port
from service.api import Settings
from service.api.dataplane import DataPlane
from service.api.errors import WorkTimeoutError
from service.api.machinery.metrics import Metrics
from service.api.placement import EXPLAINED
from service.api.registry import ModelRegistry, ModelState
from service.api.repository import Repository
from service.api.serving_file import SERVING_FILE, BatchingPolicy
from service.model import InvalidInputError, Predictor
from tests.api.conftest import server_process

# Scores of an instance in a batch and alone differ by the summation order of the products.
TOLERANCE = 1e-9


class RecordedBatches(Metrics):
    """The batches a data plane computed: (instances, requests, each request's wait)."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, int, list[float]]] = []

    def batch_computed(self, model, instances, requests, waits) -> None:
        self.batches.append((instances, requests, waits))


async def _plane(model_dir, **settings) -> tuple[DataPlane, RecordedBatches]:
    registry = ModelRegistry(Repository(model_dir, single=True))
    metrics = RecordedBatches()
    # Every request on the thread pool (no estimate sends one inline), so that a batch takes
    # long enough for others to arrive while it computes.
    base = {"inline_budget_ms": 0, "dynamic_batch_max_instances": 8}
    settings = Settings(_env_file=None, model_dir=model_dir, **base | settings)
    plane = DataPlane(registry, settings, metrics)
    await registry.sync()
    return plane, metrics


def _assert_alone(predictor: Predictor, instances, answers, top_k: int = 3) -> None:
    alone = predictor.classify(instances, top_k)
    assert [a.label for a in answers] == [a.label for a in alone]
    for together, single in zip(answers, alone, strict=True):
        assert np.allclose(together.scores, single.scores, rtol=0, atol=TOLERANCE)
        assert [c for c, _ in together.ranked] == [c for c, _ in single.ranked]


def test_requests_waiting_together_are_one_batch_and_each_answer_is_its_own(
    digits_model_dir, digits_predictor, digits
):
    images = digits.X_test[:40].reshape(40, 8, 8).tolist()

    async def scenario():
        plane, metrics = await _plane(digits_model_dir)
        capacity = plane.batcher(plane.snapshot(None)).capacity
        # One bad request among them: it fails alone.
        bodies = [[image] for image in images[:-1]] + [[[[1.0, 2.0]]]]
        outcomes = await asyncio.gather(
            *(plane.classify(None, body, None, 3) for body in bodies), return_exceptions=True
        )
        plane.close()
        return capacity, bodies, outcomes, metrics.batches

    capacity, bodies, outcomes, batches = asyncio.run(scenario())
    assert isinstance(outcomes[-1], InvalidInputError)
    for body, (_, answers) in zip(bodies[:-1], outcomes[:-1], strict=True):
        _assert_alone(digits_predictor, body, answers)
    assert sum(requests for _, requests, _ in batches) == len(bodies)
    assert max(instances for instances, _, _ in batches) <= 8
    # The first requests found the model idle: alone, at once. The others gathered.
    assert [requests for _, requests, _ in batches[:capacity]] == [1] * capacity
    assert max(requests for _, requests, _ in batches) > 1
    assert len(batches) < len(bodies)


def test_a_lone_request_is_never_held_back(digits_model_dir, digits):
    images = digits.X_test[:10].reshape(10, 1, 8, 8).tolist()

    async def scenario():
        # A delay far longer than a digit's work: a lone request must not wait it out.
        plane, metrics = await _plane(digits_model_dir, dynamic_batch_max_delay_ms=2000)
        started = time.perf_counter()
        for image in images:
            await plane.classify(None, image, None, 3)
        seconds = time.perf_counter() - started
        plane.close()
        return seconds, metrics.batches

    seconds, batches = asyncio.run(scenario())
    assert seconds < 2.0
    assert [requests for _, requests, _ in batches] == [1] * len(images)
    assert max(wait for _, _, waits in batches for wait in waits) < 0.05


def test_a_batch_that_explains_learns_the_cost_of_its_explanations(digits_model_dir, digits):
    images = digits.X_test[:2].reshape(2, 1, 8, 8).tolist()

    async def scenario():
        plane, metrics = await _plane(digits_model_dir)
        snapshot = plane.snapshot(None)
        await plane.classify(None, images[0], None, 3)
        plain = plane.estimate(snapshot, EXPLAINED)
        await plane.classify(None, images[1], None, 3, explain=2)
        explained = plane.estimate(snapshot, EXPLAINED)
        plane.close()
        return plain, explained, metrics.batches

    plain, explained, batches = asyncio.run(scenario())
    assert len(batches) == 2  # both went through the batcher
    assert plain is None
    assert explained > 0


def test_a_delay_gathers_the_queue_into_one_batch(digits_model_dir, digits, digits_predictor):
    async def scenario():
        plane, metrics = await _plane(
            digits_model_dir, dynamic_batch_max_instances=64, dynamic_batch_max_delay_ms=300
        )
        capacity = plane.batcher(plane.snapshot(None)).capacity
        bodies = [[image] for image in digits.X_test[: capacity + 3].reshape(-1, 8, 8).tolist()]
        outcomes = await asyncio.gather(*(plane.classify(None, b, None, 3) for b in bodies))
        plane.close()
        return bodies, outcomes, metrics.batches, capacity

    bodies, outcomes, batches, capacity = asyncio.run(scenario())
    for body, (_, answers) in zip(bodies, outcomes, strict=True):
        _assert_alone(digits_predictor, body, answers)
    # The first ones ran at once; the three queued behind them waited out the delay from the
    # oldest's arrival, then went as one batch.
    assert [requests for _, requests, _ in batches] == [1] * capacity + [3]
    assert min(batches[-1][2]) > 0.25


def test_a_request_queued_past_its_deadline_times_out_and_gives_back_its_slot(
    digits_model_dir, digits
):
    async def scenario():
        plane, _ = await _plane(
            digits_model_dir, dynamic_batch_max_delay_ms=30_000, request_timeout_s=0.3
        )
        capacity = plane.batcher(plane.snapshot(None)).capacity
        bodies = [[image] for image in digits.X_test[: capacity + 2].reshape(-1, 8, 8).tolist()]
        outcomes = await asyncio.gather(
            *(plane.classify(None, b, None, 3) for b in bodies), return_exceptions=True
        )
        await asyncio.sleep(0)  # the abandoned requests' callbacks
        free = plane.work.free
        plane.close()
        return capacity, outcomes, free, plane.work.max_concurrent

    capacity, outcomes, free, slots = asyncio.run(scenario())
    assert all(not isinstance(o, BaseException) for o in outcomes[:capacity])
    assert all(isinstance(o, WorkTimeoutError) for o in outcomes[capacity:])
    assert free == slots


def test_a_model_sets_its_own_batching_in_serving_json(digits_model_dir, tmp_path):
    model = tmp_path / "digits"
    shutil.copytree(digits_model_dir, model)

    async def load():
        registry = ModelRegistry(Repository(model, single=True))
        await registry.sync()
        (entry,) = registry.entries.values()
        return entry

    (model / SERVING_FILE).write_text(
        json.dumps({"dynamic_batching": {"max_instances": 16, "max_delay_ms": 2.5}})
    )
    entry = asyncio.run(load())
    assert entry.snapshot.batching == BatchingPolicy(16, 0.0025)
    for bad in (
        "[1]",
        '{"dynamic_batching": {"max_instances": -1}}',
        '{"dynamic_batching": {"max_instances": 4, "max_delay_ms": "soon"}}',
        '{"dynamic_batching": {"max_size": 4}}',
        "{not json",
    ):
        (model / SERVING_FILE).write_text(bad)
        entry = asyncio.run(load())
        assert entry.state == ModelState.FAILED
        assert SERVING_FILE in entry.reason
    (model / SERVING_FILE).write_text("{}")
    assert asyncio.run(load()).snapshot.batching is None


@pytest.mark.slow
def test_every_route_batches_through_a_real_server(digits_model_dir, digits, digits_predictor):
    grpc_port = free_port()
    images = digits.X_test[:48].reshape(48, 8, 8)
    expected = [digits_predictor.classify([image.tolist()], 3)[0] for image in images]
    with server_process(
        digits_model_dir,
        GRPC_PORT=str(grpc_port),
        INLINE_BUDGET_MS="0",
        DYNAMIC_BATCH_MAX_INSTANCES="16",
    ) as server:
        url = server.url

        def rest(i: int) -> list[float]:
            body = {"instances": [images[i].tolist()], "top_k": 10}
            with httpx.Client(base_url=url) as client:
                (prediction,) = client.post("/classify", json=body).json()["predictions"]
            by_label = {c["label"]: c["score"] for c in prediction["top_k"]}
            return [by_label[c] for c in digits_predictor.classes]

        def v2(i: int) -> list[float]:
            tensor = {"name": "input", "shape": [1, 8, 8], "datatype": "FP64",
                      "data": images[i].ravel().tolist()}  # fmt: skip
            with httpx.Client(base_url=url) as client:
                answer = client.post("/v2/models/digits/infer", json={"inputs": [tensor]}).json()
            return next(o["data"] for o in answer["outputs"] if o["name"] == "scores")

        def grpc(i: int) -> list[float]:
            with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
                tensor = grpcclient.InferInput("input", [1, 8, 8], "FP64")
                tensor.set_data_from_numpy(images[i : i + 1].astype(np.float64))
                result = client.infer("digits", [tensor])
            return result.as_numpy("scores")[0].tolist()

        calls = [(route, i) for i in range(len(images)) for route in (rest, v2, grpc)]
        with ThreadPoolExecutor(24) as pool:
            scores = list(pool.map(lambda call: call[0](call[1]), calls))
        metrics = httpx.get(f"{url}/metrics").text
        # The explanation output over gRPC, as the model library explains.
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
            tensor = grpcclient.InferInput("input", [1, 8, 8], "FP64")
            tensor.set_data_from_numpy(images[:1].astype(np.float64))
            wanted = [grpcclient.InferRequestedOutput("explanation")]
            result = client.infer("digits", [tensor], outputs=wanted, parameters={"explain": 2})
        (document,) = result.as_numpy("explanation")
        explanation = json.loads(document)
        (answer,) = digits_predictor.classify([images[0].tolist()], 3, explain=2)
        assert [i["basis_index"] for i in explanation["items"]] == [
            i.basis_index for i in answer.explanation.items
        ]
    for (_, i), got in zip(calls, scores, strict=True):
        assert np.allclose(got, expected[i].scores, rtol=0, atol=TOLERANCE)
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name.startswith("besvm_dynamic_batch")
    }
    assert samples["besvm_dynamic_batch_requests_sum"] == len(calls)
    # Batches formed: fewer batches than requests.
    assert samples["besvm_dynamic_batch_requests_count"] < len(calls)
    assert samples["besvm_dynamic_batch_queue_seconds_count"] == len(calls)
