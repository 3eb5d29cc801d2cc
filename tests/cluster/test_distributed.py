"""The squared-hinge solver over shards held by a real Dask cluster (two worker processes)
against the one-process solver on the same features."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

import numpy as np
import pytest
from dask.utils import key_split
from sklearn.datasets import make_classification
from sklearn.metrics.pairwise import rbf_kernel

from tests.cluster.conftest import start_local_cluster
from training.cluster.rows import classes_of
from training.cluster.shards import read_shard, write_shards
from training.estimator.cluster_fit import feature_blocks
from training.estimator.distributed_solver import (
    ONE_TASK_BYTES,
    ONE_TASK_MEMORY_SHARE,
    fit_along_C,
    fit_one_vs_rest_distributed,
    one_task_limit,
    uniform_by_row,
)
from training.estimator.newton_cg import liblinear_tolerance
from training.estimator.solver import fit_one_vs_rest
from training.estimator.squared_hinge import InMemorySquaredHinge

TOL = 1e-8


def _sharded(tmp_path, n_samples, n_classes=4, rows_per_shard=500, n_basis=60, seed=0):
    X, y = make_classification(
        n_samples=n_samples,
        n_features=10,
        n_informative=6,
        n_classes=n_classes,
        n_clusters_per_class=1,
        random_state=seed,
    )
    labels = np.array([f"class-{c}" for c in y])
    data = write_shards(X, labels, tmp_path / "shards", rows_per_shard=rows_per_shard)
    basis = X[np.random.default_rng(seed).choice(n_samples, n_basis, replace=False)]
    featurize = functools.partial(rbf_kernel, Y=basis, gamma=0.05)
    return X, labels, data, featurize


def _one_process(X, labels, featurize):
    classes, codes = np.unique(labels, return_inverse=True)
    features = featurize(X)
    fitted = fit_one_vs_rest(
        features.copy(), codes, len(classes), C=1.0, max_iter=1000, n_jobs=1, tol=TOL
    )
    return features, codes, fitted


def _blocks(client, data, featurize):
    """The classes and each shard's FeatureBlock, read and featurized where the shard is, as the
    distributed fit makes them."""
    pieces = client.map(read_shard, data.shards, pure=False)
    classes = classes_of(client, pieces)
    return classes, feature_blocks(client, pieces, classes, featurize)


def _on_cluster(client, data, featurize, one_task_bytes=0):
    """The fit on the cluster: by default every product a task on every block (features of
    any size), else as :func:`fit_one_vs_rest_distributed` chooses by ``one_task_bytes``."""
    classes, blocks = _blocks(client, data, featurize)
    n_features = featurize(np.zeros((1, 10))).shape[1]
    return classes, fit_one_vs_rest_distributed(
        client, blocks, n_features, len(classes), C=1.0, max_iter=1000, tol=TOL,
        one_task_bytes=one_task_bytes,
    )  # fmt: skip


def _task_names(stream) -> list[str]:
    """The functions of the tasks a task stream saw (Dask's names drop a leading underscore)."""
    return [key_split(task["key"]) for task in stream.data]


def _stopping_norms(features, codes, n_classes):
    """Each problem's gradient norm at which the solver stops: tol's share of the norm at 0."""
    signs = np.where(codes[:, None] == np.arange(n_classes)[None, :], 1.0, -1.0)
    loss = InMemorySquaredHinge(features, signs, 1.0)
    _, g0 = loss.value_and_gradient(np.zeros((features.shape[1] + 1, n_classes)), np.arange(4))
    return liblinear_tolerance((signs > 0).sum(axis=0), len(signs), TOL) * np.linalg.norm(
        g0, axis=0
    )


@pytest.mark.parametrize(
    ("one_task_bytes", "solver_task"),
    [(0, "hessian_part"), (None, "fit_in_one_task")],
    ids=["products-on-every-shard", "small-features-in-one-task"],
)
def test_the_fit_on_the_cluster_is_the_one_process_fit(
    dask_client, tmp_path, one_task_bytes, solver_task
):
    """The objective is 1-strongly convex (the regulariser), so a point whose gradient has norm
    g lies within g of the optimum: two solutions that each stopped below their problem's
    stopping norm are within twice it of each other (summation orders differ, by 1e-16).

    Features of 3000 x 60 are solved in one task by default, and with ``one_task_bytes=0``
    by products over the six shards; both are checked, and that each ran as it says."""
    from distributed import get_task_stream

    X, labels, data, featurize = _sharded(tmp_path, 3000)
    assert len(data.shards) == 6
    features, codes, (coef, intercept, _, accuracy) = _one_process(X, labels, featurize)
    with get_task_stream(dask_client) as stream:
        classes, (coef_c, intercept_c, n_iter_c, accuracy_c) = _on_cluster(
            dask_client, data, featurize, one_task_bytes
        )
    names = _task_names(stream)
    other = ({"hessian_part", "fit_in_one_task"} - {solver_task}).pop()
    assert solver_task in names, sorted(set(names))
    assert other not in names, sorted(set(names))
    np.testing.assert_array_equal(classes, np.unique(labels))
    bound = 2 * _stopping_norms(features, codes, 4)
    distance = np.linalg.norm(np.column_stack([coef - coef_c, intercept - intercept_c]), axis=1)
    assert (distance <= bound + 1e-12).all(), (distance, bound)
    scores, scores_c = features @ coef.T + intercept, features @ coef_c.T + intercept_c
    np.testing.assert_array_equal(scores.argmax(axis=1), scores_c.argmax(axis=1))
    assert accuracy_c == pytest.approx(accuracy)
    assert n_iter_c > 1


@pytest.mark.parametrize("one_task_bytes", [0, None], ids=["products", "one-task"])
def test_two_classes_on_the_cluster_give_opposite_rows(dask_client, tmp_path, one_task_bytes):
    X, labels, data, featurize = _sharded(tmp_path, 1000, n_classes=2)
    features, _, (coef, intercept, _, _) = _one_process(X, labels, featurize)
    _, (coef_c, intercept_c, _, _) = _on_cluster(dask_client, data, featurize, one_task_bytes)
    np.testing.assert_allclose(coef_c[0], -coef_c[1])
    np.testing.assert_allclose(
        features @ coef_c.T + intercept_c, features @ coef.T + intercept, atol=1e-5
    )


def _executed(client) -> int:
    return sum(client.run(lambda dask_worker: dask_worker.state.executed_count).values())


def _solving_worker(client) -> str | None:
    """The worker running the one-task solve, if it runs."""
    for worker, keys in client.processing().items():
        if any(key_split(key) == "fit_in_one_task" for key in keys):
            return worker
    return None


@pytest.mark.parametrize("one_task_bytes", [0, None], ids=["products", "one-task"])
def test_killing_a_worker_mid_fit_gives_the_same_model(tmp_path, one_task_bytes):
    """Dask recomputes a lost worker's shards from their files (the blocks' lineage), and runs
    a lost one-task solve again on another worker: the fit goes on and reaches the same model,
    within the solver's tolerance (BLAS's results may differ in the last bits between
    processes, so not to the bit) and with the same predictions.

    Products: a worker is killed once the solver's tasks have started to run. One task: the
    worker running it is killed."""
    from distributed import Client

    X, labels, data, featurize = _sharded(tmp_path, 10_000, rows_per_shard=1000, n_basis=200)
    with start_local_cluster() as cluster, Client(cluster) as client:
        _, expected = _on_cluster(client, data, featurize, one_task_bytes)
        pids = client.run(os.getpid)
        result: dict = {}
        fit = threading.Thread(
            target=lambda: result.setdefault(
                "model", _on_cluster(client, data, featurize, one_task_bytes)[1]
            )
        )
        executed = _executed(client)
        fit.start()
        victim = None
        while fit.is_alive() and victim is None:
            time.sleep(0.02)
            if one_task_bytes is None:
                victim = _solving_worker(client)
            elif _executed(client) >= executed + 60:
                victim = next(iter(pids))
        assert fit.is_alive(), "the fit ended before a worker could be killed: make it longer"
        os.kill(pids[victim], signal.SIGKILL)
        fit.join(timeout=300)
        assert not fit.is_alive()
        assert pids[victim] not in client.run(os.getpid).values()  # the nanny started a new one
    coef, intercept = result["model"][:2]
    features = featurize(X)
    codes = np.unique(labels, return_inverse=True)[1]
    bound = 2 * _stopping_norms(features, codes, 4)
    distance = np.linalg.norm(
        np.column_stack([coef - expected[0], intercept - expected[1]]), axis=1
    )
    assert (distance <= bound + 1e-12).all(), (distance, bound)
    np.testing.assert_array_equal(
        (features @ coef.T + intercept).argmax(axis=1),
        (features @ expected[0].T + expected[1]).argmax(axis=1),
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_features_larger_than_a_worker_memory_limit_are_spilled_and_the_fit_completes(tmp_path):
    """Features of 1.3 times one worker's memory limit, in shards of 16 MB: Dask spills blocks
    to disk past 60% of the limit and reads them back for each pass.

    Spilling is what is tested, so the workers neither pause nor get restarted: a worker whose
    process alone (Python, numpy, numba) is past the pause fraction of a small limit on another
    machine would wait forever for memory it cannot free."""
    import dask
    from distributed import Client

    X, _labels, data, _ = _sharded(tmp_path, 70_000, rows_per_shard=2000, n_basis=1)
    featurize = functools.partial(rbf_kernel, Y=X[:1000], gamma=0.05)
    limit = 400 * 2**20
    assert 1.3 * limit < 70_000 * 1000 * 8
    no_pause = {
        "distributed.worker.memory.pause": False,
        "distributed.worker.memory.terminate": False,
    }
    with (
        dask.config.set(no_pause),
        start_local_cluster(memory_limit=limit) as cluster,
        Client(cluster) as client,
    ):
        classes, blocks = _blocks(client, data, featurize)
        coef, _, _, accuracy = fit_one_vs_rest_distributed(
            client, blocks, 1000, len(classes), C=1.0, max_iter=2, tol=1e-1
        )
        spilled = client.run(lambda dask_worker: len(dask_worker.data.slow))
    assert coef.shape == (4, 1000)
    assert accuracy > 0.5
    assert sum(spilled.values()) > 0, "nothing was spilled: the test does not test spilling"


def test_one_task_holds_a_quarter_of_a_worker_on_one_machine_and_less_across_machines():
    gib = 2**30
    one_machine = [{"host": "10.0.0.1", "memory_limit": 4 * gib}] * 2
    assert one_task_limit(one_machine) == ONE_TASK_MEMORY_SHARE * 4 * gib
    two_machines = [{"host": "10.0.0.1", "memory_limit": 4 * gib},
                    {"host": "10.0.0.2", "memory_limit": 8 * gib}]  # fmt: skip
    assert one_task_limit(two_machines) == min(ONE_TASK_MEMORY_SHARE * 4 * gib, ONE_TASK_BYTES)
    small = [{"host": "a", "memory_limit": gib}, {"host": "b", "memory_limit": gib}]
    assert one_task_limit(small) == ONE_TASK_MEMORY_SHARE * gib
    assert one_task_limit([{"host": "a", "memory_limit": 0}]) == ONE_TASK_BYTES
    unlimited_beside = [{"host": "a", "memory_limit": None}, {"host": "a", "memory_limit": gib}]
    assert one_task_limit(unlimited_beside) == ONE_TASK_MEMORY_SHARE * gib
    assert one_task_limit(one_machine, one_task_bytes=0) == 0


def _splitmix64(x: int) -> int:
    """SplitMix64 (Steele, Lea and Flood), written out on Python's integers."""
    mask = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_each_rows_number_is_splitmix64_of_its_number_and_the_seed():
    rows = np.array([0, 1, 2, 999_999, 2**39 + 5])
    for seed in (0, 7):
        expected = [(_splitmix64((seed << 40) + int(r)) >> 11) / 2**53 for r in rows]
        np.testing.assert_array_equal(uniform_by_row(rows, seed), expected)
    u = uniform_by_row(np.arange(200_000), 0)
    assert abs((u < 0.1).mean() - 0.1) < 0.005


@pytest.mark.parametrize("one_task_bytes", [0, None], ids=["products", "one-task"])
def test_the_C_path_holds_out_the_same_rows_however_the_data_is_cut(
    dask_client, tmp_path, one_task_bytes
):
    """Shards of 500 and of 1,500 rows of the same items: the same rows held out, the same C
    chosen, held-out accuracies within one item (the models agree within the solver's
    tolerance; their sums run in other orders). Both ways of solving are checked."""
    paths = []
    for rows_per_shard in (500, 1500):
        _, _, data, featurize = _sharded(tmp_path / str(rows_per_shard), 3000,
                                         rows_per_shard=rows_per_shard)  # fmt: skip
        classes, blocks = _blocks(dask_client, data, featurize)
        paths.append(
            fit_along_C(
                dask_client, blocks, 60, len(classes), [0.1, 1.0, 10.0], max_iter=1000,
                held_out=0.1, seed=3, one_task_bytes=one_task_bytes,
            )
        )  # fmt: skip
    (path_a, (C_a, _)), (path_b, (C_b, _)) = paths
    assert [step["C"] for step in path_a] == [0.1, 1.0, 10.0]
    assert C_a == C_b
    held = (uniform_by_row(np.arange(3000), 3) < 0.1).sum()
    for a, b in zip(path_a, path_b, strict=True):
        assert abs(a["held_out_accuracy"] - b["held_out_accuracy"]) <= 1 / held + 1e-12
