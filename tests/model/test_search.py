"""The search model, its catalogue artifact and queries, against numpy references."""

from __future__ import annotations

import dataclasses
import inspect
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from service.model import ArtifactIntegrityError, InvalidInputError, NotFoundError, Predictor
from service.model.search import (
    SearchIndex,
    SearchQuery,
    SparseCode,
    UnionOfSubspacesModel,
    catalogue_dir,
    read_catalogue,
    search_dir,
    search_features,
)
from training.retrieval.catalogue import build_catalogue, dataset_items


@pytest.fixture(scope="module")
def index(search_model_dir) -> SearchIndex:
    return SearchIndex.load(search_model_dir, Predictor.load(search_model_dir))


@pytest.fixture(scope="module")
def test_features(index, digits) -> np.ndarray:
    return search_features(index.predictor, index.model.feature_space, digits.X_test)


def _score_bound(code: SparseCode, projected: np.ndarray, relative: float) -> float:
    """How far a score ``b + sum_r w_r x'_rj`` can be off, over the items, when each of its
    terms is off by ``relative`` of itself: ``relative * max_j (|b| + sum_r |w_r x'_rj|)``.

    ``projected`` is (A, N), float64. Relative errors: ``2**-23`` for the float32 catalogue
    against float64 projections (float32 rounding, 2**-24, with room for the float64 sums);
    ``(nnz + 1) * eps`` for the catalogue's own values summed in another order.
    """
    terms = np.abs(code.weights) @ np.abs(projected[code.atoms])
    return relative * float(abs(code.bias) + terms.max())


def _float64_order(code: SparseCode) -> float:
    return (code.n_nonzero + 1) * np.finfo(np.float64).eps


def assert_top_k(items, reference: np.ndarray, k: int, tolerance: float):
    """``items`` (``test-<position>`` ids, scores) are the top k of ``reference`` (float64
    scores of every catalogue position), up to ``tolerance`` on each returned score.

    Scores off by up to ``tolerance`` may swap items whose reference scores are within
    ``2 * tolerance``: in the order, and at the k-th place, where any item tied with the k-th
    within that band may come. Where the reference's k-th and (k+1)-th scores are further apart,
    the set of items is exactly the reference's top k.
    """
    reference = np.asarray(reference, dtype=np.float64)
    candidates = np.arange(reference.size)
    m = min(k, candidates.size)
    positions = np.array([int(i.split("-")[1]) for i, _ in items], dtype=np.int64)
    scores = np.array([s for _, s in items])
    assert len(items) == m
    assert len(set(positions.tolist())) == m
    np.testing.assert_allclose(scores, reference[positions], rtol=0, atol=tolerance)
    assert (np.diff(scores) <= 0).all()  # best first, by the scores returned
    assert (np.diff(reference[positions]) <= 2 * tolerance).all()  # and by the reference
    ranked = candidates[np.argsort(-reference[candidates], kind="stable")]
    kth = reference[ranked[m - 1]]
    left_out = np.setdiff1d(candidates, positions)
    assert (reference[positions] >= kth - 2 * tolerance).all()
    assert (reference[left_out] <= kth + 2 * tolerance).all()
    if m == candidates.size or kth - reference[ranked[m]] > 2 * tolerance:
        assert set(positions.tolist()) == set(ranked[:m].tolist())


def test_catalogue_holds_d_transpose_x_of_the_test_split(index, digits, test_features):
    catalogue = index.catalogue
    assert catalogue.projected.shape == (index.model.n_atoms, len(digits.y_test))
    assert isinstance(catalogue.projected, np.memmap)
    expected = (test_features @ index.model.dictionary).T
    np.testing.assert_allclose(catalogue.projected, expected, rtol=1e-6, atol=1e-6)
    assert catalogue.ids[:3].tolist() == ["test-0", "test-1", "test-2"]
    np.testing.assert_array_equal(catalogue.labels, digits.y_test)
    assert index.model.feature_space == "inputs"
    assert catalogue.negatives.size == len(digits.y_test)  # fewer items than the sample size


def test_class_search_matches_numpy_ranking(index, test_features):
    query = SearchQuery(class_label="3", top_k=25)
    result = index.run(query)
    k = index.model.classes.index("3")
    z, b = index.model.codes[:, k], index.model.intercept[k]
    assert result.code.n_nonzero == np.count_nonzero(z) <= 10
    # The reference scores float64 features; the catalogue holds D^T x rounded to float32.
    projected = (test_features @ index.model.dictionary).T
    scores = z @ projected + b
    tolerance = _score_bound(result.code, projected, 2.0**-23)
    assert_top_k(result.items, scores, 25, tolerance)
    # The code lists its strongest atoms first.
    assert np.all(np.diff(np.abs(result.code.weights)) <= 0)


def test_class_search_finds_the_class(index, digits):
    precision = {}
    for label in index.model.classes:
        result = index.run(SearchQuery(class_label=label, top_k=20))
        positions = [int(i.split("-")[1]) for i, _ in result.items]
        precision[label] = (digits.y_test[positions] == label).mean()
    assert np.mean(list(precision.values())) >= 0.8, precision


def test_code_query_matches_reference_and_prunes(index):
    projected64 = np.asarray(index.catalogue.projected, dtype=np.float64)
    query = SearchQuery(code=([4, 9, 2], [0.5, -2.0, 1.0]), bias=0.25, top_k=7)
    result = index.run(query)
    assert result.code.atoms.tolist() == [9, 2, 4]
    # The catalogue's own float32 values: only the order of the float64 sums differs.
    scores = 0.25 + np.array([0.5, -2.0, 1.0]) @ projected64[[4, 9, 2]]
    tolerance = _score_bound(result.code, projected64, _float64_order(result.code))
    assert_top_k(result.items, scores, 7, tolerance)
    pruned = index.run(SearchQuery(code=([4, 9, 2], [0.5, -2.0, 1.0]), sparsity=1))
    assert pruned.code.atoms.tolist() == [9]
    assert pruned.code.weights.tolist() == [-2.0]


def test_exclusions_are_never_returned(index):
    top = index.run(SearchQuery(class_label="5", top_k=10))
    excluded = [i for i, _ in top.items[:4]]
    again = index.run(SearchQuery(class_label="5", top_k=10, exclude=excluded))
    assert not set(excluded) & {i for i, _ in again.items}
    assert [i for i, _ in again.items[:6]] == [i for i, _ in top.items[4:]]


def test_learned_code_from_ids_finds_more_of_the_class(index, digits):
    sevens = [f"test-{j}" for j in np.flatnonzero(digits.y_test == "7")[:5]]
    result = index.run(SearchQuery(positives=sevens, top_k=20))
    assert result.kind == "positives"
    assert result.n_positives == 5
    assert result.n_negatives == len(digits.y_test) - 5  # the sample minus the positives
    assert 1 <= result.code.n_nonzero <= index.model.metadata["n_nonzero"]
    ids = [i for i, _ in result.items]
    assert not set(sevens) & set(ids)  # positives excluded by default
    positions = [int(i.split("-")[1]) for i in ids]
    assert (digits.y_test[positions] == "7").mean() >= 0.7
    kept = index.run(SearchQuery(positives=sevens, top_k=20, exclude_positives=False))
    assert set(sevens) & {i for i, _ in kept.items}


def test_instances_project_like_their_catalogue_rows(index, digits):
    rows, positions = index._example_rows(
        [digits.X_test[3].reshape(8, 8).tolist(), "test-8"], "positive"
    )
    assert positions.tolist() == [8]
    catalogue = index.catalogue
    # Ids first, then instances, which go through the features and D^T like the catalogue did.
    np.testing.assert_allclose(rows[0], catalogue.projected[:, 8], rtol=0, atol=0)
    np.testing.assert_allclose(rows[1], catalogue.projected[:, 3], rtol=1e-5, atol=1e-6)


def test_strongest_atoms_report_each_atoms_items(index):
    # A class whose two strongest atoms have opposite signs, so that both directions are checked.
    codes = index.model.codes
    strongest = np.take_along_axis(codes, np.argsort(-np.abs(codes), axis=0)[:2], axis=0)
    k = int(np.flatnonzero((strongest > 0).any(axis=0) & (strongest < 0).any(axis=0))[0])
    result = index.run(SearchQuery(class_label=index.model.classes[k], strongest_atoms=2))
    z = codes[:, k]
    atoms = [a.atom for a in result.strongest_atoms]
    # The two atoms of largest |z| (any of equal ones), with their weights.
    np.testing.assert_array_equal(np.abs(z[atoms]), np.sort(np.abs(z))[::-1][:2])
    assert [a.weight for a in result.strongest_atoms] == z[atoms].tolist()
    # Each atom's items: the catalogue ranked by that atom alone, highest first for a positive
    # weight and lowest first for a negative one.
    projected64 = np.asarray(index.catalogue.projected, dtype=np.float64)
    for report in result.strongest_atoms:
        alone = SparseCode(np.array([report.atom]), np.array([np.sign(z[report.atom])]), 0.0)
        reference = np.sign(z[report.atom]) * projected64[report.atom]
        tolerance = _score_bound(alone, projected64, _float64_order(alone))
        assert_top_k(report.items, reference, 5, tolerance)
    for sign in (1.0, -1.0):
        alone = SparseCode(np.array([7]), np.array([sign]), 0.0)
        tolerance = _score_bound(alone, projected64, _float64_order(alone))
        assert_top_k(index.atom_items(7, 4, sign=sign), sign * projected64[7], 4, tolerance)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"class_label": "eleven"}, "unknown class 'eleven'"),
        ({"code": ([64], [1.0])}, "code index 64 is out of range"),
        ({"code": ([-1], [1.0])}, "code index -1 is out of range"),
        ({"code": ([1, 1], [1.0, 2.0])}, "distinct"),
        ({"code": ([1, 2], [1.0])}, "one length"),
        ({"code": ([], [])}, "the code is empty"),
        ({"code": ([1], [float("nan")])}, "finite"),
        ({"positives": ["test-1", "nope"]}, "unknown catalogue positive(s): 'nope'"),
        ({"positives": [[1.0, 2.0]]}, "expected"),
        ({"class_label": "1", "exclude": ["x-1"]}, "unknown catalogue id(s): 'x-1'"),
        ({"class_label": "1", "exclude": ["test-7960"]}, "unknown catalogue id(s)"),
    ],
)
def test_bad_queries_say_what_is_wrong(index, query, message):
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        index.run(SearchQuery(**query))


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({}, "send exactly one of class, code or positives"),
        (
            {"class_label": "1", "code": ([1], [1.0])},
            "send exactly one of class, code or positives",
        ),
        ({"class_label": "1", "positives": ["test-1"]}, "send exactly one"),
        ({"code": ([1], [1.0]), "positives": ["test-1"]}, "send exactly one"),
        ({"negatives": ["test-1"]}, "send exactly one"),
        ({"class_label": "1", "negatives": ["test-1"]}, "negatives go with positives"),
        ({"code": ([1], [1.0]), "negatives": ["test-1"]}, "negatives go with positives"),
        ({"positives": []}, "positives is empty"),
        ({"positives": ["test-1"], "negatives": []}, "negatives is empty"),
        ({"class_label": "1", "top_k": 0}, "top_k must be at least 1, got 0"),
        ({"class_label": "1", "top_k": -5}, "top_k must be at least 1, got -5"),
        ({"class_label": "1", "top_k": 2.5}, "top_k must be at least 1, got 2.5"),
        ({"class_label": "1", "top_k": True}, "top_k must be at least 1, got True"),
        ({"class_label": "1", "sparsity": 0}, "sparsity must be at least 1, got 0"),
        ({"class_label": "1", "sparsity": "3"}, "sparsity must be at least 1, got '3'"),
        ({"class_label": "1", "strongest_atoms": -1}, "strongest_atoms must be >= 0, got -1"),
    ],
)
def test_a_query_checks_its_own_rules_when_made(query, message):
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        SearchQuery(**query)


def test_valid_queries_are_made_and_replace_checks_again():
    query = SearchQuery(positives=["test-1"], negatives=["test-2"], top_k=1, sparsity=1)
    assert SearchQuery(class_label="1", strongest_atoms=0, top_k=np.int64(3)).top_k == 3
    with pytest.raises(InvalidInputError, match="top_k must be at least 1"):
        dataclasses.replace(query, top_k=0)


def test_run_takes_no_serving_limits(index, digits):
    assert list(inspect.signature(SearchIndex.run).parameters) == ["self", "query"]
    # Limits on items and examples are the HTTP layer's: the library answers any valid query.
    result = index.run(SearchQuery(class_label="1", top_k=10**6))
    assert len(result.items) == len(digits.y_test)
    positives = [f"test-{j}" for j in range(60)]
    learned = index.run(SearchQuery(positives=positives, negatives=["test-60", "test-61"]))
    assert (learned.n_positives, learned.n_negatives) == (60, 2)


def test_an_id_among_both_positives_and_negatives_is_named(index):
    # It answered a code of weight 0 (l1_min_c has no start for it), which ranks nothing.
    with pytest.raises(InvalidInputError, match=r"among both positives and negatives: 'test-1'"):
        index.run(SearchQuery(positives=["test-1", "test-2"], negatives=["test-1"], top_k=3))
    with pytest.raises(InvalidInputError, match=r"'7'"):
        index.run(SearchQuery(positives=[7], negatives=["7", "test-3"]))


def test_the_same_instances_as_positives_and_negatives_are_refused(index, digits):
    # The same defect with instances: nothing separates them (it was an HTTP 500, then a
    # meaningless code).
    image = digits.X_test[9].reshape(8, 8).tolist()
    with pytest.raises(InvalidInputError, match="nothing separates the positives"):
        index.run(SearchQuery(positives=[image], negatives=[image], top_k=3))


def test_atoms_out_of_range_are_not_found(index):
    with pytest.raises(NotFoundError, match="no atom 64"):
        index.atom_items(64, 5)


def test_top_k_beyond_the_catalogue_returns_everything(index, digits):
    result = index.run(SearchQuery(class_label="1", top_k=1000))
    assert len(result.items) == len(digits.y_test)
    assert len({i for i, _ in result.items}) == len(digits.y_test)


def test_chunked_memory_mapped_build_equals_one_chunk(search_model_dir, digits, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(search_model_dir, copy)
    predictor = Predictor.load(copy)
    model = UnionOfSubspacesModel.load(search_dir(copy), copy)
    items_file = tmp_path / "items.npy"
    np.save(items_file, digits.X_test)
    items = np.load(items_file, mmap_mode="r")
    _, ids, _ = dataset_items(digits, "test")
    build_catalogue(copy, predictor, model, items, ids, chunk_size=97, progress=False,
                    overwrite=True)  # fmt: skip
    chunked = read_catalogue(catalogue_dir(copy), search_dir(copy))
    reference = read_catalogue(catalogue_dir(search_model_dir), search_dir(search_model_dir))
    # The same float64 products, which BLAS may sum in another order for chunks of another size,
    # then rounded to float32: at most one float32 step apart (2**-23 relative), or the float64
    # rounding itself near zero.
    scale = float(np.abs(reference.projected).max())
    np.testing.assert_allclose(
        chunked.projected, reference.projected, rtol=2.0**-23, atol=1e-12 * scale
    )
    assert chunked.labels is None


def test_a_catalogue_of_another_dictionary_is_refused(search_model_dir, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(search_model_dir, copy)
    model = UnionOfSubspacesModel.load(search_dir(copy), copy)
    kept = tmp_path / "catalogue"
    shutil.copytree(catalogue_dir(copy), kept)
    retrained = UnionOfSubspacesModel(**{**model.__dict__, "intercept": model.intercept + 1.0})
    retrained.save(search_dir(copy), copy, overwrite=True)
    assert not catalogue_dir(copy).exists()  # a new dictionary retires the catalogue
    shutil.copytree(kept, catalogue_dir(copy))
    with pytest.raises(ArtifactIntegrityError, match="built for another version"):
        SearchIndex.load(copy, Predictor.load(copy))


def test_a_tampered_catalogue_is_refused(search_model_dir, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(search_model_dir, copy)
    (projected,) = (catalogue_dir(copy) / "shards").glob("*/projected.npy")
    data = bytearray(projected.read_bytes())
    data[-1] ^= 0xFF
    projected.write_bytes(bytes(data))
    with pytest.raises(ArtifactIntegrityError, match=r"checksum of projected\.npy"):
        SearchIndex.load(copy, Predictor.load(copy))


def test_a_model_without_search_has_no_index(digits_model_dir, digits_predictor):
    assert SearchIndex.load(digits_model_dir, digits_predictor) is None


def test_sparse_code_from_dense_keeps_the_strongest():
    code = SparseCode.from_dense(np.array([0.0, -3.0, 1.0, 0.0, 2.0]), 0.5, n_nonzero=2)
    assert code.atoms.tolist() == [1, 4]
    assert code.weights.tolist() == [-3.0, 2.0]
    assert code.bias == 0.5


def test_negatives_sample_is_distinct_seeded_and_uniform():
    from service.model.search.catalogue import sample_positions

    sample = sample_positions(1000, 100, np.random.default_rng(3))
    assert sample.tolist() == sorted(set(sample.tolist()))
    assert len(sample) == 100
    assert 0 <= sample.min() <= sample.max() < 1000
    again = sample_positions(1000, 100, np.random.default_rng(3))
    np.testing.assert_array_equal(sample, again)
    assert sample_positions(5, 5, np.random.default_rng(0)).tolist() == [0, 1, 2, 3, 4]
    # Uniform: every position is drawn about equally often over many seeds.
    counts = np.zeros(20)
    for seed in range(2000):
        counts[sample_positions(20, 5, np.random.default_rng(seed))] += 1
    assert counts.min() > 0.8 * 500
    assert counts.max() < 1.2 * 500


def test_ids_are_stored_asnarrow_strings_and_must_be_unique(search_model_dir, tmp_path):
    from service.model.search.catalogue import narrow_strings

    assert narrow_strings(np.arange(1000)).dtype == np.dtype("<U3")
    assert narrow_strings(np.array([-12, 5])).tolist() == ["-12", "5"]
    assert narrow_strings(np.array(["a", "bcd"], dtype="<U40")).dtype == np.dtype("<U3")
    copy = tmp_path / "model"
    shutil.copytree(search_model_dir, copy)
    predictor = Predictor.load(copy)
    model = UnionOfSubspacesModel.load(search_dir(copy), copy)
    ids = np.array(["a", "b", "a"])
    with pytest.raises(InvalidInputError, match=r"'a' is given twice"):
        build_catalogue(copy, predictor, model, np.zeros((3, 64)), ids, progress=False,
                        overwrite=True)  # fmt: skip
    assert catalogue_dir(copy).exists()  # the old catalogue is untouched


def test_a_search_model_without_catalogue_refuses_searches(search_model_dir, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(search_model_dir, copy)
    shutil.rmtree(catalogue_dir(copy))
    index = SearchIndex.load(copy, Predictor.load(copy))
    assert index.catalogue is None
    assert index.model.class_code("3").n_nonzero == 10  # the codes are still there
    with pytest.raises(NotFoundError, match="python -m training index"):
        index.run(SearchQuery(class_label="3"))


_WARM_UP_SCRIPT = """
import sys
from service.model import Predictor
from service.model.kernels.l1svm import l1_svm_path
from service.model.search import SearchIndex

index = SearchIndex.load(sys.argv[1], Predictor.load(sys.argv[1]))
assert not l1_svm_path.signatures, "loading already ran the path solver"
index.warm_up()
assert l1_svm_path.signatures, "warm_up did not run the path solver"
assert "sklearn.svm" not in sys.modules, "learning a code imported scikit-learn's SVMs"
"""


def test_warm_up_runs_what_a_query_by_positives_needs(search_model_dir):
    # A fresh interpreter: this one has long run the solver.
    completed = subprocess.run(
        [sys.executable, "-c", _WARM_UP_SCRIPT, str(search_model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr


@pytest.mark.parametrize("n_items", [1, 2])
def test_warm_up_of_a_catalogue_smaller_than_its_positives(search_model_dir, digits, tmp_path,
                                                           n_items):  # fmt: skip
    copy = tmp_path / "model"
    shutil.copytree(search_model_dir, copy)
    predictor = Predictor.load(copy)
    model = UnionOfSubspacesModel.load(search_dir(copy), copy)
    ids = np.array([f"item-{j}" for j in range(n_items)])
    build_catalogue(copy, predictor, model, digits.X_test[:n_items], ids, progress=False,
                    overwrite=True)  # fmt: skip
    index = SearchIndex.load(copy, predictor)
    index.warm_up()  # every item is a positive: no default negatives are left
    assert index.run(SearchQuery(class_label="3", top_k=5)).items[0][0] in ids
    other = digits.X_test[5].reshape(8, 8).tolist()
    learned = index.run(SearchQuery(positives=["item-0"], negatives=[other]))
    assert learned.n_positives == learned.n_negatives == 1
