"""service.model.threads: thread limits that restore what they change, and the worker split."""

import os

import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_info

from service.model import threads
from service.model.similarity import parse_spec
from service.model.threads import configure_worker_threads, limit_threads


def blas_threads() -> list[int]:
    return [info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"]


def test_limit_threads_sets_and_restores_both():
    numba_before, blas_before = numba.get_num_threads(), blas_threads()
    with limit_threads(numba_threads=1, blas_threads=1):
        assert numba.get_num_threads() == 1
        assert all(n == 1 for n in blas_threads())
    assert numba.get_num_threads() == numba_before
    assert blas_threads() == blas_before


def test_limit_threads_holds_openmp_to_its_count_and_restores_it():
    import sklearn.cluster  # noqa: F401  (loads scikit-learn's OpenMP runtime)

    def openmp_threads() -> list[int]:
        return [info["num_threads"] for info in threadpool_info() if info["user_api"] == "openmp"]

    before = openmp_threads()
    assert before  # an OpenMP runtime is loaded
    if max(before) == 1:
        pytest.skip("OpenMP runs one thread here already: nothing to hold")
    with limit_threads(openmp_threads=1):
        assert all(n == 1 for n in openmp_threads())
    assert openmp_threads() == before


def test_limit_threads_restores_after_an_exception():
    numba_before, blas_before = numba.get_num_threads(), blas_threads()
    with pytest.raises(RuntimeError, match="inside"), limit_threads(1, 1):
        raise RuntimeError("inside")
    assert numba.get_num_threads() == numba_before
    assert blas_threads() == blas_before


def test_limit_threads_restores_a_count_set_before_it():
    # The previous value is the calling thread's current count, not numba's default.
    original = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        with limit_threads(numba_threads=numba.config.NUMBA_NUM_THREADS):
            assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(original)


def test_limit_threads_caps_numba_at_the_launched_threads():
    before = numba.get_num_threads()
    with limit_threads(numba_threads=numba.config.NUMBA_NUM_THREADS + 7):
        assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS
    assert numba.get_num_threads() == before


def test_limit_threads_with_none_changes_nothing():
    numba_before, blas_before = numba.get_num_threads(), blas_threads()
    with limit_threads(None, None):
        assert numba.get_num_threads() == numba_before
        assert blas_threads() == blas_before


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_limit_threads_refuses_bad_counts_before_changing_anything(bad):
    before = numba.get_num_threads()
    with pytest.raises(ValueError, match="positive integer"), limit_threads(numba_threads=bad):
        pass
    with pytest.raises(ValueError, match="positive integer"), limit_threads(blas_threads=bad):
        pass
    assert numba.get_num_threads() == before


def test_parallel_drivers_run_inside_a_one_thread_limit(monkeypatch):
    # The parallel similarity driver on one numba thread gives the serial driver's answer.
    monkeypatch.setattr(threads, "SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS", 0)
    rng = np.random.default_rng(0)
    X, basis = rng.normal(size=(7, 5)), rng.normal(size=(4, 5))
    spec = parse_spec("rbf(0.5)")
    expected = np.empty((7, 4))
    spec.kind.dense.serial(basis, X, 0.5, expected)
    with limit_threads(numba_threads=1, blas_threads=1):
        np.testing.assert_allclose(spec.compute(basis, X), expected, rtol=1e-12)


@pytest.mark.parametrize(
    ("cpus", "workers", "expected"),
    [
        (2, 1, 2),
        (2, 2, 1),
        (2, 4, 1),
        (2, 16, 1),
        (16, 1, 16),
        (16, 2, 8),
        (16, 4, 4),
        (16, 16, 1),
    ],
)
def test_configure_worker_threads_splits_the_cpus(cpus, workers, expected):
    assert configure_worker_threads(workers, cpu_count=cpus) == expected


def test_configure_worker_threads_defaults_to_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(threads, "available_cpus", lambda: 12)
    assert configure_worker_threads(5) == 2
    monkeypatch.undo()
    assert configure_worker_threads(1) == threads.available_cpus() >= 1


def test_the_cpus_available_are_the_fewest_the_process_is_allowed(monkeypatch):
    """The affinity mask bounds them, and so does a limit the mask does not show: a cgroup's
    CPU quota, read through joblib, which also reads LOKY_MAX_CPU_COUNT (the quota itself is
    checked in a container with `--cpus 1` by docker/smoke-test.sh)."""
    assert 1 <= threads.available_cpus() <= len(os.sched_getaffinity(0))
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "1")
    assert threads.available_cpus() == 1
    assert configure_worker_threads(1) == 1


@pytest.mark.parametrize(("workers", "cpus"), [(0, 4), (-2, 4), (2, 0), (None, 4)])
def test_configure_worker_threads_refuses_bad_counts(workers, cpus):
    with pytest.raises(ValueError, match="positive integer"):
        configure_worker_threads(workers, cpu_count=cpus)


def test_worker_environment_shares_the_cores_and_keeps_explicit_settings(monkeypatch):
    from service.model import threads

    monkeypatch.setattr(threads, "available_cpus", lambda: 16)
    env = threads.worker_environment(4, environ={})
    assert env == {
        "NUMBA_NUM_THREADS": "4",
        "OMP_NUM_THREADS": "4",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    assert threads.worker_environment(32, environ={})["NUMBA_NUM_THREADS"] == "1"
    kept = threads.worker_environment(4, environ={"NUMBA_NUM_THREADS": "2"})
    assert "NUMBA_NUM_THREADS" not in kept
    assert kept["OMP_NUM_THREADS"] == "4"
