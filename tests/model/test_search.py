"""The search model, its catalogue artifact and queries, against numpy references."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from service.model import ArtifactIntegrityError, InvalidInputError, NotFoundError, Predictor
from service.model.search import (
    SearchIndex,
    SearchQuery,
    SparseCode,
    UnionOfSubspacesModel,
    read_catalogue,
    search_features,
)
from training.search import build_catalogue, catalogue_dir, dataset_items, search_dir


@pytest.fixture(scope="module")
def index(search_model_dir) -> SearchIndex:
    return SearchIndex.load(search_model_dir, Predictor.load(search_model_dir))


@pytest.fixture(scope="module")
def test_features(index, digits) -> np.ndarray:
    return search_features(index.predictor, index.model.feature_space, digits.X_test)


def _reference_top(projected64: np.ndarray, code: SparseCode, k: int, excluded=()):
    scores = code.bias + code.weights @ projected64[code.atoms]
    scores[list(excluded)] = -np.inf
    order = np.lexsort((np.arange(len(scores)), -scores))[:k]
    order = order[np.isfinite(scores[order])]
    return order, scores[order]


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
    result = index.run(query, max_top_k=1000)
    k = index.model.classes.index("3")
    z, b = index.model.codes[:, k], index.model.intercept[k]
    assert result.code.n_nonzero == np.count_nonzero(z) <= 10
    scores = test_features @ index.model.dictionary @ z + b
    order = np.argsort(-scores, kind="stable")[:25]
    assert [i for i, _ in result.items] == [f"test-{j}" for j in order]
    np.testing.assert_allclose([s for _, s in result.items], scores[order], rtol=1e-5)
    # The code lists its strongest atoms first.
    assert np.all(np.diff(np.abs(result.code.weights)) <= 0)


def test_class_search_finds_the_class(index, digits):
    precision = {}
    for label in index.model.classes:
        result = index.run(SearchQuery(class_label=label, top_k=20), max_top_k=1000)
        positions = [int(i.split("-")[1]) for i, _ in result.items]
        precision[label] = (digits.y_test[positions] == label).mean()
    assert np.mean(list(precision.values())) >= 0.8, precision


def test_code_query_matches_reference_and_prunes(index):
    projected64 = np.asarray(index.catalogue.projected, dtype=np.float64)
    query = SearchQuery(code=([4, 9, 2], [0.5, -2.0, 1.0]), bias=0.25, top_k=7)
    result = index.run(query, max_top_k=1000)
    assert result.code.atoms.tolist() == [9, 2, 4]
    order, scores = _reference_top(projected64, result.code, 7)
    assert [i for i, _ in result.items] == [f"test-{j}" for j in order]
    np.testing.assert_allclose([s for _, s in result.items], scores, rtol=1e-6)
    pruned = index.run(SearchQuery(code=([4, 9, 2], [0.5, -2.0, 1.0]), sparsity=1), 1000)
    assert pruned.code.atoms.tolist() == [9]
    assert pruned.code.weights.tolist() == [-2.0]


def test_exclusions_are_never_returned(index):
    top = index.run(SearchQuery(class_label="5", top_k=10), 1000)
    excluded = [i for i, _ in top.items[:4]]
    again = index.run(SearchQuery(class_label="5", top_k=10, exclude=excluded), 1000)
    assert not set(excluded) & {i for i, _ in again.items}
    assert [i for i, _ in again.items[:6]] == [i for i, _ in top.items[4:]]


def test_learned_code_from_ids_finds_more_of_the_class(index, digits):
    sevens = [f"test-{j}" for j in np.flatnonzero(digits.y_test == "7")[:5]]
    result = index.run(SearchQuery(positives=sevens, top_k=20), 1000)
    assert result.kind == "positives"
    assert result.n_positives == 5
    assert result.n_negatives == len(digits.y_test) - 5  # the sample minus the positives
    assert 1 <= result.code.n_nonzero <= index.model.metadata["n_nonzero"]
    ids = [i for i, _ in result.items]
    assert not set(sevens) & set(ids)  # positives excluded by default
    positions = [int(i.split("-")[1]) for i in ids]
    assert (digits.y_test[positions] == "7").mean() >= 0.7
    kept = index.run(SearchQuery(positives=sevens, top_k=20, exclude_positives=False), 1000)
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
    result = index.run(SearchQuery(class_label="0", strongest_atoms=2), 1000)
    assert [a.atom for a in result.strongest_atoms] == result.code.atoms[:2].tolist()
    for report in result.strongest_atoms:
        sign = 1.0 if report.weight >= 0 else -1.0
        assert report.items == index.atom_items(report.atom, 5, sign=sign)
    row = np.asarray(index.catalogue.projected[7], dtype=np.float64)
    best = np.argsort(-row, kind="stable")[:4]
    assert [i for i, _ in index.atom_items(7, 4)] == [f"test-{j}" for j in best]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (SearchQuery(class_label="eleven"), "unknown class 'eleven'"),
        (SearchQuery(code=([64], [1.0])), "code index 64 is out of range"),
        (SearchQuery(code=([-1], [1.0])), "code index -1 is out of range"),
        (SearchQuery(code=([1, 1], [1.0, 2.0])), "distinct"),
        (SearchQuery(code=([1, 2], [1.0])), "one length"),
        (SearchQuery(code=([], [])), "the code is empty"),
        (SearchQuery(code=([1], [float("nan")])), "finite"),
        (SearchQuery(positives=[]), "positives is empty"),
        (SearchQuery(positives=["test-1"], negatives=[]), "negatives is empty"),
        (SearchQuery(positives=["test-1", "nope"]), "unknown catalogue positive(s): 'nope'"),
        (SearchQuery(positives=[[1.0, 2.0]]), "expected"),
        (SearchQuery(class_label="1", exclude=["x-1"]), "unknown catalogue id(s): 'x-1'"),
        (SearchQuery(class_label="1", exclude=["test-7960"]), "unknown catalogue id(s)"),
        (SearchQuery(class_label="1", top_k=0), "top_k must be between 1 and 1000"),
        (SearchQuery(class_label="1", top_k=1001), "top_k must be between 1 and 1000"),
        (SearchQuery(class_label="1", sparsity=0), "sparsity must be at least 1"),
        (SearchQuery(), "exactly one of class, code or positives"),
        (SearchQuery(class_label="1", code=([1], [1.0])), "exactly one"),
    ],
)
def test_bad_queries_say_what_is_wrong(index, query, message):
    with pytest.raises(InvalidInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        index.run(query, max_top_k=1000)


def test_atoms_out_of_range_are_not_found(index):
    with pytest.raises(NotFoundError, match="no atom 64"):
        index.atom_items(64, 5)


def test_top_k_beyond_the_catalogue_returns_everything(index, digits):
    result = index.run(SearchQuery(class_label="1", top_k=1000), max_top_k=1000)
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
    np.testing.assert_array_equal(chunked.projected, reference.projected)
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
    projected = catalogue_dir(copy) / "projected.npy"
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
    from service.model.search import _sample_positions

    sample = _sample_positions(1000, 100, np.random.default_rng(3))
    assert sample.tolist() == sorted(set(sample.tolist()))
    assert len(sample) == 100
    assert 0 <= sample.min() <= sample.max() < 1000
    again = _sample_positions(1000, 100, np.random.default_rng(3))
    np.testing.assert_array_equal(sample, again)
    assert _sample_positions(5, 5, np.random.default_rng(0)).tolist() == [0, 1, 2, 3, 4]
    # Uniform: every position is drawn about equally often over many seeds.
    counts = np.zeros(20)
    for seed in range(2000):
        counts[_sample_positions(20, 5, np.random.default_rng(seed))] += 1
    assert counts.min() > 0.8 * 500
    assert counts.max() < 1.2 * 500


def test_ids_are_stored_as_narrow_strings_and_must_be_unique(search_model_dir, tmp_path):
    from service.model.search import _narrow_strings

    assert _narrow_strings(np.arange(1000)).dtype == np.dtype("<U3")
    assert _narrow_strings(np.array([-12, 5])).tolist() == ["-12", "5"]
    assert _narrow_strings(np.array(["a", "bcd"], dtype="<U40")).dtype == np.dtype("<U3")
    copy = tmp_path / "model"
    shutil.copytree(search_model_dir, copy)
    predictor = Predictor.load(copy)
    model = UnionOfSubspacesModel.load(search_dir(copy), copy)
    ids = np.array(["a", "b", "a"])
    with pytest.raises(InvalidInputError, match=r"duplicate catalogue ids, e\.g\. 'a'"):
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
        index.run(SearchQuery(class_label="3"), 1000)
