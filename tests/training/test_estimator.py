"""BasisExpandingSVC, the Python API: scikit-learn's estimator checks, agreement with the steps
done by hand in scikit-learn, every input kind, and the artifact served as it is."""

import json
import warnings

import httpx
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import load_digits, load_iris
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import LinearSVC
from sklearn.utils.estimator_checks import parametrize_with_checks

from service.model import ArtifactError, Predictor
from tests.api.conftest import serving
from training import BasisExpandingSVC, ForwardSelectionCV
from training.estimator import exact_newton, squared_hinge
from training.estimator.expansion import BasisExpansion
from training.estimator.preprocessing import InputNormalizer
from training.selection import folds as selection_folds


@parametrize_with_checks([BasisExpandingSVC(basis_per_class=5)])
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)


TOPICS = {
    "space": "rocket orbit planet moon launch star galaxy telescope astronaut comet",
    "food": "bread cheese butter apple soup recipe kitchen oven dinner pepper",
    "law": "court judge lawyer trial verdict appeal contract witness jury statute",
}


def topic_texts(n_per_class: int, seed: int) -> tuple[list[str], np.ndarray]:
    """Short texts drawn from each topic's words and a few shared ones."""
    rng = np.random.default_rng(seed)
    shared = ["the", "of", "people", "time", "world"]
    texts, labels = [], []
    for label, words in TOPICS.items():
        for _ in range(n_per_class):
            texts.append(" ".join(rng.choice(words.split() * 2 + shared, size=12)))
            labels.append(label)
    return texts, np.array(labels)


@pytest.fixture(scope="module")
def digits_arrays():
    X, y = load_digits(return_X_y=True)
    return X[:600], y[:600], X[1000:1300], y[1000:1300]


@pytest.fixture(scope="module")
def digits_model(digits_arrays):
    X, y, _, _ = digits_arrays
    return BasisExpandingSVC(basis_per_class=8).fit(X, y)


def test_scores_like_the_steps_done_by_hand_in_scikit_learn(digits_model, digits_arrays):
    X, y, X_test, _ = digits_arrays
    by_hand = make_pipeline(
        InputNormalizer(),
        BasisExpansion("rbf(gamma=1)", n_basis_per_class=8, normalization="nystroem(square)"),
        LinearSVC(C=1.0, dual="auto", max_iter=10_000, random_state=0, tol=1e-8),
    ).fit(X, y)
    # LinearSVC's objective, minimised by another solver: both near the optimum (LinearSVC's
    # default tolerance alone moves the scores by about 2e-3; here both are within 1e-6).
    np.testing.assert_allclose(
        digits_model.decision_function(X_test), by_hand.decision_function(X_test), atol=1e-5
    )
    np.testing.assert_array_equal(digits_model.predict(X_test), by_hand.predict(X_test))


def test_one_core_and_every_core_train_the_same_model(digits_arrays, digits_model):
    X, y, X_test, _ = digits_arrays
    one = BasisExpandingSVC(basis_per_class=8, n_jobs=1).fit(X, y)
    np.testing.assert_allclose(
        one.decision_function(X_test), digits_model.decision_function(X_test), rtol=1e-9
    )


def test_row_blocks_solved_in_threads_give_the_model_of_one_core(digits_arrays, monkeypatch):
    X, y, X_test, _ = digits_arrays
    # 6 blocks of rows, for either Newton method the design's shape picks
    monkeypatch.setattr(squared_hinge, "ROWS_PER_BLOCK", 100)
    monkeypatch.setattr(exact_newton, "EXACT_NEWTON_ROWS", 100)
    models = [BasisExpandingSVC(basis_per_class=8, n_jobs=n).fit(X, y) for n in (1, 2)]
    scores = [model.decision_function(X_test) for model in models]
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-9)
    reference = make_pipeline(
        InputNormalizer(),
        BasisExpansion("rbf(gamma=1)", n_basis_per_class=8, normalization="nystroem(square)"),
        LinearSVC(C=1.0, dual="auto", max_iter=10_000, random_state=0, tol=1e-8),
    ).fit(X, y)
    np.testing.assert_allclose(scores[1], reference.decision_function(X_test), atol=1e-5)


@pytest.mark.parametrize(
    "labels",
    [
        np.array(["zero", "one", "two"]),
        np.array([10, -3, 7]),
        np.array([1.0, 2.0, 4.0]),
    ],
    ids=["str", "int", "float"],
)
def test_labels_of_any_type_come_back_as_given(labels):
    X, y = load_iris(return_X_y=True)
    model = BasisExpandingSVC(basis_per_class=5).fit(X, labels[y])
    np.testing.assert_array_equal(model.classes_, np.sort(labels))
    predicted = model.predict(X)
    assert predicted.dtype == labels.dtype
    assert (predicted == labels[y]).mean() > 0.9
    scores = model.decision_function(X)
    assert scores.shape == (150, 3)
    np.testing.assert_array_equal(model.classes_[scores.argmax(axis=1)], predicted)


def test_two_classes_have_one_score_positive_for_the_second():
    X, y = load_iris(return_X_y=True)
    labels = np.where(y == 2, "virginica", "other")
    model = BasisExpandingSVC(basis_per_class=5).fit(X, labels)
    scores = model.decision_function(X)
    assert scores.shape == (150,)
    np.testing.assert_array_equal(
        model.predict(X), np.where(scores > 0, model.classes_[1], model.classes_[0])
    )
    assert model.score(X, labels) > 0.9


def test_images_as_grids_flat_rows_or_with_a_grid_measure(digits_arrays):
    X, y, X_test, y_test = digits_arrays
    images = BasisExpandingSVC(basis_per_class=5, similarity="rigid(1)").fit(X.reshape(-1, 8, 8), y)
    assert str(images.input_spec_) == "grid(8, 8, 1)"
    flat = BasisExpandingSVC(
        basis_per_class=5, similarity="rigid(1)", input_shape="grid(8, 8, 1)"
    ).fit(X, y)
    np.testing.assert_allclose(
        images.decision_function(X_test.reshape(-1, 8, 8)), flat.decision_function(X_test)
    )
    assert images.score(X_test, y_test) > 0.8
    with pytest.raises(ValueError, match="grid"):  # a grid measure on vectors
        BasisExpandingSVC(basis_per_class=2, similarity="rigid(1)").fit(X, y)
    with pytest.raises(ValueError, match="grid"):
        images.predict(X_test.reshape(-1, 4, 16, 1)[:, :, :, :1].reshape(-1, 4, 16))


def test_documents_as_a_list_of_texts():
    texts, labels = topic_texts(30, 0)
    test_texts, test_labels = topic_texts(10, 1)
    model = BasisExpandingSVC(similarity="sensing1(n=150) + linear", basis_per_class=6, min_df=1)
    model.fit(texts, labels)
    assert str(model.input_spec_) == "text"
    assert model.predictor_.vocabulary is not None
    assert model.score(test_texts, test_labels) > 0.8
    assert model.decision_function(np.array(test_texts, dtype=object)).shape == (30, 3)
    with pytest.raises(ValueError, match="sequence of texts"):
        model.predict(np.zeros((2, 5)))
    with pytest.raises(ValueError, match=r"does not apply|documents|text"):
        BasisExpandingSVC(similarity="rigid(1)", min_df=1).fit(texts, labels)


def test_works_in_a_pipeline_under_grid_search_and_clones():
    X, y = load_iris(return_X_y=True)
    search = GridSearchCV(
        make_pipeline(StandardScaler(), BasisExpandingSVC(basis_per_class=5, n_jobs=1)),
        {
            "basisexpandingsvc__C": [0.1, 10.0],
            "basisexpandingsvc__similarity": ["linear", "rbf(gamma=1)"],
        },
        cv=3,
    ).fit(X, y)
    assert set(search.cv_results_["params"][0]) == {
        "basisexpandingsvc__C",
        "basisexpandingsvc__similarity",
    }
    assert search.best_score_ > 0.85
    fitted = search.best_estimator_[-1]
    copy = clone(fitted)
    assert copy.get_params() == fitted.get_params()
    assert not hasattr(copy, "predictor_")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"input_normalization": "sideways"}, "input_normalization"),
        ({"similarity": "nonsense(3)"}, "nonsense"),
        ({"normalization": "sideways"}, "sideways"),
        ({"input_transform": "hog(2, 9)"}, "grid"),
        ({"input_shape": "grid(3, 3, 1)"}, "9 numbers"),
    ],
)
def test_bad_settings_are_refused_in_fit_with_a_message(params, message):
    X, y = load_iris(return_X_y=True)
    estimator = BasisExpandingSVC(basis_per_class=2, **params)  # __init__ only stores them
    with pytest.raises(ValueError, match=message):
        estimator.fit(X, y)


def test_auto_is_the_selection_wrapped_around_the_estimator_which_refuses_it():
    """The estimator never builds its selector (tests/training/test_layers.py: it imports
    nothing of the selection): similarity='auto' is refused, with the wrapper that does it
    named."""
    X, y = load_iris(return_X_y=True)
    with pytest.raises(ValueError, match=r"ForwardSelectionCV\(BasisExpandingSVC\(\.\.\.\)\)"):
        BasisExpandingSVC(similarity="auto").fit(X, y)


def test_auto_selects_on_the_training_set_and_keeps_the_parameters_as_given(tmp_path):
    from sklearn.datasets import load_wine
    from sklearn.model_selection import train_test_split
    from sklearn.svm import SVC

    X, y = load_wine(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)
    model = BasisExpandingSVC().fit(X_train, y_train)
    assert model.get_params()["similarity"] == "rbf(gamma=1)"  # the default, not auto
    # A budget the selection never reaches: on a loaded machine a short one cuts it (the record
    # says so), and the accuracy claimed below is the whole selection's.
    estimator = BasisExpandingSVC(n_jobs=1)
    auto = ForwardSelectionCV(estimator, budget=600, n_jobs=1).fit(X_train, y_train)
    assert auto.estimator is estimator  # cloned, never fitted itself
    assert not hasattr(estimator, "classes_")
    assert estimator.get_params()["similarity"] == "rbf(gamma=1)"
    chosen = auto.best_estimator_  # the fitted estimator itself, not grafted into another
    assert isinstance(chosen, BasisExpandingSVC)
    assert chosen.get_params()["similarity"] == auto.best_params_["similarity"]
    record = auto.to_predictor().metadata["training"]["selection"]
    accuracies = [step["cv_accuracy"] for step in record["path"]]
    assert accuracies == sorted(accuracies)
    assert (record["budget_s"], record["budget_rule"]) == (600.0, "given")
    assert record["stopped"] == "every stage done"
    assert record["stages"][0]["stage"] == "widths and C"
    # The chosen model is what the wrapper predicts with, and what it saves, with its record.
    reference = make_pipeline(StandardScaler(), SVC()).fit(X_train, y_train)
    assert auto.score(X_test, y_test) >= reference.score(X_test, y_test) - 0.05
    assert auto.score(X_test, y_test) > model.score(X_test, y_test)
    np.testing.assert_array_equal(auto.predict(X_test), chosen.predict(X_test))
    auto.save(tmp_path / "wine")
    loaded = Predictor.load(tmp_path / "wine")
    np.testing.assert_array_equal(
        loaded.predict(X_test), np.asarray([str(label) for label in auto.predict(X_test)])
    )
    training = loaded.metadata["training"]
    assert training["selection"]["chosen"] == auto.best_params_
    assert training["timings"]["selection_seconds"] == auto.seconds_
    assert training["config"]["similarity"] == auto.best_params_["similarity"]


def test_labels_that_are_equal_as_text_are_refused():
    X, _ = load_iris(return_X_y=True)
    y = np.array([1, "1"] * 75, dtype=object)
    with pytest.raises(ValueError, match=r"not distinct as text|Unknown label type|Mix"):
        BasisExpandingSVC(basis_per_class=2).fit(X, y)


def test_a_solver_stopped_early_warns_once_from_the_calling_thread(digits_arrays):
    X, y, _, _ = digits_arrays
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        BasisExpandingSVC(basis_per_class=8, max_iter=1, C=100.0).fit(X, y)
    convergence = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert len(convergence) == 1
    assert "max_iter=1" in str(convergence[0].message)


@pytest.mark.slow
def test_a_saved_model_loads_and_is_served_as_it_is(digits_model, digits_arrays, tmp_path):
    _, y, X_test, _ = digits_arrays
    path = digits_model.save(tmp_path / "notebook-digits", record={"note": "from a notebook"})
    loaded = Predictor.load(path)
    assert loaded.name == "notebook-digits"
    assert loaded.metadata["training"]["note"] == "from a notebook"
    assert loaded.metadata["training"]["n_train"] == len(y)
    assert set(loaded.metadata["diagnostics"]) == {"rbf(gamma=1)"}
    np.testing.assert_allclose(
        loaded.decision_function(X_test), digits_model.decision_function(X_test), rtol=1e-9
    )
    expected = [str(label) for label in digits_model.predict(X_test[:40])]
    with pytest.raises(ArtifactError, match="exists"):
        digits_model.save(path)
    digits_model.save(path, overwrite=True)  # replaced (by rename)
    with serving(path) as url:
        response = httpx.post(
            f"{url}/classify",
            json={"instances": X_test[:40].tolist(), "top_k": 10},
            timeout=30,
        )
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert [p["label"] for p in predictions] == expected
    scores = digits_model.decision_function(X_test[:40])
    for prediction, row in zip(predictions, scores, strict=True):
        served = {c["label"]: c["score"] for c in prediction["top_k"]}
        np.testing.assert_allclose(
            [served[str(c)] for c in digits_model.classes_], row, rtol=1e-6, atol=1e-9
        )


def test_auto_searches_with_the_vocabulary_the_model_is_fitted_with(text_dataset, monkeypatch):
    texts, labels = list(text_dataset.X_train), text_dataset.y_train
    folds_fitted = []
    score_fold = selection_folds._score_fold

    def recording(X, estimator, params, fold, threads):
        folds_fitted.append(clone(estimator).set_params(**params).get_params())
        return score_fold(X, estimator, params, fold, threads)

    monkeypatch.setattr(selection_folds, "_score_fold", recording)  # one process: n_jobs=1
    estimator = BasisExpandingSVC(min_df=1, stop_words=None, n_jobs=1)
    auto = ForwardSelectionCV(estimator, budget=10, n_jobs=1).fit(texts, labels)
    assert folds_fitted
    assert {(p["min_df"], p["stop_words"]) for p in folds_fitted} == {(1, None)}
    # Words every text shares ("the", "of") are kept by both: stop words are not removed.
    assert "the" in auto.best_estimator_.predictor_.vocabulary.terms


def test_the_artifact_records_the_parameters_that_made_the_model(digits_model):
    """training.config is derived from the parameters: every one but how the fit ran."""
    recorded = digits_model.predictor_.metadata["training"]["config"]
    params = digits_model.get_params()
    assert set(recorded) == set(params) - {"n_jobs", "cluster", "verbose"}
    assert all(recorded[name] == params[name] for name in recorded)
    json.dumps(recorded)  # plain JSON, as the manifest holds it


def test_one_expansion_fits_each_C_as_the_steps_done_by_hand(digits_arrays):
    """Fits that differ only in C share one expansion, which none of them changes: each is
    scikit-learn's pipeline at its C."""
    X, y, X_test, _ = digits_arrays
    expanded = BasisExpandingSVC(basis_per_class=8, C=5.0).expand(X, y)
    for C in (1.0, 0.1, 1.0):
        model = BasisExpandingSVC(basis_per_class=8, C=C).fit_expanded(expanded)
        by_hand = make_pipeline(
            InputNormalizer(),
            BasisExpansion("rbf(gamma=1)", n_basis_per_class=8, normalization="nystroem(square)"),
            LinearSVC(C=C, dual="auto", max_iter=10_000, random_state=0, tol=1e-8),
        ).fit(X, y)
        np.testing.assert_allclose(
            model.decision_function(X_test), by_hand.decision_function(X_test), atol=1e-5
        )
        assert model.n_features_in_ == X.shape[1]


def test_a_sparse_design_is_shared_unshifted_by_the_fits_on_it():
    """Documents whose similarities are mostly zero train on a sparse design around the column
    medians (the solver's ``training_design``): the fits on one expansion leave it as it was,
    and each is LinearSVC on that design (its bias regularised there), scoring the features."""
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    texts = [
        " ".join(f"word{topic}x{k}" for k in rng.integers(0, 60, size=4))
        for topic in range(3)
        for _ in range(40)
    ]
    labels = np.repeat(["a", "b", "c"], 40)
    params = {"similarity": "sensing0", "basis_per_class": 10, "min_df": 1}
    expanded = BasisExpandingSVC(**params).expand(texts, labels)
    assert sp.issparse(expanded.design)
    assert np.abs(expanded.shift).max() > 0
    design = expanded.design.toarray()
    features = design + expanded.shift
    before = expanded.design.copy()
    for C in (10.0, 1.0):
        model = BasisExpandingSVC(**params, C=C).fit_expanded(expanded)
        reference = LinearSVC(C=C, dual="auto", max_iter=100_000, tol=1e-8).fit(design, labels)
        ours = features @ model.predictor_.coef.T + model.predictor_.intercept
        np.testing.assert_allclose(ours, reference.decision_function(design), atol=1e-4)
    assert (expanded.design != before).nnz == 0


def test_an_expansion_fits_only_an_estimator_of_its_parameters(digits_arrays):
    X, y, _, _ = digits_arrays
    estimator = BasisExpandingSVC(basis_per_class=4)
    expanded = estimator.expand(X, y)
    with pytest.raises(NotFittedError):  # expanding fits nothing
        estimator.predict(X[:2])
    with pytest.raises(ValueError, match=r"basis_per_class=4 \(here 5\)"):
        BasisExpandingSVC(basis_per_class=5).fit_expanded(expanded)
    with pytest.raises(ValueError, match="ForwardSelectionCV"):
        BasisExpandingSVC(similarity="auto").expand(X, y)


def test_a_warm_start_on_one_expansion_reaches_the_cold_optimum(digits_arrays):
    X, y, X_test, _ = digits_arrays
    params = {"basis_per_class": 60, "normalization": "besvm", "n_jobs": 1}  # every item
    expanded = BasisExpandingSVC(**params).expand(X, y)
    first = BasisExpandingSVC(**params, C=100.0).fit_expanded(expanded)
    cold = BasisExpandingSVC(**params, C=10.0).fit_expanded(expanded)
    warm = BasisExpandingSVC(**params, C=10.0).fit_expanded(expanded, start=first)
    # scores of order 1, the solver's stopping rule at tol 1e-8
    np.testing.assert_allclose(
        warm.decision_function(X_test), cold.decision_function(X_test), atol=1e-4
    )
    assert warm.n_iter_ < cold.n_iter_  # started nearer (10 Newton steps cold, 5 warm)
    other = BasisExpandingSVC(**params).expand(X, y)
    with pytest.raises(ValueError, match="same expansion"):
        BasisExpandingSVC(**params, C=10.0).fit_expanded(other, start=first)


def test_a_refit_on_arrays_forgets_the_column_names_of_a_data_frame(digits_arrays):
    import pandas as pd

    X, y, X_test, _ = digits_arrays
    model = BasisExpandingSVC(basis_per_class=4, n_jobs=1)
    model.fit(pd.DataFrame(X, columns=[f"pixel{i}" for i in range(X.shape[1])]), y)
    assert list(model.feature_names_in_)[:2] == ["pixel0", "pixel1"]
    model.fit(X, y)
    assert not hasattr(model, "feature_names_in_")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scikit-learn warns of names fitted and not given
        model.predict(X_test)
