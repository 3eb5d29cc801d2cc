"""Input transforms: their text form, checks and HOG cells against scikit-image directly."""

import numpy as np
import pytest

from service.model import SpecError
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import InputTransform, default_transform, parse_transform
from tests.model.kernels.test_hog import reference


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        (None, "none"),
        ("pixels", "pixels"),
        ("HOG", "hog(cell_size=4, orientations=9)"),
        ("hog(2)", "hog(cell_size=2, orientations=9)"),
        ("hog(2, 6)", "hog(cell_size=2, orientations=6)"),
        ("hog(orientations=6, cell_size=3)", "hog(cell_size=3, orientations=6)"),
    ],
)
def test_transforms_parse_to_a_canonical_form_that_parses_back(text, canonical):
    transform = parse_transform(text)
    assert str(transform) == canonical
    assert parse_transform(canonical) == transform


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sift", "unknown transform"),
        ("hog(0)", ">= 1"),
        ("hog(2.5)", "integer"),
        ("hog(1, 2, 3)", "takes 2"),
        ("hog(size=2)", "no parameter"),
        ("pixels(2)", "takes 0"),
        ("hog(", "cannot parse"),
    ],
)
def test_bad_transforms_are_refused_with_a_message(text, message):
    with pytest.raises(SpecError, match=message):
        parse_transform(text)


@pytest.mark.parametrize(
    ("transform", "spec", "message"),
    [
        ("pixels", "vector(64)", "needs images"),
        ("hog(2)", "grid(8, 8, 2)", "needs images"),
        ("hog(16)", "grid(8, 8, 1)", "larger than"),
    ],
)
def test_transforms_refuse_inputs_they_cannot_read(transform, spec, message):
    with pytest.raises(SpecError, match=message):
        parse_transform(transform).grid_shape(InputSpec.parse(spec))


def test_defaults_are_pixels_for_images_and_none_otherwise():
    assert default_transform(InputSpec.parse("grid(8, 8, 1)")) == InputTransform("pixels")
    assert default_transform(InputSpec.parse("grid(4, 4, 9)")) == InputTransform("none")
    assert default_transform(InputSpec.parse("vector(5)")) == InputTransform("none")


def test_identity_transforms_keep_the_batch_and_its_grid():
    spec = InputSpec.parse("grid(5, 3, 3)")
    X = np.random.default_rng(0).random((4, 45))
    for name in ("none", "pixels"):
        transform = parse_transform(name)
        assert transform.apply(X, spec) is X
        assert transform.grid_shape(spec) == (5, 3, 3)
    assert parse_transform("none").grid_shape(InputSpec.parse("vector(45)")) is None


@pytest.mark.parametrize(("channels", "cell", "orientations"), [(1, 2, 9), (1, 3, 6), (3, 4, 8)])
def test_hog_cells_equal_scikit_image(channels, cell, orientations):
    spec = InputSpec("grid", (12, 9, channels))
    rng = np.random.default_rng(channels + cell)
    X = rng.random((3, spec.n_features)) * 16
    transform = parse_transform(f"hog({cell}, {orientations})")
    cells = transform.apply(X, spec)
    grid = transform.grid_shape(spec)
    assert grid == (12 // cell, 9 // cell, orientations)
    assert cells.shape == (3, int(np.prod(grid)))
    expected = reference(X, 12, 9, channels, cell, orientations)  # scikit-image, image by image
    np.testing.assert_allclose(cells, expected, rtol=1e-12)
    # Each cell is normalised on its own: a bright copy of an image has the same cells.
    np.testing.assert_allclose(transform.apply(3 * X, spec), cells, atol=1e-5)


def test_a_bound_transform_is_checked_once_and_applies_like_the_transform():
    spec = InputSpec.parse("grid(8, 8, 1)")
    X = np.random.default_rng(0).uniform(0, 16, size=(3, 64))
    transform = parse_transform("hog(2, 6)")
    bound = transform.bind(spec)
    assert (bound.grid_shape, bound.n_features) == ((4, 4, 6), 96)
    np.testing.assert_array_equal(bound.apply(X), transform.apply(X, spec))
    assert parse_transform("pixels").bind(spec).apply(X) is X
    with pytest.raises(SpecError, match="needs images"):
        transform.bind(InputSpec.parse("vector(64)"))
