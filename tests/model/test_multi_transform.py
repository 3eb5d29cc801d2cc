"""Measures on different input transforms of the same raw input in one model
(``hog(4): rbf + pixels: rigid(1)``): the notation, the scores against a reference built by hand,
the artifact, each transform computed once per request, the bound on absurd inputs, a real
server and the command line."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import httpx
import numpy as np
import pytest

from service.model import InvalidInputError, Predictor, SpecError
from service.model.inputs.dense import DenseInputs, TransformedSpace
from service.model.inputs.spaces import Spaces
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import BoundTransform, InputTransform, parse_transform
from service.model.search import SearchIndex, SearchQuery, search_dir
from service.model.similarity import parse_spec, parse_specs
from tests.api.conftest import serving
from training import BasisExpandingSVC
from training.cli.main import main
from training.evaluation.report import parse_configuration
from training.retrieval.catalogue import build_catalogue, dataset_items
from training.retrieval.search_model import estimator_for as search_estimator_for
from training.retrieval.search_model import fit_search_model

MIXED = "hog(4): rbf(gamma=0.5) + pixels: rigid(1)"


@pytest.fixture(scope="module")
def mixed(digits):
    """A two-transform model on 600 digits, 5 basis items per class, besvm normalisation (the
    rigid measure is indefinite)."""
    X = digits.X_train[:600]
    model = BasisExpandingSVC(
        similarity=MIXED, basis_per_class=5, input_shape="grid(8, 8, 1)", n_jobs=1
    ).fit(X, digits.y_train[:600])
    return model, X


# -- notation ------------------------------------------------------------------------------


def test_terms_with_transforms_parse_and_print_back():
    text = "hog(8): rbf + hog(cell_size=4, orientations=9): rigid(1) + pixels: rbf + linear"
    specs = parse_specs(text)
    names = [str(s) for s in specs]
    assert names == [
        "hog(cell_size=8, orientations=9): rbf(gamma=1)",
        "hog(cell_size=4, orientations=9): rigid(h=1)",
        "pixels: rbf(gamma=1)",
        "linear",
    ]
    assert parse_specs(names) == specs
    assert parse_specs(" + ".join(names)) == specs
    assert specs[0].measure_name == "rbf(gamma=1)"
    assert specs[3].transform is None
    # One measure on two transforms is two terms; the same term twice is refused.
    assert len(parse_specs("hog(4): rbf + hog(8): rbf")) == 2
    with pytest.raises(SpecError, match="given twice"):
        parse_specs("hog(4): rbf + hog(cell_size=4): rbf")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sift(4): rbf", "unknown transform 'sift'"),
        (": rbf", "empty transform"),
        ("hog(0): rbf", "cell_size must be >= 1"),
        ("hog(4): nope", "unknown similarity 'nope'"),
    ],
)
def test_bad_terms_are_refused_with_the_reason(text, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(text)


def test_a_measure_on_a_transform_that_does_not_apply_is_refused(digits):
    X, y = digits.X_train[:100], digits.y_train[:100]
    with pytest.raises(ValueError, match="needs images"):
        BasisExpandingSVC(similarity="hog(4): rbf + rbf", basis_per_class=2).fit(X, y)
    images = X.reshape(-1, 8, 8)
    with pytest.raises(ValueError, match="larger than the 8x8 image"):
        BasisExpandingSVC(similarity="hog(16): rbf + rbf", basis_per_class=2).fit(images, y)
    with pytest.raises(ValueError, match=r"rbf.* on pixels is given twice"):
        BasisExpandingSVC(similarity="rbf + pixels: rbf", basis_per_class=2).fit(images, y)
    with pytest.raises(ValueError, match="not a grid"):
        BasisExpandingSVC(similarity="rbf + none: rigid(1)", basis_per_class=2).fit(X, y)


# -- the scores against a reference built by hand --------------------------------------------


def _normalised(T: np.ndarray, T_train: np.ndarray) -> np.ndarray:
    """The paper's global input normalisation, learned on ``T_train`` (numpy)."""
    mean = T_train.mean(axis=0)
    scale = np.linalg.norm(T_train - mean, axis=1).mean()
    return (T - mean) / scale


def _rigid(basis: np.ndarray, X: np.ndarray, grid, h: int) -> np.ndarray:
    """max over shifts z in {-h..h}^2 of sum_cells <b_c, x_(c+z)> (cells outside: zero)."""
    height, width, channels = grid
    B = basis.reshape(-1, height, width, channels)
    Z = X.reshape(-1, height, width, channels)
    padded = np.pad(Z, ((0, 0), (h, h), (h, h), (0, 0)))
    best = np.full((len(X), len(basis)), -np.inf)
    for dy in range(-h, h + 1):
        for dx in range(-h, h + 1):
            shifted = padded[:, h + dy : h + dy + height, h + dx : h + dx + width]
            best = np.maximum(best, np.einsum("nhwc,bhwc->nb", shifted, B))
    return best


def test_decision_function_equals_a_reference_built_by_hand(mixed, digits):
    model, X_train = mixed
    predictor = model.predictor_
    spec = predictor.input_spec
    X = digits.X_test[:40]
    hog = parse_transform("hog(4)")
    indices = model.expansion_.basis_indices_
    # Each space from the raw inputs: transform, normalise on the training set, the shared
    # basis items taken from the same training rows.
    H_train = hog.apply(X_train, spec)
    hog_basis = _normalised(H_train[indices], H_train)
    hog_X = _normalised(hog.apply(X, spec), H_train)
    pixel_basis = _normalised(X_train[indices], X_train)
    pixel_X = _normalised(X, X_train)
    rbf_block = np.exp(-0.5 * ((hog_X[:, None, :] - hog_basis[None, :, :]) ** 2).sum(axis=2))
    rigid_block = _rigid(pixel_basis, pixel_X, (8, 8, 1), 1)
    raw = np.hstack([rbf_block, rigid_block])
    assert predictor.normalization == "besvm"
    features = (raw - predictor.feature_offset) / predictor.feature_scale
    expected = features @ predictor.coef.T + predictor.intercept
    np.testing.assert_allclose(predictor.decision_function(X), expected, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(model.decision_function(X), expected, rtol=1e-9, atol=1e-9)
    # The model's stored spaces are those of the reference.
    inputs = predictor.inputs
    assert inputs.transform_names == ("pixels", "hog(cell_size=4, orientations=9)")
    np.testing.assert_allclose(inputs.basis, pixel_basis, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(inputs.more_spaces[0].basis, hog_basis, rtol=1e-12, atol=1e-12)
    # The search side's dense form: every space side by side.
    np.testing.assert_allclose(
        predictor.normalized_inputs(X), np.hstack([pixel_X, hog_X]), rtol=1e-12, atol=1e-12
    )


def test_a_linear_measure_on_a_second_space_folds_into_weights_on_that_space(digits):
    # The linear measure reads the HOG space: the predictor never computes its similarities,
    # it applies weights to the HOG items of the batch; the reference computes them.
    X_train = digits.X_train[:600]
    model = BasisExpandingSVC(
        similarity="pixels: rbf(gamma=0.5) + hog(4): linear",
        basis_per_class=5,
        normalization="besvm",
        input_shape="grid(8, 8, 1)",
        n_jobs=1,
    ).fit(X_train, digits.y_train[:600])
    predictor = model.predictor_
    X = digits.X_test[:40]
    hog = parse_transform("hog(4)")
    indices = model.expansion_.basis_indices_
    H_train = hog.apply(X_train, predictor.input_spec)
    hog_basis = _normalised(H_train[indices], H_train)
    hog_X = _normalised(hog.apply(X, predictor.input_spec), H_train)
    pixel_basis = _normalised(X_train[indices], X_train)
    pixel_X = _normalised(X, X_train)
    rbf_block = np.exp(-0.5 * ((pixel_X[:, None, :] - pixel_basis[None, :, :]) ** 2).sum(axis=2))
    raw = np.hstack([rbf_block, hog_X @ hog_basis.T])
    features = (raw - predictor.feature_offset) / predictor.feature_scale
    expected = features @ predictor.coef.T + predictor.intercept
    np.testing.assert_allclose(predictor.decision_function(X), expected, rtol=1e-9, atol=1e-9)


def test_a_model_over_one_other_transform_named_in_its_terms_is_one_space(digits):
    images = digits.X_train[:300].reshape(-1, 8, 8)
    prefixed = BasisExpandingSVC(similarity="hog(4): rbf", basis_per_class=3, n_jobs=1)
    plain = BasisExpandingSVC(
        similarity="rbf", input_transform="hog(4)", basis_per_class=3, n_jobs=1
    )
    prefixed.fit(images, digits.y_train[:300])
    plain.fit(images, digits.y_train[:300])
    X = digits.X_test[:10].reshape(-1, 8, 8)
    # Every measure names its transform: it is the model's, no pixel space nothing reads.
    inputs = prefixed.predictor_.inputs
    assert inputs.transform_names == ("hog(cell_size=4, orientations=9)",)
    assert prefixed.predictor_.similarity_names == [
        "hog(cell_size=4, orientations=9): rbf(gamma=1)"
    ]
    assert "transforms" not in inputs.manifest()
    np.testing.assert_allclose(
        prefixed.decision_function(X), plain.decision_function(X), rtol=1e-8, atol=1e-8
    )


# -- artifact ------------------------------------------------------------------------------


def test_artifact_round_trip_of_a_two_transform_model(mixed, digits, tmp_path):
    model, _ = mixed
    path = model.save(tmp_path / "mixed", diagnostics=False)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["transform"] == "pixels"
    assert manifest["transforms"] == ["pixels", "hog(cell_size=4, orientations=9)"]
    assert manifest["similarities"] == [
        "hog(cell_size=4, orientations=9): rbf(gamma=0.5)",
        "pixels: rigid(h=1)",
    ]
    assert {"input_mean_1", "input_scale_1", "basis_1"} <= set(manifest["arrays"])
    loaded = Predictor.load(path)
    X = digits.X_test[:50]
    np.testing.assert_array_equal(loaded.decision_function(X), model.decision_function(X))
    assert loaded.describe_measures() == [
        {"similarity": "rbf(gamma=0.5)", "transform": "hog(cell_size=4, orientations=9)"},
        {"similarity": "rigid(h=1)", "transform": "pixels"},
    ]
    # A missing space is refused at load time, not answered wrongly.
    (path / "basis_1.npy").unlink()
    with pytest.raises(Exception, match="basis_1"):
        Predictor.load(path)


def test_single_transform_artifacts_are_unchanged(digits_model_dir, tmp_path):
    before = json.loads((digits_model_dir / "manifest.json").read_text())
    assert "transforms" not in before
    copy = Predictor.load(digits_model_dir).save(tmp_path / "copy")
    after = json.loads((copy / "manifest.json").read_text())
    assert list(after) == list(before)
    assert after["arrays"] == before["arrays"]  # same names, shapes and checksums
    assert {k: v for k, v in after.items() if k != "created"} == {
        k: v for k, v in before.items() if k != "created"
    }


def test_a_manifest_whose_transforms_do_not_start_with_the_models_is_refused(mixed, tmp_path):
    model, _ = mixed
    path = model.save(tmp_path / "mixed", diagnostics=False)
    manifest_path = path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["transforms"] = list(reversed(manifest["transforms"]))
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(Exception, match="transforms must list"):
        Predictor.load(path)


# -- each transform once per request ---------------------------------------------------------


@dataclass(frozen=True)
class CountingTransform(InputTransform):
    """A transform that records each batch it computes (a test double of the data, not of the
    code: :meth:`apply` is the real transform's)."""

    calls: list = field(default_factory=list, compare=False, repr=False)

    def bind(self, input_spec):
        bound = InputTransform(self.name, self.params).bind(input_spec)
        return CountingBound(bound.transform, input_spec, bound.grid_shape, bound.n_features, self)


@dataclass(frozen=True)
class CountingBound(BoundTransform):
    counter: CountingTransform | None = None

    def apply(self, X):
        self.counter.calls.append(len(X))
        return super().apply(X)


def _counting(inputs: DenseInputs) -> DenseInputs:
    def counting(transform):
        return CountingTransform(transform.name, transform.params)

    return DenseInputs(
        inputs.spec,
        inputs.mean,
        inputs.scale,
        inputs.basis,
        counting(inputs.transform),
        tuple(
            TransformedSpace(counting(s.transform), s.mean, s.scale, s.basis)
            for s in inputs.more_spaces
        ),
    )


def test_classify_computes_each_transform_once_per_request(mixed, digits):
    model, _ = mixed
    predictor = model.predictor_
    counted = replace(predictor, inputs=_counting(predictor.inputs))
    images = digits.X_test[:7].reshape(7, 8, 8).tolist()
    answers = counted.classify(images, top_k=2)
    assert [t.calls for t in counted.inputs.transforms] == [[7], [7]]
    expected = predictor.predict(digits.X_test[:7])
    assert [a.label for a in answers] == expected.tolist()


def test_a_hog_model_computes_its_transform_once_per_request(digits):
    """Regression: classify prepared each batch twice, once for the bound on absurd inputs."""
    images = digits.X_train[:300].reshape(-1, 8, 8)
    model = BasisExpandingSVC(
        similarity="rbf", input_transform="hog(4)", basis_per_class=3, n_jobs=1
    ).fit(images, digits.y_train[:300])
    counted = replace(model.predictor_, inputs=_counting(model.predictor_.inputs))
    counted.classify(digits.X_test[:3].reshape(3, 8, 8).tolist())
    assert counted.inputs.transform.calls == [3]


def test_absurd_inputs_are_refused_whichever_transform_sees_them(mixed, digits):
    predictor = mixed[0].predictor_
    image = digits.X_test[0].reshape(8, 8)
    # HOG cells are normalised, so its space hides the scale: the pixel space still refuses.
    assert isinstance(predictor.inputs.prepare(image.reshape(1, 64) * 1e20), Spaces)
    with pytest.raises(InvalidInputError, match="farther from the training data's mean"):
        predictor.classify([(image * 1e20).tolist()])
    with pytest.raises(InvalidInputError, match="too large for the transform hog"):
        predictor.classify([(image * 1e300).tolist()])
    assert predictor.classify([(image * 100).tolist()])[0].label


# -- the search side -------------------------------------------------------------------------


@pytest.mark.parametrize("feature_space", ["inputs", "besvm"])
def test_search_trains_and_answers_on_a_two_transform_model(mixed, digits, tmp_path, feature_space):
    model, X_train = mixed
    path = model.save(tmp_path / "mixed", diagnostics=False)
    predictor = Predictor.load(path)
    data = replace(
        digits,
        X_train=X_train,
        y_train=digits.y_train[: len(X_train)],
        X_test=digits.X_test[:200],
        y_test=digits.y_test[:200],
    )
    search = fit_search_model(
        predictor,
        data,
        search_estimator_for(n_atoms=20, n_epochs=5, random_state=0),
        feature_space=feature_space,
        sparsity=5,
    )
    # inputs: every transform's normalised form side by side, 64 pixels and 2x2x9 HOG cells.
    assert search.n_features == {"inputs": 64 + 36, "besvm": predictor.coef.shape[1]}[feature_space]
    search.save(search_dir(path), path)
    items, ids, labels = dataset_items(data, "test")
    build_catalogue(path, predictor, search, items, ids, labels, chunk_size=64, progress=False)
    index = SearchIndex.load(path, predictor)
    label = predictor.classes[3]
    result = index.run(SearchQuery(class_label=label, top_k=10))
    positions = [int(i.split("-")[1]) for i, _ in result.items]
    assert (labels[positions] == label).mean() >= 0.6
    # Search by example: each transform computed once for the examples of a query.
    counted = replace(predictor, inputs=_counting(predictor.inputs))
    examples = digits.X_train[:4][digits.y_train[:4] == digits.y_train[0]].reshape(-1, 8, 8)
    by_example = SearchIndex.load(path, counted).run(
        SearchQuery(positives=examples.tolist(), top_k=5)
    )
    assert len(by_example.items) == 5
    assert [t.calls for t in counted.inputs.transforms] == [[len(examples)]] * 2


# -- a real server and the command line ----------------------------------------------------


@pytest.mark.slow
def test_a_server_answers_for_a_two_transform_model(mixed, digits, tmp_path):
    model, _ = mixed
    path = model.save(tmp_path / "mixed", diagnostics=False)
    images = digits.X_test[:5].reshape(5, 8, 8, 1)
    expected = model.predict(digits.X_test[:5])
    with serving(path) as url:
        answer = httpx.post(f"{url}/classify", json={"instances": images.tolist()}, timeout=30)
        assert answer.status_code == 200, answer.text
        assert [p["label"] for p in answer.json()["predictions"]] == expected.tolist()
        info = httpx.get(f"{url}/v1/models/mixed", timeout=30).json()
        assert info["transform"] == "pixels"
        assert info["measures"] == [
            {"similarity": "rbf(gamma=0.5)", "transform": "hog(cell_size=4, orientations=9)"},
            {"similarity": "rigid(h=1)", "transform": "pixels"},
        ]
        metadata = httpx.get(f"{url}/v2/models/mixed", timeout=30).json()
        assert metadata["inputs"][0]["parameters"]["measures"] == info["measures"]
        absurd = httpx.post(
            f"{url}/classify", json={"instances": (images[:1] * 1e20).tolist()}, timeout=30
        )
        assert absurd.status_code == 422, absurd.text


@pytest.mark.slow
def test_fit_on_the_command_line_with_a_mixed_spec(tmp_path, capsys):
    out = tmp_path / "mixed"
    args = ["fit", "--out", str(out), "--similarity", "hog(4): rbf + pixels: rbf", "--quiet"]
    assert main(args) == 0
    summary = capsys.readouterr().out
    assert "measures also read hog(cell_size=4, orientations=9)" in summary
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["transforms"] == ["pixels", "hog(cell_size=4, orientations=9)"]
    assert manifest["training"]["test_accuracy"] > 0.93


def test_report_configurations_keep_a_model_wide_transform_and_read_mixed_terms(digits):
    model_wide = parse_configuration("hog(2, 9): rigid(1) + rbf", digits)
    assert model_wide.transform == "hog(cell_size=2, orientations=9)"
    assert model_wide.similarities == "rigid(h=1) + rbf(gamma=1)"
    mixed = parse_configuration("hog(4): rbf + pixels: rigid(1) [C=2]", digits)
    assert mixed.transform == "pixels"
    assert (
        mixed.similarities == "hog(cell_size=4, orientations=9): rbf(gamma=1) + pixels: rigid(h=1)"
    )
    assert mixed.C == 2.0
    with pytest.raises(SpecError, match="needs images"):
        parse_configuration(
            "rbf + hog(4): rbf", replace(digits, input_spec=InputSpec("vector", (64,)))
        )


def test_kmedoids_chooses_one_set_of_items_for_every_space(digits):
    X, y = digits.X_train[:300], digits.y_train[:300]
    model = BasisExpandingSVC(
        similarity="hog(4): rbf + pixels: rbf",
        basis_strategy="kmedoids",
        basis_per_class=3,
        input_shape="grid(8, 8, 1)",
        n_jobs=1,
    ).fit(X, y)
    indices = model.expansion_.basis_indices_
    assert len(indices) == 30
    H = parse_transform("hog(4)").apply(X, model.input_spec_)
    inputs = model.predictor_.inputs
    assert inputs.transform_names == ("pixels", "hog(cell_size=4, orientations=9)")
    np.testing.assert_allclose(inputs.basis, _normalised(X[indices], X), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        inputs.more_spaces[0].basis, _normalised(H[indices], H), rtol=1e-12, atol=1e-12
    )
    assert set(model.predictor_.basis_labels.tolist()) == set(range(10))
