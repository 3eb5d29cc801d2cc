"""Load: a real server at concurrency 64 answers every request right, and its memory stays flat.

64 keep-alive connections (benchmarks.loadgen, raw asyncio in a process of its own) send
/classify requests of one digit each, eight different digits spread over the connections. Every
answer must be a 200 equal to the answer the same digit gets alone, and the server's resident
memory after 50,000 such requests may exceed its level after a 5,000-request warm-up by at most
:data:`RSS_GROWTH_BOUND`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import numpy as np
import pytest

from benchmarks.loadgen import LoadResult, http_request, run_load
from tests.api.conftest import server_process, worker_pids

pytestmark = pytest.mark.slow

CONCURRENCY = 64
N_DIGITS = 8
WARM_UP_REQUESTS = 5_000
MEASURED_REQUESTS = 50_000
# After the warm-up every per-connection buffer, thread-pool thread, compiled kernel and cache
# exists, so a server without a leak stays within allocator noise (arena and page-cache
# granularity: a few MiB). 32 MiB is 671 bytes per request: a leak of even 1 KiB per request
# (48.8 MiB over 50,000) fails it, while a one-off growth of glibc's arenas does not.
RSS_GROWTH_BOUND = 32 * 2**20
# Generous, only so that a hung server fails the test instead of blocking the suite.
RUN_TIMEOUT_S = 600


def server_rss_bytes(pid: int) -> int:
    """Resident memory (VmRSS) of server process ``pid`` and, with WORKERS > 1, of its worker
    processes, in bytes."""
    total = 0
    for process in (pid, *worker_pids(pid)):
        status = Path(f"/proc/{process}/status").read_text()
        kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
        total += int(kib) * 1024
    return total


def assert_same_answer(got: dict, expected: dict) -> None:
    """Equal labels, model and version; scores equal within float64 round-off (the same model
    on the same input, summed possibly in another order by another thread)."""
    assert got["model"] == expected["model"]
    assert got["model_version"] == expected["model_version"]
    assert len(got["predictions"]) == len(expected["predictions"])
    for prediction, reference in zip(got["predictions"], expected["predictions"], strict=True):
        assert prediction["label"] == reference["label"]
        assert [c["label"] for c in prediction["top_k"]] == [c["label"] for c in reference["top_k"]]
        for score, ref in zip(prediction["top_k"], reference["top_k"], strict=True):
            assert math.isclose(score["score"], ref["score"], rel_tol=1e-9, abs_tol=1e-12)


def assert_all_answers_right(result: LoadResult, expected: list[dict], requests: int) -> None:
    """Every request answered 200 with its own digit's single-request answer."""
    assert result.n_errors == 0, (dict(result.errors), result.samples)
    assert len(result.latencies_ns) == requests
    assert sum(sum(tally.values()) for tally in result.answers) == requests
    for index, tally in enumerate(result.answers):
        assert tally, f"digit {index} was never answered"
        for body in tally:
            assert body is not None, f"digit {index}: more distinct answers than were kept"
            assert_same_answer(json.loads(body), expected[index])


@pytest.fixture(scope="module")
def digit_bodies(digits) -> list[bytes]:
    """Eight one-digit /classify bodies (8 x 8 images), one per label of the first eight."""
    rows = np.unique(digits.y_test, return_index=True)[1][:N_DIGITS]
    return [
        json.dumps({"instances": [digits.X_test[i].reshape(8, 8).tolist()], "top_k": 3}).encode()
        for i in rows
    ]


def test_concurrency_64_answers_every_request_right_and_memory_stays_flat(
    digits_model_dir, digits_predictor, digit_bodies
):
    with server_process(digits_model_dir, LOG_LEVEL="warning") as server:
        port = httpx.URL(server.url).port
        expected = []
        for body in digit_bodies:
            answer = httpx.post(f"{server.url}/classify", content=body, timeout=30)
            assert answer.status_code == 200, answer.text
            expected.append(answer.json())
        # The single-request answers themselves are the model's, computed in this process.
        instances = np.array([json.loads(body)["instances"][0] for body in digit_bodies])
        for served, local in zip(expected, digits_predictor.classify(instances, 3), strict=True):
            assert served["predictions"][0]["label"] == local.label
            np.testing.assert_allclose(
                [c["score"] for c in served["predictions"][0]["top_k"]],
                [score for _, score in local.ranked],
                rtol=1e-9,
            )
        requests = [http_request("127.0.0.1", port, "/classify", body) for body in digit_bodies]

        def load(count: int) -> LoadResult:
            return run_load(
                "127.0.0.1", port, requests, CONCURRENCY, count=count, timeout=RUN_TIMEOUT_S
            )

        warm = load(WARM_UP_REQUESTS)
        assert_all_answers_right(warm, expected, WARM_UP_REQUESTS)
        rss_after_warm_up = server_rss_bytes(server.process.pid)

        measured = load(MEASURED_REQUESTS)
        assert_all_answers_right(measured, expected, MEASURED_REQUESTS)
        rss_after = server_rss_bytes(server.process.pid)
        assert server.process.poll() is None, server.log()

    growth = rss_after - rss_after_warm_up
    print(
        f"RSS {rss_after_warm_up / 2**20:.1f} MiB after {WARM_UP_REQUESTS:,} requests, "
        f"{rss_after / 2**20:.1f} MiB after {MEASURED_REQUESTS:,} more "
        f"({growth / 2**20:+.1f} MiB; {measured.requests_per_second:.0f} req/s at c={CONCURRENCY})"
    )
    assert growth < RSS_GROWTH_BOUND, (
        f"the server's RSS grew by {growth / 2**20:.1f} MiB over {MEASURED_REQUESTS:,} requests "
        f"({growth / MEASURED_REQUESTS:.0f} bytes per request; bound "
        f"{RSS_GROWTH_BOUND / 2**20:.0f} MiB)"
    )


def test_workqueue_layer_survives_concurrent_parallel_batches(digits_model_dir, digits):
    """The image's threading layer, workqueue, aborts the process if two threads enter parallel
    regions at once, which the server rules out (one compute thread runs the parallel kernels,
    behind the parallel-region lock). 16 connections sending 50-digit batches (parallel
    similarity kernels) must all get the right answer, and the server must live on: with a
    four-thread compute pool and no lock it aborts at once."""
    batch = digits.X_test[:50].reshape(-1, 8, 8).tolist()
    body = json.dumps({"instances": batch, "top_k": 3}).encode()
    with server_process(
        digits_model_dir, NUMBA_THREADING_LAYER="workqueue", LOG_LEVEL="warning"
    ) as server:
        expected = httpx.post(f"{server.url}/classify", content=body, timeout=30)
        assert expected.status_code == 200, expected.text
        port = httpx.URL(server.url).port
        request = http_request("127.0.0.1", port, "/classify", body)
        result = run_load("127.0.0.1", port, request, 16, count=1_000, timeout=RUN_TIMEOUT_S)
        assert_all_answers_right(result, [expected.json()], 1_000)
        assert server.process.poll() is None, server.log()
