"""Input kinds: the strategy chosen once from the input spec, and what each kind does with client
requests, trainer batches and its own artifact arrays."""

import dataclasses

import numpy as np
import pytest

from service.model import ArtifactIntegrityError, InvalidInputError, Predictor, SpecError
from service.model.artifact import FORMAT_KEYS, read_artifact
from service.model.artifact_writing import write_artifact
from service.model.inputs.dense import MAX_INPUT_DISTANCE, DenseInputs
from service.model.inputs.documents import DocumentInputs
from service.model.inputs.kinds import input_kind_for
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import parse_transform


def test_the_kind_is_chosen_from_the_input_spec(digits_predictor, text_fit):
    assert input_kind_for(InputSpec("vector", (3,))) is DenseInputs
    assert input_kind_for(InputSpec("grid", (2, 2, 1))) is DenseInputs
    assert input_kind_for(InputSpec("counts", (5,))) is DocumentInputs
    with pytest.raises(SpecError, match="text needs a vocabulary"):
        input_kind_for(InputSpec("text", ()))
    assert isinstance(digits_predictor.inputs, DenseInputs)
    assert isinstance(text_fit.predictor.inputs, DocumentInputs)


def test_dense_inputs_parse_prepare_and_warm_up(digits_predictor, digits):
    inputs = digits_predictor.inputs
    batch = inputs.parse(digits.X_test[:2].reshape(2, 8, 8).tolist())
    np.testing.assert_array_equal(batch, digits.X_test[:2])
    np.testing.assert_allclose(
        inputs.prepare(batch), (digits.X_test[:2] - inputs.mean) / inputs.scale, rtol=1e-15
    )
    # The dense normalised form search models read: pixels centred and scaled, by numpy.
    np.testing.assert_allclose(
        inputs.normalized(digits.X_test[:2]),
        (digits.X_test[:2] - inputs.mean) / inputs.scale,
        rtol=1e-15,
    )
    assert inputs.known_words(batch) is None
    assert inputs.warm_up_batch(3).shape == (3, 64)
    assert inputs.has_normalized_form
    assert inputs.vocabulary is None
    assert inputs.n_basis_values == inputs.basis.size
    with pytest.raises(InvalidInputError, match=r"reads grid\(8, 8, 1\), not text: send instances"):
        inputs.parse_texts(["a seven"])
    with pytest.raises(InvalidInputError, match=r"\(n, 64\)"):
        inputs.batch(np.zeros((2, 8, 8)))


def test_documents_read_pairs_and_texts_alike(text_fit):
    inputs = text_fit.predictor.inputs
    by_text = inputs.parse_texts(["Rocket moon rocket.", ""])
    first = by_text.counts[0]
    by_pairs = inputs.parse(
        [
            {"indices": first.indices.tolist(), "counts": first.data.tolist()},
            {"indices": [], "counts": []},
        ]
    )
    assert (by_text.counts != by_pairs.counts).nnz == 0
    assert inputs.known_words(by_text) == [3, 0]
    assert inputs.prepare(by_text) is by_text
    assert inputs.batch(by_text) is by_text
    warm = inputs.warm_up_batch(4)
    assert warm.shape == (4, inputs.n_features)
    assert inputs.known_words(warm) == [1, 1, 1, 1]
    assert not inputs.has_normalized_form
    assert inputs.n_basis_values == inputs.basis.nnz
    with pytest.raises(InvalidInputError, match="no normalised dense form"):
        inputs.normalized(by_text)
    with pytest.raises(InvalidInputError, match="has no vocabulary"):
        dataclasses.replace(inputs, vocabulary=None).parse_texts(["rocket"])
    with pytest.raises(InvalidInputError, match="the batch is empty"):
        inputs.parse([])


def test_each_kind_writes_the_arrays_and_keys_it_reads(digits_predictor, text_fit):
    dense, documents = digits_predictor.inputs, text_fit.predictor.inputs
    assert dense.arrays().keys() == DenseInputs.array_names(dense.manifest())
    assert documents.arrays().keys() == DocumentInputs.array_names(documents.manifest())
    assert dense.manifest() == {
        "input": {"kind": "grid", "shape": [8, 8, 1]},
        "transform": "pixels",
    }
    assert documents.manifest()["transform"] == "none"
    assert documents.manifest()["vocabulary"]["size"] == documents.n_features
    plain = dataclasses.replace(documents, vocabulary=None)
    assert "vocabulary" not in plain.arrays()
    assert "vocabulary" not in plain.manifest()


def test_arrays_of_the_other_kind_are_refused(text_model_dir, tmp_path):
    artifact = read_artifact(text_model_dir)
    manifest = {
        k: v for k, v in artifact.manifest.items() if k not in FORMAT_KEYS | {"created", "versions"}
    }
    manifest["model_type"] = artifact.manifest["model_type"]
    path = write_artifact(tmp_path / "m", manifest, {**artifact.arrays, "input_mean": np.zeros(2)})
    with pytest.raises(ArtifactIntegrityError, match="inputs have no input_mean"):
        Predictor.load(path)


def test_a_document_basis_of_another_vocabulary_is_inconsistent(text_fit):
    predictor = text_fit.predictor
    inputs = predictor.inputs
    narrower = InputSpec("counts", (inputs.n_features - 1,))
    with pytest.raises(ArtifactIntegrityError, match="basis has shape"):
        dataclasses.replace(predictor, inputs=dataclasses.replace(inputs, spec=narrower))


def _distances(inputs, X):
    """Each instance's distance from the training mean in units of the scale, by numpy."""
    return np.linalg.norm((X - inputs.mean) / inputs.scale, axis=1)


def test_inputs_on_the_training_scale_or_near_it_are_never_refused(digits_predictor, digits):
    inputs = digits_predictor.inputs
    everything = np.vstack([digits.X_train, digits.X_test])
    for factor in (1.0, 255 / 16, 65535 / 16):  # 4-bit digits, 8-bit and 16-bit images
        X = everything * factor
        assert _distances(inputs, X).max() < MAX_INPUT_DISTANCE
        np.testing.assert_array_equal(inputs.parse(X.reshape(-1, 8, 8).tolist()), X)
    assert _distances(inputs, everything).max() < 2  # the training items lie near 1


@pytest.mark.parametrize("value", [1e20, 1e150, 1e300, -1e300, 1.7e308])
def test_finite_but_absurd_instances_are_refused_naming_them(digits_predictor, digits, value):
    # A 1 KB request of such values took seconds to learn a meaningless one-atom code.
    inputs = digits_predictor.inputs
    absurd = np.full(64, value)
    batch = np.vstack([digits.X_test[:2], absurd]).reshape(3, 8, 8).tolist()
    with pytest.raises(InvalidInputError, match=r"instances\[2\] lies .* times farther") as error:
        inputs.parse(batch)
    assert f"the bound is {MAX_INPUT_DISTANCE:,.0f}" in str(error.value)
    with pytest.raises(InvalidInputError, match=r"^positives\[7\] lies"):
        inputs.parse(batch[2:], names=["positives[7]"])


def test_the_bound_lies_between_the_farthest_accepted_and_nearest_refused(digits_predictor):
    inputs = digits_predictor.inputs
    direction = np.ones(64) / 8.0  # unit norm
    inside = inputs.mean + 0.999 * MAX_INPUT_DISTANCE * inputs.scale * direction
    outside = inputs.mean + 1.001 * MAX_INPUT_DISTANCE * inputs.scale * direction
    assert inputs.parse([inside.reshape(8, 8).tolist()]).shape == (1, 64)
    with pytest.raises(InvalidInputError, match="1e\\+05 times"):
        inputs.parse([outside.reshape(8, 8).tolist()])


def test_values_too_large_for_the_transform_are_refused():
    # HOG is scale-invariant: 1e20 pixels are the same image; 1e200 overflow its gradients.
    spec = InputSpec("grid", (8, 8, 1))
    transform = parse_transform("hog(4, 9)")
    d = transform.n_features(spec)
    inputs = DenseInputs(spec, np.zeros(d), 1.0, np.zeros((1, d)), transform)
    image = np.arange(64.0).reshape(8, 8)
    assert inputs.parse([(image * 1e20).tolist()]).shape == (1, 64)
    with pytest.raises(InvalidInputError, match=r"instances\[0\] holds values too large for the"):
        inputs.parse([(image * 1e200).tolist()])


@pytest.mark.parametrize("counts", [[2**53, 1], [1e300], [10**400]])
def test_documents_of_more_than_2_53_words_are_refused(text_fit, counts):
    # 1e300 words answered known_words = -9223372036854775808.
    inputs = text_fit.predictor.inputs
    document = {"indices": list(range(len(counts))), "counts": counts}
    with pytest.raises(InvalidInputError, match=r"instances\[0\] counts more than 9,007,"):
        inputs.parse([document])
    assert inputs.known_words(inputs.parse([{"indices": [0], "counts": [2**53]}])) == [2**53]
