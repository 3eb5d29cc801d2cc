"""Per-feature input standardisation: fitted like scikit-learn's StandardScaler (then scaled to
mean norm 1), stored in the artifact as one scale per feature, applied by the service; artifacts
of the global normalisation (every artifact written before it) load as before."""

import json

import httpx
import numpy as np
import pytest
from sklearn.datasets import load_wine
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from service.model import ArtifactIntegrityError, Predictor
from service.model.artifact import FORMAT_KEYS, read_artifact
from service.model.artifact_writing import write_artifact
from service.model.inputs.spec import InputSpec
from tests.api.conftest import serving
from training.data.datasets import Dataset
from training.estimator.preprocessing import InputNormalizer
from training.fitting import fit_dataset

pytestmark = pytest.mark.slow  # trains models and starts a server


@pytest.fixture(scope="module")
def wine() -> Dataset:
    X, y = load_wine(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y.astype(str), test_size=0.25, random_state=0, stratify=y
    )
    return Dataset("wine", InputSpec("vector", (13,)), X_train, y_train, X_test, y_test)


@pytest.fixture(scope="module")
def per_feature_dir(wine, tmp_path_factory):
    config = dict(input_normalization="per-feature")
    path = tmp_path_factory.mktemp("artifacts") / "wine"
    fit_dataset(wine, "wine", diagnostics=False, **config).predictor.save(path)
    return path


def test_per_feature_scaling_is_a_z_score_scaled_to_mean_norm_one(wine):
    X = np.column_stack([wine.X_train, np.full(len(wine.X_train), 3.0)])  # a constant feature
    normalizer = InputNormalizer(scaling="per-feature").fit(X)
    z = StandardScaler().fit_transform(X)
    expected = z / np.linalg.norm(z, axis=1).mean()
    np.testing.assert_allclose(normalizer.transform(X), expected, rtol=1e-12, atol=1e-15)
    assert normalizer.scale_.shape == (X.shape[1],)
    assert np.linalg.norm(normalizer.transform(X), axis=1).mean() == pytest.approx(1.0)
    # The global normalisation keeps one scale.
    assert np.ndim(InputNormalizer().fit(X).scale_) == 0
    with pytest.raises(ValueError, match="scaling must be one of global, per-feature"):
        InputNormalizer(scaling="zscore").fit(X)


def test_a_per_feature_model_round_trips_through_its_artifact(wine, per_feature_dir):
    manifest = json.loads((per_feature_dir / "manifest.json").read_text())
    assert manifest["input_normalization"] == "per-feature"
    assert manifest["arrays"]["input_scale"]["shape"] == [13]
    assert "input_normalization" not in Predictor.load(per_feature_dir).metadata
    loaded = Predictor.load(per_feature_dir)
    reference = InputNormalizer(scaling="per-feature").fit(wine.X_train)
    np.testing.assert_allclose(loaded.inputs.scale, reference.scale_, rtol=1e-12)
    np.testing.assert_allclose(
        loaded.normalized_inputs(wine.X_test),
        (wine.X_test - wine.X_train.mean(axis=0)) / reference.scale_,
        rtol=1e-10,
    )
    fitted = fit_dataset(wine, "w", diagnostics=False, input_normalization="per-feature")
    np.testing.assert_allclose(
        loaded.decision_function(wine.X_test),
        fitted.predictor.decision_function(wine.X_test),
        rtol=1e-12,
        atol=1e-12,
    )


def test_the_service_applies_the_per_feature_scaling(wine, per_feature_dir):
    expected = Predictor.load(per_feature_dir).predict(wine.X_test)
    with serving(per_feature_dir) as url:
        response = httpx.post(
            f"{url}/classify", json={"instances": wine.X_test[:10].tolist()}, timeout=60
        )
    assert response.status_code == 200, response.text
    labels = [answer["label"] for answer in response.json()["predictions"]]
    assert labels == expected[:10].tolist()
    assert np.mean(expected == wine.y_test) >= 0.9


def test_global_artifacts_load_as_before(digits_model_dir, digits):
    manifest = json.loads((digits_model_dir / "manifest.json").read_text())
    # What every artifact written before per-feature scaling looks like: no key, a scalar.
    assert "input_normalization" not in manifest
    assert manifest["arrays"]["input_scale"]["shape"] == []
    predictor = Predictor.load(digits_model_dir)
    assert predictor.inputs.input_normalization == "global"
    assert np.mean(predictor.predict(digits.X_test) == digits.y_test) > 0.95


def _rewrite(source, target, *, manifest_changes=None, arrays_changes=None):
    artifact = read_artifact(source)
    manifest = {
        k: v for k, v in artifact.manifest.items() if k not in FORMAT_KEYS | {"created", "versions"}
    }
    manifest["model_type"] = artifact.manifest["model_type"]
    manifest.update(manifest_changes or {})
    for key in [k for k, v in manifest.items() if v is None]:
        del manifest[key]
    return write_artifact(target, manifest, {**artifact.arrays, **(arrays_changes or {})})


@pytest.mark.parametrize(
    ("manifest_changes", "arrays_changes", "message"),
    [
        ({"input_normalization": None}, {}, r"does not fit input_normalization 'global'"),
        ({}, {"input_scale": np.asarray(2.0)}, r"does not fit input_normalization 'per-feature'"),
        ({"input_normalization": "minmax"}, {}, "input_normalization must be one of"),
        ({}, {"input_scale": np.ones(12)}, r"input_scale has shape \(12,\), expected \(13,\)"),
        ({}, {"input_scale": -np.ones(13)}, "input_scale must be positive and finite"),
    ],
)
def test_inconsistent_scales_are_refused(
    per_feature_dir, tmp_path, manifest_changes, arrays_changes, message
):
    path = _rewrite(
        per_feature_dir,
        tmp_path / "m",
        manifest_changes=manifest_changes,
        arrays_changes=arrays_changes,
    )
    with pytest.raises(ArtifactIntegrityError, match=message):
        Predictor.load(path)
