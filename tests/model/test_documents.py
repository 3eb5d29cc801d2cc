"""Documents: the vocabulary against scikit-learn, count payloads, the views, and the document
measures through SimilaritySpec against direct dense references (scipy's gammaln)."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import gammaln
from sklearn.feature_extraction.text import CountVectorizer, TfidfTransformer

from service.model import InvalidInputError, SpecError, parse_spec
from service.model.inputs.words import (
    Documents,
    Vocabulary,
    canonical_counts,
    counts_from_pairs,
    resampled,
    smooth_idf,
)

TEXTS = [
    "The quick brown fox -- jumps over the lazy dog!",
    "Ünïcode wörds, CAPITALS and numbers 42 and 4242; the fox again, FOX.",
    "",
    "a I x",  # only one-letter tokens: none counts
    "Computers are useless. They can only give you answers. (Pablo Picasso)",
    "dog dog dog dog dog dog dog dog dog dog dog dog cat",
]


@pytest.fixture(scope="module")
def vectorizer():
    return CountVectorizer(stop_words="english", min_df=1).fit(TEXTS)


@pytest.fixture(scope="module")
def vocabulary(vectorizer):
    return Vocabulary(tuple(vectorizer.get_feature_names_out()))


def test_encode_counts_the_same_words_as_scikit_learn(vectorizer, vocabulary):
    unseen = ["Foxes and dogs: the FOX, the dog.", "nothing known here at all", "dog"]
    for texts in (TEXTS, unseen):
        ours = vocabulary.encode(texts)
        np.testing.assert_array_equal(ours.toarray(), vectorizer.transform(texts).toarray())
        assert ours.indices.dtype == np.int64
        assert ours.has_sorted_indices


def test_unknown_words_are_dropped_and_an_empty_text_is_an_empty_row(vocabulary):
    counts = vocabulary.encode(["zzz qqq the and", "", "fox zzz fox"])
    assert counts.getrow(0).nnz == 0
    assert counts.getrow(1).nnz == 0
    assert counts.getrow(2).toarray().sum() == 2


def test_encode_refuses_what_is_not_text(vocabulary):
    with pytest.raises(InvalidInputError, match=r"texts\[1\] must be a string"):
        vocabulary.encode(["fine", 3])


def test_vocabulary_terms_must_be_distinct():
    with pytest.raises(ValueError, match="distinct"):
        Vocabulary(("a", "b", "a"))


def test_counts_from_pairs_sums_repeats_and_checks_every_field():
    counts = counts_from_pairs(
        [{"indices": [3, 1, 3], "counts": [1, 2, 4]}, {"indices": [], "counts": []}], 5
    )
    np.testing.assert_array_equal(counts.toarray(), [[0, 2, 0, 5, 0], [0, 0, 0, 0, 0]])
    bad = [
        ([{"indices": [5], "counts": [1]}], r"instances\[0\]: word index 5 is not .* \[0, 5\)"),
        ([{"indices": [-1], "counts": [1]}], "word index -1"),
        ([{"indices": [1.5], "counts": [1]}], "word index 1.5"),
        ([{"indices": [True], "counts": [1]}], "word index True"),
        ([{"indices": [1], "counts": [-2]}], "count -2 is not a non-negative whole number"),
        ([{"indices": [1], "counts": [0.5]}], "count 0.5"),
        ([{"indices": [1], "counts": ["2"]}], "count '2'"),
        ([{"indices": [1, 2], "counts": [1]}], "2 indices but 1 counts"),
        ([{"indices": [1]}], "exactly the keys indices and counts"),
        ([[1, 2]], "exactly the keys"),
        ([{"indices": 1, "counts": 1}], "must be lists"),
    ]
    for documents, message in bad:
        with pytest.raises(InvalidInputError, match=message):
            counts_from_pairs(documents, 5)


def test_canonical_counts_refuses_negative_or_fractional_counts():
    with pytest.raises(InvalidInputError, match="document 1"):
        canonical_counts(sp.csr_matrix(np.array([[1.0, 0.0], [0.0, 0.5]])))
    with pytest.raises(InvalidInputError, match="expected counts over 3 words"):
        canonical_counts(sp.csr_matrix(np.ones((1, 2))), n_words=3)


def test_tfidf_view_is_scikit_learns_smooth_l2_tfidf(vectorizer):
    counts = canonical_counts(vectorizer.transform(TEXTS))
    documents = Documents(counts, smooth_idf(counts))
    expected = TfidfTransformer().fit_transform(counts).toarray()
    np.testing.assert_allclose(documents.view("tfidf").toarray(), expected, rtol=1e-12)


def test_resampling_is_deterministic_per_document_and_keeps_its_words():
    rng = np.random.default_rng(0)
    dense = rng.integers(0, 4, size=(20, 30)).astype(float)
    dense[3] = 0.0
    counts = canonical_counts(sp.csr_matrix(dense))
    first = Documents(counts).view("resampled", 40).toarray()
    np.testing.assert_array_equal(counts.toarray(), dense)  # the counts are left alone
    # The same documents in another order and batch give the same resamples.
    order = rng.permutation(20)
    again = Documents(counts[order]).view("resampled", 40).toarray()
    np.testing.assert_array_equal(again, first[order])
    np.testing.assert_array_equal(
        Documents(counts[5:6]).view("resampled", 40).toarray(), first[5:6]
    )
    totals = first.sum(axis=1)
    assert totals[3] == 0.0  # an empty document stays empty
    np.testing.assert_array_equal(np.delete(totals, 3), 40.0)
    assert ((first > 0) <= (dense > 0)).all()  # only the document's own words
    # The draws follow the document's own distribution, with real randomness.
    drawn = resampled(canonical_counts(sp.csr_matrix([[60.0, 30.0, 10.0]])), 20_000).toarray()[0]
    np.testing.assert_allclose(drawn / 20_000, [0.6, 0.3, 0.1], atol=0.015)
    assert drawn[0] != 12_000


# -- the measures on documents, through SimilaritySpec --------------------------------------


def dense_sensing0(B, X):
    W = B.shape[1]
    overlap = gammaln(B[None] + X[:, None] + 1) - gammaln(B[None] + 1) - gammaln(X[:, None] + 1)
    nb, nx = B.sum(1), X.sum(1)
    return (
        overlap.sum(-1) + gammaln(nb + 1)[None] + gammaln(nx + 1)[:, None]
        - gammaln(nb[None] + nx[:, None] + W)
    )  # fmt: skip


def dense_sensing1(B, X, n):
    def freq(A):
        totals = A.sum(1, keepdims=True)
        return n * np.divide(A, totals, out=np.zeros_like(A), where=totals > 0)

    Bf, Xf = freq(B), freq(X)
    overlap = gammaln(Bf[None] + Xf[:, None] + 1) - gammaln(Bf[None] + 1) - gammaln(Xf[:, None] + 1)
    return overlap.sum(-1)


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(3)
    dense = rng.poisson(0.15, size=(60, 80)).astype(float)
    dense[7] = 0.0  # an empty document
    dense[8] = 0.0
    dense[8, 5] = 1.0  # a one-word document
    dense[9, 2] = 900.0  # a very long one
    counts = canonical_counts(sp.csr_matrix(dense))
    idf = smooth_idf(counts)
    return dense, Documents(counts[:15], idf), Documents(counts[15:], idf)


@pytest.mark.parametrize("n_inputs", [1, 45])  # serial and parallel drivers
def test_document_measures_equal_dense_references(corpus, n_inputs):
    dense, basis, inputs = corpus
    inputs = inputs[:n_inputs]
    B, X = dense[:15], dense[15 : 15 + n_inputs]
    checks = {
        "sensing0": dense_sensing0(B, X),
        "sensing1(n=150)": dense_sensing1(B, X, 150.0),
        "sensing1(n=0.5)": dense_sensing1(B, X, 0.5),
        "sensing2(n_words=30)": dense_sensing0(
            basis.view("resampled", 30).toarray(), inputs.view("resampled", 30).toarray()
        ),
    }
    tfidf_b, tfidf_x = basis.view("tfidf").toarray(), inputs.view("tfidf").toarray()
    checks["linear"] = tfidf_x @ tfidf_b.T
    sq = ((tfidf_x[:, None] - tfidf_b[None]) ** 2).sum(-1)
    checks["rbf(gamma=0.7)"] = np.exp(-0.7 * sq)
    for text, expected in checks.items():
        got = parse_spec(text).compute(basis, inputs)
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9, err_msg=text)


def test_measures_refuse_the_wrong_kind_of_input(corpus):
    _, basis, inputs = corpus
    with pytest.raises(SpecError, match="compares bag-of-words documents"):
        parse_spec("sensing1").compute(np.ones((2, 3)), np.ones((1, 3)))
    with pytest.raises(SpecError, match="does not apply to bag-of-words documents"):
        parse_spec("rigid(1)").compute(basis, inputs)


def test_tfidf_measures_need_the_idf(corpus):
    dense, _, _ = corpus
    counts = canonical_counts(sp.csr_matrix(dense))
    with pytest.raises(ValueError, match="idf"):
        parse_spec("linear").compute(Documents(counts[:3]), Documents(counts[3:5]))


def test_basis_expansion_on_word_counts(corpus):
    from training.estimator.expansion import BasisExpansion

    dense, _, _ = corpus
    counts = sp.csr_matrix(dense)
    y = np.arange(len(dense)) % 3
    expansion = BasisExpansion("sensing1(n=150) + linear", n_basis_per_class=4, chunk_size=7)
    features = expansion.fit_transform(counts, y)
    assert sp.issparse(expansion.basis_)
    assert expansion.basis_.shape == (12, dense.shape[1])
    np.testing.assert_allclose(expansion.transform(counts), features, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(expansion.idf_, smooth_idf(canonical_counts(counts)))
    assert expansion.normalization_ == "besvm"
    with pytest.raises(ValueError, match="fitted on word counts"):
        expansion.transform(dense)
    with pytest.raises(ValueError, match="word counts"):
        BasisExpansion("sensing0").fit(sp.csr_matrix(-dense), y)
    with pytest.raises(ValueError, match="compares bag-of-words documents"):
        BasisExpansion("sensing0").fit(dense, y)
