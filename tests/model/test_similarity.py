"""Parsing and formatting of similarity specs, and dispatch to the dense_kernels."""

import os
import subprocess
import sys

import numba
import numpy as np
import pytest
from sklearn.metrics.pairwise import rbf_kernel

from service.model import SpecError, parse_spec, parse_specs, threads
from service.model.kernels import dense as dense_kernels
from service.model.similarity import format_spec, split_specs


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("linear", "linear"),
        ("LINEAR()", "linear"),
        ("rbf", "rbf(gamma=1)"),
        ("rbf(0.5)", "rbf(gamma=0.5)"),
        ("  RBF ( gamma = 2.5e-3 ) ", "rbf(gamma=0.0025)"),
        ("rbf(gamma=1e+3)", "rbf(gamma=1000)"),
        ("rigid", "rigid(h=1)"),
        ("rigid(2)", "rigid(h=2)"),
        ("rigid(h=0.0)", "rigid(h=0)"),
        ("deformable(2, 0)", "deformable(h_r=2, h_l=0)"),
        ("Deformable(h_l=2)", "deformable(h_r=1, h_l=2)"),
    ],
)
def test_parse_gives_canonical_text_and_round_trips(text, canonical):
    spec = parse_spec(text)
    assert format_spec(spec) == canonical == str(spec)
    assert parse_spec(canonical) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("poly(3)", "unknown similarity 'poly'"),
        ("rbf(gamma=0)", "gamma must be > 0"),
        ("rbf(-1)", "gamma must be > 0"),
        ("rbf(gamma=nan)", "must be finite"),
        ("rbf(sigma=1)", "has no parameter 'sigma'"),
        ("rbf(1, 2)", "takes 1 parameter"),
        ("rbf(gamma=x)", "must be a number"),
        ("rbf(1, gamma=2)", "given twice"),
        ("linear(1)", "takes 0 parameter"),
        ("rigid(1.5)", "h must be an integer"),
        ("rigid(-1)", "h must be >= 0"),
        ("deformable(1, 1, 1)", "takes 2 parameter"),
        ("rbf(", "cannot parse"),
        ("", "cannot parse"),
    ],
)
def test_bad_specs_are_refused_with_a_reason(text, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        parse_spec(text)


def test_several_measures_split_outside_parentheses():
    assert split_specs("rbf(gamma=1e+3) + linear") == ["rbf(gamma=1e+3) ", " linear"]
    specs = parse_specs("rbf(gamma=1e+3) + linear")
    assert [str(s) for s in specs] == ["rbf(gamma=1000)", "linear"]
    assert parse_specs(["rbf", "linear"]) == parse_specs("rbf+linear")


@pytest.mark.parametrize("text", ["rbf + rbf(gamma=1)", "linear + ", "+"])
def test_duplicate_or_empty_measures_are_refused(text):
    with pytest.raises(SpecError):
        parse_specs(text)


def test_spec_compute_dispatches_to_the_right_kernel():
    rng = np.random.default_rng(0)
    X, basis = rng.normal(size=(5, 3)), rng.normal(size=(4, 3))
    np.testing.assert_allclose(parse_spec("linear").compute(basis, X), X @ basis.T, rtol=1e-12)
    np.testing.assert_allclose(
        parse_spec("rbf(0.25)").compute(basis, X), rbf_kernel(X, basis, gamma=0.25), rtol=1e-10
    )


@pytest.mark.parametrize(
    ("n", "driver"),
    [
        (1, dense_kernels.rbf_similarities_serial),
        (3, dense_kernels.rbf_similarities_serial),
        (16, dense_kernels.rbf_similarities_blas),
        (400, dense_kernels.rbf_similarities_blas),
        (400, dense_kernels.rbf_similarities),
    ],
)
def test_every_driver_gives_the_same_similarities(n, driver, monkeypatch):
    # Small batches run on the serial driver, from 16 items on BLAS, and large ones on the
    # parallel driver when enough numba threads share them (here: as soon as two do).
    from service.model.threads import SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS

    numba_threads = 1
    if driver is dense_kernels.rbf_similarities:
        _need_two_numba_threads()
        monkeypatch.setattr(threads, "SIMILARITY_PARALLEL_MIN_THREADS_OVER_BLAS", 1)
        numba_threads = 2
    rng = np.random.default_rng(n)
    X, basis = rng.normal(size=(n, 64)), rng.normal(size=(20, 64))
    spec = parse_spec("rbf(0.1)")
    assert (n * 20 * 64 >= SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS) == (n == 400)
    with threads.limit_threads(numba_threads=numba_threads):
        assert spec.bind(64).driver_for(n, 20) is driver
        similarities = spec.compute(basis, X)
    np.testing.assert_allclose(similarities, rbf_kernel(X, basis, gamma=0.1), rtol=1e-10)


def _need_two_numba_threads():
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("the parallel drivers run where numba has two threads or more")


def test_heavy_work_is_heavy_whichever_driver_computes_it(monkeypatch):
    # The data plane sends heavy work to its one compute thread: BLAS, or the serial driver on
    # one numba thread, must not make a 4,000-item batch look light.
    rbf, rigid = parse_spec("rbf(0.1)").bind(64), parse_spec("rigid(1)").bind(64, (8, 8, 1))
    with threads.limit_threads(numba_threads=1):
        assert rbf.driver_for(4000, 100) is dense_kernels.rbf_similarities_blas
        assert not rbf.runs_serially(4000, 100)
        assert rigid.driver_for(4000, 100) is rigid.drivers.serial
        assert not rigid.runs_serially(4000, 100)
        assert rbf.runs_serially(1, 100)
        assert rigid.driver_for(1, 100) is rigid.drivers.serial
    _need_two_numba_threads()
    with threads.limit_threads(numba_threads=2):
        assert rigid.driver_for(4000, 100) is rigid.drivers.parallel
        assert rigid.driver_for(1, 100) is rigid.drivers.serial
        assert rbf.driver_for(4000, 100) is dense_kernels.rbf_similarities_blas
    monkeypatch.setattr(threads, "SIMILARITY_PARALLEL_MIN_THREADS_OVER_BLAS", 1)
    with threads.limit_threads(numba_threads=1):
        assert rbf.driver_for(4000, 100) is dense_kernels.rbf_similarities_blas
    with threads.limit_threads(numba_threads=2):
        assert rbf.driver_for(4000, 100) is dense_kernels.rbf_similarities


# Heavy work on one numba thread under the image's threading layer, timed by the calling
# thread's clock and the process's: run in a process of its own, since the layer is chosen
# once per process at its first parallel region.
_ONE_THREAD_UNDER_WORKQUEUE = """
import time
import numpy as np
from service.model import parse_spec, threads

rigid = parse_spec("rigid(1)").bind(64, (8, 8, 1))
X, basis = np.random.default_rng(0).random((4000, 64)), np.random.default_rng(1).random((100, 64))
assert not rigid.runs_serially(4000, 100)
with threads.limit_threads(numba_threads=1):
    rigid.compute(basis, X)  # compiled, not timed
    own, process = time.thread_time(), time.process_time()
    while time.process_time() - process < 0.3:  # enough CPU time to tell the clocks apart
        rigid.compute(basis, X)
    print(time.thread_time() - own, time.process_time() - process)
"""


def test_heavy_work_on_one_numba_thread_runs_on_the_calling_thread():
    """Under the ``workqueue`` layer (the image's) a parallel region runs on numba's pool
    thread even at one thread, where the caller's thread clock, by which the trainer's
    selection times a fold fit on one thread, missed it."""
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    result = subprocess.run(
        [sys.executable, "-c", _ONE_THREAD_UNDER_WORKQUEUE],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    own, process = (float(value) for value in result.stdout.split())
    assert own >= 0.9 * process >= 0.27


def test_grid_measures_need_a_grid_that_fits_the_items():
    rng = np.random.default_rng(1)
    X, basis = rng.normal(size=(2, 12)), rng.normal(size=(3, 12))
    rigid = parse_spec("rigid(1)")
    with pytest.raises(SpecError, match="not a grid"):
        rigid.compute(basis, X)
    with pytest.raises(SpecError, match=r"grid \(3, 3, 1\) does not hold 12 numbers"):
        rigid.compute(basis, X, grid_shape=(3, 3, 1))
    # h = 0 is the inner product, whatever the grid's shape.
    for grid in [(3, 4, 1), (2, 2, 3), (1, 1, 12)]:
        np.testing.assert_allclose(
            parse_spec("rigid(0)").compute(basis, X, grid_shape=grid), X @ basis.T, rtol=1e-12
        )


def test_work_estimates_count_every_shift():
    assert parse_spec("rbf").work(2, 3, 4) == 24
    assert parse_spec("rigid(1)").work(2, 3, 4) == 24 * 9
    assert parse_spec("deformable(1, 1)").work(1, 1, 1) == 25 + 9 * 9


def test_a_bound_measure_is_checked_once_and_computes_like_the_spec():
    rng = np.random.default_rng(2)
    X, basis = rng.normal(size=(3, 12)), rng.normal(size=(4, 12))
    for text, grid in [
        ("rbf(0.5)", None),
        ("rigid(1)", (3, 4, 1)),
        ("deformable(1, 1)", (2, 2, 3)),
    ]:
        spec = parse_spec(text)
        bound = spec.bind(12, grid)
        assert bound.pair_work == spec.work(1, 1, 12)
        np.testing.assert_array_equal(
            bound.compute(basis, X), spec.compute(basis, X, grid_shape=grid)
        )
    with pytest.raises(SpecError, match="not a grid"):
        parse_spec("rigid(1)").bind(12)
    with pytest.raises(SpecError, match="does not hold 12 numbers"):
        parse_spec("rigid(1)").bind(12, (3, 3, 1))
    with pytest.raises(SpecError, match="are not documents"):
        parse_spec("sensing0").bind(12)
    with pytest.raises(SpecError, match="does not apply to bag-of-words"):
        parse_spec("rigid(1)").bind(12, (3, 4, 1), documents=True)
