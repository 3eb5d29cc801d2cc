"""A bof model trained on real images (letters rendered from installed fonts): its artifact
round trip, its refusals, and the glyph set's command."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.model import Predictor
from service.model.errors import InvalidInputError, SpecError
from service.model.inputs.bof import BagOfFeatures
from service.model.inputs.transforms import parse_transform
from training.data.datasets import load_dataset
from training.data.glyphs import font_files
from training.estimator.estimator import BasisExpandingSVC


def test_artifact_round_trip_gives_the_same_scores(bof_fit, bof_model_dir, glyphs):
    loaded = Predictor.load(bof_model_dir)
    np.testing.assert_allclose(
        loaded.decision_function(glyphs.X_test),
        bof_fit.predictor.decision_function(glyphs.X_test),
        rtol=1e-12,
        atol=1e-12,
    )
    manifest = json.loads((bof_model_dir / "manifest.json").read_text())
    bof = "bof(patch=8, step=4, words=24, levels=1, single=0)"
    assert manifest["transforms"] == ["pixels", bof]
    assert manifest["similarities"] == [f"{bof}: sensing1(n=50)", "pixels: rbf(gamma=1)"]
    centres = np.load(bof_model_dir / "visual_words_1.npy", allow_pickle=False)
    assert centres.shape == (24, 128)
    np.testing.assert_array_equal(centres, bof_fit.predictor.inputs.bags[0].centres)
    cells = np.load(bof_model_dir / "cell_basis_indptr_1.npy", allow_pickle=False)
    assert cells.shape == (loaded.n_basis * 5 + 1,)  # 1 + 4 cells per basis image
    assert not loaded.inputs.has_normalized_form


def test_the_bags_learn_the_letters(bof_fit, glyphs):
    accuracy = np.mean(bof_fit.predictor.predict(glyphs.X_test) == glyphs.y_test)
    assert accuracy > 0.5  # ten letters: chance is 0.1


def test_a_single_level_bof_model_alone(glyphs):
    model = BasisExpandingSVC(
        similarity="sensing0",
        input_transform="bof(patch=8, step=4, words=16, levels=1, single=1)",
        basis_per_class=3,
        input_shape="grid(32, 32, 1)",
    ).fit(glyphs.X_train, glyphs.y_train)
    inputs = model.predictor_.inputs
    assert inputs.transform_names == ("bof(patch=8, step=4, words=16, levels=1, single=1)",)
    np.testing.assert_array_equal(inputs.basis_items.cell_weights, np.ones(4))
    assert model.score(glyphs.X_test, glyphs.y_test) > 0.3


def test_values_too_large_for_the_descriptors_are_refused(bof_fit, glyphs):
    image = glyphs.X_test[0].copy()
    image[::5] = 1e300
    with pytest.raises(InvalidInputError, match=r"instances\[1\] holds values too large.*bof"):
        bof_fit.predictor.classify(
            [glyphs.X_test[1].reshape(32, 32).tolist(), image.reshape(32, 32).tolist()]
        )


def test_measures_without_drivers_on_cells_are_refused(glyphs):
    model = BasisExpandingSVC(similarity="bof(words=8): rigid(1)", input_shape="grid(32, 32, 1)")
    with pytest.raises(ValueError, match="does not apply to bags of visual words"):
        model.fit(glyphs.X_train, glyphs.y_train)


def test_visual_words_of_the_wrong_shape_are_refused():
    with pytest.raises(SpecError, match=r"visual_words has shape \(3, 128\), expected \(400"):
        BagOfFeatures(parse_transform("bof"), np.zeros((3, 128)), np.ones(400))


def test_build_glyphs_writes_a_set_split_by_font(tmp_path):
    from training.cli.main import main

    fonts = tmp_path / "fonts"
    fonts.mkdir()
    for path in font_files()[:40]:
        (fonts / path.name).symlink_to(path)
    out = tmp_path / "glyphs.npz"
    args = ["build-glyphs", "--out", str(out), "--fonts-dir", str(fonts), "--quiet"]
    assert main([*args, "--train-per-class", "3", "--test-per-class", "2"]) == 0
    dataset = load_dataset(str(out))
    assert str(dataset.input_spec) == "grid(64, 64, 1)"
    assert dataset.classes == list("ABCDEFGHIJ")
    assert len(dataset.y_train) == 30
    assert len(dataset.y_test) == 20
    with np.load(out, allow_pickle=False) as archive:
        train_fonts, test_fonts = set(archive["fonts"]), set(archive["fonts_test"])
    assert len(train_fonts) == 3
    assert len(test_fonts) == 2
    assert not train_fonts & test_fonts
    assert main([*args, "--train-per-class", "3"]) == 2  # exists: --force replaces it
